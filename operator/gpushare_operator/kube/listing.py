"""One-shot paged lists, for priming caches that another component keeps up to date."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from gpushare_operator.kube import http
from gpushare_operator.kube.streams import drop_managed_fields


async def list_all(
    api: client.ApiClient, *, path: str, page_size: int = 500
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        query = [("limit", str(page_size))]
        if token:
            query.append(("continue", token))
        page = await http.request(api, method="GET", path=path, query=query, timeout=120)
        items.extend(drop_managed_fields(item) for item in page.get("items") or ())
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items

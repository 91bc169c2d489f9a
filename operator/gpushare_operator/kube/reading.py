"""One-shot reads for the kubectl plugin: whole collections into a sink, single objects, dry runs.

The operator keeps its caches with informers that never stop; the plugin reads once and exits,
so a failure here is the user's to see, never retried.  A collection is read as a *streaming
list* where the server has it (a watch with ``sendInitialEvents=true``, served from the watch
cache object by object and closed once the initial-events-end bookmark arrives), and as a paged
list otherwise, or when watching is not allowed: either way at most one object (or one page)
of full JSON is alive at a time, ``managedFields`` is dropped before the sink sees it, and the
sink keeps the slim record it projects, as the operator's caches do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson
from kubernetes_asyncio import client

from gpushare_operator.kube import http
from gpushare_operator.kube.streams import LineSplitter, drop_managed_fields

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# A server without streaming lists says 400/422 to sendInitialEvents; a user allowed to list
# but not to watch gets 403: all three fall back to a paged list.
_NO_STREAMING = frozenset({400, 403, 422})
DRY_RUN = ("dryRun", "All")
# The client the plugin passes around; callers above this layer name it without importing
# kubernetes_asyncio themselves.
Api = client.ApiClient
ApiError = http.ApiError


class ItemSink(Protocol):
    """Where listed objects go (the cache layer's informer sinks fit)."""

    def relist_item(self, obj: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Collection:
    path: str
    field_selector: str | None = None
    page_size: int = 250
    # A test on an object's raw JSON: False means the sink would keep nothing of it, so it is
    # not even decoded (most pods ask for no GPU: their bytes never mention a GPU resource).
    worth_decoding: Callable[[bytes], bool] | None = None


_ADDED = b'{"type":"ADDED"'


def _query(collection: Collection, **extra: str) -> list[tuple[str, str]]:
    query = list(extra.items())
    if collection.field_selector:
        query.append(("fieldSelector", collection.field_selector))
    return query


async def list_into(api: client.ApiClient, collection: Collection, sink: ItemSink) -> int:
    """Deliver every object of ``collection`` to ``sink``; returns how many."""
    streamed = await _streaming_list(api, collection, sink)
    if streamed is not None:
        return streamed
    return await _paged_list(api, collection, sink)


async def _streaming_list(
    api: client.ApiClient, collection: Collection, sink: ItemSink
) -> int | None:
    """The initial events of a watch, up to their closing bookmark; None if the server (or
    the user's RBAC) will not have it, before anything was delivered."""
    query = _query(
        collection,
        watch="1",
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
        timeoutSeconds="300",
    )
    response = await http.open_request(
        api,
        method="GET",
        path=collection.path,
        query=query,
        timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
    )
    async with response:
        if response.status in _NO_STREAMING:
            return None
        if response.status != 200:
            raise http.error_from(response, http.decode(await response.read()))
        splitter = LineSplitter()
        count = 0
        worth = collection.worth_decoding
        async for chunk in response.content.iter_any():
            for line in splitter.feed(chunk):
                if worth is not None and line.startswith(_ADDED) and not worth(line):
                    count += 1
                    continue
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "BOOKMARK":
                    annotations = (obj.get("metadata") or {}).get("annotations") or {}
                    if annotations.get(INITIAL_EVENTS_END):
                        return count
                elif kind == "ERROR":
                    raise http.ApiError(
                        status=int(obj.get("code") or 500), reason="watch", body=obj
                    )
                else:
                    sink.relist_item(drop_managed_fields(obj))
                    count += 1
    if count:  # the watch ended without its bookmark after delivering objects: not a listing
        raise http.ApiError(status=500, reason="watch", body="streaming list ended early")
    return None


async def _paged_list(api: client.ApiClient, collection: Collection, sink: ItemSink) -> int:
    token, count = "", 0
    while True:
        query = _query(collection, limit=str(collection.page_size))
        if token:
            query.append(("continue", token))
        page = await http.request(api, method="GET", path=collection.path, query=query, timeout=120)
        for item in page.get("items") or ():
            sink.relist_item(drop_managed_fields(item))
            count += 1
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return count


async def get(
    api: client.ApiClient, path: str, *, keep_managed_fields: bool = False
) -> dict[str, Any] | None:
    """One object, or None when it does not exist."""
    try:
        body = await http.request(api, method="GET", path=path)
    except http.ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return dict(body) if keep_managed_fields else drop_managed_fields(dict(body))


async def list_items(
    api: client.ApiClient, path: str, *, field_selector: str | None = None
) -> list[dict[str, Any]]:
    """A small collection (policies, one node's events), whole."""
    items: list[dict[str, Any]] = []

    class _Collect:
        def relist_item(self, obj: dict[str, Any]) -> None:
            items.append(obj)

    await _paged_list(api, Collection(path=path, field_selector=field_selector), _Collect())
    return items


async def dry_run_create(
    api: client.ApiClient, path: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    """The object as the API server would store it (defaults, admission); nothing is stored."""
    created = await http.request(api, method="POST", path=path, query=[DRY_RUN], body=dict(body))
    return drop_managed_fields(dict(created))


async def dry_run_replace(
    api: client.ApiClient, path: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    """A whole-object update as dry run; ``body`` carries the current resourceVersion."""
    replaced = await http.request(api, method="PUT", path=path, query=[DRY_RUN], body=dict(body))
    return drop_managed_fields(dict(replaced))


async def dry_run_delete(api: client.ApiClient, path: str) -> dict[str, Any]:
    """What a delete would leave: the object with its deletionTimestamp while finalizers
    hold it (the operator's keeps a policy until its nodes are released)."""
    answer = await http.request(api, method="DELETE", path=path, query=[DRY_RUN])
    return drop_managed_fields(dict(answer)) if isinstance(answer, Mapping) else {}

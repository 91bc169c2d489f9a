"""Raw JSON requests through kubernetes_asyncio's authenticated session.

The generated API classes deserialize every response into model objects (slow, and a second
copy of every body).  The informer and the writer need bytes in and bytes out: we reuse the
client's connection pool, TLS and auth, and decode with orjson ourselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client

from gpushare_operator.kube.backoff import retry_after_seconds

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class ApiError(Exception):
    """A non-2xx answer, with the Status object the API server sent when there is one."""

    def __init__(
        self, *, status: int, reason: str, body: Any, retry_after: float | None = None
    ) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        # Seconds the server asked us to wait (429 and some 503s say so in Retry-After).
        self.retry_after = retry_after
        message = body.get("message") if isinstance(body, Mapping) else None
        super().__init__(f"{status} {reason}: {message or body!r}")

    @property
    def status_reason(self) -> str | None:
        """The Status ``reason`` (``NotFound``, ``AlreadyExists``, ``Conflict``...)."""
        return self.body.get("reason") if isinstance(self.body, Mapping) else None


async def open_request(
    api: client.ApiClient,
    *,
    method: str,
    path: str,
    query: Sequence[tuple[str, str]] = (),
    body: Any = None,
    content_type: str = JSON,
    timeout: aiohttp.ClientTimeout | None = None,
) -> aiohttp.ClientResponse:
    """Start a request and return the unread response (for streaming watches)."""
    headers = {"Accept": JSON, "Content-Type": content_type}
    response: aiohttp.ClientResponse = await api.call_api(
        path,
        method,
        query_params=list(query),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=timeout,
    )
    return response


async def request(
    api: client.ApiClient,
    *,
    method: str,
    path: str,
    query: Sequence[tuple[str, str]] = (),
    body: Any = None,
    content_type: str = JSON,
    timeout: float = 30.0,
) -> Any:
    """One request, decoded; raises ApiError on any non-2xx status."""
    response = await open_request(
        api,
        method=method,
        path=path,
        query=query,
        body=body,
        content_type=content_type,
        timeout=aiohttp.ClientTimeout(total=timeout),
    )
    async with response:
        raw = await response.read()
    decoded = decode(raw)
    if not 200 <= response.status < 300:
        raise error_from(response, decoded)
    return decoded


def error_from(response: aiohttp.ClientResponse, body: Any) -> ApiError:
    """The ApiError for a non-2xx response whose body has been read (and decoded)."""
    return ApiError(
        status=response.status,
        reason=response.reason or "",
        body=body,
        retry_after=retry_after_seconds(response.headers),
    )


def decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")

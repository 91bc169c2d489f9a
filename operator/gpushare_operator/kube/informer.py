"""List/watch informers on raw JSON: paged lists, bookmarks, 410 Gone → re-list with replace.

Deliberately not kopf's per-object pipeline (which deep-copies and diffs every event body) and
not the generated API models (which build a second copy of every object): each line is decoded
once with orjson, ``metadata.managedFields`` is dropped, and the sink projects what it keeps.
A re-list replaces the sink's contents page by page, so objects deleted while the watch was
down leave the cache, and at most one page of full bodies is ever alive.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson
import structlog
from kubernetes_asyncio import client

from gpushare_operator.kube import http
from gpushare_operator.kube.telemetry import NoTelemetry, Telemetry

log = structlog.get_logger(__name__)


class Sink(Protocol):
    """Where an informer delivers objects (a cache in the ``cache`` layer)."""

    def begin_relist(self) -> None: ...
    def relist_item(self, obj: dict[str, Any]) -> None: ...
    def end_relist(self) -> None: ...
    def apply(self, event_type: str, obj: dict[str, Any]) -> None: ...


class Gone(Exception):
    """The resourceVersion we watch from has been compacted away: re-list."""


@dataclass(frozen=True, slots=True)
class Target:
    """What to list and watch."""

    path: str  # e.g. /api/v1/nodes
    kind: str  # for logs and metrics
    field_selector: str | None = None
    label_selector: str | None = None
    # A page of 100 fifteen-kilobyte Nodes decodes to a few MiB; pages of 500 made the first
    # list of a 5,000-node cluster the operator's peak memory, for no gain in speed.
    page_size: int = 100
    watch_timeout: int = 290  # server-side; we reconnect from the last resourceVersion
    # A collection the operator may be refused at first (the device-plugin ConfigMap before its
    # Role exists): a 403 on the first list counts as an empty listing, so the operator syncs and
    # says why it cannot write; the list is retried until allowed.
    forbidden_is_empty: bool = False


@dataclass
class InformerStats:
    events: int = 0
    bookmarks: int = 0
    relists: int = 0
    reconnects: int = 0
    last_activity: float = field(default_factory=time.monotonic)


def drop_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    return obj


def _transient(exc: http.ApiError) -> bool:
    """429 and 5xx (a restarting apiserver says 503): resume the watch, don't re-list."""
    return exc.status == 429 or exc.status >= 500


class LineSplitter:
    """Split a chunked HTTP body into lines without a size limit (a Node can exceed 64 KiB)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        if b"\n" not in chunk:
            return []
        *lines, rest = self._buffer.split(b"\n")
        self._buffer = bytearray(rest)
        return [bytes(line) for line in lines if line.strip()]


class Informer:
    """Keeps one sink in step with one resource collection, forever."""

    def __init__(
        self,
        *,
        api: client.ApiClient,
        target: Target,
        sink: Sink,
        telemetry: Telemetry | None = None,
        max_backoff: float = 30.0,
    ) -> None:
        self._api = api
        self._target = target
        self._sink = sink
        self._telemetry: Telemetry = telemetry or NoTelemetry()
        self._max_backoff = max_backoff
        self.synced = asyncio.Event()
        self._relist = asyncio.Event()
        self.stats = InformerStats()
        self.resource_version: str | None = None

    @property
    def kind(self) -> str:
        return self._target.kind

    def request_relist(self) -> None:
        """Ask for a fresh listing (the sink's idea of what to keep has widened)."""
        self._relist.set()

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                self._relist.clear()
                self.resource_version = await self._list()
                self.synced.set()
                backoff = 0.2
                await self._watch_until_gone_or_relist()
            except Gone:
                log.info("watch expired (410 Gone): re-listing", kind=self._target.kind)
            except (TimeoutError, aiohttp.ClientError, http.ApiError, OSError) as exc:
                if self._forbidden_before_sync(exc):
                    self._sink.begin_relist()
                    self._sink.end_relist()
                    self.synced.set()
                log.warning(
                    "list failed; retrying",
                    kind=self._target.kind,
                    error=str(exc),
                    retry_in=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def _forbidden_before_sync(self, exc: Exception) -> bool:
        return (
            self._target.forbidden_is_empty
            and not self.synced.is_set()
            and isinstance(exc, http.ApiError)
            and exc.status == 403
        )

    def _query(self, **extra: str) -> list[tuple[str, str]]:
        query = list(extra.items())
        if self._target.field_selector:
            query.append(("fieldSelector", self._target.field_selector))
        if self._target.label_selector:
            query.append(("labelSelector", self._target.label_selector))
        return query

    async def _list(self) -> str:
        """A paged list that replaces the sink's contents; returns the list's resourceVersion."""
        self.stats.relists += 1
        self._sink.begin_relist()
        token = ""
        while True:
            query = self._query(limit=str(self._target.page_size))
            if token:
                query.append(("continue", token))
            try:
                page = await http.request(
                    self._api, method="GET", path=self._target.path, query=query, timeout=120
                )
            except http.ApiError as exc:
                if exc.status == 410 and token:
                    # The continue token expired mid-list: start the listing over.
                    self._sink.begin_relist()
                    token = ""
                    continue
                raise
            for item in page.get("items") or ():
                self._sink.relist_item(drop_managed_fields(item))
            self.stats.last_activity = time.monotonic()
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                self._sink.end_relist()
                return str(metadata.get("resourceVersion", ""))

    async def _watch_until_gone_or_relist(self) -> None:
        watch = asyncio.create_task(self._watch_until_gone(), name=f"watch-{self.kind}")
        relist = asyncio.create_task(self._relist.wait(), name=f"relist-{self.kind}")
        try:
            await asyncio.wait({watch, relist}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watch, relist):
                task.cancel()
            await asyncio.gather(watch, relist, return_exceptions=True)
        if watch.done() and not watch.cancelled() and watch.exception() is not None:
            raise watch.exception()  # type: ignore[misc]
        log.info("re-list requested", kind=self.kind)

    async def _watch_until_gone(self) -> None:
        backoff = 0.2
        while True:
            try:
                await self._watch_once()
                backoff = 0.2
            except (TimeoutError, aiohttp.ClientError, OSError, http.ApiError) as exc:
                if isinstance(exc, http.ApiError) and not _transient(exc):
                    raise  # e.g. 403: let run() back off and list again
                self.stats.reconnects += 1
                log.warning(
                    "watch broke; resuming",
                    kind=self._target.kind,
                    error=str(exc),
                    retry_in=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    async def _watch_once(self) -> None:
        query = self._query(
            watch="1",
            allowWatchBookmarks="true",
            resourceVersion=self.resource_version or "",
            timeoutSeconds=str(self._target.watch_timeout),
        )
        response = await http.open_request(
            self._api,
            method="GET",
            path=self._target.path,
            query=query,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self._target.watch_timeout + 30),
        )
        async with response:
            if response.status == 410:
                raise Gone()
            if response.status != 200:
                body = await response.read()
                raise http.ApiError(status=response.status, reason=response.reason or "", body=body)
            self.stats.last_activity = time.monotonic()  # connected: alive, if quiet
            splitter = LineSplitter()
            async for chunk in response.content.iter_any():
                for line in splitter.feed(chunk):
                    self._handle_line(line)

    def _handle_line(self, line: bytes) -> None:
        event = orjson.loads(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        self.stats.last_activity = time.monotonic()
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise http.ApiError(status=int(obj.get("code") or 500), reason="watch", body=obj)
        metadata = obj.get("metadata") or {}
        version = metadata.get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            return
        self.stats.events += 1
        started = time.perf_counter()
        self._sink.apply(str(kind), drop_managed_fields(obj))
        self._telemetry.event_ingested(self._target.kind, time.perf_counter() - started)

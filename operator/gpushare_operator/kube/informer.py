"""List/watch informers on raw JSON: streaming lists, bookmarks, 410 Gone → re-list with replace.

Deliberately not kopf's per-object pipeline (which deep-copies and diffs every event body) and
not the generated API models (which build a second copy of every object): each line is decoded
once with orjson, ``metadata.managedFields`` is dropped, and the sink projects what it keeps.

Listing is a *streaming list* where the server has it (a watch with ``sendInitialEvents=true``,
served from the API server's watch cache object by object, then going on as the watch itself),
and a paged list otherwise (docs/reading.md says why).  Either way a re-list replaces the sink's
contents as it goes, so objects deleted while the watch was down leave the cache, and at most
one page (or one read) of full bodies is ever alive.

An informer never dies: whatever goes wrong (the API, the network, a body the sink chokes on)
is logged with the object it concerns, counted, and followed by a re-list after a jittered
back-off; ``synced`` is cleared meanwhile, which is what readiness reports.
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

from gpushare_operator.kube import http, streams
from gpushare_operator.kube.backoff import Backoff
from gpushare_operator.kube.streams import LineSplitter, drop_managed_fields
from gpushare_operator.kube.telemetry import NoTelemetry, Telemetry

# Re-exported: writing.py and the tests import them from here.
__all__ = [
    "EventFailed",
    "Gone",
    "Informer",
    "LineSplitter",
    "Sink",
    "Target",
    "drop_managed_fields",
]

log = structlog.get_logger(__name__)

# The annotation on the bookmark that closes a streaming list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# How a server without streaming lists answers ``sendInitialEvents``: 422 Invalid when the
# WatchList gate is off (1.27-1.31, 1.33), as do older servers to ``resourceVersionMatch``.
_REFUSES_STREAMING = frozenset({400, 422})
# Longest stretch of event handling between two turns of the loop: lease renewals share it.
_MAX_STEP_SECONDS = 0.01
# A read this big means events already arrive faster than we wake up: no need to wait more.
_BIG_READ = 64 * 1024
# Watches in a row refused by the server (not the network) before giving up on resuming.
_MAX_REFUSED_WATCHES = 3
_EXPECTED = (TimeoutError, aiohttp.ClientError, http.ApiError, OSError)


class Sink(Protocol):
    """Where an informer delivers objects (a cache in the ``cache`` layer)."""

    def begin_relist(self) -> None: ...
    def relist_item(self, obj: dict[str, Any]) -> None: ...
    def end_relist(self) -> None: ...
    def apply(self, event_type: str, obj: dict[str, Any]) -> None: ...


class Gone(Exception):
    """The resourceVersion we watch from has been compacted away: re-list."""


class EventFailed(Exception):
    """Decoding or delivering one object failed; says which, for the log."""

    def __init__(self, *, event: str, name: str | None, cause: BaseException) -> None:
        self.event = event
        self.name = name
        super().__init__(f"{event} {name or '<undecoded>'}: {cause!r}")


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
    # Seconds to let events pile up in the socket after a small read (streams.gather_more):
    # for collections the operator only reads, whose events come in storms (Node heartbeats,
    # Pods).  Not for what it writes itself: its writer waits for the echo of its own writes.
    batch_window: float = 0.0
    # A collection the operator may be refused at first (the device-plugin ConfigMap before its
    # Role exists): a 403 on the first list counts as an empty listing, so the operator syncs and
    # says why it cannot write; the list is retried until allowed.
    forbidden_is_empty: bool = False
    # Keep metadata.managedFields (dropped otherwise): the device-plugin ConfigMap's say which
    # field manager owns each key, so that keys like ours owned by others are left alone.
    keep_managed_fields: bool = False


@dataclass
class InformerStats:
    events: int = 0
    bookmarks: int = 0
    relists: int = 0
    reconnects: int = 0
    failures: int = 0
    last_activity: float = field(default_factory=time.monotonic)


def _name_of(obj: Any) -> str | None:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return str(name) if name is not None else None


def _transient(exc: http.ApiError) -> bool:
    """429 and 5xx (a restarting apiserver says 503): resume the watch, don't re-list."""
    return exc.status == 429 or exc.status >= 500


def _retry_after(exc: BaseException) -> float | None:
    return exc.retry_after if isinstance(exc, http.ApiError) else None


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
        streaming: bool = True,
    ) -> None:
        self._api = api
        self._target = target
        self._sink = sink
        self._telemetry: Telemetry = telemetry or NoTelemetry()
        self._max_backoff = max_backoff
        self._backoff = Backoff(cap=max_backoff)
        self._streaming = streaming
        self._batch_window = target.batch_window
        self._initial = False  # inside a streaming list's initial events
        self._listed = False  # this round's streaming list has been closed by its bookmark
        self.synced = asyncio.Event()
        self._relist = asyncio.Event()
        self.stats = InformerStats()
        self.resource_version: str | None = None

    @property
    def kind(self) -> str:
        return self._target.kind

    @property
    def list_mode(self) -> str:
        """``streaming`` until the server has refused it, ``paged`` from then on."""
        return "streaming" if self._streaming else "paged"

    def request_relist(self) -> None:
        """Ask for a fresh listing (the sink's idea of what to keep has widened)."""
        self._relist.set()

    async def run(self) -> None:
        while True:
            try:
                await self._list_and_watch()
            except Gone:
                log.info("watch expired (410 Gone): re-listing", kind=self.kind)
            except Exception as exc:  # anything at all: an informer must outlive it
                await self._recover(exc)

    async def _recover(self, exc: Exception) -> None:
        """Log and count a failure, say we are out of sync, and wait before listing again."""
        self.stats.failures += 1
        if self._forbidden_before_sync(exc):
            self._sink.begin_relist()
            self._sink.end_relist()
            self.synced.set()
        else:
            self.synced.clear()
        delay = self._backoff.next(retry_after=_retry_after(exc))
        if isinstance(exc, _EXPECTED):
            reason = "api" if isinstance(exc, http.ApiError) else "connection"
            # The message predates streaming lists (where a list is a watch); dashboards and
            # tests look for it as it is.
            log.warning("list failed; retrying", kind=self.kind, error=str(exc), retry_in=delay)
        else:
            reason = "event" if isinstance(exc, EventFailed) else "unexpected"
            name = exc.name if isinstance(exc, EventFailed) else None
            log.error(
                "informer failed; re-listing",
                kind=self.kind,
                name=name,
                error=repr(exc.__cause__ or exc),
                retry_in=round(delay, 3),
                exc_info=exc,
            )
        self._telemetry.informer_failed(self.kind, reason)
        await asyncio.sleep(delay)

    async def _list_and_watch(self) -> None:
        """List, then watch until the watch is gone or a re-list is requested."""
        self._relist.clear()
        watch = asyncio.create_task(self._list_then_watch(), name=f"watch-{self.kind}")
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

    async def _list_then_watch(self) -> None:
        self._initial = self._listed = False  # a list cut short last time is no concern now
        if not (self._streaming and await self._streaming_list()):
            await self._paged_list()
        await self._watch_until_gone()

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

    # -- listing --------------------------------------------------------------------------------

    async def _streaming_list(self) -> bool:
        """List as a watch's initial events, and go on watching; False if the server can't."""
        try:
            await self._watch_once(initial_events=True)
        except _EXPECTED as exc:
            if not self._listed:
                if isinstance(exc, http.ApiError) and exc.status in _REFUSES_STREAMING:
                    self._fall_back(str(exc))
                    return False
                raise
            if isinstance(exc, http.ApiError) and not _transient(exc):
                raise
            # Listed, then the watch broke: resume it from where it was, as any watch does.
            self.stats.reconnects += 1
            log.warning("watch broke; resuming", kind=self.kind, error=str(exc))
            return True
        if not self._listed:  # the watch ended without the bookmark that closes the list
            self._fall_back("no initial-events-end bookmark")
            return False
        return True

    def _fall_back(self, why: str) -> None:
        self._streaming = False
        log.warning("no streaming lists from this API server: paged lists", kind=self.kind, why=why)

    def _begin_relist(self) -> None:
        self.stats.relists += 1
        self._sink.begin_relist()

    def _end_relist(self, resource_version: str) -> None:
        self._sink.end_relist()
        self.resource_version = resource_version
        self.synced.set()

    async def _paged_list(self) -> None:
        """A paged (consistent) list that replaces the sink's contents."""
        self._begin_relist()
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
                self._deliver("LISTED", item)
            self.stats.last_activity = time.monotonic()
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                self._end_relist(str(metadata.get("resourceVersion", "")))
                return

    # -- watching -------------------------------------------------------------------------------

    async def _watch_until_gone(self) -> None:
        backoff = Backoff(cap=self._max_backoff)
        refused = 0  # watches in a row that the server answered with an error
        while True:
            events = self.stats.events + self.stats.bookmarks
            try:
                await self._watch_once(initial_events=False)
            except _EXPECTED as exc:
                if isinstance(exc, http.ApiError) and not _transient(exc):
                    raise  # e.g. 403: let run() back off and list again
                progressed = self.stats.events + self.stats.bookmarks > events
                refused = 0 if progressed else refused + isinstance(exc, http.ApiError)
                if refused >= _MAX_REFUSED_WATCHES:
                    # A server that keeps failing one resume (a 500 about compacted history
                    # has been seen) will not stop: a fresh list will do what resuming can't.
                    raise
                self.stats.reconnects += 1
                delay = backoff.next(retry_after=_retry_after(exc))
                log.warning("watch broke; resuming", kind=self.kind, error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)

    def _watch_query(self, *, initial_events: bool) -> list[tuple[str, str]]:
        timeout = str(self._target.watch_timeout)
        if initial_events:
            # No resourceVersion: a consistent start (never older than anything we have seen),
            # served from the watch cache once that has caught up with etcd.
            return self._query(
                watch="1",
                sendInitialEvents="true",
                resourceVersionMatch="NotOlderThan",
                allowWatchBookmarks="true",
                timeoutSeconds=timeout,
            )
        return self._query(
            watch="1",
            allowWatchBookmarks="true",
            resourceVersion=self.resource_version or "",
            timeoutSeconds=timeout,
        )

    async def _watch_once(self, *, initial_events: bool) -> None:
        response = await http.open_request(
            self._api,
            method="GET",
            path=self._target.path,
            query=self._watch_query(initial_events=initial_events),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self._target.watch_timeout + 30),
        )
        async with response:
            if response.status == 410:
                raise Gone()
            if response.status != 200:
                raise http.error_from(response, http.decode(await response.read()))
            self.stats.last_activity = time.monotonic()  # connected: alive, if quiet
            if initial_events:
                self._begin_relist()
                self._initial = True
            await self._consume(response)

    async def _consume(self, response: aiohttp.ClientResponse) -> None:
        splitter = LineSplitter()
        step_started = time.perf_counter()
        async for chunk in response.content.iter_any():
            for line in splitter.feed(chunk):
                self._handle_line(line)
            if time.perf_counter() - step_started > _MAX_STEP_SECONDS:
                await asyncio.sleep(0)  # a long stretch of buffered events: let others run
            elif len(chunk) < _BIG_READ and not self._initial and self._batch_window > 0:
                await streams.gather_more(response, window=self._batch_window)
            step_started = time.perf_counter()

    def _handle_line(self, line: bytes) -> None:
        try:
            event = orjson.loads(line)
            kind = str(event.get("type"))
            obj = event.get("object") or {}
            metadata = obj.get("metadata") or {}
        except Exception as exc:
            raise EventFailed(event="undecodable", name=None, cause=exc) from exc
        self.stats.last_activity = time.monotonic()
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise http.ApiError(status=int(obj.get("code") or 500), reason="watch", body=obj)
        version = metadata.get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            if self._initial and (metadata.get("annotations") or {}).get(INITIAL_EVENTS_END):
                self._initial, self._listed = False, True
                self._end_relist(str(version or ""))
            return
        if self._initial:
            self._deliver("LISTED", obj)
            return
        self.stats.events += 1
        started = time.perf_counter()
        self._deliver(kind, obj)
        self._telemetry.event_ingested(self.kind, time.perf_counter() - started)

    def _deliver(self, kind: str, obj: dict[str, Any]) -> None:
        """Hand one object to the sink; a failure names the object."""
        if not self._target.keep_managed_fields:
            obj = drop_managed_fields(obj)
        try:
            if kind == "LISTED":
                self._sink.relist_item(obj)
            else:
                self._sink.apply(kind, obj)
        except Exception as exc:
            raise EventFailed(event=kind, name=_name_of(obj), cause=exc) from exc

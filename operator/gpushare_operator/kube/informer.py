"""Informers: one collection kept in step with one sink, forever, on the one read path.

Deliberately not kopf's per-object pipeline (which deep-copies and diffs every event body) and
not the generated API models (which build a second copy of every object): kube/reading.py
decodes each line once with orjson, drops ``metadata.managedFields``, and the sink projects what
it keeps.  What this module adds is what an informer needs and a one-shot read must not have:
a list followed by a watch resumed from its last version, 410 Gone answered with a re-list
(replace semantics), and recovery from anything at all.

An informer never dies: whatever goes wrong (the API, the network, a body the sink chokes on)
is logged with the object it concerns, counted, and followed by a re-list after a jittered
back-off; ``synced`` is cleared meanwhile, which is what readiness reports.
"""

from __future__ import annotations

import asyncio

import aiohttp
import structlog
from kubernetes_asyncio import client

from gpushare_operator.kube import http
from gpushare_operator.kube.backoff import Backoff
from gpushare_operator.kube.reading import (
    Collection,
    EventFailed,
    Gone,
    InformerStats,
    Reader,
    Sink,
)
from gpushare_operator.kube.telemetry import NoTelemetry, Telemetry

__all__ = ["Informer"]

log = structlog.get_logger(__name__)

# Watches in a row refused by the server (not the network) before giving up on resuming.
_MAX_REFUSED_WATCHES = 3
_EXPECTED = (TimeoutError, aiohttp.ClientError, http.ApiError, OSError)


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
        collection: Collection,
        sink: Sink,
        telemetry: Telemetry | None = None,
        max_backoff: float = 30.0,
        streaming: bool = True,
    ) -> None:
        self._collection = collection
        self._sink = sink
        self._telemetry: Telemetry = telemetry or NoTelemetry()
        self._max_backoff = max_backoff
        self._backoff = Backoff(cap=max_backoff)
        self.synced = asyncio.Event()
        self._relist = asyncio.Event()
        self._reader = Reader(
            api=api,
            collection=collection,
            sink=sink,
            telemetry=self._telemetry,
            streaming=streaming,
            on_listed=self.synced.set,
        )
        self.stats: InformerStats = self._reader.stats

    @property
    def kind(self) -> str:
        return self._collection.kind

    @property
    def list_mode(self) -> str:
        """``streaming`` until the server has refused it, ``paged`` from then on."""
        return "streaming" if self._reader.streaming else "paged"

    @property
    def resource_version(self) -> str | None:
        """Where the watch resumes from."""
        return self._reader.resource_version

    @resource_version.setter
    def resource_version(self, version: str | None) -> None:
        self._reader.resource_version = version

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

    def _forbidden_before_sync(self, exc: Exception) -> bool:
        return (
            self._collection.forbidden_is_empty
            and not self.synced.is_set()
            and isinstance(exc, http.ApiError)
            # 404: a cluster that does not serve the API at all (resource.k8s.io/v1 before 1.34)
            and exc.status in (403, 404)
        )

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
        streaming = self._reader.streaming
        try:
            await self._reader.relist(then_watch=True)
        except _EXPECTED as exc:
            if not self._reader.listed or (isinstance(exc, http.ApiError) and not _transient(exc)):
                raise
            # Streamed, then the watch broke: resume it from where it was, as any watch does.
            self.stats.reconnects += 1
            log.warning("watch broke; resuming", kind=self.kind, error=str(exc))
        finally:
            if streaming and not self._reader.streaming:
                why = self._reader.fallback_reason
                log.warning(
                    "no streaming lists from this API server: paged lists", kind=self.kind, why=why
                )
        await self._watch_until_gone()

    async def _watch_until_gone(self) -> None:
        backoff = Backoff(cap=self._max_backoff)
        refused = 0  # watches in a row that the server answered with an error
        while True:
            events = self.stats.events + self.stats.bookmarks
            try:
                await self._reader.watch()
            except _EXPECTED as exc:
                if isinstance(exc, http.ApiError) and not _transient(exc):
                    raise  # e.g. 403 or 410: let run() list again
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

"""The one read path: a collection listed into a sink, and watched.

Everything that reads a collection goes through ``Reader``: the operator's informers (which add
the retries that keep them alive, kube/informer.py), its policy priming and resync, and the
kubectl plugin's one-shot reads (whose failures are the user's to see, so nothing here retries).

A list is a *streaming list* where the server has it (a watch with ``sendInitialEvents=true``,
served from the watch cache object by object and closed by the initial-events-end bookmark),
and a paged list otherwise; a paged list whose continue token expired (410) starts over.  Either
way the sink is given replace semantics (``begin_relist``, the objects, ``end_relist``), sees no
``managedFields`` unless the collection keeps them, and at most one page (or one object of a
streaming list) of full JSON is alive at a time.  docs/reading.md says why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson
from kubernetes_asyncio import client

from gpushare_operator.kube import http, objectpaths, streams
from gpushare_operator.kube.streams import LineSplitter, drop_managed_fields
from gpushare_operator.kube.telemetry import NoTelemetry, Telemetry

# The client callers above this layer pass around, named without importing kubernetes_asyncio.
Api = client.ApiClient
ApiError = http.ApiError

# The annotation on the bookmark that closes a streaming list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# How a server without streaming lists answers ``sendInitialEvents``: 422 Invalid when the
# WatchList gate is off (1.27-1.31, 1.33), as do older servers to ``resourceVersionMatch``.
_REFUSES_STREAMING = frozenset({400, 422})
# A list that is not watched afterwards also falls back on 403: a user allowed to list but not
# to watch.  (A watched one would only be refused again by its watch.)
_REFUSES_ONE_SHOT = _REFUSES_STREAMING | {403}
# Seconds for one page, and between two reads of a streaming list that ends at its bookmark.
_LIST_TIMEOUT = 120
# Longest stretch of event handling between two turns of the loop: lease renewals share it.
_MAX_STEP_SECONDS = 0.01
# A read this big means events already arrive faster than we wake up: no need to wait more.
_BIG_READ = 64 * 1024
_ADDED = b'{"type":"ADDED"'


class Sink(Protocol):
    """Where a collection's objects go (the ``cache`` layer's sinks): a list replaces what the
    sink holds, from ``begin_relist`` to ``end_relist``; a watch applies events one by one."""

    def begin_relist(self) -> None: ...
    def relist_item(self, obj: dict[str, Any]) -> None: ...
    def end_relist(self) -> None: ...
    def apply(self, event_type: str, obj: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Collection:
    """What to list and watch, and how."""

    path: str  # e.g. /api/v1/nodes
    kind: str  # for logs and metrics
    field_selector: str | None = None
    label_selector: str | None = None
    # A page of 100 fifteen-kilobyte Nodes decodes to a few MiB; pages of 500 made the first
    # list of a 5,000-node cluster the operator's peak memory, for no gain in speed.
    page_size: int = 100
    watch_timeout: int = 290  # server-side; a watch is resumed from its last resourceVersion
    # Seconds to let events pile up in the socket after a small read (streams.gather_more):
    # for collections the operator only reads, whose events come in storms (Node heartbeats,
    # Pods).  Not for what it writes itself: its writer waits for the echo of its own writes.
    batch_window: float = 0.0
    # A collection the operator may be refused at first (the device-plugin ConfigMap before its
    # Role exists): a 403 on the first list counts as an empty listing, so the operator syncs and
    # says why it cannot write; the list is retried until allowed (kube/informer.py).
    forbidden_is_empty: bool = False
    # Keep metadata.managedFields (dropped otherwise): the device-plugin ConfigMap's say which
    # field manager owns each key, so that keys like ours owned by others are left alone.
    keep_managed_fields: bool = False
    # Keep them for the objects this says yes to (Nodes carrying nvidia.com/mig.config: who set
    # that label decides whether gpushare may touch it); the record keeps only the owners.
    keep_managed_fields_of: Callable[[dict[str, Any]], bool] | None = None
    # A test on a listed object's raw JSON: False means the sink would keep nothing of it, so it
    # is not even decoded (most pods ask for no GPU: their bytes never mention a GPU resource).
    # Streaming lists here (a page is one JSON document); the plugin's paged pod list cuts its
    # pages into objects first (kubectl/cluster.py, read_pages_into).
    worth_decoding: Callable[[bytes], bool] | None = None

    def query(self, **extra: str) -> list[tuple[str, str]]:
        """A request's query: ``extra``, then the selectors."""
        query = list(extra.items())
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        return query

    def delivered(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The object as a sink is handed it: without managedFields, unless kept."""
        keep = self.keep_managed_fields_of
        if self.keep_managed_fields or (keep is not None and keep(obj)):
            return obj
        return drop_managed_fields(obj)


class Gone(http.ApiError):
    """410: the resourceVersion we watch from has been compacted away; list again."""

    def __init__(self, body: Any = None) -> None:
        super().__init__(status=410, reason="Gone", body=body)


class EventFailed(Exception):
    """Decoding or delivering one object failed; says which, for the log."""

    def __init__(self, *, event: str, name: str | None, cause: BaseException) -> None:
        self.event = event
        self.name = name
        super().__init__(f"{event} {name or '<undecoded>'}: {cause!r}")


@dataclass
class InformerStats:
    events: int = 0
    bookmarks: int = 0
    relists: int = 0
    reconnects: int = 0
    failures: int = 0
    last_activity: float = field(default_factory=time.monotonic)


def _name_of(obj: Any) -> str | None:
    """For the log of a failure: defensive, the object may be anything at all."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return str(name) if name is not None else None


class Reader:
    """Lists and watches one collection into one sink; remembers where the watch is.

    Nothing is retried but what the server itself says to do otherwise (no streaming lists:
    paged ones from then on; an expired continue token: the paged list starts over).  Any
    other error is the caller's: an informer backs off and lists again, the plugin exits.
    """

    def __init__(
        self,
        *,
        api: client.ApiClient,
        collection: Collection,
        sink: Sink,
        telemetry: Telemetry | None = None,
        streaming: bool = True,
        on_listed: Callable[[], None] | None = None,
    ) -> None:
        self._api = api
        self._collection = collection
        self._sink = sink
        self._telemetry: Telemetry = telemetry or NoTelemetry()
        self._on_listed = on_listed
        self.streaming = streaming  # False once the server has refused a streaming list
        self.fallback_reason: str | None = None
        self.listed = False  # the current list has ended (its watch, if any, goes on)
        self._initial = False  # inside a streaming list's initial events
        self.stats = InformerStats()
        self.resource_version: str | None = None

    async def relist(self, *, then_watch: bool = False) -> None:
        """Replace the sink's contents with the collection's.

        With ``then_watch``, a streaming list goes on as the watch on the same connection until
        the server ends it (``listed`` tells a broken watch from a failed list); a paged list
        returns once listed, and the caller watches.
        """
        self._initial = self.listed = False  # a list cut short last time is no concern now
        if not (self.streaming and await self._streaming_list(then_watch=then_watch)):
            await self._paged_list()

    async def watch(self) -> None:
        """One watch from ``resource_version``, until the server ends it (Gone on 410)."""
        await self._watch(initial_events=False)

    # -- listing --------------------------------------------------------------------------------

    async def _streaming_list(self, *, then_watch: bool) -> bool:
        """False if the server will not stream this list; it is then listed in pages."""
        refusals = _REFUSES_STREAMING if then_watch else _REFUSES_ONE_SHOT
        try:
            await self._watch(initial_events=True, until_listed=not then_watch)
        except http.ApiError as exc:
            if self.listed or exc.status not in refusals:
                raise
            self.streaming, self.fallback_reason = False, str(exc)
            return False
        if not self.listed:  # the watch ended without the bookmark that closes the list
            self.streaming, self.fallback_reason = False, "no initial-events-end bookmark"
            return False
        return True

    def _begin_relist(self) -> None:
        self.stats.relists += 1
        self._sink.begin_relist()

    def _end_relist(self, resource_version: str) -> None:
        self._sink.end_relist()
        self.resource_version = resource_version
        self.listed = True
        if self._on_listed is not None:
            self._on_listed()

    async def _paged_list(self) -> None:
        """A paged (consistent) list; an expired continue token starts it over."""
        self._begin_relist()
        token = ""
        while True:
            try:
                token, version = await self._page(token)
            except http.ApiError as exc:
                if exc.status != 410 or not token:
                    raise
                # etcd was compacted past the list's revision: start over (replace semantics
                # again, so what the first pages had and is gone now leaves the sink).
                self._sink.begin_relist()
                token = ""
                continue
            if not token:
                self._end_relist(version)
                return

    async def _page(self, token: str) -> tuple[str, str]:
        """One page into the sink: the next page's token ("" after the last) and the list's
        version.  A function of its own so that the page is freed before the next is asked."""
        query = self._collection.query(limit=str(self._collection.page_size))
        if token:
            query.append(("continue", token))
        page = await http.request(
            self._api, method="GET", path=self._collection.path, query=query, timeout=_LIST_TIMEOUT
        )
        for item in page.get("items") or ():
            self._deliver("LISTED", item)
        self.stats.last_activity = time.monotonic()
        metadata = page.get("metadata") or {}
        return str(metadata.get("continue") or ""), str(metadata.get("resourceVersion", ""))

    # -- watching -------------------------------------------------------------------------------

    def _watch_query(self, *, initial_events: bool) -> list[tuple[str, str]]:
        timeout = str(self._collection.watch_timeout)
        if initial_events:
            # No resourceVersion: a consistent start (never older than anything we have seen),
            # served from the watch cache once that has caught up with etcd.
            return self._collection.query(
                watch="1",
                sendInitialEvents="true",
                resourceVersionMatch="NotOlderThan",
                allowWatchBookmarks="true",
                timeoutSeconds=timeout,
            )
        return self._collection.query(
            watch="1",
            allowWatchBookmarks="true",
            resourceVersion=self.resource_version or "",
            timeoutSeconds=timeout,
        )

    async def _watch(self, *, initial_events: bool, until_listed: bool = False) -> None:
        quiet = _LIST_TIMEOUT if until_listed else self._collection.watch_timeout + 30
        response = await http.open_request(
            self._api,
            method="GET",
            path=self._collection.path,
            query=self._watch_query(initial_events=initial_events),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=quiet),
        )
        async with response:
            if response.status == 410:
                raise Gone(http.decode(await response.read()))
            if response.status != 200:
                raise http.error_from(response, http.decode(await response.read()))
            self.stats.last_activity = time.monotonic()  # connected: alive, if quiet
            if initial_events:
                self._begin_relist()
                self._initial = True
            await self._consume(response, until_listed=until_listed)

    async def _consume(self, response: aiohttp.ClientResponse, *, until_listed: bool) -> None:
        splitter = LineSplitter()
        worth = self._collection.worth_decoding
        window = self._collection.batch_window
        step_started = time.perf_counter()
        async for chunk in response.content.iter_any():
            for line in splitter.feed(chunk):
                if (
                    worth is not None
                    and self._initial
                    and line.startswith(_ADDED)
                    and not worth(line)
                ):
                    continue  # the sink would keep nothing of it: not even decoded
                self._handle_line(line)
                if until_listed and self.listed:
                    return
            if time.perf_counter() - step_started > _MAX_STEP_SECONDS:
                await asyncio.sleep(0)  # a long stretch of buffered events: let others run
            elif len(chunk) < _BIG_READ and not self._initial and window > 0:
                await streams.gather_more(response, window=window)
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
                raise Gone(obj)
            raise http.ApiError(status=int(obj.get("code") or 500), reason="watch", body=obj)
        version = metadata.get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            if self._initial and (metadata.get("annotations") or {}).get(INITIAL_EVENTS_END):
                self._initial = False
                self._end_relist(str(version or ""))
            return
        if self._initial:
            self._deliver("LISTED", obj)
            return
        self.stats.events += 1
        started = time.perf_counter()
        self._deliver(kind, obj)
        self._telemetry.event_ingested(self._collection.kind, time.perf_counter() - started)

    def _deliver(self, kind: str, obj: dict[str, Any]) -> None:
        """Hand one object to the sink; a failure names the object."""
        obj = self._collection.delivered(obj)
        try:
            if kind == "LISTED":
                self._sink.relist_item(obj)
            else:
                self._sink.apply(kind, obj)
        except Exception as exc:
            raise EventFailed(event=kind, name=_name_of(obj), cause=exc) from exc


# -- one-shot reads ------------------------------------------------------------------------------


async def list_into(api: client.ApiClient, collection: Collection, sink: Sink) -> None:
    """Replace ``sink``'s contents with the collection's, once."""
    await Reader(api=api, collection=collection, sink=sink).relist()


class _Objects:
    """A sink that keeps whole objects, by namespace and name (a small collection's)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str]:
        metadata = obj.get("metadata") or {}
        return str(metadata.get("namespace") or ""), str(metadata.get("name"))

    def begin_relist(self) -> None:
        self.objects = {}

    def relist_item(self, obj: dict[str, Any]) -> None:
        self.objects[self._key(obj)] = obj

    def end_relist(self) -> None:
        return None

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self.objects.pop(self._key(obj), None)
        else:
            self.relist_item(obj)


async def list_all(api: client.ApiClient, collection: Collection) -> list[dict[str, Any]]:
    """A small collection (policies, one node's events), whole, in the server's order."""
    objects = _Objects()
    await list_into(api, collection, objects)
    return list(objects.objects.values())


async def get(
    api: client.ApiClient,
    resource: objectpaths.Resource,
    name: str,
    *,
    namespace: str | None = None,
    keep_managed_fields: bool = False,
) -> dict[str, Any] | None:
    """One object, or None when it does not exist (the path: kube/objectpaths.py, name checked)."""
    path = objectpaths.path(resource, name, namespace=namespace)
    try:
        body = await http.request(api, method="GET", path=path)
    except http.ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return dict(body) if keep_managed_fields else drop_managed_fields(dict(body))

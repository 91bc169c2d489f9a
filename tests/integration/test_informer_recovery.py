"""The read path on the real API server: streaming lists from the watch cache, paged lists where
the server has none, the same for the informer and the kubectl plugin, and an informer that
outlives whatever goes wrong (a poisoned object, a 429)."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
import structlog
from kubernetes_asyncio import client

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import NodeSink
from gpushare_operator.kube import connection, http
from gpushare_operator.kube.informer import Informer
from gpushare_operator.kube.reading import Sink
from gpushare_operator.kubectl import cluster
from gpushare_testing import controlplane
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.informers import (
    NODES,
    TAG,
    Nodes,
    RecordingSink,
    expiring_after_first_page,
    running,
)
from gpushare_testing.waiting import eventually

POISON = "gpushare.dev/poison"

# Reads of Nodes are what these tests are about; the shared plane's policy logs writes only.
READ_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "resources": [{"group": "", "resources": ["nodes"]}]},
        {"level": "None"},
    ],
}


@pytest.fixture(scope="module")
def audited_plane() -> Iterator[ControlPlane]:
    """A plane as shipped (watch cache and streaming lists on) that audits every Node read."""
    with controlplane.running(audit_policy=READ_AUDIT_POLICY) as plane:
        yield plane


async def _nodes_on(plane: ControlPlane) -> AsyncIterator[Nodes]:
    handle = await connection.open_handle(kubeconfig=str(plane.admin_kubeconfig))
    async with handle:
        made = Nodes(handle.api)
        try:
            yield made
        finally:
            await made.delete_all()


@pytest.fixture(scope="module")
def legacy_plane() -> Iterator[ControlPlane]:
    """A server as 1.27-1.31 and 1.33 ship: no streaming lists (and Nodes read from etcd)."""
    args = ("--feature-gates=WatchList=false", "--watch-cache-sizes=nodes#0")
    with controlplane.running(audit_policy=READ_AUDIT_POLICY, extra_apiserver_args=args) as plane:
        yield plane


@pytest.fixture
async def audited_nodes(audited_plane: ControlPlane) -> AsyncIterator[Nodes]:
    async for made in _nodes_on(audited_plane):
        yield made


@pytest.fixture
async def legacy_nodes(legacy_plane: ControlPlane) -> AsyncIterator[Nodes]:
    async for made in _nodes_on(legacy_plane):
        yield made


@pytest.fixture
async def nodes(control_plane: ControlPlane) -> AsyncIterator[Nodes]:
    async for made in _nodes_on(control_plane):
        yield made


def _reads_of(plane: ControlPlane, tag: str) -> list[tuple[str, dict[str, str], int]]:
    """(verb, query, status) of every Node list or watch that selected this test's nodes."""
    reads = []
    for event in plane.audit_events():
        uri = urllib.parse.urlsplit(event["requestURI"])
        query = dict(urllib.parse.parse_qsl(uri.query))
        ours = uri.path == NODES and query.get("labelSelector") == f"{TAG}={tag}"
        # A watch is logged when its response starts (and again when it ends): count it once.
        if ours and (event["stage"] == "ResponseStarted" or event["verb"] == "list"):
            status = int((event.get("responseStatus") or {}).get("code") or 0)
            reads.append((event["verb"], query, status))
    return reads


# -- streaming lists ----------------------------------------------------------------------------


async def test_the_first_list_streams_from_the_watch_cache_and_goes_on_watching(
    audited_plane: ControlPlane, audited_nodes: Nodes
) -> None:
    nodes = audited_nodes
    names = sorted([str((await nodes.gpu(f"s{i}"))["metadata"]["name"]) for i in range(3)])
    cache = ClusterCache()
    sink = RecordingSink(NodeSink(cache))
    informer = Informer(api=nodes.api, collection=nodes.collection(), sink=sink)
    async with running(informer):
        assert sorted(cache.nodes) == names
        assert informer.list_mode == "streaming"
        assert informer.resource_version  # the closing bookmark's
        assert sink.relists == [names] or sorted(sink.relists[0]) == names
        assert sink.events == []  # listed objects are not watch events

        # The same connection carries on as the watch.
        relabelled = await nodes.label(names[0], {"gpushare.dev/team": "streamed"})
        await sink.wait_event("MODIFIED", relabelled)
        assert cache.nodes[names[0]].labels["gpushare.dev/team"] == "streamed"

    async def reads() -> list[tuple[str, dict[str, str], int]]:
        return _reads_of(audited_plane, nodes.tag)

    seen = await eventually(reads, what="the informer's reads in the audit log")
    verbs = [verb for verb, _, _ in seen]
    assert verbs == ["watch"], seen  # one request: no LIST, no second watch
    query = seen[0][1]
    # A watch-cache read: initial events, consistent (no resourceVersion) yet not from etcd.
    assert query["sendInitialEvents"] == "true"
    assert query["resourceVersionMatch"] == "NotOlderThan"
    assert query["allowWatchBookmarks"] == "true"
    assert "resourceVersion" not in query
    assert informer.stats.relists == 1
    assert informer.stats.reconnects == 0


async def test_a_server_without_streaming_lists_gets_paged_lists(
    legacy_plane: ControlPlane, legacy_nodes: Nodes
) -> None:
    nodes = legacy_nodes
    names = sorted([str((await nodes.gpu(f"l{i}"))["metadata"]["name"]) for i in range(3)])
    cache = ClusterCache()
    informer = Informer(
        api=nodes.api, collection=nodes.collection(page_size=2), sink=NodeSink(cache)
    )
    async with running(informer):
        assert sorted(cache.nodes) == names
        assert informer.list_mode == "paged"
        live = await nodes.label(names[0], {"gpushare.dev/team": "paged"})

        async def seen() -> bool:
            record = cache.nodes[names[0]]
            return record.resource_version == str(live["metadata"]["resourceVersion"])

        await eventually(seen, what="the watch after the paged list")

    async def reads() -> list[tuple[str, dict[str, str], int]]:
        found = _reads_of(legacy_plane, nodes.tag)
        return found if len(found) >= 4 else []

    found = await eventually(reads, what="the informer's reads in the audit log")
    refused, *pages, watch = found[:4]
    assert (refused[0], refused[1]["sendInitialEvents"], refused[2]) == ("watch", "true", 422)
    assert [(verb, query["limit"], status) for verb, query, status in pages] == [
        ("list", "2", 200),
        ("list", "2", 200),
    ]
    assert "continue" in pages[1][1]
    assert watch[0] == "watch" and "sendInitialEvents" not in watch[1]
    assert watch[1]["resourceVersion"]  # from where the list ended


async def test_a_watch_the_server_keeps_refusing_ends_in_a_relist(
    legacy_plane: ControlPlane, legacy_nodes: Nodes
) -> None:
    """Seen on this server: resuming a watch across compacted history answers 500, forever;
    or, when the API server's etcd client has already heard of the compaction as the watch
    starts, 410 at once.  Either way the informer ends the watch and lists afresh."""
    nodes = legacy_nodes
    victim, kept = [str((await nodes.gpu(r))["metadata"]["name"]) for r in ("v", "k")]
    cache = ClusterCache()
    first = Informer(api=nodes.api, collection=nodes.collection(), sink=NodeSink(cache))
    async with running(first):
        assert sorted(cache.nodes) == sorted([victim, kept])
    await nodes.delete(victim)
    await asyncio.to_thread(legacy_plane.compact_etcd)

    # Resuming from where the first one stopped: refused again and again, then given up on ...
    second = Informer(
        api=nodes.api, collection=nodes.collection(), sink=NodeSink(cache), max_backoff=0.2
    )
    second.resource_version = first.resource_version
    with pytest.raises(http.ApiError) as refused:
        await asyncio.wait_for(second._watch_until_gone(), timeout=30)
    status = refused.value.status
    assert status in (500, 410), refused.value
    if status == 500:
        assert second.stats.reconnects == 2  # resumed twice, and the third refusal ends it
    else:
        assert second.stats.reconnects == 0  # Gone: never resumed, there is nothing to resume
    # ... so that run() lists afresh, and the deletion reaches the cache.
    async with running(second):
        assert sorted(cache.nodes) == [kept]


# -- one read path: the informer and the kubectl plugin -----------------------------------------


async def _plugin_reads_nodes(plane: ControlPlane, cache: ClusterCache) -> None:
    """What ``kubectl gpushare plan`` does to read the nodes, on this test's nodes only."""
    plugin_cluster = cluster.ClusterRef(kubeconfig=str(plane.admin_kubeconfig))
    async with cluster.connected(plugin_cluster) as api:
        await cluster.load_fleet(api, cache, pods=False, node_states=False)


@pytest.mark.parametrize("reader", ["informer", "plugin"])
async def test_an_expired_continue_token_restarts_the_paged_list_of_informer_and_plugin_alike(
    reader: str, legacy_plane: ControlPlane, legacy_nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the first and the second page, a node of the first page is deleted, another
    changed and etcd compacted: the continue token has expired (410).  Both readers start the
    list over, and the replace semantics leave the deleted node out."""
    nodes = legacy_nodes
    names = sorted([str((await nodes.gpu(f"c{i}"))["metadata"]["name"]) for i in range(5)])
    victim, bumped = names[0], names[-1]  # the API server lists in name order
    real_request = http.request
    calls: list[tuple[dict[str, str], int]] = []  # (query, HTTP status) of each page asked

    compacted_after_first_page = expiring_after_first_page(
        real_request,
        nodes,
        victim=victim,
        bumped=bumped,
        compact=lambda: asyncio.to_thread(legacy_plane.compact_etcd),
        calls=calls,
    )
    monkeypatch.setattr(http, "request", compacted_after_first_page)
    collection = nodes.collection(page_size=2)
    cache = ClusterCache()
    if reader == "informer":
        informer = Informer(api=nodes.api, collection=collection, sink=NodeSink(cache))
        async with running(informer):
            assert informer.list_mode == "paged"
    else:
        monkeypatch.setattr(cluster, "NODE_LIST", collection)
        await _plugin_reads_nodes(legacy_plane, cache)

    assert sorted(cache.nodes) == names[1:]
    assert cache.nodes[bumped].labels["gpushare.dev/team"] == "bump"
    assert [status for _, status in calls[:3]] == [200, 410, 200]
    assert "continue" in calls[1][0]  # the expired token
    assert "continue" not in calls[2][0]  # the list started over

    async def reads() -> list[tuple[str, dict[str, str], int]]:
        found = _reads_of(legacy_plane, nodes.tag)
        return found if len(found) >= 3 else []

    refused, first_page, expired = (await eventually(reads, what="the reads in the audit log"))[:3]
    # Streaming first, refused by this server, then the same paged list.
    assert (refused[0], refused[1]["sendInitialEvents"], refused[2]) == ("watch", "true", 422)
    assert [(verb, status) for verb, _, status in (first_page, expired)] == [
        ("list", 200),
        ("list", 410),
    ]


async def test_the_plugin_lists_with_the_informers_request_and_stops_at_the_list_end(
    audited_plane: ControlPlane, audited_nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One streaming list each, asked in the same words; the informer's goes on as its watch,
    the plugin's ends at the bookmark that closes the list (the plugin returns at once)."""
    nodes = audited_nodes
    names = sorted([str((await nodes.gpu(f"p{i}"))["metadata"]["name"]) for i in range(3)])
    informed, read = ClusterCache(), ClusterCache()
    informer = Informer(api=nodes.api, collection=nodes.collection(), sink=NodeSink(informed))
    async with running(informer):
        monkeypatch.setattr(cluster, "NODE_LIST", nodes.collection())
        started = time.monotonic()
        await _plugin_reads_nodes(audited_plane, read)
        took = time.monotonic() - started
    assert sorted(read.nodes) == sorted(informed.nodes) == names
    assert took < 10, took  # not held open until the server's watch timeout

    async def reads() -> list[tuple[str, dict[str, str], int]]:
        found = _reads_of(audited_plane, nodes.tag)
        return found if len(found) >= 2 else []

    found = await eventually(reads, what="both reads in the audit log")
    assert [(verb, status) for verb, _, status in found] == [("watch", 200), ("watch", 200)]
    informers_query, plugins_query = found[0][1], found[1][1]
    assert plugins_query == informers_query
    assert plugins_query["sendInitialEvents"] == "true"
    assert "resourceVersion" not in plugins_query


# -- recovery -----------------------------------------------------------------------------------


class PoisonedSink:
    """A real sink that raises on any node labelled POISON, as a bug in a sink would."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner

    @staticmethod
    def _check(obj: dict[str, Any]) -> None:
        if POISON in (obj.get("metadata") or {}).get("labels", {}):
            raise KeyError(f"cannot digest {obj['metadata']['name']}")

    def begin_relist(self) -> None:
        self.inner.begin_relist()

    def relist_item(self, obj: dict[str, Any]) -> None:
        self._check(obj)
        self.inner.relist_item(obj)

    def end_relist(self) -> None:
        self.inner.end_relist()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._check(obj)
        self.inner.apply(event_type, obj)


class CountingTelemetry:
    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []

    def event_ingested(self, kind: str, seconds: float) -> None:
        return None

    def informer_failed(self, kind: str, reason: str) -> None:
        self.failures.append((kind, reason))

    def reconciled(self, kind: str, seconds: float) -> None:
        return None

    def wrote(self, kind: str, outcome: str, seconds: float) -> None:
        return None

    def evicted(self, result: str, count: int) -> None:
        return None


async def test_a_poisoned_object_neither_kills_the_informer_nor_leaves_the_cache_behind(
    nodes: Nodes,
) -> None:
    victim, bystander = [str((await nodes.gpu(r))["metadata"]["name"]) for r in ("v", "b")]
    cache, telemetry = ClusterCache(), CountingTelemetry()
    informer = Informer(
        api=nodes.api,
        collection=nodes.collection(),
        sink=PoisonedSink(NodeSink(cache)),
        telemetry=telemetry,
        max_backoff=0.5,
    )
    with structlog.testing.capture_logs() as logs:
        async with running(informer) as task:
            await nodes.label(victim, {POISON: "x"})

            async def failing_again() -> bool:
                # The event failed, and so does every re-list while the object stays poisoned.
                return informer.stats.failures >= 3 and not informer.synced.is_set()

            await eventually(failing_again, what="re-lists failing on the poisoned node")
            assert not task.done()
            await nodes.label(bystander, {"gpushare.dev/team": "meanwhile"})
            fixed = await nodes.label(victim, {POISON: None, "gpushare.dev/team": "fixed"})

            async def converged() -> bool:
                record = cache.nodes.get(victim)
                return (
                    informer.synced.is_set()
                    and record is not None
                    and record.resource_version == str(fixed["metadata"]["resourceVersion"])
                    and cache.nodes[bystander].labels.get("gpushare.dev/team") == "meanwhile"
                )

            await eventually(converged, what="the cache to catch up once the node is fixed")
            assert not task.done()

    assert cache.nodes[victim].labels["gpushare.dev/team"] == "fixed"
    assert POISON not in cache.nodes[victim].labels
    assert set(telemetry.failures) == {("Node", "event")}
    failed = [e for e in logs if e["event"] == "informer failed; re-listing"]
    assert len(failed) == len(telemetry.failures)
    assert {(e["kind"], e["name"]) for e in failed} == {("Node", victim)}
    assert all("cannot digest" in e["error"] for e in failed)
    delays = [e["retry_in"] for e in failed]
    assert all(0 < d <= 0.5 for d in delays)
    assert len(set(delays)) > 1  # jittered


async def test_a_429_is_waited_out_as_long_as_retry_after_says(
    nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one test double of the read path: a real 429 cannot be had on demand."""
    name = str((await nodes.gpu("t"))["metadata"]["name"])
    real_request = http.request
    calls: list[float] = []

    async def throttled_once(
        api: client.ApiClient,
        *,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        **kw: Any,
    ) -> Any:
        if method == "GET" and path == NODES:
            calls.append(time.monotonic())
            if len(calls) == 1:
                body = {"kind": "Status", "code": 429, "reason": "TooManyRequests"}
                raise http.ApiError(
                    status=429, reason="Too Many Requests", body=body, retry_after=2
                )
        return await real_request(api, method=method, path=path, query=query, **kw)

    monkeypatch.setattr(http, "request", throttled_once)
    cache = ClusterCache()
    informer = Informer(
        api=nodes.api, collection=nodes.collection(), sink=NodeSink(cache), streaming=False
    )
    started = time.monotonic()
    async with running(informer):
        assert name in cache.nodes
    assert len(calls) == 2
    waited = calls[1] - calls[0]
    # The informer's own back-off would have been 0.2-0.3 s; the server asked for 2 s.
    assert 2.0 <= waited < 3.0, waited
    assert time.monotonic() - started >= 2.0
    assert informer.stats.failures == 1


async def test_a_streaming_list_yields_to_the_loop(nodes: Nodes) -> None:
    """Nothing else may starve while an informer lists: leader-lease renewals share the loop."""
    for i in range(40):
        await nodes.gpu(f"y{i:02d}")
    cache = ClusterCache()
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker(), name="ticker")
    try:
        informer = Informer(api=nodes.api, collection=nodes.collection(), sink=NodeSink(cache))
        async with running(informer):
            assert len(cache.nodes) == 40
    finally:
        ticking.cancel()
        await asyncio.gather(ticking, return_exceptions=True)
    assert len(gaps) > 5
    assert max(gaps) < 0.25, max(gaps)  # generous: two shared cores; unbounded would be ~1 s

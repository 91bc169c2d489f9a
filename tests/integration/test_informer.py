"""The Node informer against the real API server: streaming and paged lists, watches, 410 Gone,
recovery from failures, slim records."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gc
import json
import tracemalloc
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import orjson
import pytest
from kubernetes_asyncio import client

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import NodeSink
from gpushare_operator.core.records.nodes import GPU_PRESENT, NodeRecord, project_node
from gpushare_operator.kube import connection, http
from gpushare_operator.kube.informer import Informer
from gpushare_operator.kube.reading import Gone
from gpushare_operator.kube.streams import LineSplitter
from gpushare_testing import bodies, controlplane, writepath
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.informers import (
    NODES,
    Nodes,
    RecordingSink,
    expiring_after_first_page,
    running,
)
from gpushare_testing.waiting import eventually

RECORD_FIELDS = {
    "name",
    "uid",
    "resource_version",
    "labels",
    "gpu_capacity",
    "shared_capacity",
    "allocatable",  # the nvidia.com/* allocatable pairs: Verified checks them
    "taints",  # spec.taints, usually none: the cordon taint is patched against this list
    # Who besides us set nvidia.com/mig.config (from managedFields, only while it is there).
    "mig_config_owners",
}
MAX_RECORD_BYTES = 2048


# -- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """The client the operator itself would open (``open_handle``), as admin."""
    handle = await connection.open_handle(kubeconfig=str(control_plane.admin_kubeconfig))
    async with handle:
        yield handle.api


@pytest.fixture
async def nodes(api: client.ApiClient) -> AsyncIterator[Nodes]:
    made = Nodes(api)
    try:
        yield made
    finally:
        await made.delete_all()


def _name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def _version_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion"))


def drain(cache: ClusterCache) -> None:
    writepath.drain(cache.queue)
    assert len(cache.queue) == 0


# -- paged list (the fallback) -------------------------------------------------------------------


async def test_a_paged_list_syncs_every_node(
    api: client.ApiClient, nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [_name_of(await nodes.gpu(f"page{i}")) for i in range(5)]
    pages: list[tuple[dict[str, str], int, str]] = []  # (query, items, continue of the answer)
    real_request = http.request

    async def recording_request(
        api: client.ApiClient,
        *,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        **kw: Any,
    ) -> Any:
        answer = await real_request(api, method=method, path=path, query=query, **kw)
        if method == "GET" and path == NODES:
            token = str((answer.get("metadata") or {}).get("continue") or "")
            pages.append((dict(query), len(answer.get("items") or ()), token))
        return answer

    monkeypatch.setattr(http, "request", recording_request)
    cache = ClusterCache()
    informer = Informer(
        api=api, collection=nodes.collection(page_size=2), sink=NodeSink(cache), streaming=False
    )
    async with running(informer):
        assert sorted(cache.nodes) == sorted(names)

    assert len(pages) >= 3, pages
    assert all(query["limit"] == "2" for query, _, _ in pages)
    assert all(items <= 2 for _, items, _ in pages)
    assert sum(items for _, items, _ in pages) == 5
    assert "continue" not in pages[0][0]
    for (query, _, _), (_, _, previous_token) in zip(pages[1:], pages, strict=False):
        assert previous_token
        assert query["continue"] == previous_token  # each page resumed where the last one ended
    assert pages[-1][2] == ""
    assert informer.stats.relists == 1
    assert informer.resource_version  # the list's version, where the watch starts


# -- watch --------------------------------------------------------------------------------------


async def test_watch_follows_labels_deletions_and_ignores_cpu_nodes_and_heartbeats(
    api: client.ApiClient, nodes: Nodes
) -> None:
    first, second = _name_of(await nodes.gpu("w1")), _name_of(await nodes.gpu("w2"))
    listed_cpu = _name_of(await nodes.plain("cpu1"))
    cache = ClusterCache()
    sink = RecordingSink(NodeSink(cache))
    informer = Informer(api=api, collection=nodes.collection(), sink=sink)
    async with running(informer):
        assert sorted(cache.nodes) == sorted([first, second])
        assert listed_cpu in sink.relists[0]  # listed, and dropped by the cache
        assert listed_cpu not in cache.nodes

        # A label change reaches the record, and dirties the node.
        drain(cache)
        relabelled = await nodes.label(first, {"gpushare.dev/team": "vision"})
        await sink.wait_event("MODIFIED", relabelled)
        assert cache.nodes[first].labels["gpushare.dev/team"] == "vision"
        assert cache.nodes[first].resource_version == _version_of(relabelled)
        assert first in cache.queue.nodes

        # A CPU node created after the sync is seen, and never kept.
        drain(cache)
        cpu = await nodes.plain("cpu2")
        await sink.wait_event("ADDED", cpu)
        assert _name_of(cpu) not in cache.nodes
        assert len(cache.queue) == 0

        # A heartbeat (status-only) keeps the very same record and dirties nothing.
        record = cache.nodes[second]
        beaten = await nodes.heartbeat(second)
        assert _version_of(beaten) != record.resource_version
        await sink.wait_event("MODIFIED", beaten)
        assert cache.nodes[second] is record
        assert len(cache.queue) == 0

        # A CPU node that gains a GPU label is a GPU node from then on.
        gained = await nodes.label(_name_of(cpu), {GPU_PRESENT: "true"})
        await sink.wait_event("MODIFIED", gained)
        assert cache.nodes[_name_of(cpu)].is_gpu_node

        # A deletion removes the record.
        await nodes.delete(first)

        async def first_gone() -> bool:
            return first not in cache.nodes

        await eventually(first_gone, timeout=30, what=f"{first} to leave the cache")
        assert ("DELETED", first) in [(kind, name) for kind, name, _ in sink.events]

    assert sorted(cache.nodes) == sorted([second, _name_of(cpu)])
    assert listed_cpu not in cache.nodes
    assert informer.stats.relists == 1  # the watch never had to start over
    assert informer.stats.events >= 5


# -- 410 Gone -----------------------------------------------------------------------------------
#
# The shared control plane cannot produce a 410 on demand: its watch cache was filled from etcd
# revision ~1 and, in a quiet test cluster, never evicts, so a watch from any old version
# (even "1") is answered with a replay of the whole history.  In a real cluster the window is
# short (evicted after ~75 s) and etcd is compacted every 5 minutes.  So these tests get a plane
# of their own that serves Nodes straight from etcd (``--watch-cache-sizes=nodes#0``) and compact
# etcd when the test says so, as kube-apiserver's compactor would: what the informer then meets is
# the API server's own 410 ("too old resource version" / expired continue token).
#
# The tests that cut in between a list's pages, or between the list and the watch, use the paged
# list (the fallback for servers without streaming lists): a streaming list has no such seams,
# being one request that goes on as the watch.


@pytest.fixture(scope="module")
def uncached_plane() -> Iterator[ControlPlane]:
    with controlplane.running(extra_apiserver_args=("--watch-cache-sizes=nodes#0",)) as plane:
        yield plane


@pytest.fixture
async def uncached_nodes(uncached_plane: ControlPlane) -> AsyncIterator[Nodes]:
    handle = await connection.open_handle(kubeconfig=str(uncached_plane.admin_kubeconfig))
    async with handle:
        made = Nodes(handle.api)
        try:
            yield made
        finally:
            await made.delete_all()


def _etcd(plane: ControlPlane, call: str, body: Mapping[str, Any]) -> dict[str, Any]:
    url = f"http://127.0.0.1:{plane.etcd_port}/v3/kv/{call}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def _compact_now(plane: ControlPlane) -> int:
    head = int(
        _etcd(plane, "range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"]
    )
    _etcd(plane, "compaction", {"revision": str(head), "physical": True})
    return head


async def compact_etcd(plane: ControlPlane) -> int:
    """Drop all history before etcd's current revision; return that revision."""
    return await asyncio.to_thread(_compact_now, plane)


async def test_a_stale_watch_is_gone_and_the_relist_replaces_the_cache(
    uncached_plane: ControlPlane, uncached_nodes: Nodes
) -> None:
    nodes, api = uncached_nodes, uncached_nodes.api
    names = [_name_of(await nodes.gpu(f"g{i}")) for i in range(3)]
    victim, relabelled, untouched = names
    cache = ClusterCache()
    sink = NodeSink(cache)

    first = Informer(api=api, collection=nodes.collection(), sink=sink)
    async with running(first):
        assert sorted(cache.nodes) == sorted(names)
    stopped_at = first.resource_version
    assert stopped_at
    untouched_record = cache.nodes[untouched]

    # While no informer runs, a node goes away and another changes; then etcd is compacted.
    await nodes.delete(victim)
    changed = await nodes.label(relabelled, {"gpushare.dev/team": "while-down"})
    assert await compact_etcd(uncached_plane) > int(stopped_at) + 1

    # Resuming from where the first informer stopped is answered with 410 Gone ...
    second = Informer(api=api, collection=nodes.collection(), sink=sink)
    second.resource_version = stopped_at
    with pytest.raises(Gone):
        await asyncio.wait_for(second._watch_until_gone(), timeout=30)
    assert second.stats.events == 0
    assert victim in cache.nodes  # nothing was delivered

    # ... and run() re-lists with replace semantics.  (run() always lists first, so it cannot
    # be told to resume from a given version; the resume was driven directly above.)
    drain(cache)
    async with running(second):
        assert sorted(cache.nodes) == sorted([relabelled, untouched])  # replaced, not merged
    assert cache.nodes[relabelled].labels["gpushare.dev/team"] == "while-down"
    assert cache.nodes[relabelled].resource_version == _version_of(changed)
    assert cache.nodes[untouched] is untouched_record  # unchanged: same record, no work
    # The changed node, and the deleted one (planned once more, so the planner forgets it).
    assert sorted(cache.queue.nodes) == sorted([victim, relabelled])
    assert second.stats.relists == 1


async def test_run_relists_after_gone_and_keeps_watching(
    uncached_plane: ControlPlane, uncached_nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run() itself: the list's version is compacted before the watch starts → 410 → re-list.

    Right after the first list is served (and before the informer can watch), a node is deleted,
    another relabelled and etcd compacted: only the re-list can tell the cache.
    """
    nodes, api = uncached_nodes, uncached_nodes.api
    names = [_name_of(await nodes.gpu(f"r{i}")) for i in range(3)]
    victim, relabelled, _ = names
    real_request = http.request
    lists_done = 0

    async def compacted_after_first_list(
        api: client.ApiClient,
        *,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        **kw: Any,
    ) -> Any:
        nonlocal lists_done
        answer = await real_request(api, method=method, path=path, query=query, **kw)
        if method != "GET" or path != NODES or answer["metadata"].get("continue"):
            return answer
        lists_done += 1  # the last page of a list
        if lists_done == 1:
            await nodes.delete(victim)
            await nodes.label(relabelled, {"gpushare.dev/team": "missed"})
            await compact_etcd(uncached_plane)
        return answer

    monkeypatch.setattr(http, "request", compacted_after_first_list)
    cache = ClusterCache()
    sink = RecordingSink(NodeSink(cache))
    informer = Informer(api=api, collection=nodes.collection(), sink=sink, streaming=False)
    async with running(informer):

        async def relisted() -> bool:
            return informer.stats.relists >= 2 and victim not in cache.nodes

        await eventually(relisted, timeout=30, what=f"a re-list without {victim}")
        assert victim in sink.relists[0]
        assert victim not in sink.relists[1]
        assert sorted(cache.nodes) == sorted(names[1:])
        assert cache.nodes[relabelled].labels["gpushare.dev/team"] == "missed"

        # And the watch after the re-list is live.
        live = await nodes.label(relabelled, {"gpushare.dev/team": "after-gone"})
        await sink.wait_event("MODIFIED", live)
        assert cache.nodes[relabelled].labels["gpushare.dev/team"] == "after-gone"

    assert informer.stats.relists == 2
    assert lists_done == 2
    assert not [name for _, name, _ in sink.events if name == victim]  # only the re-list told


async def test_an_expired_continue_token_restarts_the_list_from_scratch(
    uncached_plane: ControlPlane, uncached_nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes, api = uncached_nodes, uncached_nodes.api
    names = sorted([_name_of(await nodes.gpu(f"c{i}")) for i in range(5)])
    victim = names[0]  # on the first page: the API server lists in name order
    real_request = http.request
    calls: list[tuple[dict[str, str], int]] = []  # (query, HTTP status)

    compacted_after_first_page = expiring_after_first_page(
        real_request,
        nodes,
        victim=victim,
        bumped=names[-1],
        compact=lambda: compact_etcd(uncached_plane),
        calls=calls,
    )
    monkeypatch.setattr(http, "request", compacted_after_first_page)
    cache = ClusterCache()
    sink = RecordingSink(NodeSink(cache))
    informer = Informer(
        api=api, collection=nodes.collection(page_size=2), sink=sink, streaming=False
    )
    async with running(informer):
        assert sorted(cache.nodes) == names[1:]

    assert [status for _, status in calls[:3]] == [200, 410, 200]
    assert "continue" in calls[1][0]  # the expired token
    assert "continue" not in calls[2][0]  # the list started over
    assert sink.relists[0] == names[:2]
    assert sink.relists[1] == names[1:]
    assert informer.stats.relists == 1  # one list, restarted inside


# -- slim records -------------------------------------------------------------------------------


def _strings_in(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in (*_strings_in(k), *_strings_in(v))]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [s for f in dataclasses.fields(value) for s in _strings_in(getattr(value, f.name))]
    return []


async def test_records_from_the_api_server_are_slim(api: client.ApiClient, nodes: Nodes) -> None:
    created = await nodes.gpu("slim")
    name = _name_of(created)
    assert created["metadata"]["managedFields"]  # the API server keeps them on every Node
    assert len(created["status"]["images"]) == 40
    cache = ClusterCache()
    informer = Informer(api=api, collection=nodes.collection(), sink=NodeSink(cache))
    async with running(informer):
        record = cache.nodes[name]

    assert isinstance(record, NodeRecord)
    assert {f.name for f in dataclasses.fields(record)} == RECORD_FIELDS
    assert not hasattr(record, "__dict__")  # slots: nothing can be stuck on it later
    assert record.labels == created["metadata"]["labels"]
    assert record.uid == created["metadata"]["uid"]
    assert record.resource_version == _version_of(created)
    assert (record.gpu_capacity, record.shared_capacity) == (8, None)
    strings = _strings_in(record)
    assert not [s for s in strings if "sha256:" in s]  # no image list
    info = created["status"]["nodeInfo"]
    assert info["machineID"] not in strings and info["bootID"] not in strings  # no nodeInfo
    assert not [s for s in strings if "Kubelet" in s]  # no conditions (reasons or messages)
    assert not [s for s in strings if "f:" in s]  # no managedFields
    annotations = created["metadata"]["annotations"]
    assert not set(annotations) & set(strings)  # no annotations
    assert annotations["csi.volume.kubernetes.io/nodeid"] not in strings


def test_a_record_holds_at_most_two_kib_of_a_realistic_node() -> None:
    """What the cache keeps per Node once the decoded body is gone: measured, not estimated.

    The bodies are serialized before tracing starts; each is then decoded and projected as the
    informer does, and dropped.  What remains traced is what the records keep alive: the record,
    its label dict, the strings only this node has, and (shared by all) the interned keys and
    common values.
    """
    raw_bodies = [
        orjson.dumps(bodies.gpu_node(name=f"slim-{i:03d}", pool=f"pool-{i % 7}"))
        for i in range(200)
    ]
    assert min(map(len, raw_bodies)) > 14_000  # realistic, not toys
    gc.collect()
    tracemalloc.start()
    try:
        records = [project_node(orjson.loads(raw)) for raw in raw_bodies]
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_record = retained / len(records)
    print(f"slim Node record: {per_record:.0f} bytes retained per record")
    assert len({r.name for r in records}) == 200
    assert all(r.labels["pool"] == f"pool-{i % 7}" for i, r in enumerate(records))
    assert per_record <= MAX_RECORD_BYTES, f"{per_record:.0f} bytes per record"


# -- LineSplitter -------------------------------------------------------------------------------


def _stream(count: int, *, images: int) -> tuple[bytes, list[bytes]]:
    lines = [
        bodies.watch_event_line(
            "MODIFIED",
            bodies.gpu_node(name=f"big-{i}", pool="p", images=images),
            resource_version=str(i + 1),
        )
        for i in range(count)
    ]
    return b"".join(lines), [line.rstrip(b"\n") for line in lines]


@pytest.mark.parametrize("chunk", [1, 3, 4096, 65_536, 1 << 20])
def test_line_splitter_reassembles_lines_over_64_kib_from_any_chunking(chunk: int) -> None:
    stream, expected = _stream(3, images=400)
    assert min(map(len, expected)) > 65_536
    splitter = LineSplitter()
    lines = [
        line
        for at in range(0, len(stream), chunk)
        for line in splitter.feed(stream[at : at + chunk])
    ]
    assert lines == expected
    versions = [orjson.loads(line)["object"]["metadata"]["resourceVersion"] for line in lines]
    assert versions == ["1", "2", "3"]


def test_line_splitter_holds_a_partial_line_and_skips_blank_ones() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b'{"type":"BOOK') == []
    assert splitter.feed(b'MARK"}\n\n  \n{"a"') == [b'{"type":"BOOKMARK"}']
    assert splitter.feed(b":1}") == []
    assert splitter.feed(b"\n") == [b'{"a":1}']
    assert splitter.feed(b"") == []

"""The write loop against an in-memory API: writes in flight, per-object order, holds.

The real API server is in the integration tests; here a fake answers in a few milliseconds so
that how many writes overlap, and for which objects, can be seen exactly.
"""

from __future__ import annotations

import asyncio
import collections
import copy
from typing import Any

import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api import models
from gpushare_operator.core.workqueue import WorkQueue
from gpushare_operator.kube import http
from gpushare_operator.kube.events import EventRecorder
from gpushare_operator.kube.inflight import InFlight
from gpushare_operator.kube.leadership import LeaderGate
from gpushare_operator.kube.ratelimit import TokenBucket
from gpushare_operator.kube.writeloop import ConfigMapRef, WriteLoop
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing import writepath
from gpushare_testing.builders import config_texts, node, policy
from gpushare_testing.gates import AlwaysLeader, ManualGate
from gpushare_testing.waiting import eventually

NODES = 24


class SlowApi:
    """Answers writes after a short delay and records which objects were written at once."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes
        self.fail_once: set[str] = set()  # paths answered 503 the first time
        self.open: collections.Counter[str] = collections.Counter()  # object path -> in flight
        self.most_open = 0
        self.overlaps: list[str] = []  # an object written twice at the same time
        self.writes: list[tuple[str, str]] = []

    async def request(self, api: object, *, method: str, path: str, **kw: Any) -> Any:
        target = path.removesuffix("/status")
        if method == "POST":  # a create names its object in the body
            target = f"{path}/{kw['body']['metadata']['name']}"
        if self.open[target]:
            self.overlaps.append(target)
        self.open[target] += 1
        self.most_open = max(self.most_open, sum(self.open.values()))
        try:
            await asyncio.sleep(0.005)
            if path in self.fail_once:
                self.fail_once.discard(path)
                raise http.ApiError(status=503, reason="ServiceUnavailable", body={})
            self.writes.append((method, path))
            return self._answer(method, path, kw.get("body"))
        finally:
            self.open[target] -= 1

    def _answer(self, method: str, path: str, body: Any) -> Any:
        if method == "PATCH" and path.startswith("/api/v1/nodes/"):
            current = self.nodes[path.rsplit("/", 1)[1]]
            current["metadata"]["labels"].update(body["metadata"].get("labels") or {})
            return copy.deepcopy(current)
        return copy.deepcopy(body) if isinstance(body, dict) else {}


def writes_to(api: SlowApi, prefix: str) -> collections.Counter[str]:
    return collections.Counter(path for method, path in api.writes if path.startswith(prefix))


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> tuple[ClusterCache, Reconciler, SlowApi]:
    cache = ClusterCache()
    bodies = {f"n{i}": node(f"n{i}") for i in range(NODES)}
    api = SlowApi(copy.deepcopy(bodies))
    monkeypatch.setattr(http, "request", api.request)
    # Every node at once: these tests are about writes in flight, not about pacing.
    cache.upsert_policy(policy("p", rollout={"maxUnavailable": "100%", "canary": 0}))
    cache.set_config_data(config_texts(cache), initial=True)  # written long ago
    for body in bodies.values():
        cache.upsert_node(body)
    cache.config_synced = True
    timings = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=600)
    return cache, Reconciler(cache, timings=timings, max_unavailable="100%"), api


def writer(
    cache: ClusterCache,
    reconciler: Reconciler,
    *,
    concurrency: int,
    gate: LeaderGate | None = None,
) -> WriteLoop:
    return WriteLoop(
        api=None,  # type: ignore[arg-type]  # the fake request ignores it
        cache=cache,
        reconciler=reconciler,
        gate=gate or AlwaysLeader(),
        bucket=TokenBucket(qps=10_000, burst=10_000),
        recorder=EventRecorder(api=None, allowed=lambda: False),  # type: ignore[arg-type]
        config=ConfigMapRef(namespace="gpu-operator", name="configs"),
        concurrency=concurrency,
    )


async def run_until_written(w: WriteLoop, api: SlowApi) -> None:
    task = asyncio.create_task(w.run())
    try:

        async def settled() -> bool:
            policies = writes_to(api, f"/apis/{models.GROUP}/{models.VERSION}/gpusharingpolicies")
            return sum(policies.values()) >= 1 and w.backlog == 0

        await eventually(settled, timeout=10, what="every write made")
        await asyncio.sleep(0.6)  # a held-back policy would look again by now: nothing more
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_several_writes_are_in_flight_but_never_two_for_one_object(
    cluster: tuple[ClusterCache, Reconciler, SlowApi],
) -> None:
    cache, planner, api = cluster
    w = writer(cache, planner, concurrency=4)
    await run_until_written(w, api)
    assert 1 < api.most_open <= 4
    assert api.overlaps == []
    # Each node: one label apply, its GPUNodeState created once and its status written once.
    labels = writes_to(api, "/api/v1/nodes/")
    assert sorted(labels) == sorted(f"/api/v1/nodes/n{i}" for i in range(NODES))
    assert set(labels.values()) == {1}
    statuses = [p for m, p in api.writes if m == "PATCH" and p.endswith("/status")]
    assert len(statuses) == NODES + 1  # and the policy's, once, after its nodes settled


async def test_a_policy_status_waits_for_its_nodes_to_settle(
    cluster: tuple[ClusterCache, Reconciler, SlowApi],
) -> None:
    cache, planner, api = cluster
    w = writer(cache, planner, concurrency=2)
    await run_until_written(w, api)
    policy_at = [i for i, (_, p) in enumerate(api.writes) if "gpusharingpolicies" in p]
    last_node = max(i for i, (_, p) in enumerate(api.writes) if "gpunodestates" in p)
    assert policy_at and min(policy_at) > last_node


async def test_an_object_dirtied_while_being_written_is_written_again_after() -> None:
    queue = WorkQueue(clock=lambda: 0.0)
    flight = InFlight(limit=2, finished=queue.done)
    release = asyncio.Event()

    async def job() -> None:
        await release.wait()

    queue.node("a")
    await flight.slot()
    assert queue.get("node") == "a"
    flight.spawn(("node", "a"), job())
    queue.node("a")  # dirty again while in flight: not handed out twice at once
    assert queue.get("node") is None
    assert flight.busy == {("node", "a")}
    release.set()

    async def done() -> bool:
        return not flight.busy

    await eventually(done, timeout=2, what="the job to end")
    assert queue.get("node") == "a"  # handed back once its write was done


async def test_slots_bound_the_jobs_and_cancel_leaves_none_behind() -> None:
    finished: list[tuple[str, str]] = []
    flight = InFlight(limit=2, finished=finished.append)
    forever = asyncio.Event()
    for name in ("a", "b"):
        await flight.slot()
        flight.spawn(("node", name), forever.wait())  # type: ignore[arg-type]
    third = asyncio.create_task(flight.slot())
    await asyncio.sleep(0.01)
    assert not third.done()  # no third slot while two jobs run
    await flight.cancel()
    await asyncio.wait_for(third, timeout=1)  # cancelled jobs gave their slots back
    assert sorted(finished) == [("node", "a"), ("node", "b")]  # and their keys
    flight.release()
    with pytest.raises(ValueError, match="at least one"):
        InFlight(limit=0, finished=finished.append)


async def test_a_failed_write_is_retried_without_waiting_for_another_event(
    cluster: tuple[ClusterCache, Reconciler, SlowApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, planner, api = cluster
    cache.queue.base = 0.3  # the first retry comes within 0.3 s
    w = writer(cache, planner, concurrency=4)
    task = asyncio.create_task(w.run())
    try:

        async def settled() -> bool:
            return w.backlog == 0 and len(api.writes) > NODES

        await eventually(settled, timeout=10, what="the first writes")
        await asyncio.sleep(0.6)  # the writer is asleep: no timer is due for minutes
        status_path = f"/apis/{models.GROUP}/{models.VERSION}/gpunodestates/n3/status"
        api.fail_once.add(status_path)
        cache.delete_node_state("n3")  # its GPUNodeState is gone: create and publish it again

        async def retried() -> bool:
            return api.writes.count(("PATCH", status_path)) == 2

        # The failure sets a retry timer after the writer went back to sleep; nothing else
        # happens in the cluster, so only that timer can bring the write about.
        await eventually(retried, timeout=5, what="the failed status write retried")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_write_dropped_for_lost_leadership_stays_queued(
    cluster: tuple[ClusterCache, Reconciler, SlowApi],
) -> None:
    cache, reconciler, api = cluster
    gate = ManualGate(leading=False)  # the lease lapsed between the loop's check and the send
    w = writer(cache, reconciler, concurrency=1, gate=gate)
    planning = writepath.PlanningLoop(reconciler)
    assert planning.plan_admitted("n5").labels is not None  # its turn has come
    writepath.drain(cache.queue)
    await w._job(("node", "n5"))
    assert api.writes == []  # nothing was sent
    assert "n5" in cache.queue.nodes  # the gate may reopen without a resync: not forgotten

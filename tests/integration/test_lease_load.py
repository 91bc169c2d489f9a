"""Lease renewals keep their period while the writer is saturated and the pods are re-listed.

The leader runs as a real process against a control plane of this test's own (tens of thousands
of pods would slow every later test of the session's shared one).  Its writer gets a backlog of
thousands of writes against ``--write-qps 5``; then a policy naming a new resource forces the
pod informer to re-list every pod.  The Lease's ``spec.renewTime`` history, from a watch on the
Lease, says whether renewals kept their period; the API server's audit log says the same from
the server's side.  Nothing is taken from the operator's own logs.

Sizes: ``make test`` runs 700 GPU nodes (~2,100 queued writes) and 10,000 pods; ``make soak``
(``GPUSHARE_SOAK=1``) runs the full case, 3,400 nodes (~10,200 queued writes) and 50,000 pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from benchmarks.scale import cluster

from gpushare_testing import podbodies
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import spawn
from gpushare_testing.rawclient import RawClient
from gpushare_testing.replicas import LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, USERS, report
from gpushare_testing.waiting import eventually

SOAK = os.environ.get("GPUSHARE_SOAK") == "1"
NODES, PODS = (3_400, 50_000) if SOAK else (700, 10_000)
USER = USERS["a"]
# A fifth of the pods ask for LATE_RESOURCE's shared slots: untracked until the last policy
# advertises them, whose creation makes the pod informer re-list; the cache grows by exactly
# those pods when it is done.
LATE_RESOURCE = "nvidia.com/a100"
LATE_EVERY = 5
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{cluster.OPERATOR_NAMESPACE}/leases"


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def own_plane() -> Iterator[ControlPlane]:
    plane = ControlPlane()
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def admin(own_plane: ControlPlane) -> AsyncIterator[RawClient]:
    async with RawClient(kubeconfig=own_plane.admin_kubeconfig) as client:
        yield client


class LeaseHistory:
    """Every version of the Lease a watch delivers: (renewTime, holder, transitions)."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str, int]] = []

    async def follow(self, client: RawClient) -> None:
        params = {"fieldSelector": "metadata.name=gpushare-operator"}
        while True:
            status, listed = await client.get(LEASES, params=params)
            assert status == 200, listed
            version = listed["metadata"]["resourceVersion"]
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async for event in client.watch(
                    LEASES, params={**params, "resourceVersion": version}
                ):
                    spec = (event.get("object") or {}).get("spec") or {}
                    if event.get("type") in ("ADDED", "MODIFIED") and spec.get("renewTime"):
                        self.seen.append(
                            (
                                stamp(spec["renewTime"]),
                                str(spec.get("holderIdentity") or ""),
                                int(spec.get("leaseTransitions") or 0),
                            )
                        )

    def gaps(self, *, start: float, end: float) -> list[float]:
        times = sorted(t for t, _, _ in self.seen if start <= t <= end)
        return [b - a for a, b in itertools.pairwise(times)]


def audit_renewals(plane: ControlPlane, *, start: float, end: float) -> list[float]:
    """When the API server received each successful Lease update by the operator."""
    received = [
        stamp(e["requestReceivedTimestamp"])
        for e in plane.audit_events()
        if e["user"]["username"] == USER
        and e["objectRef"].get("resource") == "leases"
        and e["verb"] == "update"
        and 200 <= int((e.get("responseStatus") or {}).get("code") or 0) < 300
    ]
    return sorted(t for t in received if start <= t <= end)


def pool_policy(name: str, pool: str, **spec: Any) -> dict[str, Any]:
    body = cluster.policy(name, {"matchLabels": {"pool": pool}}, 10, "TimeSlicing", 2)
    body["spec"].update(spec)
    return body


def pod_body(index: int) -> dict[str, Any]:
    """The scale bench's pods (a fifth of them shared), and a fifth asking for LATE_RESOURCE."""
    if index % LATE_EVERY != 1:
        return cluster.pod_body(index, nodes=NODES)
    body = podbodies.shared_gpu_pod(
        name=f"pod-{index:06d}",
        node=cluster.node_name(index % NODES),
        namespace=cluster.POD_NAMESPACES[index % len(cluster.POD_NAMESPACES)],
        resource=f"{LATE_RESOURCE}.shared",  # the bench's policies rename by default
        managed_fields=False,
    )
    for key in ("uid", "creationTimestamp", "generateName", "ownerReferences"):
        body["metadata"].pop(key, None)
    body.pop("status", None)
    return body


async def create_pods(client: RawClient) -> None:
    async def one(index: int) -> None:
        body = pod_body(index)
        path = f"/api/v1/namespaces/{body['metadata']['namespace']}/pods"
        await cluster.create(client, path, body)

    await cluster.bounded(
        (cluster.functools_partial(one, i) for i in range(PODS)),
        progress=lambda n: report(f"  {n:,}/{PODS:,} pods") if n % 10_000 == 0 else None,
    )


async def test_renewals_keep_their_period_under_a_write_backlog_and_a_pod_relist(
    own_plane: ControlPlane, admin: RawClient, tmp_path: Path
) -> None:
    started = time.monotonic()
    await cluster.apply_crds(admin)
    await cluster.create_namespaces(admin)
    await cluster.create_nodes(admin, NODES, log=report)
    nodes_s = time.monotonic() - started
    await create_pods(admin)
    pods_s = time.monotonic() - started - nodes_s
    report(f"created {NODES:,} nodes in {nodes_s:.1f} s and {PODS:,} pods in {pods_s:.1f} s")
    # Every node governed: a label, a GPUNodeState and its status to write for each.
    await cluster.create_policies(
        admin, [pool_policy(f"{pool}-base", pool) for pool in cluster.POOLS]
    )

    history = LeaseHistory()
    watcher = asyncio.create_task(history.follow(admin), name="lease-watch")
    operator = spawn(
        own_plane,
        tmp_path / "operator.log",
        "--identity=a",
        f"--device-plugin-namespace={cluster.DEVICE_PLUGIN_NAMESPACE}",
        f"--lease-duration={LEASE_DURATION:g}",
        f"--renew-deadline={RENEW_DEADLINE:g}",
        f"--retry-period={RETRY_PERIOD:g}",
        "--write-qps=5",
        "--write-burst=5",
        user=USER,
    )
    try:

        async def leading() -> float:
            with contextlib.suppress(aiohttp.ClientError):
                return (await operator.metrics()).get("gpushare_leader", 0.0)
            assert operator.proc.poll() is None, operator.logs()
            return 0.0

        await eventually(leading, timeout=180, interval=0.5, what="the operator to lead")
        led_at = time.time()

        async def queued() -> float:
            return (await operator.metrics())["gpushare_write_queue_depth"]

        # The ConfigMap first; the nodes once their new key has had its propagation delay.
        depth = await eventually(
            queued, until=lambda n: n >= NODES, timeout=30, what="the nodes queued to write"
        )
        cached = (await operator.metrics())["gpushare_cache_objects{kind=Pod}"]
        report(f"leading; {depth:.0f} objects queued to write, {cached:.0f} pods cached")

        await asyncio.sleep(5 * RETRY_PERIOD)  # by design: renewals sampled, writer saturated
        relist_at = time.time()
        late = pool_policy("late", "nowhere", resourceName=LATE_RESOURCE)
        await cluster.create_policies(admin, [late])

        async def pods_cached() -> float:
            return (await operator.metrics())["gpushare_cache_objects{kind=Pod}"]

        await eventually(
            pods_cached,
            until=lambda n: n >= cached + PODS // LATE_EVERY,
            timeout=600,
            interval=0.5,
            what="the re-list",
        )
        relisted_at = time.time()
        await asyncio.sleep(3 * RETRY_PERIOD)  # by design: a few renewals sampled after it
        end = time.time()
        final = await operator.metrics()
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        operator.stop()
        print(f"--- operator log ---\n{operator.logs()[-10000:]}")

    gaps = history.gaps(start=led_at, end=end)
    audited = audit_renewals(own_plane, start=led_at, end=end)
    audit_gaps = [b - a for a, b in itertools.pairwise(audited)]
    during = history.gaps(start=relist_at, end=relisted_at)
    report(
        f"re-list of {PODS:,} pods took {relisted_at - relist_at:.1f} s with "
        f"{final['gpushare_write_queue_depth']:.0f} objects still queued to write; "
        f"renewTime gaps over {end - led_at:.0f} s: max {max(gaps):.2f} s, "
        f"mean {sum(gaps) / len(gaps):.2f} s ({len(gaps)} gaps; during the re-list max "
        f"{max(during, default=0):.2f} s); audit-log gaps max {max(audit_gaps):.2f} s; "
        f"event-loop lag max {final['gpushare_event_loop_lag_max_seconds']:.3f} s "
        f"(retry period {RETRY_PERIOD:g} s, renew deadline {RENEW_DEADLINE:g} s)"
    )
    holders = {holder for t, holder, _ in history.seen if t >= led_at}
    transitions = {count for t, _, count in history.seen if t >= led_at}
    assert holders == {"a"}  # no leadership loss...
    assert len(transitions) == 1  # ...not even a lost-and-retaken one
    assert final["gpushare_leader"] == 1
    assert final["gpushare_write_queue_depth"] > 0  # still saturated at the end
    # Every renewal on time: no missed period, never near the renew deadline.
    assert len(gaps) >= (end - led_at) / RETRY_PERIOD * 0.8
    assert max(gaps) <= 2 * RETRY_PERIOD, gaps
    assert max(audit_gaps) <= 2 * RETRY_PERIOD, audit_gaps

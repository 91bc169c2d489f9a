"""Chaos against the real control plane: an apiserver restart, etcd compaction, a SIGKILL.

These tests run on their OWN control plane (module scope), since they restart its
kube-apiserver; the session-wide one stays untouched for every other test.  Its apiserver runs
with ``--watch-cache=false`` (a watch resumes straight from etcd, so a resourceVersion expires
exactly when etcd compacts it, not when a cache window moves) and ``--etcd-compaction-interval=0``
(the apiserver never compacts on its own, so the only 410 Gone is the one a test causes) and
``--shutdown-watch-termination-grace-period=2s`` (on SIGTERM it ends open watches instead of
waiting up to a minute for them, so a restart takes seconds).

The operator runs as users run it (``python -m gpushare_operator run``), next to the GPU node
simulator, and is judged by what the API server shows and by its audit log: which object the
operator wrote, how often, and with what.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import rolloutaudit
from gpushare_testing import webhooks as wh
from gpushare_testing.auditlog import AuditEvent, describe, write_key
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import install_crds
from gpushare_testing.gpupods import create_pod, delete_pod
from gpushare_testing.operators import OPERATOR_NAMESPACE, RunningOperator, spawn
from gpushare_testing.quiet import quiet
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

CHAOS_ARGS = (
    "--watch-cache=false",
    "--etcd-compaction-interval=0",
    "--shutdown-watch-termination-grace-period=2s",
)
IDENTITY = "chaos-operator"
# Short Lease timings, and an apiserver down for longer than the renew deadline: the operator
# loses leadership and, on regaining it, re-plans every object from its caches.
FAST_LEASE = ("--lease-duration", "4", "--renew-deadline", "2", "--retry-period", "0.5")
DOWN_FOR = 3.0

SLOTS_OF_TIME_SLICING = (wh.SLOT_ISOLATION, wh.SLOT_RESOURCE)


# -- the module's own control plane ------------------------------------------------------------


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver (watch cache off) + controller manager, CRDs installed."""
    chaos = ControlPlane(extra_apiserver_args=CHAOS_ARGS)
    chaos.start()
    try:
        install_crds(chaos)
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
        status, raw = chaos.request("POST", "/api/v1/namespaces", body=body)
        assert status in (201, 409), raw
        yield chaos
    finally:
        chaos.stop()


@pytest.fixture
def namespace(plane: ControlPlane) -> Iterator[str]:
    """The test's device-plugin namespace, which also holds its pods (force-deleted after)."""
    name = f"chaos-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    status, raw = plane.request("POST", "/api/v1/namespaces", body=body)
    assert status == 201, raw
    yield name
    plane.request("DELETE", f"/api/v1/namespaces/{name}/pods?gracePeriodSeconds=0")
    plane.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
async def sim(plane: ControlPlane, namespace: str) -> AsyncIterator[GpuClusterSimulator]:
    """The test's GPU nodes; once they are deleted, their GPUNodeStates must be collected too,
    so that the next test's operator starts from an empty cluster."""
    async with GpuClusterSimulator(
        kubeconfig=plane.admin_kubeconfig, namespace=namespace
    ) as simulator:
        yield simulator

    async def states_left() -> list[str]:
        status, raw = plane.request("GET", f"{h.API}/gpunodestates")
        assert status == 200, raw
        return [s["metadata"]["name"] for s in json.loads(raw)["items"]]

    # The garbage collector can take its time after an apiserver restart (its resync period).
    await eventually(
        states_left, until=lambda left: not left, timeout=90, what="GPUNodeStates collected"
    )


@pytest.fixture
def policies(plane: ControlPlane) -> Iterator[list[str]]:
    """Names of policies a test created; deleted afterwards so later tests do not see them."""
    created: list[str] = []
    yield created
    for name in created:
        plane.request("DELETE", f"{h.API}/gpusharingpolicies/{name}")


async def add_policy(sim: GpuClusterSimulator, created: list[str], body: dict[str, Any]) -> None:
    await h.create_policy(sim.client, body)
    created.append(body["metadata"]["name"])


# -- the operator, on this plane -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def operator(
    plane: ControlPlane, log_path: Path, *args: str
) -> AsyncIterator[RunningOperator]:
    """``python -m gpushare_operator run`` against ``plane``, synced; stopped on the way out.

    A frozen (SIGSTOPped) operator is thawed first; a killed one is left as it is.  Its log
    tail is printed (pytest shows it when the test fails).
    """
    running = spawn(plane, log_path, "--identity", IDENTITY, *args)
    try:
        await running.wait_synced()
        yield running
    finally:
        running.resume()
        running.stop()
        print(f"--- operator log {log_path} ---\n{running.logs()[-20000:]}")


async def restart_apiserver(plane: ControlPlane, *, down_for: float = 0.0) -> None:
    """Restart kube-apiserver, on this thread: its children die with the thread that started
    them (PR_SET_PDEATHSIG), so not from a worker thread.  The event loop is blocked meanwhile;
    a short sleep afterwards lets it notice its dead connections before the next request."""
    started = time.monotonic()
    plane.restart_apiserver(down_for=down_for)
    print(f"kube-apiserver restarted in {time.monotonic() - started:.1f} s")
    await asyncio.sleep(0.5)  # by design: the loop's own sockets, not the operator, are waited on


def log_records(running: RunningOperator, event: str) -> list[dict[str, Any]]:
    return [line for line in running.log_lines() if line.get("event") == event]


def kinds_logged(running: RunningOperator, *events: str) -> set[str]:
    """The informer kinds for which the operator logged any of ``events``."""
    return {str(r.get("kind")) for e in events for r in log_records(running, e)}


async def wait_cached(running: RunningOperator, **expected: float) -> None:
    await eventually(
        running.cached,
        until=lambda sizes: all(sizes.get(k) == v for k, v in expected.items()),
        what=f"the operator's caches to hold {expected}",
    )


# -- the audit log -------------------------------------------------------------------------------


def is_change(event: AuditEvent) -> bool:
    """A write of the operator's that changes cluster state (not its Lease, not an Event)."""
    return bool(
        event["user"]["username"] == h.OPERATOR_USER
        and event["objectRef"].get("resource") not in ("leases", "events")
    )


def changes_since(plane: ControlPlane, mark: int) -> list[AuditEvent]:
    return [e for e in plane.audit_events()[mark:] if is_change(e)]


# -- cluster state -------------------------------------------------------------------------------


def shows(actual: Any, expected: Any) -> bool:
    """``actual`` equals ``expected``; for a mapping, on the keys ``expected`` names (slots
    are compared by their totals: their per-class breakdown is another test's)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        return all(actual.get(k) == v for k, v in expected.items())
    return bool(actual == expected)


async def wait_state(
    sim: GpuClusterSimulator, node: str, timeout: float = 60, **expected: Any
) -> dict[str, Any]:
    """Wait until ``node``'s GPUNodeState status shows ``expected`` (top-level fields)."""

    def matches(state: dict[str, Any] | None) -> bool:
        status = (state or {}).get("status") or {}
        return all(shows(status.get(k), v) for k, v in expected.items())

    state = await eventually(
        lambda: h.node_state(sim.client, node),
        until=matches,
        timeout=timeout,
        what=f"GPUNodeState {node} to show {expected}",
    )
    assert state is not None
    return state


async def wait_policy(
    sim: GpuClusterSimulator, name: str, timeout: float = 60, **expected: Any
) -> dict[str, Any]:
    def matches(body: dict[str, Any]) -> bool:
        status = body.get("status") or {}
        return all(shows(status.get(k), v) for k, v in expected.items())

    return await eventually(
        lambda: h.get_policy(sim.client, name),
        until=matches,
        timeout=timeout,
        what=f"{name} status {expected}",
    )


async def all_verified(sim: GpuClusterSimulator, names: list[str]) -> bool:
    status, body = await sim.client.get(f"{h.API}/gpunodestates")
    assert status == 200, body
    phases = {s["metadata"]["name"]: (s.get("status") or {}).get("phase") for s in body["items"]}
    return all(phases.get(name) == "Verified" for name in names)


# -- 1. kube-apiserver restarted mid-run ---------------------------------------------------------


async def test_apiserver_restart_reconnects_converges_and_writes_nothing_twice(
    plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    tmp_path: Path,
) -> None:
    pool_a, pool_b = h.unique("a"), h.unique("b")
    a_nodes = await sim.create_gpu_nodes(pool=pool_a, count=3, gpus=8)
    b_nodes = await sim.create_gpu_nodes(pool=pool_b, count=2, gpus=8)
    pa, pb = h.unique("pa"), h.unique("pb")
    await add_policy(sim, policies, h.policy(pa, pool=pool_a, replicas=4))
    await add_policy(sim, policies, h.policy(pb, pool=pool_b, replicas=2))
    moved, busy = a_nodes[0], b_nodes[0]
    untouched = a_nodes[1:] + b_nodes[1:]

    dp = ("--device-plugin-namespace", namespace)
    async with operator(plane, tmp_path / "operator.log", *dp, *FAST_LEASE) as op:
        for name in a_nodes + b_nodes:
            await wait_state(sim, name, phase="Verified")
        await wait_policy(sim, pa, matchedNodes=3, verifiedNodes=3)
        body = await wait_policy(sim, pb, matchedNodes=2, verifiedNodes=2)
        pb_key = body["status"]["configKey"]
        mark = len(await quiet(plane, [op], namespace=namespace))

        await restart_apiserver(plane, down_for=DOWN_FOR)
        # At once, likely before the operator's backoff has reconnected it: a node moves to
        # pool B, and a pod takes 2 slots on a node of pool B.
        await sim.relabel(moved, {"pool": pool_b})
        await create_pod(sim, namespace, "busy", busy, count=2)

        await wait_state(sim, moved, policy=pb, phase="Verified", replicas=2)
        await wait_state(
            sim, busy, phase="Verified", pods=1, slots={"capacity": 16, "allocated": 2}
        )
        await wait_policy(
            sim,
            pa,
            matchedNodes=2,
            appliedNodes=2,
            verifiedNodes=2,
            slots={"capacity": 64, "allocated": 0},
        )
        await wait_policy(
            sim,
            pb,
            matchedNodes=3,
            appliedNodes=3,
            verifiedNodes=3,
            slots={"capacity": 48, "allocated": 2},
        )
        await sim.wait_idle()
        end = len(await quiet(plane, [op], namespace=namespace))

        assert op.proc.poll() is None, "the operator died with the apiserver"
        # It reconnected: its watches broke (or their first attempt failed) and came back...
        broke = kinds_logged(op, "watch broke; resuming", "list failed; retrying")
        assert {"Node", "Pod", "GPUNodeState", "ConfigMap"} <= broke, broke
        # ... from where they were: etcd still had every revision, so no watch expired.
        assert kinds_logged(op, "watch expired (410 Gone): re-listing") == set()
        # The outage outlasted the renew deadline: leadership was lost and regained, and with
        # it came a full resync, which must find nothing to write for what did not change.
        leadership = [
            line["event"]
            for line in op.log_lines()
            if line.get("event") in ("leadership acquired", "leadership lost")
        ]
        assert "leadership lost" in leadership, leadership
        assert leadership[-1] == "leadership acquired", leadership
        await wait_cached(op, Node=5, Pod=1, GPUNodeState=5, GPUSharingPolicy=2)

    writes = [e for e in plane.audit_events()[mark:end] if is_change(e)]
    report = "\n".join(describe(writes))
    counts = collections.Counter(map(write_key, writes))
    # The moved node: its two labels, applied once, naming pool B's policy and config.
    label_writes = rolloutaudit.config_applies(writes, [moved])  # (not its slot labels)
    assert len(label_writes) == 1, report
    [label_write] = label_writes
    assert label_write["verb"] == "patch"
    assert label_write["requestObject"]["metadata"]["labels"] == {
        h.CONFIG_LABEL: pb_key,
        h.POLICY_LABEL: pb,
    }
    # Its GPUNodeState: one write per phase it went through (Pending, rendered when the label
    # write was planned and written just after it; Applied; Verified), nothing more.
    assert counts[("gpunodestates", moved, "status")] <= 3, report
    # The busy node's state changed once (1 pod, 2 slots); pool A lost one node; pool B gained
    # a node (Applied, then Verified) and 2 allocated slots: at most one write per change.
    assert counts[("gpunodestates", busy, "status")] == 1, report
    assert counts[("gpusharingpolicies", pa, "status")] == 1, report
    assert 1 <= counts[("gpusharingpolicies", pb, "status")] <= 3, report
    # Nothing else: no label or state write for nodes that did not change, no ConfigMap write
    # (no new key), no GPUNodeState created again, no write for the reconnect or re-list.
    expected = {
        ("nodes", moved, ""),
        ("gpunodestates", moved, "status"),
        ("gpunodestates", busy, "status"),
        ("gpusharingpolicies", pa, "status"),
        ("gpusharingpolicies", pb, "status"),
    }
    assert set(counts) <= expected, report
    for name in untouched:
        assert not [e for e in writes if write_key(e)[1] == name], report
    assert all(200 <= e["responseStatus"]["code"] < 300 for e in writes), report
    print(f"operator writes after the restart:\n{report}")


# -- 2. etcd compaction: 410 Gone, re-list, nothing stale ----------------------------------------


async def test_compacted_watch_relists_and_drops_what_was_deleted_meanwhile(
    plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    tmp_path: Path,
) -> None:
    pool = h.unique("c")
    names = await sim.create_gpu_nodes(pool=pool, count=4, gpus=8)
    policy = h.unique("pc")
    await add_policy(sim, policies, h.policy(policy, pool=pool, replicas=4))
    await create_pod(sim, namespace, "kept", names[1], count=1)
    await create_pod(sim, namespace, "gone", names[2], count=2)
    doomed = names[3]

    async with operator(
        plane, tmp_path / "operator.log", "--device-plugin-namespace", namespace
    ) as op:
        for name in names:
            await wait_state(sim, name, phase="Verified")
        await wait_state(sim, names[2], pods=1, slots={"capacity": 32, "allocated": 2})
        await wait_policy(
            sim, policy, matchedNodes=4, verifiedNodes=4, slots={"capacity": 128, "allocated": 3}
        )
        await wait_cached(op, Node=4, Pod=2, GPUNodeState=4)
        await quiet(plane, [op], namespace=namespace)

        # Freeze the operator, so that it cannot see what happens next; the apiserver restart
        # ends its watch connections, so nothing reaches it later through an old socket either.
        op.proc.send_signal(signal.SIGSTOP)
        try:
            await restart_apiserver(plane)
            await sim.delete_node(doomed)
            await delete_pod(sim, namespace, "gone")
            # One more write, so that the revision compacted at is past every resourceVersion
            # the operator's watches could resume from (a watch from rv starts at rv + 1).
            marker = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "marker"}}
            await h.ok(sim.client, "POST", f"/api/v1/namespaces/{namespace}/configmaps", marker)
            revision = plane.compact_etcd()
            print(f"etcd compacted at revision {revision}")
        finally:
            op.proc.send_signal(signal.SIGCONT)

        # Every watch resumes from a compacted revision: 410 Gone, and a re-list that replaces
        # the cache, so the deleted node and pod leave it although no DELETED event came.
        await wait_cached(op, Node=3, Pod=1)
        await wait_policy(
            sim,
            policy,
            matchedNodes=3,
            appliedNodes=3,
            verifiedNodes=3,
            gpus=24,
            slots={"capacity": 96, "allocated": 1},
        )
        await wait_state(sim, names[2], pods=0, slots={"capacity": 32, "allocated": 0})
        await wait_state(sim, names[1], pods=1, slots={"capacity": 32, "allocated": 1})
        expired = kinds_logged(op, "watch expired (410 Gone): re-listing")
        assert {"Node", "Pod"} <= expired, expired
        assert op.proc.poll() is None


# -- 3. the operator SIGKILLed in the middle of a burst of writes --------------------------------


async def labelled(sim: GpuClusterSimulator, policy: str) -> list[str]:
    """Nodes that carry ``policy``'s label (listed with a label selector)."""
    status, body = await sim.client.get(
        "/api/v1/nodes", params={"labelSelector": f"{h.POLICY_LABEL}={policy}"}
    )
    assert status == 200, body
    return sorted(n["metadata"]["name"] for n in body["items"])


async def test_operator_killed_mid_burst_converges_with_no_label_lost_or_doubled(
    plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    tmp_path: Path,
) -> None:
    count, gpus, replicas = 30, 4, 4
    pool = h.unique("k")
    names = await sim.create_gpu_nodes(pool=pool, count=count, gpus=gpus, images=10)
    policy = h.unique("pk")
    dp = ("--device-plugin-namespace", namespace)

    # 5 writes a second: the ~3 writes per node (labels, GPUNodeState create and status) of 30
    # nodes take ~20 s, so the kill lands in the middle of the burst.
    slow = operator(plane, tmp_path / "first.log", *dp, "--write-qps", "5", "--write-burst", "5")
    async with slow as first:
        await add_policy(sim, policies, h.policy(policy, pool=pool, replicas=replicas))
        await eventually(
            lambda: labelled(sim, policy),
            until=lambda done: len(done) >= 5,
            interval=0.05,
            what="the first nodes to be labelled",
        )
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
    assert first.proc.returncode == -signal.SIGKILL
    # The API server goes on serving what a client sent before it died; no signal says when it
    # is done, so this one waits a second (the requests take milliseconds).
    await asyncio.sleep(1)
    before = await labelled(sim, policy)
    assert 0 < len(before) < count, f"the kill was not mid-way: {len(before)} of {count} labelled"
    states_before = {n for n in names if await h.node_state(sim.client, n) is not None}
    print(f"killed with {len(before)} of {count} nodes labelled, {len(states_before)} states")
    mark = len(plane.audit_events())

    # Restarted as a container restarts in its pod: same identity, so no Lease to wait out.
    async with operator(plane, tmp_path / "second.log", *dp) as second:
        await eventually(
            lambda: all_verified(sim, names), timeout=90, what="every node to be Verified"
        )
        body = await wait_policy(
            sim,
            policy,
            matchedNodes=count,
            appliedNodes=count,
            verifiedNodes=count,
            gpus=count * gpus,
            slots={"capacity": count * gpus * replicas, "allocated": 0},
        )
        key = body["status"]["configKey"]
        await sim.wait_idle()
        end = len(await quiet(plane, [second], namespace=namespace))
        assert second.proc.poll() is None

    for name in names:
        node = await h.node(sim.client, name)
        labels = node["metadata"]["labels"]
        assert (labels.get(h.CONFIG_LABEL), labels.get(h.POLICY_LABEL)) == (key, policy), name
        # One field manager entry for the operator, an Apply owning exactly its labels (its
        # two, and the slot labels of a Verified time-sliced node: isolation and resource):
        # neither process left a second entry or a stray field behind.
        ours = [m for m in node["metadata"]["managedFields"] if m["manager"] == "gpushare-operator"]
        assert len(ours) == 1, (name, ours)
        assert ours[0]["operation"] == "Apply", (name, ours)
        owned = (h.CONFIG_LABEL, h.POLICY_LABEL, *SLOTS_OF_TIME_SLICING)
        assert ours[0]["fieldsV1"] == {
            "f:metadata": {"f:labels": {f"f:{label}": {} for label in owned}}
        }, (name, ours)

    # The restarted operator applied labels exactly to the nodes the first one had not reached,
    # once each, and created only the GPUNodeStates that did not exist yet.
    writes = [e for e in plane.audit_events()[mark:end] if is_change(e)]
    report = "\n".join(describe(writes))
    label_writes = collections.Counter(
        e["objectRef"]["name"] for e in rolloutaudit.config_applies(writes)
    )
    assert label_writes == collections.Counter(n for n in names if n not in before), report
    creates = collections.Counter(
        e["objectRef"]["name"]
        for e in writes
        if e["verb"] == "create" and write_key(e)[0] == "gpunodestates"
    )
    assert creates == collections.Counter(n for n in names if n not in states_before), report

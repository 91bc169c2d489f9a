"""The rollout promise on the real control plane: budgets a new leader keeps, halts an edit
lifts, a failed canary that never wedges, a new policy's canary.

Every count of nodes changing at once is read from the API server's audit log: the operator's
label writes and the simulated GFD's and device plugin's own writes (``gpushare_testing.promise``),
never from the operator's account.  Drift, deletion and taints are in test_rollout_promise_drift.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import promise
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create_pod
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.quiet import quiet
from gpushare_testing.replicas import USERS, Replicas
from gpushare_testing.rolloutstate import (
    all_verified,
    key_replicas,
    paced,
    rollout_of,
    rollout_state,
)
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

StartReplicas = Callable[..., Awaitable[Replicas]]


async def label_written(
    plane: ControlPlane, node: str, *, since: float, users: list[str], key: object = ...
) -> None:
    """Until the operator's label write on ``node`` (of ``key``, if given) is in the audit log."""

    async def writes() -> list[tuple[float, str, str | None]]:
        return audit.label_writes(plane, [node], since=since, users=users)

    await eventually(
        writes,
        until=lambda found: any(key is ... or written == key for _, _, written in found),
        timeout=60,
        what=f"the operator's label write on {node}",
    )


def unavailable(
    plane: ControlPlane,
    sim: GpuClusterSimulator,
    nodes: list[str],
    *,
    replicas_of: dict[str, int],
    users: list[str],
) -> list[promise.Window]:
    events = promise.node_events(plane.audit_events(), nodes=nodes, operators=users)
    return promise.windows(events, replicas_of=replicas_of, gpus=sim.gpu_counts)


# -- 1. a new leader counts what the last one left unconfirmed --------------------------------


@pytest.mark.parametrize("situation", ["mid-change", "releasing", "mismatch"])
async def test_after_a_failover_during_a_second_change_max_unavailable_holds(
    situation: str,
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_replicas: StartReplicas,
) -> None:
    """Nodes left unconfirmed by the last leader on a config the spec has moved on from (two
    mid-change; or one released, its device plugin not back; or one Mismatch) still count
    against ``maxUnavailable`` 2 for the new one.  Each carries a GPU pod, so that it sorts
    after the idle nodes: a leader that took it for available would change two idle ones."""
    pool = h.unique("handover")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=6, gpus=1))
    name = h.unique("handover")
    rollout = {"maxUnavailable": 2, "canary": 0, "failureThreshold": 3, "podPolicy": "Proceed"}
    await h.add_policy(sim, policies, paced(name, pool=pool, **rollout))
    timeout = "3" if situation == "mismatch" else "300"
    replicas = await start_replicas("--mismatch-timeout", timeout, "--max-unavailable", "100%")
    leader, follower = await replicas.roles()
    await all_verified(sim, nodes, name)
    users = list(USERS.values())

    since = time.time()
    stuck = nodes[:2] if situation == "mid-change" else nodes[:1]
    for node in stuck:
        sim.set_healthy(node, False)  # nothing of its agents reaches the node from now on
    if situation == "releasing":
        await sim.relabel(stuck[0], {"pool": h.unique("elsewhere")})
        await label_written(control_plane, stuck[0], since=since, users=users, key=None)
    else:
        await h.patch_policy(sim.client, name, {"replicas": 2})
        for node in stuck:
            await label_written(control_plane, node, since=since, users=users)
        if situation == "mismatch":
            await h.wait_phase(sim, stuck[0], "Mismatch")
            await all_verified(sim, nodes[1:], name)
        for node in stuck:
            await create_pod(sim, pods_ns, f"holds-{node}", node, count=1)
    pool_nodes = nodes[1:] if situation == "releasing" else nodes

    # The second change reaches only the next leader: the current one is frozen first.
    dying = replicas.running[leader]
    dying.proc.send_signal(signal.SIGSTOP)
    try:
        await h.patch_policy(sim.client, name, {"replicas": 3})
        dying.proc.send_signal(signal.SIGKILL)
        assert await dying.exited() == -signal.SIGKILL
    finally:
        dying.resume()
    await replicas.wait_holder(follower, timeout=30)
    await replicas.quiet(follower)  # as far as it goes while the stuck nodes stay unconfirmed
    by_new = audit.label_writes(control_plane, nodes, since=since, users=[USERS[follower]])
    assert by_new, "the new leader carried the rollout on"

    for node in stuck:
        sim.set_healthy(node, True)
    await all_verified(sim, pool_nodes, name, timeout=180)
    found = unavailable(
        control_plane,
        sim,
        nodes,
        replicas_of=await key_replicas(sim, namespace),
        users=users,
    )
    found = [w for w in found if w.start >= since]  # the pool's first rollout is no part of it
    ledger = promise.Ledger(budgets={name: [(0.0, 2)]})
    assert promise.excesses(found, ledger) == []
    assert promise.most_at_once(found, policy=name) <= 2


# -- 2. a rollout-only edit re-evaluates a halt -------------------------------------------------


async def test_raising_failure_threshold_lifts_a_halt_without_a_restart(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("lift")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=4, gpus=1))
    canary, rest = nodes[0], nodes[1:]
    name = h.unique("lift")
    rollout = {"maxUnavailable": 2, "canary": 1, "failureThreshold": 1}
    await h.add_policy(sim, policies, paced(name, pool=pool, **rollout))
    operator = await start_operator(
        "--device-plugin-namespace", namespace, "--mismatch-timeout", "3"
    )
    await all_verified(sim, nodes, name)

    sim.set_healthy(canary, False)
    await h.patch_policy(sim.client, name, {"replicas": 2})
    await rollout_state(sim, name, "Halted")
    await quiet(control_plane, [operator], namespace=namespace)

    edited = time.time()
    await h.patch_policy(sim.client, name, {"rollout": {**rollout, "failureThreshold": 2}})
    key = await all_verified(sim, rest, name, timeout=60)  # the halt lifted: the rest go
    assert operator.proc.poll() is None, "the same operator process, never restarted"
    writes = audit.label_writes(control_plane, rest, since=edited, key=key)
    assert sorted(node for _, node, _ in writes) == rest
    # The status catches up with the GNS objects within a status round.
    state = await eventually(
        lambda: rollout_of(sim, name),
        until=lambda r: r.get("waitingOn") == [canary],
        timeout=30,
        what=f"{name}'s rollout waiting on its failed canary alone",
    )
    assert state["state"] == "Progressing", state

    sim.set_healthy(canary, True)
    await all_verified(sim, nodes, name)
    await rollout_state(sim, name, "Complete")


# -- 3. a failed canary is replaced by the next node, never a silent wait ---------------------


async def test_a_failed_canary_under_the_threshold_is_replaced_by_the_next_node(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("replaced")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=5, gpus=1))
    canary, second, rest = nodes[0], nodes[1], nodes[2:]
    name = h.unique("replaced")
    rollout = {"maxUnavailable": 2, "canary": 1, "failureThreshold": 2}
    await h.add_policy(sim, policies, paced(name, pool=pool, **rollout))
    await start_operator("--device-plugin-namespace", namespace, "--mismatch-timeout", "3")
    await all_verified(sim, nodes, name)

    sim.set_healthy(canary, False)
    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})
    await h.wait_phase(sim, canary, "Mismatch")
    key = await all_verified(sim, nodes[1:], name, timeout=60)

    windows = {
        w.node: w
        for w in audit.unavailable_windows(control_plane, nodes, key=key, replicas=2, since=since)
    }
    assert windows[canary].start < windows[second].start, "the canary went first, and failed"
    assert all(windows[n].start >= windows[second].end for n in rest), (
        "the next node took the canary's place: alone, until Verified"
    )
    assert audit.most_at_once(windows.values()) <= 2
    state = await eventually(
        lambda: rollout_of(sim, name),
        until=lambda r: r.get("waitingOn") == [canary],
        timeout=30,
        what=f"{name}'s rollout waiting on its failed canary alone",
    )
    assert state["state"] == "Progressing" and canary in state["message"], state

    sim.set_healthy(canary, True)
    await all_verified(sim, nodes, name)
    await rollout_state(sim, name, "Complete")


# -- 7. a new policy over an idle pool has a canary and a budget too --------------------------


async def test_a_new_policy_over_an_idle_pool_changes_its_canary_first_then_under_budget(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("idle")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=8, gpus=1))
    await start_operator("--device-plugin-namespace", namespace, "--max-unavailable", "100%")

    since = time.time()
    name = h.unique("idle")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=2, canary=1))
    key = await all_verified(sim, nodes, name)

    windows = sorted(
        audit.unavailable_windows(control_plane, nodes, key=key, replicas=4, since=since),
        key=lambda w: w.start,
    )
    assert sorted(w.node for w in windows) == nodes  # one label write per node
    canary, rest = windows[0], windows[1:]
    assert canary.node == nodes[0]  # no pods anywhere: by name
    assert all(w.start >= canary.end for w in rest), "the canary changes alone, first"
    assert audit.most_at_once(windows) <= 2
    await rollout_state(sim, name, "Complete")

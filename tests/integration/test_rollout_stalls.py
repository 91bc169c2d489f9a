"""A rollout that cannot move says so, on the real control plane, and a new leader agrees.

Two nodes whose agents never follow a new config (``set_healthy(False)``) under
``maxUnavailable: 2``: with ``failureThreshold: 3`` they fail one after the other and then
fill the whole budget, though too few to halt the rollout by its threshold.  The rollout is
``Halted`` with ``BudgetHeldByFailedNodes`` (the condition, an Event, the metric), and once
no node has moved for ``progressDeadlineSeconds`` its ``Progressing`` condition turns False.
Both are derived from the cluster: the leader is killed (SIGKILL) while it stands still and
the new one says the same, measured from the same recorded time.  Which nodes changed is read
from the API server's audit log.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpushare_operator.core.stamps import epoch_of
from gpushare_testing import apiobjects as h
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import RunningOperator
from gpushare_testing.replicas import USERS, Replicas
from gpushare_testing.rolloutstate import all_verified, paced, rollout_state
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

DEADLINE = 12  # seconds: progressDeadlineSeconds, short enough to watch it pass


async def condition(sim: GpuClusterSimulator, name: str, kind: str) -> dict[str, Any]:
    return dict(h.condition((await h.get_policy(sim.client, name)).get("status"), kind))


async def stalled(operator: RunningOperator, policy: str) -> dict[str, float]:
    """``gpushare_rollout_stalled`` of one policy, by reason."""
    return {
        labels["reason"]: value
        for labels, value in await operator.labelled("gpushare_rollout_stalled")
        if labels.get("policy") == policy
    }


async def reports(operator: RunningOperator, policy: str, reason: str) -> None:
    """Wait for ``operator``'s /metrics to say ``reason`` stalls ``policy``.

    The metric is the status the operator last rendered, recorded once its write has come
    back: a scrape right after the condition reached the API server may still show the one
    before it.
    """
    await eventually(
        lambda: stalled(operator, policy),
        until=lambda s: s.get(reason) == 1,
        timeout=15,
        what=f"gpushare_rollout_stalled{{reason={reason!r}}} 1 on {operator.user}",
    )


async def events(sim: GpuClusterSimulator, name: str) -> list[dict[str, Any]]:
    return list(await h.events_about(sim.client, name))


async def test_failed_nodes_holding_the_budget_halt_the_rollout_and_its_deadline_passes(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: Callable[..., Awaitable[Replicas]],
) -> None:
    pool = h.unique("stall")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=5, gpus=1))
    broken = nodes[:2]  # by name: the canary, then the next node in line
    name = h.unique("stall")
    rollout = {
        "maxUnavailable": 2,
        "canary": 1,
        "failureThreshold": 3,
        "progressDeadlineSeconds": DEADLINE,
    }
    await h.add_policy(sim, policies, paced(name, pool=pool, **rollout))
    replicas = await start_replicas("--mismatch-timeout", "4")
    leader, follower = await replicas.roles()
    await all_verified(sim, nodes, name)

    for node in broken:
        sim.set_healthy(node, False)  # their agents will not follow the next config
    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 8})
    # The canary fails, the next node takes its place and fails too: two failures, under the
    # threshold of three, and both nodes hold the budget of two for good.
    halted = await rollout_state(sim, name, "Halted", timeout=90)
    assert (halted["failedNodes"], halted["updatedNodes"], halted["waitingNodes"]) == (2, 0, 3)
    assert halted["waitingOn"] == broken
    assert "hold the whole budget" in halted["message"]
    cond = await condition(sim, name, "RolloutHalted")
    assert (cond["status"], cond["reason"]) == ("True", "BudgetHeldByFailedNodes")
    assert all(node in cond["message"] for node in broken)
    first = replicas.running[leader]
    await reports(first, name, "BudgetHeldByFailedNodes")
    await eventually(
        lambda: events(sim, name),
        until=lambda seen: any(
            e["reason"] == "RolloutHalted" and "hold the whole budget" in e["message"] for e in seen
        ),
        what="a RolloutHalted Event saying the budget is held",
    )
    changed = audit.label_writes(control_plane, nodes, since=since, users=list(USERS.values()))
    assert sorted({node for _, node, _ in changed}) == broken, "only the two nodes changed"

    # Nothing moves: once the deadline has passed since the last move, Progressing is False.
    moved_at = halted["progressedAt"]
    exceeded = await eventually(
        lambda: condition(sim, name, "Progressing"),
        until=lambda c: c.get("reason") == "ProgressDeadlineExceeded",
        timeout=DEADLINE + 30,
        what="Progressing False with ProgressDeadlineExceeded",
    )
    assert exceeded["status"] == "False" and moved_at in exceeded["message"]
    passed = (epoch_of(exceeded["lastTransitionTime"]) or 0) - (epoch_of(moved_at) or 0)
    assert passed >= DEADLINE, f"it turned False {passed:.0f} s after the last move"
    await reports(first, name, "ProgressDeadlineExceeded")
    await eventually(
        lambda: events(sim, name),
        until=lambda seen: any(e["reason"] == "ProgressDeadlineExceeded" for e in seen),
        what="a ProgressDeadlineExceeded Event",
    )

    # A new leader reads the same from the cluster: the same halt, the same moment of the
    # last move, the deadline still passed (a new leader that remembered nothing would start
    # the clock again and say Progressing).
    first.proc.send_signal(signal.SIGKILL)
    assert await first.exited() == -signal.SIGKILL
    second = replicas.running[follower]
    await replicas.wait_holder(follower, timeout=30)
    await eventually(
        lambda: stalled(second, name),
        until=lambda s: s.get("BudgetHeldByFailedNodes") == 1,
        what=f"{follower} to see the held budget",
    )
    await reports(second, name, "ProgressDeadlineExceeded")
    kept = (await h.get_policy(sim.client, name))["status"]["rollout"]
    assert kept["progressedAt"] == moved_at and kept["state"] == "Halted"

    # One failed node recovers: the rollout resumes by itself and says it progresses.
    sim.set_healthy(broken[1], True)
    await eventually(
        lambda: condition(sim, name, "Progressing"),
        until=lambda c: (c.get("status"), c.get("reason")) == ("True", "NodesChanging"),
        timeout=60,
        what="Progressing True again",
    )
    sim.set_healthy(broken[0], True)
    key = await all_verified(sim, nodes, name, timeout=180)
    await rollout_state(sim, name, "Complete")
    assert (await condition(sim, name, "RolloutHalted"))["status"] == "False"
    assert await stalled(second, name) == {
        "FailureThresholdReached": 0,
        "BudgetHeldByFailedNodes": 0,
        "ProgressDeadlineExceeded": 0,
    }
    windows = audit.unavailable_windows(
        control_plane, nodes, key=key, replicas=8, since=since, users=list(USERS.values())
    )
    assert audit.most_at_once(windows) <= 2

"""Safe rollouts on the real control plane: budgets, the canary, halting, pods, cordon, deletion.

The simulator plays the device plugin's restart window (allocatable 0 for 2 s) and GFD; every
claim about how many nodes changed at once is read from the API server's audit log
(``gpushare_testing.rolloutaudit``), never from the operator's own account.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections.abc import Awaitable, Callable

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import create_until_accepted
from gpushare_testing.gpupods import create, create_pod, delete_pod, small_pod
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.quiet import quiet
from gpushare_testing.replicas import USERS, Replicas
from gpushare_testing.rolloutstate import (
    all_verified,
    paced,
    rollout_metrics,
    rollout_state,
)
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

TAINT = "gpushare.dev/reconfiguring"


async def reasons(sim: GpuClusterSimulator, name: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in await h.events_about(sim.client, name)]


async def test_twenty_nodes_change_canary_first_then_never_more_than_four_at_once(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("fleet")
    # The canary alone, then nineteen nodes under a budget of four: enough to use the budget
    # and show it is never exceeded (forty nodes proved the same in twice the time).
    nodes = await sim.create_gpu_nodes(pool=pool, count=20, gpus=2)
    name = h.unique("fleet")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=4, canary=1))
    await start_operator("--device-plugin-namespace", namespace, "--max-unavailable", "100%")
    first = await all_verified(sim, nodes, name)  # new nodes: configured at once

    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})
    key = await all_verified(sim, nodes, name, timeout=300)
    assert key != first

    windows = sorted(
        audit.unavailable_windows(control_plane, nodes, key=key, replicas=2, since=since),
        key=lambda w: w.start,
    )
    assert sorted(w.node for w in windows) == sorted(nodes)  # one label write per node
    assert audit.most_at_once(windows) == 4  # the budget, used and never exceeded
    canary, rest = windows[0], windows[1:]
    assert canary.node == sorted(nodes)[0]  # no pods anywhere: by name
    assert all(w.start >= canary.end for w in rest), "the canary changes alone, first"
    rollout = await rollout_state(sim, name, "Complete")
    assert (rollout["updatedNodes"], rollout["totalNodes"], rollout["progress"]) == (
        20,
        20,
        "20/20",
    )
    assert rollout["generation"] == 2 and rollout["completedAt"] >= rollout["startedAt"]
    # The Events are posted on their own, after the status that says Complete: wait for them.
    await eventually(
        lambda: reasons(sim, name),
        until=lambda seen: (
            {("Normal", "RolloutStarted"), ("Normal", "RolloutComplete")} <= set(seen)
        ),
        what="RolloutStarted and RolloutComplete Events",
    )


async def test_a_failed_canary_halts_the_rollout_until_the_node_recovers(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("canary")
    nodes = await sim.create_gpu_nodes(pool=pool, count=6, gpus=1)
    canary = sorted(nodes)[0]
    name = h.unique("canary")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=2, canary=1))
    operator = await start_operator(
        "--device-plugin-namespace",
        namespace,
        "--mismatch-timeout",
        "4",
        "--max-unavailable",
        "100%",
    )
    await all_verified(sim, nodes, name)

    sim.set_healthy(canary, False)  # its agents will not follow the next config
    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})
    rollout = await rollout_state(sim, name, "Halted", timeout=60)
    assert (rollout["failedNodes"], rollout["updatedNodes"]) == (1, 0)
    halted = h.condition((await h.get_policy(sim.client, name))["status"], "RolloutHalted")
    assert halted["status"] == "True" and canary in halted["message"]
    # A rollout that went on would have changed more nodes before the operator fell quiet.
    await quiet(control_plane, [operator], namespace=namespace)
    changed = audit.label_writes(control_plane, nodes, since=since)
    assert [node for _, node, _ in changed] == [canary], "exactly the canary changed"
    assert ("Warning", "RolloutHalted") in await reasons(sim, name)
    steps = await rollout_metrics(operator, name)
    assert (steps["failed"], steps["updated"], steps["waiting"]) == (1, 0, len(nodes) - 1)
    others = [await h.node_state(sim.client, n) for n in sorted(nodes)[1:]]
    assert {h.condition(s["status"], "Ready")["reason"] for s in others if s} == {"RolloutHalted"}

    sim.set_healthy(canary, True)  # the node recovers: the rollout resumes by itself
    key = await all_verified(sim, nodes, name, timeout=120)
    await rollout_state(sim, name, "Complete")
    windows = audit.unavailable_windows(control_plane, nodes, key=key, replicas=2, since=since)
    assert sorted(w.node for w in windows) == sorted(nodes)
    assert audit.most_at_once(windows) <= 2


async def test_wait_for_pods_keeps_a_node_whose_pods_would_not_fit(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pods")
    busy, idle = sorted(await sim.create_gpu_nodes(pool=pool, count=2, gpus=1))
    name = h.unique("pods")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=2, canary=0))
    await start_operator("--device-plugin-namespace", namespace, "--max-unavailable", "100%")
    old = await all_verified(sim, [busy, idle], name)
    await create_pod(sim, pods_ns, "holds-three", busy, count=3)  # 3 of its 4 slots
    await eventually(
        lambda: h.node_state(sim.client, busy),
        until=lambda s: (s or {}).get("status", {}).get("slots", {}).get("allocated") == 3,
        what="the pod's slots counted",
    )

    await h.patch_policy(sim.client, name, {"replicas": 2})  # 2 slots: the pod does not fit
    new = await all_verified(sim, [idle], name)
    waiting = await eventually(
        lambda: h.node_state(sim.client, busy),
        until=lambda s: (
            h.condition((s or {}).get("status"), "Ready").get("reason") == "WaitingForPods"
        ),
        what=f"{busy} waiting for its pods",
    )
    assert (
        "pods hold 3 nvidia.com/gpu; the new config has 2"
        in h.condition(waiting["status"], "Ready")["message"]
    )
    await rollout_state(sim, name, "WaitingForPods")
    labels = (await h.node(sim.client, busy))["metadata"]["labels"]
    assert labels[h.CONFIG_LABEL] == old  # keeps its config while the pod runs

    await delete_pod(sim, pods_ns, "holds-three")
    await all_verified(sim, [busy, idle], name)
    assert (await h.node(sim.client, busy))["metadata"]["labels"][h.CONFIG_LABEL] == new
    await rollout_state(sim, name, "Complete")


async def test_cordon_taints_each_node_during_its_change_and_keeps_other_taints_in_order(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("cordon")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=3, gpus=1))
    theirs = [
        {"key": "example.com/maintenance", "value": "planned", "effect": "PreferNoSchedule"},
        {"key": "example.com/dedicated", "value": "ml", "effect": "NoSchedule"},
    ]
    for node in nodes:  # another manager's taints, set beforehand
        await h.ok(
            sim.client,
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"spec": {"taints": theirs}},
        )
    name = h.unique("cordon")
    # Proceed: the pods the scheduler places meanwhile must not hold a node's change back.
    body = paced(
        name, pool=pool, maxUnavailable=1, canary=0, cordonDuringChange=True, podPolicy="Proceed"
    )
    await h.add_policy(sim, policies, body)
    await start_operator("--device-plugin-namespace", namespace, "--max-unavailable", "100%")
    await all_verified(sim, nodes, name)

    since = time.time()
    submitting = asyncio.create_task(submit_gpu_pods(sim, pods_ns, pool=pool, every=0.3))
    try:
        await h.patch_policy(sim.client, name, {"replicas": 2})
        key = await all_verified(sim, nodes, name)
    finally:
        submitting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await submitting
    await eventually(
        lambda: asyncio.gather(*(h.node(sim.client, n) for n in nodes)),
        until=lambda bodies: all(b["spec"].get("taints") == theirs for b in bodies),
        what="every node's taints back to exactly theirs, in their order",
    )
    taints = audit.taint_writes(control_plane, nodes, since=since)
    labels = audit.label_writes(control_plane, nodes, since=since, key=key)
    windows = {
        w.node: w
        for w in audit.unavailable_windows(control_plane, nodes, key=key, replicas=2, since=since)
    }
    for node in nodes:
        mine = [(when, patch) for when, n, patch in taints if n == node]
        assert len(mine) == 2, mine  # on once, off once
        (on, add), (off, remove) = mine
        [labelled] = [when for when, n, _ in labels if n == node]
        assert on <= labelled <= windows[node].end <= off  # around the whole change
        assert add[-1] == {
            "op": "add",
            "path": "/spec/taints/-",
            "value": {"key": TAINT, "effect": "NoSchedule"},
        }
        assert add[0] == {"op": "test", "path": "/spec/taints", "value": theirs}
        assert [op["op"] for op in remove] == ["test", "remove"]
    # kube-scheduler placed pods in the pool meanwhile, and none on a node while it was tainted
    # (allowing its watch a moment to deliver the taint).
    bindings = audit.bindings(control_plane, nodes, since=since)
    assert bindings, "the scheduler placed pods during the rollout"
    for when, node in bindings:
        (on, _), (off, _) = [(t, p) for t, n, p in taints if n == node]
        assert not on + SCHEDULER_LAG < when < off, (node, when - on, off - when)


SCHEDULER_LAG = 0.5  # seconds for kube-scheduler's informer to see a new taint


async def submit_gpu_pods(
    sim: GpuClusterSimulator, namespace: str, *, pool: str, every: float
) -> None:
    """One pod a GPU slot every ``every`` seconds, for the pool's nodes (tolerating the other
    manager's taint, not ours), until cancelled."""
    for index in itertools.count():
        body = small_pod(f"during-{index}", gpus=1, selector={"pool": pool})
        body["spec"]["tolerations"] = [
            {"key": "example.com/dedicated", "operator": "Equal", "value": "ml"}
        ]
        await create(sim, namespace, body)
        await asyncio.sleep(every)  # paces the load: one pod every `every` seconds


async def test_deleting_a_policy_releases_its_nodes_under_budget_and_the_finalizer_goes_last(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("gone")
    nodes = await sim.create_gpu_nodes(pool=pool, count=6, gpus=1)
    name = h.unique("gone")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=2))
    await start_operator(
        "--device-plugin-namespace",
        namespace,
        "--max-unavailable",
        "100%",
        "--policy-status-max-delay",
        "1",  # status while its nodes are still changing
    )
    await all_verified(sim, nodes, name)
    body = await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: "gpushare.dev/release-nodes" in (b["metadata"].get("finalizers") or ()),
        what="our finalizer on the policy",
    )
    assert body["metadata"]["finalizers"] == ["gpushare.dev/release-nodes"]

    since = time.time()
    await h.delete_policy(sim.client, name)
    releasing = await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: h.condition(b.get("status"), "Deleting").get("status") == "True",
        what="the release shown on the policy",
    )
    assert (
        "still carry this policy's config"
        in h.condition(releasing["status"], "Deleting")["message"]
    )
    await eventually(
        lambda: sim.client.get(f"{h.API}/gpusharingpolicies/{name}"),
        until=lambda answer: answer[0] == 404,
        timeout=120,
        what="the policy gone",
    )
    for node in nodes:
        labels = (await h.node(sim.client, node))["metadata"]["labels"]
        assert h.CONFIG_LABEL not in labels and h.POLICY_LABEL not in labels
    removals = audit.label_writes(control_plane, nodes, since=since)
    assert sorted(n for _, n, key in removals if key is None) == sorted(nodes)
    settled = audit.release_windows(control_plane, nodes, since=since)
    assert audit.most_at_once(settled) <= 2
    finalizer = audit.finalizer_writes(control_plane, name, since=since)
    assert len(finalizer) == 1 and finalizer[0] >= max(w.start for w in settled)


async def test_a_new_leader_continues_the_rollout_within_its_budget(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: Callable[[], Awaitable[Replicas]],
) -> None:
    pool = h.unique("handover")
    nodes = await sim.create_gpu_nodes(pool=pool, count=12, gpus=1)
    name = h.unique("handover")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=2, canary=1))
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    await all_verified(sim, nodes, name)
    users = list(USERS.values())

    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})
    await eventually(
        lambda: asyncio.sleep(
            0, audit.label_writes(control_plane, nodes, since=since, users=users)
        ),
        until=lambda writes: len(writes) >= 4,
        timeout=90,
        what="the rollout under way",
    )
    dying = replicas.running[leader]
    dying.proc.send_signal(signal.SIGKILL)  # mid-rollout: some nodes still restarting
    assert await dying.exited() == -signal.SIGKILL
    key = await all_verified(sim, nodes, name, timeout=180)

    windows = audit.unavailable_windows(
        control_plane, nodes, key=key, replicas=2, since=since, users=users
    )
    assert sorted(w.node for w in windows) == sorted(nodes)  # each node changed exactly once
    assert audit.most_at_once(windows) <= 2
    by_new = audit.label_writes(control_plane, nodes, since=since, users=[USERS[follower]])
    assert by_new, "the new leader carried the rollout on"


async def test_a_new_leader_keeps_the_last_good_spec_of_a_broken_policy(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    relaxed_crd: None,
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("kept")
    nodes = await sim.create_gpu_nodes(pool=pool, count=3, gpus=1)
    body = h.policy(h.unique("kept"), pool=pool, replicas=4)
    name = body["metadata"]["name"]
    try:
        await create_until_accepted(sim.client, body)
        first = await start_operator("--device-plugin-namespace", namespace)
        key = await all_verified(sim, nodes, name)
        await h.patch_policy(sim.client, name, {"replicas": 100})  # the relaxed CRD allows it
        broken = await eventually(
            lambda: h.get_policy(sim.client, name),
            until=lambda b: h.condition(b.get("status"), "Ready").get("reason") == "InvalidSpec",
            what="InvalidSpec",
        )
        applied = broken["status"]["appliedSpec"]
        assert applied["generation"] == 1 and applied["spec"]["replicas"] == 4
        first.stop()  # hands the Lease back: the next one leads at once

        restarted = time.time()
        second = await start_operator("--device-plugin-namespace", namespace)  # API only
        await eventually(second.leader_gauge, until=lambda v: v == 1, what="the new one leading")
        await quiet(control_plane, [second], namespace=namespace)  # a release would show by now
        for node in nodes:
            labels = (await h.node(sim.client, node))["metadata"]["labels"]
            assert (labels[h.CONFIG_LABEL], labels[h.POLICY_LABEL]) == (key, name)
        assert audit.label_writes(control_plane, nodes, since=restarted) == []
        status = (await h.get_policy(sim.client, name))["status"]
        assert "generation 1 stays in force" in h.condition(status, "Ready")["message"]
        assert status["appliedSpec"]["generation"] == 1 and status["configKey"] == key
    finally:
        await h.delete_policy(sim.client, name)

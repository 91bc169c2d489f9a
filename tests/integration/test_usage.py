"""End to end: GPU-sharing usage from Pods, published on GPUNodeStates and policies.

Each pod is created already bound (``spec.nodeName``, as the scheduler's binding leaves it); the
simulated kubelet admits it against what its node offers at that moment and runs it, or rejects
it (``Failed``) as the real one would.  Pods finish when a test patches their phase through the
status subresource, as kubelet would report it.  Pods are deleted with
``gracePeriodSeconds=0``, so that they go at once (the simulated kubelet would otherwise stop
them after their grace period, as the real one does).  The operator runs as a child process;
the simulator plays the NVIDIA agents on its nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import podbodies
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import (
    bind,
    create_pod,
    delete_pod,
    node_state,
    node_usage,
    read_pod,
    set_phase,
    wait_node_usage,
)
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.quiet import quiet
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
# Passes the CRD's resourceName rule and the device plugin's (nvidia.com/ + a DNS subdomain),
# and no policy in the cluster advertises it until the test creates one.
MIG = "nvidia.com/mig-1g.10gb"


# -- what the operator publishes -------------------------------------------------------------


async def wait_verified(sim: GpuClusterSimulator, *nodes: str) -> None:
    """Wait until the operator verified each node: its device plugin serves the new config, so
    that kubelet admits pods there again (it rejects them while the plugin restarts)."""
    for node in nodes:
        await eventually(
            functools.partial(node_state, sim, node),
            until=lambda s: s.get("status", {}).get("phase") == "Verified",
            what=f"{node} to be Verified",
        )


async def wait_policy_slots(
    sim: GpuClusterSimulator, name: str, *, allocated: int, capacity: int | None = None
) -> dict[str, Any]:
    def matches(body: dict[str, Any]) -> bool:
        slots = (body.get("status") or {}).get("slots") or {}
        return slots.get("allocated") == allocated and (
            capacity is None or slots.get("capacity") == capacity
        )

    return await eventually(
        lambda: h.get_policy(sim.client, name),
        until=matches,
        what=f"{name} to show {allocated} slots allocated (capacity {capacity})",
    )


async def expect(
    sim: GpuClusterSimulator,
    *,
    nodes: dict[str, tuple[int, int]],
    policies: dict[str, int],
) -> None:
    """Every listed GPUNodeState shows (allocated, pods) and every policy its allocation."""
    for node, (allocated, pods) in nodes.items():
        await wait_node_usage(sim, node, allocated, pods)
    for policy, allocated in policies.items():
        await wait_policy_slots(sim, policy, allocated=allocated)


def status_writes(plane: ControlPlane, name: str, *, resource: str = "gpunodestates") -> int:
    """The operator's status writes to one object so far, from the audit log."""
    return sum(
        1
        for event in h.operator_writes(plane)
        if event["objectRef"].get("resource") == resource
        and event["objectRef"].get("subresource") == "status"
        and event["objectRef"].get("name") == name
        and event["verb"] == "patch"
    )


async def phase_reached(
    sim: GpuClusterSimulator, namespace: str, names: list[str], phase: str, *, since: str
) -> None:
    """Until a watch from ``since`` has seen each of ``names`` reach ``phase``: the API server
    has then sent those events to every watcher of pods, the operator's included."""
    waiting = set(names)
    params = {"resourceVersion": since}
    path = f"/api/v1/namespaces/{namespace}/pods"
    async with contextlib.aclosing(sim.client.watch(path, params=params)) as events:
        async for event in events:
            pod = event["object"]
            if pod.get("status", {}).get("phase") == phase:
                waiting.discard(pod["metadata"]["name"])
            if not waiting:
                return
    raise AssertionError(f"the watch ended before {sorted(waiting)} reached {phase}")


# -- the tests -------------------------------------------------------------------------------


async def test_pods_are_counted_through_their_whole_life(
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    n0, n1 = await sim.create_gpu_nodes(pool=pool, count=2, gpus=2)
    policy = h.unique("ts")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=4))
    await start_operator("--device-plugin-namespace", namespace)
    body = await wait_policy_slots(sim, policy, allocated=0, capacity=16)
    assert body["status"]["gpus"] == 4
    await expect(sim, nodes={n0: (0, 0), n1: (0, 0)}, policies={policy: 0})
    await wait_verified(sim, n0, n1)

    # Bound at creation: it holds its slots from then on, Pending or (once kubelet ran it)
    # Running.
    await create_pod(sim, pods_ns, "a", n0, count=2)
    await expect(sim, nodes={n0: (2, 1), n1: (0, 0)}, policies={policy: 2})

    # An init container asking for more than the app containers: it decides (3, not 1).
    await create_pod(sim, pods_ns, "b", n0, count=1, init_count=3)
    await expect(sim, nodes={n0: (5, 2)}, policies={policy: 5})
    # A sidecar declared after the init container adds to the steady state only:
    # max(init 1, app 1 + sidecar 2) = 3.
    await create_pod(sim, pods_ns, "c", n1, count=1, init_count=1, sidecar_count=2)
    await expect(sim, nodes={n0: (5, 2), n1: (3, 1)}, policies={policy: 8})

    # Neither a pod asking for a resource the policy does not advertise, nor a CPU-only pod,
    # nor an unscheduled one counts.  (Kubelet runs the first: n1 lists no such resource, and
    # kubelet drops the requests of extended resources its node does not list.)
    await create_pod(sim, pods_ns, "other-resource", n1, resource=SHARED, count=4)
    plain = podbodies.plain_pod(name="web", node=n1, namespace=pods_ns, managed_fields=False)
    manifest = {"metadata": {"name": "web"}, "spec": plain["spec"]}
    await h.ok(sim.client, "POST", f"/api/v1/namespaces/{pods_ns}/pods", manifest)
    await create_pod(sim, pods_ns, "unscheduled", None, count=1)
    # kube-scheduler leaves it Pending: the PersistentVolumeClaim it mounts does not exist.
    unscheduled = await eventually(
        lambda: read_pod(sim, pods_ns, "unscheduled"),
        until=lambda p: any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in p["status"].get("conditions") or ()
        ),
        what="kube-scheduler to find no node for the pod",
    )
    assert "nodeName" not in unscheduled["spec"]
    await expect(sim, nodes={n0: (5, 2), n1: (3, 1)}, policies={policy: 8})
    # Bound as the scheduler binds (the binding subresource): now it holds a slot on n1.
    await bind(sim, pods_ns, "unscheduled", n1)
    await expect(sim, nodes={n0: (5, 2), n1: (4, 2)}, policies={policy: 9})

    # Completing and failing release the slots (the pods still exist, finished).
    await set_phase(sim, pods_ns, "a", "Succeeded")
    await expect(sim, nodes={n0: (3, 1), n1: (4, 2)}, policies={policy: 7})
    await set_phase(sim, pods_ns, "b", "Failed")
    await expect(sim, nodes={n0: (0, 0), n1: (4, 2)}, policies={policy: 4})
    status, _ = await sim.client.get(f"/api/v1/namespaces/{pods_ns}/pods/a")
    assert status == 200

    # Deleting a running pod releases its slots; deleting a finished one changes nothing.
    assert (await read_pod(sim, pods_ns, "c"))["status"]["phase"] == "Running"
    await delete_pod(sim, pods_ns, "c")
    await delete_pod(sim, pods_ns, "a")
    await expect(sim, nodes={n0: (0, 0), n1: (1, 1)}, policies={policy: 1})
    await delete_pod(sim, pods_ns, "unscheduled")
    body = await wait_policy_slots(sim, policy, allocated=0, capacity=16)
    assert body["status"]["slotsSummary"] == "0/16"
    await wait_node_usage(sim, n1, 0, 0)


async def test_rename_by_default_counts_the_shared_resource(
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    policy = h.unique("ts")
    # Pods of a resource the config stops advertising would hold the change back (the default
    # podPolicy, WaitForPods): this test is about counting them while it goes ahead.
    rollout = {**h.UNPACED, "podPolicy": "Proceed"}
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=4, rollout=rollout))
    await create_pod(sim, pods_ns, "plain-gpu", node, resource=GPU, count=2)
    await create_pod(sim, pods_ns, "shared-a", node, resource=SHARED, count=1)
    await create_pod(sim, pods_ns, "shared-b", node, resource=SHARED, count=2)
    await start_operator("--device-plugin-namespace", namespace)
    await expect(sim, nodes={node: (2, 1)}, policies={policy: 2})

    await h.patch_policy(sim.client, policy, {"renameByDefault": True})
    await expect(sim, nodes={node: (3, 2)}, policies={policy: 3})
    # The simulated device plugin now advertises the renamed resource, as the real one would.
    advertised = await eventually(
        lambda: h.node(sim.client, node),
        until=lambda n: n["status"]["capacity"].get(SHARED) == "8",
        what="nvidia.com/gpu.shared capacity",
    )
    assert advertised["status"]["capacity"][GPU] == "0"

    # New pods of either kind: only the shared one counts now.  Kubelet rejects the other: the
    # plugin no longer serves nvidia.com/gpu, which kubelet still lists, with no device.
    await create_pod(sim, pods_ns, "plain-gpu-2", node, resource=GPU, count=1)
    await create_pod(sim, pods_ns, "shared-c", node, resource=SHARED, count=1)
    await expect(sim, nodes={node: (4, 3)}, policies={policy: 4})
    rejected = await eventually(
        lambda: read_pod(sim, pods_ns, "plain-gpu-2"),
        until=lambda p: p["status"].get("phase") == "Failed",
        what="kubelet to reject plain-gpu-2",
    )
    assert rejected["status"]["reason"] == "UnexpectedAdmissionError"

    # Back to nvidia.com/gpu: the pod that runs counts again; the rejected one never will.
    await h.patch_policy(sim.client, policy, {"renameByDefault": False})
    await expect(sim, nodes={node: (2, 1)}, policies={policy: 2})


async def test_relabelled_node_takes_its_allocation_to_the_other_policy(
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool_a, pool_b = h.unique("a"), h.unique("b")
    [moving] = await sim.create_gpu_nodes(pool=pool_a, count=1, gpus=2)
    [staying] = await sim.create_gpu_nodes(pool=pool_b, count=1, gpus=2)
    plain, shared = h.unique("plain"), h.unique("shared")
    # The moving node's pods hold slots the other config does not advertise, which would hold
    # the move back (podPolicy WaitForPods): this test is about where its slots are counted.
    proceed = {**h.UNPACED, "podPolicy": "Proceed"}
    await h.add_policy(sim, policies, h.policy(plain, pool=pool_a, replicas=4, rollout=proceed))
    await h.add_policy(
        sim,
        policies,
        h.policy(shared, pool=pool_b, replicas=2, renameByDefault=True, rollout=proceed),
    )
    await start_operator("--device-plugin-namespace", namespace)
    await wait_verified(sim, moving, staying)
    await create_pod(sim, pods_ns, "g", moving, resource=GPU, count=3)
    await create_pod(sim, pods_ns, "s", moving, resource=SHARED, count=1)
    await create_pod(sim, pods_ns, "s2", staying, resource=SHARED, count=2)
    await expect(sim, nodes={moving: (3, 1), staying: (2, 1)}, policies={plain: 3, shared: 2})
    await wait_policy_slots(sim, plain, allocated=3, capacity=8)

    await sim.relabel(moving, {"pool": pool_b})
    state = await wait_node_usage(sim, moving, 1, 1)
    assert state["status"]["policy"] == shared
    assert state["status"]["slots"]["capacity"] == 4  # 2 GPUs x 2 replicas now
    await expect(sim, nodes={staying: (2, 1)}, policies={plain: 0, shared: 3})
    await wait_policy_slots(sim, plain, allocated=0, capacity=0)
    await wait_policy_slots(sim, shared, allocated=3, capacity=8)

    # Into no pool at all: nobody governs it, nobody counts its pods.
    await sim.relabel(moving, {"pool": None})
    state = await eventually(
        lambda: node_state(sim, moving),
        until=lambda s: s.get("status", {}).get("phase") == "Unmanaged",
        what=f"{moving} to be Unmanaged",
    )
    assert node_usage(state) == (0, 0)
    await expect(sim, nodes={}, policies={plain: 0, shared: 2})


async def test_lowering_replicas_below_the_allocation_is_overcommitted(
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=1)
    policy = h.unique("ts")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=4))
    await start_operator("--device-plugin-namespace", namespace)
    await wait_verified(sim, node)
    for name in ("a", "b", "c"):
        await create_pod(sim, pods_ns, name, node, count=1)
    await expect(sim, nodes={node: (3, 3)}, policies={policy: 3})
    body = await wait_policy_slots(sim, policy, allocated=3, capacity=4)
    assert h.condition(body["status"], "Overcommitted")["status"] == "False"
    state = await node_state(sim, node)
    assert h.condition(state.get("status"), "Overcommitted")["status"] == "False"

    await h.patch_policy(sim.client, policy, {"replicas": 2})
    body = await wait_policy_slots(sim, policy, allocated=3, capacity=2)
    over = h.condition(body["status"], "Overcommitted")
    assert (over["status"], over["reason"]) == ("True", "AllocationExceedsCapacity")
    assert "3" in over["message"] and "2" in over["message"]
    state = await eventually(
        lambda: node_state(sim, node),
        until=lambda s: h.condition(s.get("status"), "Overcommitted").get("status") == "True",
        what=f"{node} to be Overcommitted",
    )
    slots = state["status"]["slots"]
    assert (slots["capacity"], slots["allocated"]) == (2, 3)
    events = await eventually(
        lambda: h.events_about(sim.client, policy),
        until=lambda es: any(e["reason"] == "Overcommitted" for e in es),
        what="an Overcommitted event about the policy",
    )
    event = next(e for e in events if e["reason"] == "Overcommitted")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "GPUSharingPolicy"
    assert event["involvedObject"]["uid"] == body["metadata"]["uid"]
    node_events = await eventually(
        lambda: h.events_about(sim.client, node),
        until=lambda es: any(e["reason"] == "Overcommitted" for e in es),
        what="an Overcommitted event about the node",
    )
    assert {e["involvedObject"]["kind"] for e in node_events if e["reason"] == "Overcommitted"} == {
        "Node"
    }

    # Pods finishing bring the allocation back within capacity: the condition clears.
    await set_phase(sim, pods_ns, "a", "Succeeded")
    body = await wait_policy_slots(sim, policy, allocated=2, capacity=2)
    over = h.condition(body["status"], "Overcommitted")
    assert (over["status"], over["reason"]) == ("False", "WithinCapacity")
    state = await wait_node_usage(sim, node, 2, 2)
    assert h.condition(state["status"], "Overcommitted")["status"] == "False"


async def test_a_new_resource_name_counts_pods_that_already_exist(
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("mig")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    # Listed at startup while no policy advertises the resource: skipped at ingest.
    await create_pod(sim, pods_ns, "early", node, resource=MIG, count=2)
    running = await start_operator("--device-plugin-namespace", namespace)
    # Seen through the watch, still skipped.
    seen = await running.events_ingested("Pod")
    await create_pod(sim, pods_ns, "later", node, resource=MIG, count=1)
    await create_pod(sim, pods_ns, "shared", node, resource=SHARED, count=1)
    await eventually(
        lambda: running.events_ingested("Pod"),
        until=lambda count: count >= seen + 2,
        what="the operator to see both pods through its watch",
    )

    policy = h.unique("mig")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=4, resourceName=MIG))
    await expect(sim, nodes={node: (3, 2)}, policies={policy: 3})
    relists = [
        line
        for line in running.log_lines()
        if line.get("event") == "re-list requested" and line.get("kind") == "Pod"
    ]
    assert len(relists) == 1, relists

    # From then on, the watch keeps them counted.
    await create_pod(sim, pods_ns, "after", node, resource=MIG, count=1)
    await expect(sim, nodes={node: (4, 3)}, policies={policy: 4})
    await delete_pod(sim, pods_ns, "early")
    await expect(sim, nodes={node: (2, 2)}, policies={policy: 2})


# No simulated kubelet: the test writes the phases itself, to make each change a burst of 20.
@pytest.mark.simulator(run_pods=False)
async def test_a_burst_of_pod_events_is_few_status_writes(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=8)
    policy = h.unique("ts")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=4))
    names = [f"burst-{index:02d}" for index in range(20)]
    await asyncio.gather(*(create_pod(sim, pods_ns, name, node) for name in names))
    operator = await start_operator("--device-plugin-namespace", namespace)  # default write rate
    await expect(sim, nodes={node: (20, 20)}, policies={policy: 20})
    await eventually(
        lambda: node_state(sim, node),
        until=lambda s: s.get("status", {}).get("phase") == "Verified",
        what=f"{node} to be Verified",
    )
    await eventually(
        lambda: h.get_policy(sim.client, policy),
        until=lambda b: (b.get("status") or {}).get("verifiedNodes") == 1,
        what=f"{policy} to count the node verified",
    )
    # Nothing is left to write once it is quiet; any write after that would be a stray one.
    await quiet(control_plane, [operator], namespace=namespace)

    # Pending -> Running changes no published number: no write at all.
    before = status_writes(control_plane, node)
    policy_before = status_writes(control_plane, policy, resource="gpusharingpolicies")
    seen = await operator.events_ingested("Pod")
    await asyncio.gather(*(set_phase(sim, pods_ns, name, "Running") for name in names))
    await eventually(
        lambda: operator.events_ingested("Pod"),
        until=lambda count: count >= seen + len(names),
        what="the operator to see every pod Running",
    )
    await quiet(control_plane, [operator], namespace=namespace)
    assert status_writes(control_plane, node) == before
    assert status_writes(control_plane, policy, resource="gpusharingpolicies") == policy_before

    # Running -> Succeeded for all 20, each changing the allocation.  The operator is frozen
    # until the API server has sent the whole burst out (a watch of our own saw all 20), so it
    # reaches the operator together: on a loaded machine the API server alone spreads 20
    # commits over half a second, and a spread-out burst is fairly several writes.  What is
    # measured is the writer's coalescing, not the API server's pace.
    listed = await h.ok(sim.client, "GET", f"/api/v1/namespaces/{pods_ns}/pods")
    sent = asyncio.create_task(
        phase_reached(sim, pods_ns, names, "Succeeded", since=listed["metadata"]["resourceVersion"])
    )
    operator.proc.send_signal(signal.SIGSTOP)
    try:
        await asyncio.gather(*(set_phase(sim, pods_ns, name, "Succeeded") for name in names))
        await asyncio.wait_for(sent, timeout=30)
    finally:
        operator.proc.send_signal(signal.SIGCONT)
        sent.cancel()
    await expect(sim, nodes={node: (0, 0)}, policies={policy: 0})
    await quiet(control_plane, [operator], namespace=namespace)
    writes = status_writes(control_plane, node) - before
    # Why one: a pod event only marks the node dirty.  The writer lets a burst settle for 0.2 s
    # after waking, renders the node from the ledger, and renders it again once it holds a
    # write token, so the write carries every event that arrived before it.  Two allows for
    # the operator's watch getting the last events a moment after ours; one write per event
    # would be 20.
    assert 1 <= writes <= 2, f"{writes} GPUNodeState status writes for 20 pod events"
    policy_writes = status_writes(control_plane, policy, resource="gpusharingpolicies") - (
        policy_before
    )
    assert 1 <= policy_writes <= 2, f"{policy_writes} policy status writes for 20 pod events"

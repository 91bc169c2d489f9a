"""Pods on simulated GPU nodes, placed by the real kube-scheduler and run by the simulated kubelet.

The control plane runs kube-scheduler (as ``system:kube-scheduler``); the simulator admits the
pods bound to its nodes as kubelet does (``testing/podadmission.py``) and writes their status.
No operator runs here: these are the cluster's own behaviours that the operator lives with.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpushare_testing import apiobjects as h
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create, read, small_pod
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

GPU = "nvidia.com/gpu"
CONFIGMAP = "gpushare-device-plugin-configs"
TAINT = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase"))


def scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    """The PodScheduled condition, or {} while there is none."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c["type"] == "PodScheduled"), {})


async def wait_phase(
    sim: GpuClusterSimulator, namespace: str, name: str, wanted: str
) -> dict[str, Any]:
    return await eventually(
        lambda: read(sim, namespace, name),
        until=lambda p: phase(p) == wanted,
        what=f"pod {name} to be {wanted}",
    )


async def wait_unschedulable(sim: GpuClusterSimulator, namespace: str, name: str) -> dict[str, Any]:
    return await eventually(
        lambda: read(sim, namespace, name),
        until=lambda p: scheduled(p).get("reason") == "Unschedulable",
        what=f"the scheduler to find no node for {name}",
    )


async def test_the_scheduler_places_a_gpu_pod_where_there_are_gpus_and_it_runs(
    control_plane: ControlPlane, sim: GpuClusterSimulator, pods_ns: str
) -> None:
    pool = h.unique("sched")
    [cpu_only] = await sim.create_gpu_nodes(pool=pool, count=1, prefix=f"{pool}-cpu", gpus=0)
    [gpu_node] = await sim.create_gpu_nodes(pool=pool, count=1, prefix=f"{pool}-gpu", gpus=2)
    await create(sim, pods_ns, small_pod("trainer", gpus=1, selector={"pool": pool}))

    running = await wait_phase(sim, pods_ns, "trainer", "Running")
    assert running["spec"]["nodeName"] == gpu_node != cpu_only
    status = running["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    [container] = status["containerStatuses"]
    assert container["ready"] and "running" in container["state"]
    assert status["hostIP"] and status["podIP"]
    # Bound by kube-scheduler under its own identity, the status written as kubelet.
    writes = [
        (e["user"]["username"], e["objectRef"].get("subresource"))
        for e in control_plane.audit_events()
        if e["objectRef"].get("resource") == "pods"
        and e["objectRef"].get("name") == "trainer"
        and e["objectRef"].get("namespace") == pods_ns
        and e["verb"] in ("create", "patch")
    ]
    assert ("system:kube-scheduler", "binding") in writes
    managers = {m["manager"] for m in running["metadata"]["managedFields"]}
    assert "kubelet" in managers


async def test_a_pod_asking_for_more_gpus_than_any_node_has_stays_pending(
    sim: GpuClusterSimulator, pods_ns: str
) -> None:
    pool = h.unique("big")
    await sim.create_gpu_nodes(pool=pool, count=2, gpus=8)
    await create(sim, pods_ns, small_pod("huge", gpus=9, selector={"pool": pool}))

    pending = await wait_unschedulable(sim, pods_ns, "huge")
    assert f"Insufficient {GPU}" in scheduled(pending)["message"]
    assert phase(pending) == "Pending"
    assert "nodeName" not in pending["spec"]


async def test_a_no_schedule_taint_keeps_the_scheduler_off_until_it_goes(
    sim: GpuClusterSimulator, pods_ns: str
) -> None:
    pool = h.unique("taint")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=4)
    await h.ok(sim.client, "PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": [TAINT]}})
    selector = {"kubernetes.io/hostname": node}
    await create(sim, pods_ns, small_pod("waits", gpus=1, selector=selector))

    pending = await wait_unschedulable(sim, pods_ns, "waits")
    assert "untolerated taint" in scheduled(pending)["message"]
    assert "nodeName" not in pending["spec"]

    await h.ok(sim.client, "PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": None}})
    running = await wait_phase(sim, pods_ns, "waits", "Running")
    assert running["spec"]["nodeName"] == node


async def test_a_pod_bound_while_the_device_plugin_serves_nothing_is_rejected(
    sim: GpuClusterSimulator, namespace: str, pods_ns: str
) -> None:
    """A crash-looping plugin (a config it refuses) leaves allocatable at 0: kubelet's device
    manager has no healthy device to give, and the pod fails for good."""
    refused = yaml.safe_dump(
        {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 1}]}}}
    )
    configmap = {"metadata": {"name": CONFIGMAP}, "data": {"refused": refused}}
    await h.ok(sim.client, "POST", f"/api/v1/namespaces/{namespace}/configmaps", configmap)
    [node] = await sim.create_gpu_nodes(pool=h.unique("down"), count=1, gpus=2)
    await sim.relabel(node, {h.CONFIG_LABEL: "refused"})
    await eventually(
        lambda: h.node(sim.client, node),
        until=lambda n: n["status"]["allocatable"][GPU] == "0" and bool(sim.plugin_failures),
        what=f"{node}'s plugin to crash-loop",
    )
    await create(sim, pods_ns, small_pod("unlucky", gpus=1, node=node))

    failed = await wait_phase(sim, pods_ns, "unlucky", "Failed")
    assert failed["status"]["reason"] == "UnexpectedAdmissionError"
    assert failed["status"]["message"] == (
        "Pod was rejected: Allocate failed due to no healthy devices present;"
        f" cannot allocate unhealthy devices {GPU}, which is unexpected"
    )


async def test_a_bound_pod_that_does_not_fit_beside_the_running_ones_is_rejected(
    sim: GpuClusterSimulator, pods_ns: str
) -> None:
    [node] = await sim.create_gpu_nodes(pool=h.unique("full"), count=1, gpus=2)
    await create(sim, pods_ns, small_pod("first", gpus=2, node=node))
    await wait_phase(sim, pods_ns, "first", "Running")
    await create(sim, pods_ns, small_pod("second", gpus=1, node=node))

    failed = await wait_phase(sim, pods_ns, "second", "Failed")
    assert failed["status"]["reason"] == "UnexpectedAdmissionError"
    assert (
        "requested number of devices unavailable for nvidia.com/gpu."
        in (failed["status"]["message"])
    )
    assert "Requested: 1, Available: 0" in failed["status"]["message"]

    # Finishing frees the devices: the next pod fits again.
    await h.ok(
        sim.client,
        "PATCH",
        f"/api/v1/namespaces/{pods_ns}/pods/first/status",
        {"status": {"phase": "Succeeded"}},
    )
    await create(sim, pods_ns, small_pod("third", gpus=2, node=node))
    await wait_phase(sim, pods_ns, "third", "Running")

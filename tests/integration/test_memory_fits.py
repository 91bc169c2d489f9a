"""Memory is part of "fits", on the real control plane: a pod placed by its GPU memory request
(the webhook, kube-scheduler) is not left behind by a rollout that would shrink its slot under
the request or take its enforcement away.

An A100 80GB pool (GFD's 81920 MiB) on MPS x2 promises 40960 MiB a client; a pod asks for
30Gi and is placed there.  Going to MPS x8 (10240 MiB) under ``podPolicy: WaitForPods`` holds
the node (``MemoryNoLongerEnforced``, naming the pod) with no config write until the pod is
gone; going to time-slicing under ``Evict`` evicts that pod, though both pods fit by count, and
leaves the other.  Every claim about what gpushare wrote is read from the audit log.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import rolloutaudit as audit
from gpushare_testing import webhooks as wh
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.gpupods import create, delete_pod, read, small_pod
from gpushare_testing.operators import OperatorFactory, RunningOperator
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

A100 = "NVIDIA-A100-SXM4-80GB"
A100_MIB = 81920
REASON = "MemoryNoLongerEnforced"


async def slot_memory(sim: GpuClusterSimulator, node: str) -> str | None:
    labels = (await h.node(sim.client, node))["metadata"].get("labels") or {}
    return labels.get(wh.SLOT_MEMORY)


async def wait_slot_memory(sim: GpuClusterSimulator, node: str, memory: str) -> None:
    await eventually(
        lambda: slot_memory(sim, node),
        until=lambda shown: shown == memory,
        timeout=90,
        what=f"{node} to promise {memory} MiB a slot",
    )


async def wait_running(sim: GpuClusterSimulator, namespace: str, name: str) -> dict[str, Any]:
    return await eventually(
        lambda: read(sim, namespace, name),
        until=lambda p: bool(p["spec"].get("nodeName")) and p["status"].get("phase") == "Running",
        timeout=90,
        what=f"{name} placed and running",
    )


async def mps_pool(
    sim: GpuClusterSimulator,
    policies: list[str],
    start_operator: OperatorFactory,
    namespace: str,
    flags: wh.WebhookFlags,
    *,
    rollout: Mapping[str, Any],
) -> tuple[str, str, RunningOperator]:
    """(node, policy, operator): one A100 80GB Verified on MPS x2, offering 40960 MiB slots."""
    pool = h.unique("memfit")
    [node] = await sim.create_gpu_nodes(
        pool=pool, count=1, gpus=1, product=A100, memory_mib=A100_MIB
    )
    body = h.policy(pool, pool=pool, strategy="MPS", replicas=2)
    body["spec"]["rollout"] = {"maxUnavailable": "100%", "canary": 0, **rollout}
    await h.add_policy(sim, policies, body)
    port = free_port()
    await wh.install(sim, flags.configuration, port=port)
    operator = await start_operator("--device-plugin-namespace", namespace, *flags.args(port=port))
    await wh.wait_published(sim, flags.configuration)
    await wait_slot_memory(sim, node, str(A100_MIB // 2))
    await wh.wait_offered(operator, {(pool, A100_MIB // 2): 1})
    return node, pool, operator


def memory_pod(name: str, memory: str) -> dict[str, Any]:
    body = wh.memory_pod(name, memory=memory)
    body["spec"]["terminationGracePeriodSeconds"] = 1
    return body


async def test_wait_for_pods_holds_the_node_while_a_30gi_pod_would_shrink_to_10gi(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
) -> None:
    node, name, _ = await mps_pool(
        sim,
        policies,
        start_operator,
        namespace,
        webhook_flags,
        rollout={"podPolicy": "WaitForPods"},
    )
    await create(sim, pods_ns, memory_pod("train", "30Gi"))
    assert (await wait_running(sim, pods_ns, "train"))["spec"]["nodeName"] == node
    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 8})

    def held(state: Mapping[str, Any] | None) -> bool:
        return h.condition((state or {}).get("status"), "Ready").get("reason") == REASON

    state = await eventually(
        lambda: h.node_state(sim.client, node), until=held, timeout=90, what=f"{node} held"
    )
    assert state is not None and state["status"]["phase"] == "Pending"
    message = h.condition(state["status"], "Ready")["message"]
    assert f"pod {pods_ns}/train asked for 30Gi (30720 MiB)" in message, message
    assert "from 40960 MiB mps to 10240 MiB mps" in message, message
    await eventually(  # the policy's status says why its rollout stands still
        lambda: h.get_policy(sim.client, name),
        until=lambda p: (
            ((p.get("status") or {}).get("rollout") or {}).get("state") == "WaitingForPods"
        ),
        timeout=60,
        what=f"{name}'s rollout WaitingForPods",
    )
    # Held: not one config write to the node, and its promise still the old one.
    assert audit.label_writes(control_plane, [node], since=since) == []
    assert await slot_memory(sim, node) == str(A100_MIB // 2)

    await delete_pod(sim, pods_ns, "train")
    await wait_slot_memory(sim, node, str(A100_MIB // 8))  # gone: the change goes ahead
    [(changed, _, key)] = audit.label_writes(control_plane, [node], since=since)
    assert key is not None and changed > since
    gone = [
        audit.moment(e)
        for e in control_plane.audit_events()
        if e["objectRef"].get("resource") == "pods"
        and e["objectRef"].get("name") == "train"
        and e["verb"] == "delete"
        and audit.moment(e) >= since
    ]
    assert gone and min(gone) < changed  # the config changed only after the pod went


def evictions_by_us(plane: ControlPlane, *, since: float) -> list[str]:
    return [
        str(e["objectRef"]["name"])
        for e in plane.audit_events()
        if e["user"]["username"] == h.OPERATOR_USER
        and e["objectRef"].get("resource") == "pods"
        and e["objectRef"].get("subresource") == "eviction"
        and e["verb"] == "create"
        and audit.moment(e) >= since
    ]


async def test_evict_takes_the_30gi_pod_off_before_time_slicing_and_keeps_the_other(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
) -> None:
    node, name, _ = await mps_pool(
        sim, policies, start_operator, namespace, webhook_flags, rollout={"podPolicy": "Evict"}
    )
    await create(sim, pods_ns, memory_pod("train", "30Gi"))
    plain = small_pod("plain", gpus=1, selector={"kubernetes.io/hostname": node})
    plain["spec"]["terminationGracePeriodSeconds"] = 1
    await create(sim, pods_ns, plain)
    for pod in ("train", "plain"):
        assert (await wait_running(sim, pods_ns, pod))["spec"]["nodeName"] == node
    since = time.time()
    # Two slots of two held; time-slicing x2 keeps two: both fit by count.
    await h.patch_policy(sim.client, name, {"strategy": "TimeSlicing"})

    def sliced(state: Mapping[str, Any] | None) -> bool:
        status = (state or {}).get("status") or {}
        return status.get("phase") == "Verified" and status.get("strategy") == "TimeSlicing"

    await eventually(
        lambda: h.node_state(sim.client, node), until=sliced, timeout=120, what=f"{node} sliced"
    )
    assert evictions_by_us(control_plane, since=since) == ["train"]
    [(changed, _, _)] = audit.label_writes(control_plane, [node], since=since)
    [evicted_at] = [
        audit.moment(e)
        for e in control_plane.audit_events()
        if e["objectRef"].get("subresource") == "eviction" and audit.moment(e) >= since
    ]
    assert evicted_at < changed  # the pod went before the config changed
    kept = await read(sim, pods_ns, "plain")
    assert kept["spec"]["nodeName"] == node and not kept["metadata"].get("deletionTimestamp")
    assert kept["status"]["phase"] == "Running"

"""A live pool moves from the device plugin to DRA and back, node by node, on the real control
plane with kube-scheduler allocating the claims (Kubernetes 1.37: DRAExtendedResource GA).

Six Exclusive nodes of two GPUs run pods asking ``nvidia.com/gpu: 1``.  The policy's backend
becomes DRA under ``maxUnavailable: 2`` with a canary and ``podPolicy: Evict``: each node's pods
are evicted (the device plugin and the DRA driver do not know each other's allocations), its
labels switch (``nvidia.com/gpu.deploy.device-plugin=false``, ``gpushare.dev/dra-driver=true``),
the simulated DRA kubelet plugin publishes its ResourceSlice, and the node is Verified.  The
leader is SIGKILLed in the middle; at most two nodes are ever between the label change and their
slice (the audit log).  Paused with both kinds in the pool, pods filling every GPU land on both,
those on DRA nodes with an extended-resource claim allocated from that node's slice by
kube-scheduler.  The way back restores the device plugin and deletes our DeviceClass.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable, Collection

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import gpupods
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.draobjects import (
    CLASS,
    DEPLOY_LABEL,
    DRA_LABEL,
    claim_of,
    device_class,
    exclusive,
    labels_of,
    pods_of,
    running,
)
from gpushare_testing.replicas import USERS, Replicas
from gpushare_testing.rolloutstate import all_verified, rollout_state
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")


def dra_windows(plane: ControlPlane, nodes: Collection[str], *, since: float) -> list[audit.Window]:
    """For each node, from the operator's label apply that switches it to DRA until the DRA
    kubelet plugin's ResourceSlice for it is created (the earliest it can be Verified)."""
    switched: dict[str, float] = {}
    published: dict[str, float] = {}
    users = set(USERS.values())
    for event in plane.audit_events():
        when = audit.moment(event)
        code = int((event.get("responseStatus") or {}).get("code", 0))
        if when < since or not 200 <= code < 300:
            continue
        ref, body = event["objectRef"], event.get("requestObject") or {}
        if not isinstance(body, dict):
            continue
        if ref.get("resource") == "nodes" and event["user"]["username"] in users:
            labels = (body.get("metadata") or {}).get("labels") or {}
            if labels.get(DRA_LABEL) == "true" and ref.get("name") in nodes:
                switched.setdefault(str(ref["name"]), when)
        if ref.get("resource") == "resourceslices" and event["verb"] == "create":
            node = (body.get("spec") or {}).get("nodeName")
            if node in switched:
                published.setdefault(str(node), when)
    assert set(switched) == set(nodes), f"switched: {sorted(switched)}"
    assert set(published) == set(nodes), f"published: {sorted(published)}"
    return [audit.Window(n, switched[n], published[n]) for n in nodes]


async def test_a_pool_moves_to_dra_and_back_under_its_budget_with_a_failover(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    policies: list[str],
    pods_ns: str,
    start_replicas: Callable[..., Awaitable[Replicas]],
) -> None:
    pool = h.unique("dra")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=6, gpus=2))
    name = h.unique("dra")
    rollout = {
        "maxUnavailable": 2,
        "canary": 1,
        "podPolicy": "Evict",
        "eviction": {"timeout": "2m", "gracePeriodSeconds": 1},
    }
    await h.add_policy(sim, policies, exclusive(name, pool, rollout=rollout))
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    device_plugin_key = await all_verified(sim, nodes, name)
    assert await device_class(sim) is None, "no DeviceClass while no policy is of backend DRA"

    # Before: pods placed through the device plugin.
    for i in range(4):
        await gpupods.create(sim, pods_ns, gpupods.small_pod(f"before-{i}", gpus=1))
    before = await running(sim, pods_ns, 4)
    assert not any(p["status"].get("extendedResourceClaimStatus") for p in before)

    # Every node's agents stand still for now: the canary's label change lands, but its device
    # plugin does not leave and no slice appears, so it is certainly between its label change
    # and Verified when the leader dies (a quick canary would otherwise be Verified, and the
    # next batch admitted, before the pause lands).
    for node in nodes:
        sim.set_healthy(node, False)
    since = time.time()
    await h.patch_policy(sim.client, name, {"backend": "DRA"})
    klass = await eventually(lambda: device_class(sim), what=f"DeviceClass {CLASS}", timeout=30)
    assert klass["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert [r["name"] for r in klass["metadata"]["ownerReferences"]] == [name]
    assert "device.driver == 'gpu.nvidia.com'" in klass["spec"]["selectors"][0]["cel"]["expression"]
    await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: (
            h.condition(b.get("status"), "DeviceClassReady").get("reason") == "DeviceClassWritten"
        ),
        what="DeviceClassReady True on the policy",
    )

    async def on_dra() -> list[str]:
        found = []
        for node in nodes:
            state = await h.node_state(sim.client, node) or {}
            status = state.get("status") or {}
            if status.get("phase") == "Verified" and status.get("configKey") == dra_key:
                found.append(node)
        return found

    async def switched() -> list[str]:
        return [n for n in nodes if (await labels_of(sim, n)).get(DRA_LABEL) == "true"]

    # Once the canary is switched, the policy is paused and the leader dies at once, with the
    # canary between its label change and Verified: the new leader confirms it, and moves no
    # other node while paused (none is admitted before the canary is Verified).
    await eventually(switched, until=lambda on: len(on) >= 1, timeout=120, what="the canary")
    await h.patch_policy(sim.client, name, {"paused": True})
    first = replicas.running[leader]
    first.proc.send_signal(signal.SIGKILL)
    assert await first.exited() == -signal.SIGKILL
    await replicas.wait_holder(follower, timeout=30)
    (canary,) = await switched()
    assert sim.slice_of(canary) is None, "the canary is not confirmed yet"
    for node in nodes:
        sim.set_healthy(node, True)
    dra_key = (await labels_of(sim, canary))[h.CONFIG_LABEL]
    assert dra_key != device_plugin_key and "-draexcl-" in dra_key
    await rollout_state(sim, name, "Paused", timeout=60)
    await sim.wait_idle(timeout=60)
    mixed = await on_dra()
    assert mixed == [canary], "the new leader confirmed the canary and moved nothing else"
    for node in mixed:
        labels = await labels_of(sim, node)
        assert (labels.get(DEPLOY_LABEL), labels.get(DRA_LABEL)) == ("false", "true")
        assert sim.slice_of(node) is not None
    # Both kinds serve nvidia.com/gpu: two pods for a DRA node, two for a device-plugin one.
    for pod in await pods_of(sim, pods_ns):
        await gpupods.delete_pod(sim, pods_ns, pod["metadata"]["name"])
    await running(sim, pods_ns, 0)
    old = [n for n in nodes if n not in mixed]
    candidates = [
        n
        for n in old
        if (await labels_of(sim, n)).get(h.CONFIG_LABEL) == device_plugin_key
        and not (await h.node(sim.client, n))["spec"].get("taints")
    ]
    device_plugin_node = candidates[0]
    dra_node = mixed[0]
    for node in (dra_node, device_plugin_node):
        for i in range(2):
            selector = {"kubernetes.io/hostname": node}
            body = gpupods.small_pod(f"on-{node}-{i}", gpus=1, selector=selector)
            await gpupods.create(sim, pods_ns, body)
    placed = await running(sim, pods_ns, 4)
    for pod in placed:
        served = pod["status"].get("extendedResourceClaimStatus")
        if pod["spec"]["nodeName"] == device_plugin_node:
            assert served is None, f"{pod['metadata']['name']} on a device-plugin node"
            continue
        assert pod["spec"]["nodeName"] == dra_node
        claim = await claim_of(sim, pod)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [("gpu.nvidia.com", dra_node)]
        assert results[0]["device"].startswith("gpu-")
    devices = {
        r["device"]
        for pod in placed
        if pod["spec"]["nodeName"] == dra_node
        for r in (await claim_of(sim, pod))["status"]["allocation"]["devices"]["results"]
    }
    assert devices == {"gpu-0", "gpu-1"}, "one GPU each"
    # Free the GPUs again so that the rest of the move has nothing to wait for.
    for pod in placed:
        await gpupods.delete_pod(sim, pods_ns, pod["metadata"]["name"])
    await running(sim, pods_ns, 0)

    await h.patch_policy(sim.client, name, {"paused": False})
    await all_verified(sim, nodes, name, timeout=240)
    await rollout_state(sim, name, "Complete", timeout=60)
    windows = dra_windows(control_plane, nodes, since=since)
    assert audit.most_at_once(windows) <= 2, windows

    # After: every node is DRA; a new pod gets a claim from its node's slice.
    await gpupods.create(sim, pods_ns, gpupods.small_pod("after", gpus=1))
    (after,) = await running(sim, pods_ns, 1)
    claim = await claim_of(sim, after)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == after["spec"]["nodeName"]
    await gpupods.delete_pod(sim, pods_ns, "after")
    await running(sim, pods_ns, 0)

    # The way back: the device plugin again, no DRA label, no slice, no DeviceClass.
    await h.patch_policy(sim.client, name, {"backend": "DevicePlugin"})
    await all_verified(sim, nodes, name, timeout=240)
    for node in nodes:
        labels = await labels_of(sim, node)
        assert DRA_LABEL not in labels and labels.get(DEPLOY_LABEL) == "true", labels
        assert sim.slice_of(node) is None
    await eventually(
        lambda: device_class(sim), until=lambda c: c is None, what="our DeviceClass deleted"
    )
    await gpupods.create(sim, pods_ns, gpupods.small_pod("back", gpus=1))
    (back,) = await running(sim, pods_ns, 1)
    assert back["status"].get("extendedResourceClaimStatus") is None


async def test_a_policy_deleted_mid_move_releases_every_node_back_to_the_device_plugin(
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: Callable[..., Awaitable[Replicas]],
) -> None:
    pool = h.unique("dradel")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=4, gpus=1))
    name = h.unique("dradel")
    rollout = {"maxUnavailable": 1, "canary": 1}
    await h.add_policy(sim, policies, exclusive(name, pool, rollout=rollout, backend="DRA"))
    await start_replicas()

    async def switched() -> list[str]:
        return [n for n in nodes if (await labels_of(sim, n)).get(DRA_LABEL) == "true"]

    await eventually(switched, until=lambda on: 1 <= len(on) < len(nodes), what="a node on DRA")
    await h.delete_policy(sim.client, name)
    await eventually(
        lambda: sim.client.get(f"{h.API}/gpusharingpolicies/{name}"),
        until=lambda answer: answer[0] == 404,
        timeout=180,
        what=f"{name} gone (its finalizer released every node)",
    )
    await sim.wait_idle(timeout=60)
    for node in nodes:
        labels = await labels_of(sim, node)
        assert DRA_LABEL not in labels and h.POLICY_LABEL not in labels, labels
        assert labels.get(DEPLOY_LABEL) == "true", "the GPU Operator's label is back"
        assert sim.slice_of(node) is None
        allocatable = (await h.node(sim.client, node))["status"]["allocatable"]
        assert allocatable.get("nvidia.com/gpu") == "1", "the device plugin serves it again"
    await eventually(
        lambda: device_class(sim), until=lambda c: c is None, what="our DeviceClass gone"
    )

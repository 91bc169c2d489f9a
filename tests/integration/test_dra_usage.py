"""What a DRA node's GPUs are used for is read from the claims kube-scheduler allocated, on the
real control plane (Kubernetes 1.37, the ResourceClaim controller running).

Two Exclusive nodes of two GPUs on backend DRA.  On one node a pod asks ``nvidia.com/gpu: 1``
(kube-scheduler makes and allocates its extended-resource claim through our DeviceClass) and
another asks through a ResourceClaimTemplate written against that class, naming no resource at
all.  The node's GPUNodeState and the policy's status count two GPUs held by two pods: one per
claimed device, the first pod not counted twice, the second not missed.  Deleting the second
pod deletes its claim (the ResourceClaim controller) and the counts follow.  ``kubectl gpushare
status`` and ``explain node`` read the same slices and claims and count the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import gpupods
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.draobjects import CLASS, RESOURCE_API, exclusive, running
from gpushare_testing.pluginruns import plugin
from gpushare_testing.replicas import Replicas
from gpushare_testing.rolloutstate import all_verified
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")


def claim_template(name: str) -> dict[str, Any]:
    """One full GPU of our class, as a user writes it (docs/dra.md)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}
            }
        },
    }


def claiming_pod(name: str, *, template: str, node: str) -> dict[str, Any]:
    body = gpupods.small_pod(name, gpus=0, selector={"kubernetes.io/hostname": node})
    container = body["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return body


async def slots(sim: GpuClusterSimulator, node: str) -> tuple[int, int, int]:
    """(capacity, allocated, pods) of the node's GPUNodeState."""
    status = (await h.node_state(sim.client, node) or {}).get("status") or {}
    counted = status.get("slots") or {}
    return counted.get("capacity", 0), counted.get("allocated", 0), status.get("pods", 0)


async def policy_allocated(sim: GpuClusterSimulator, name: str) -> int:
    status = (await h.get_policy(sim.client, name)).get("status") or {}
    return int((status.get("slots") or {}).get("allocated", 0))


async def test_a_dra_nodes_usage_is_counted_from_its_claims_once_each(
    control_plane: ControlPlane,
    namespace: str,
    sim: GpuClusterSimulator,
    policies: list[str],
    pods_ns: str,
    start_replicas: Callable[..., Awaitable[Replicas]],
) -> None:
    pool = h.unique("drause")
    busy, idle = sorted(await sim.create_gpu_nodes(pool=pool, count=2, gpus=2))
    name = h.unique("drause")
    await h.add_policy(sim, policies, exclusive(name, pool, backend="DRA"))
    await start_replicas()
    await all_verified(sim, [busy, idle], name)
    assert await slots(sim, busy) == (2, 0, 0)

    template = h.unique("gpu")
    path = f"{RESOURCE_API}/namespaces/{pods_ns}/resourceclaimtemplates"
    await h.ok(sim.client, "POST", path, claim_template(template))
    selector = {"kubernetes.io/hostname": busy}
    await gpupods.create(sim, pods_ns, gpupods.small_pod("asks", gpus=1, selector=selector))
    await gpupods.create(sim, pods_ns, claiming_pod("claims", template=template, node=busy))
    placed = await running(sim, pods_ns, 2)
    assert {p["spec"]["nodeName"] for p in placed} == {busy}

    # Both GPUs of the busy node are held, once each, by two pods; the idle node holds none.
    await eventually(
        lambda: slots(sim, busy), until=lambda s: s == (2, 2, 2), what=f"{busy} counting 2/2"
    )
    assert await slots(sim, idle) == (2, 0, 0)
    await eventually(
        lambda: policy_allocated(sim, name), until=lambda n: n == 2, what="the policy's 2"
    )

    # kubectl gpushare reads the slices and claims too: it shows the nodes Verified and counts
    # what the operator counts, the template's pod included.
    common = ("--device-plugin-namespace", namespace, "-o", "json")
    run = await plugin(control_plane.admin_kubeconfig, "status", "--policy", name, *common)
    assert run.code == 0, run.stderr
    report = run.json()
    [shown] = [p for p in report["policies"] if p["name"] == name]
    assert (shown["verified"], shown["slots"]) == (2, {"allocated": 2, "capacity": 4})
    assert [(n["name"], n["phase"], n["slots"]["allocated"]) for n in report["nodes"]] == [
        (busy, "Verified", 2),
        (idle, "Verified", 0),
    ]
    run = await plugin(control_plane.admin_kubeconfig, "explain", "node", busy, *common)
    assert run.code == 0, run.stderr
    explained = run.json()
    assert explained["phase"]["now"]["phase"] == "Verified"
    assert explained["slots"]["allocated"] == 2
    assert explained["slots"]["claimedDevices"] == ["gpu-0", "gpu-1"]
    assert explained["slots"]["claimPods"] == 2

    # The claim made from the template goes with its pod; the count follows the claims.
    await gpupods.delete_pod(sim, pods_ns, "claims")
    await eventually(
        lambda: slots(sim, busy), until=lambda s: s == (2, 1, 1), what=f"{busy} counting 1/2"
    )
    await eventually(
        lambda: policy_allocated(sim, name), until=lambda n: n == 1, what="the policy's 1"
    )

"""A MIG pool moves to DRA and changes its layout there, on the real control plane with
kube-scheduler allocating the claims (Kubernetes 1.37).

Two H100 nodes of one GPU under a mixed layout (one 3g.40gb, four 1g.10gb) move from the device
plugin to DRA.  gpushare writes a DeviceClass per profile (``extendedResourceName``
``nvidia.com/mig-<profile>``); the simulated DRA kubelet plugin lists each node's MIG devices
under NVIDIA's names and no full GPU; each node is Verified from that slice.  Pods asking
``nvidia.com/mig-1g.10gb`` and ``nvidia.com/mig-3g.40gb`` get claims allocated from that
profile's devices on their node, counted per profile.  Then the layout changes on the DRA nodes
(seven 1g.10gb): NVIDIA's plugin lists devices only as it starts, so a node is confirmed only once
the plugin has left during the MIG manager's work and published a slice of the new devices; the
3g.40gb class, wanted by nothing any more, is deleted.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import gpupods
from gpushare_testing.draobjects import (
    CLASSES,
    DRA_LABEL,
    RESOURCE_API,
    claim_of,
    labels_of,
    running,
)
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.rolloutstate import all_verified
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

H100 = "NVIDIA-H100-80GB-HBM3"
SMALL, BIG = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"


def dra_mig_policy(name: str, pool: str, devices: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": pool}},
            "strategy": "MIG",
            "mig": {"devices": devices},
            "rollout": {"maxUnavailable": 1, "canary": 1},
        },
    }


async def slice_devices(sim: GpuClusterSimulator, node: str) -> list[dict[str, Any]]:
    params = {"fieldSelector": f"spec.nodeName={node}"}
    status, body = await sim.client.get(f"{RESOURCE_API}/resourceslices", params=params)
    assert status == 200, body
    return [d for s in body["items"] for d in s["spec"].get("devices") or ()]


def profiles(devices: list[dict[str, Any]]) -> Counter[str]:
    """Devices per MIG profile ("gpu" for a full GPU)."""
    counted: Counter[str] = Counter()
    for device in devices:
        attributes = device.get("attributes") or {}
        kind = attributes["type"]["string"]
        counted[attributes["profile"]["string"] if kind == "mig" else kind] += 1
    return counted


async def class_named(sim: GpuClusterSimulator, name: str) -> dict[str, Any] | None:
    status, body = await sim.client.get(f"{CLASSES}/{name}")
    return dict(body) if status == 200 else None


def mig_pod(name: str, resource: str, node: str) -> dict[str, Any]:
    body = gpupods.small_pod(name, gpus=1, selector={"kubernetes.io/hostname": node})
    limits = body["spec"]["containers"][0]["resources"]["limits"]
    limits[resource] = limits.pop("nvidia.com/gpu")
    return body


async def by_resource(sim: GpuClusterSimulator, node: str) -> dict[str, Any]:
    status = (await h.node_state(sim.client, node) or {}).get("status") or {}
    return dict((status.get("slots") or {}).get("byResource") or {})


async def test_a_mig_pool_moves_to_dra_its_profiles_are_served_and_its_layout_changes_there(
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("dramig")
    nodes = sorted(
        await sim.create_gpu_nodes(pool=pool, count=2, product=H100, gpus=1, mig_preset=False)
    )
    name = h.unique("dramig")
    body = dra_mig_policy(name, pool, {"3g.40gb": 1, "1g.10gb": 4})
    await h.add_policy(sim, policies, body)
    await start_operator("--device-plugin-namespace", namespace)
    plugin_key = await all_verified(sim, nodes, name, timeout=180)

    await h.patch_policy(sim.client, name, {"backend": "DRA"})
    dra_key = await all_verified(sim, nodes, name, timeout=180)
    assert dra_key != plugin_key
    for resource, klass in ((SMALL, "mig-1g-10gb.gpushare.dev"), (BIG, "mig-3g-40gb.gpushare.dev")):
        found = await class_named(sim, klass)
        assert found is not None and found["spec"]["extendedResourceName"] == resource
    for node in nodes:
        assert (await labels_of(sim, node)).get(DRA_LABEL) == "true"
        devices = await slice_devices(sim, node)
        assert profiles(devices) == {"3g.40gb": 1, "1g.10gb": 4}, "MIG devices, no full GPU"

    # Pods keep asking the device plugin's mixed names; each gets a device of its profile.
    target = nodes[0]
    for i, resource in enumerate((SMALL, SMALL, BIG)):
        await gpupods.create(sim, pods_ns, mig_pod(f"mig-{i}", resource, target))
    placed = await running(sim, pods_ns, 3)
    for pod in placed:
        claim = await claim_of(sim, pod)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        asked = next(iter(pod["spec"]["containers"][0]["resources"]["limits"].keys() - {"cpu"}))
        profile = asked.removeprefix("nvidia.com/mig-").replace(".", "")
        assert result["pool"] == target and f"-mig-{profile}-" in result["device"], result
    await eventually(
        lambda: by_resource(sim, target),
        until=lambda b: (
            (b.get(SMALL, {}).get("allocated"), b.get(BIG, {}).get("allocated")) == (2, 1)
        ),
        what=f"{target} counting its claims per profile",
    )

    # A new layout on the DRA nodes: confirmed only by a slice of the new devices.
    for pod in placed:
        await gpupods.delete_pod(sim, pods_ns, pod["metadata"]["name"])
    await running(sim, pods_ns, 0)
    new_layout = {"3g.40gb": None, "1g.10gb": 7}  # a merge patch: None removes the 3g.40gb
    await h.patch_policy(sim.client, name, {"mig": {"devices": new_layout}})
    for node in nodes:
        # The key is the same (mixed, one slot per device): the layout says which is which.
        await eventually(
            lambda node=node: h.node_state(sim.client, node),
            until=lambda st: (
                ((st or {}).get("status") or {}).get("phase") == "Verified"
                and st["status"]["mig"]["slotsPerGPU"] == {SMALL: 7}
            ),
            timeout=240,
            what=f"{node} Verified on the new layout",
        )
        assert profiles(await slice_devices(sim, node)) == {"1g.10gb": 7}
    await eventually(
        lambda: class_named(sim, "mig-3g-40gb.gpushare.dev"),
        until=lambda c: c is None,
        what="the 3g.40gb class, wanted by no policy, deleted",
    )
    await gpupods.create(sim, pods_ns, mig_pod("after", SMALL, target))
    (after,) = await running(sim, pods_ns, 1)
    (result,) = (await claim_of(sim, after))["status"]["allocation"]["devices"]["results"]
    assert result["device"] in {d["name"] for d in await slice_devices(sim, target)}

"""A memory request on DRA nodes: the slot labels come from the ResourceSlice's ``memory``, and
the pod lands on a DRA MIG device or a DRA full GPU as it would on a device-plugin one (the real
control plane, the webhook served by the operator, kube-scheduler allocating the claims).

Two H100 pools under backend DRA: one Exclusive, one MIG of seven 1g.10gb per GPU.  Each node
promises, in its slot labels, the lowest ``memory`` its slice lists for the kind of device it
serves; a pod asking for 9 GiB gets the 1g.10gb, one asking for 40 GiB the whole GPU, each
through a claim kube-scheduler allocates from that node's slice.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_operator.core.quantities import parse_mib
from gpushare_testing import apiobjects as h
from gpushare_testing import webhooks as wh
from gpushare_testing.controlplane import free_port
from gpushare_testing.draobjects import RESOURCE_API, claim_of, exclusive, running
from gpushare_testing.gpupods import create
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.rolloutstate import all_verified
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

H100 = "NVIDIA-H100-80GB-HBM3"
SMALL = "nvidia.com/mig-1g.10gb"


async def slice_memory(sim: GpuClusterSimulator, node: str) -> dict[str, int]:
    """The slice's devices of ``node``: name → memory in MiB."""
    params = {"fieldSelector": f"spec.nodeName={node}"}
    status, body = await sim.client.get(f"{RESOURCE_API}/resourceslices", params=params)
    assert status == 200, body
    return {
        d["name"]: parse_mib(d["capacity"]["memory"]["value"])
        for s in body["items"]
        for d in s["spec"].get("devices") or ()
    }


async def slot_labels(sim: GpuClusterSimulator, node: str) -> dict[str, str]:
    async def read() -> dict[str, str]:
        labels = (await h.node(sim.client, node))["metadata"].get("labels") or {}
        return {k: v for k, v in labels.items() if k.startswith("gpushare.dev/slot-")}

    return await eventually(read, until=bool, timeout=60, what=f"{node}'s slot labels")


async def test_memory_pods_land_on_dra_mig_devices_and_full_gpus_by_the_slices_memory(
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
) -> None:
    tag = h.unique("dramem")
    [whole] = await sim.create_gpu_nodes(pool=f"{tag}-whole", count=1, product=H100, gpus=1)
    [sliced] = await sim.create_gpu_nodes(
        pool=f"{tag}-mig", count=1, product=H100, gpus=1, mig_preset=False
    )
    await h.add_policy(sim, policies, exclusive(f"{tag}-whole", f"{tag}-whole", backend="DRA"))
    mig = h.policy(f"{tag}-mig", pool=f"{tag}-mig", strategy="MIG", backend="DRA")
    mig["spec"].pop("replicas")
    mig["spec"]["mig"] = {"devices": {"1g.10gb": 7}}
    await h.add_policy(sim, policies, mig)
    port = free_port()
    await wh.install(sim, webhook_flags.configuration, port=port)
    operator = await start_operator(
        "--device-plugin-namespace", namespace, *webhook_flags.args(port=port)
    )
    await wh.wait_published(sim, webhook_flags.configuration)
    await all_verified(sim, [whole], f"{tag}-whole", timeout=180)
    await all_verified(sim, [sliced], f"{tag}-mig", timeout=240)

    # Each node promises the lowest memory its slice lists, as its own resource.
    gpu_mib = min((await slice_memory(sim, whole)).values())
    mig_devices = await slice_memory(sim, sliced)
    assert len(mig_devices) == 7 and all("-mig-1g10gb-" in d for d in mig_devices)
    mig_mib = min(mig_devices.values())
    assert await slot_labels(sim, whole) == {
        wh.SLOT_MEMORY: str(gpu_mib),
        wh.SLOT_ISOLATION: "exclusive",
        wh.SLOT_RESOURCE: "nvidia.com_gpu",
    }
    assert await slot_labels(sim, sliced) == {
        wh.SLOT_MEMORY: str(mig_mib),
        wh.SLOT_ISOLATION: "mig",
        wh.SLOT_RESOURCE: "nvidia.com_mig-1g.10gb",
    }
    await wh.wait_offered(operator, {(f"{tag}-whole", gpu_mib): 1, (f"{tag}-mig", mig_mib): 1})

    # 9 GiB fits the slice, 40 GiB only the whole GPU: each gets a claim on its node's slice.
    await create(sim, pods_ns, wh.memory_pod("small", memory="9Gi"))
    await create(sim, pods_ns, wh.memory_pod("large", memory="40Gi"))
    placed: dict[str, Any] = {p["metadata"]["name"]: p for p in await running(sim, pods_ns, 2)}
    expected = {"small": (sliced, SMALL), "large": (whole, "nvidia.com/gpu")}
    for name, (node, resource) in expected.items():
        pod = placed[name]
        assert pod["spec"]["nodeName"] == node, (name, pod["spec"]["nodeName"])
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {resource: "1"}
        (result,) = (await claim_of(sim, pod))["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == node
        assert result["device"] in await slice_memory(sim, node), result

"""A DRA node's slot promise from its ResourceSlice's ``memory``, not GFD's labels (no API)."""

from __future__ import annotations

from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.dra import draslots
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    GPU_MEMORY,
    POLICY_LABEL,
    project_node,
)
from gpushare_operator.core.slots import slotclasses
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, node, policy
from gpushare_testing.writepath import PlanningLoop

ON = {dra.DEPLOY_DEVICE_PLUGIN: "false", dra.DRA_DRIVER_LABEL: "true"}
H100 = "NVIDIA-H100-80GB-HBM3"


def device(name: str, memory: str | None, *, profile: str | None = None) -> dict[str, Any]:
    kind = "mig" if profile else "gpu"
    attributes: dict[str, Any] = {"type": {"string": kind}, "uuid": {"string": f"U-{name}"}}
    if profile:
        attributes["profile"] = {"string": profile}
    capacity = {} if memory is None else {"memory": {"value": memory}}
    return {"name": name, "attributes": attributes, "capacity": capacity}


def slice_of(*devices: dict[str, Any], node_name: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node_name}-slice"},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


def devices_of(body: dict[str, Any]) -> tuple[dra.Device, ...]:
    record = dra.slice_record(body)
    assert record is not None
    return dra.node_devices([record])


def test_the_view_takes_the_slices_lowest_memory_per_kind_of_device() -> None:
    record = project_node(node("n1", count="2", **{GPU_MEMORY: "81559"}))
    assert record is not None
    # Two GPUs listed as 80 GiB and 79 GiB (bytes and binary suffixes both read): the smaller.
    devices = devices_of(slice_of(device("gpu-0", "85899345920"), device("gpu-1", "80896Mi")))
    seen = draslots.view(record, devices, resources=["nvidia.com/gpu"])
    assert seen.labels[GPU_MEMORY] == "80896" and seen.memory_mib == 80896
    # One GPU listed without a memory: nothing is promised (never the other's figure).
    devices = devices_of(slice_of(device("gpu-0", "80Gi"), device("gpu-1", None)))
    assert draslots.view(record, devices, resources=["nvidia.com/gpu"]).memory_mib is None
    # A slice of no full GPU (MIG) leaves GFD's label; the same figure returns the same record.
    assert draslots.view(record, (), resources=["nvidia.com/gpu"]) is record
    same = devices_of(slice_of(device("gpu-0", "81559Mi"), device("gpu-1", "81559Mi")))
    assert draslots.view(record, same, resources=["nvidia.com/gpu"]) is record
    # MIG devices: the lowest of the profile's own, under the label slotclasses reads.
    migs = devices_of(
        slice_of(
            device("gpu-0-mig-1g10gb-19-0", "9856Mi", profile="1g.10gb"),
            device("gpu-0-mig-1g10gb-19-1", "9984Mi", profile="1g.10gb"),
        )
    )
    seen = draslots.view(record, migs, resources=["nvidia.com/mig-1g.10gb"])
    assert seen.labels["nvidia.com/mig-1g.10gb.memory"] == "9856"


def loop_with(body: dict[str, Any], spec: dict[str, Any]) -> tuple[PlanningLoop, ClusterCache]:
    cache = ClusterCache(clock=Clock())
    cache.upsert_policy(policy("p", backend="DRA", **spec))
    loop = PlanningLoop(
        Reconciler(
            cache,
            timings=Timings(propagation_delay=0, key_grace_period=300, mismatch_timeout=60),
            max_unavailable="10%",
        )
    )
    compiled = cache.policies["p"]
    labels = {CONFIG_LABEL: str(compiled.config_key), POLICY_LABEL: "p", **ON}
    if compiled.mig is not None:
        labels["nvidia.com/mig.config"] = compiled.mig.names[H100]
        labels["nvidia.com/mig.config.state"] = "success"
    cache.upsert_node(
        node(
            "n1",
            count="1",
            allocatable="0",
            **{GPU_MEMORY: "81559", "nvidia.com/gpu.product": H100, **labels},
        )
    )
    cache.dra.upsert_slice(body)
    return loop, cache


def test_a_verified_dra_gpu_node_promises_its_slices_memory_not_gfds() -> None:
    loop, _ = loop_with(
        slice_of(device("gpu-0", "81000Mi")), {"strategy": "Exclusive", "replicas": None}
    )
    plan = loop.plan_node("n1")
    assert plan.facts.decision is not None and plan.facts.decision.phase is NodePhase.VERIFIED
    assert plan.labels is not None
    assert plan.labels[slotclasses.MEMORY_LABEL] == "81000", "GFD says 81559: the slice wins"
    assert plan.labels[slotclasses.ISOLATION_LABEL] == "exclusive"


def test_a_verified_dra_mig_node_promises_its_mig_devices_memory_in_labels_and_status() -> None:
    devices = [device(f"gpu-0-mig-1g10gb-19-{i}", "9856Mi", profile="1g.10gb") for i in range(7)]
    spec = {"strategy": "MIG", "replicas": None, "mig": {"devices": {"1g.10gb": 7}}}
    loop, cache = loop_with(slice_of(*devices), spec)
    plan = loop.plan_node("n1")
    assert plan.facts.decision is not None and plan.facts.decision.phase is NodePhase.VERIFIED
    assert plan.labels is not None
    # NVIDIA's tables (go-nvml's) say 10240 MiB for a 1g.10gb: the device's own figure is lower.
    assert plan.labels[slotclasses.MEMORY_LABEL] == "9856"
    assert plan.labels[slotclasses.RESOURCE_LABEL] == "nvidia.com_mig-1g.10gb"
    tally = loop.reconciler.planner.tally(cache.policies["p"])
    [entry] = tally.classes.render() or []
    assert entry["memoryMiB"] == 9856 and entry["capacity"] == 7

"""Backend DRA: the node labels that switch NVIDIA's DRA kubelet plugin on, what its
ResourceSlices say, and what confirms a node (the DeviceClasses that keep ``nvidia.com/gpu``
requests working are ``core.dra.draclasses``; the claims that hold devices, ``core.dra.draclaims``).

A DRA node carries ``nvidia.com/gpu.deploy.device-plugin=false`` (the GPU Operator keeps a
non-empty value a node already carries, so its device plugin leaves that node) and our own
``gpushare.dev/dra-driver=true``, which the standalone DRA driver release's kubelet-plugin
DaemonSet selects (under a ClusterPolicy the GPU Operator sweeps its own
``nvidia.com/gpu.deploy.dra-driver`` off nodes, so that label cannot be the switch).  Going back
to the device plugin removes both.

NVIDIA's kubelet plugin publishes one pool per node, named after the node, in ResourceSlices of
driver ``gpu.nvidia.com``: a device ``gpu-<minor>`` per full GPU with attributes ``type``
(``gpu``), ``uuid``, ``productName`` and more, and capacity ``memory``
(dra-driver-nvidia-gpu ``cmd/gpu-kubelet-plugin/deviceinfo.go``).  A node is confirmed when its
slice lists the GPUs GPU Feature Discovery counts and kubelet shows no ``nvidia.com/gpu`` left
from the device plugin (KEP 5004: only then does the scheduler serve that name through DRA).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpushare_operator.core import migphases
from gpushare_operator.core.decisions import Labels
from gpushare_operator.core.quantities import QuantityError, parse_mib
from gpushare_operator.core.records.nodes import NodeRecord

DRIVER: Final = "gpu.nvidia.com"
DEPLOY_DEVICE_PLUGIN: Final = "nvidia.com/gpu.deploy.device-plugin"
DRA_DRIVER_LABEL: Final = "gpushare.dev/dra-driver"
# The labels of a DRA node, and the apply that removes them (None: left out, so SSA drops ours).
ON: Final[Mapping[str, str]] = {DEPLOY_DEVICE_PLUGIN: "false", DRA_DRIVER_LABEL: "true"}
OFF: Final[Mapping[str, None]] = {DEPLOY_DEVICE_PLUGIN: None, DRA_DRIVER_LABEL: None}
GPU_TYPE: Final = "gpu"
MIG_TYPE: Final = "mig"
# The device plugin's mixed-strategy MIG resources, nvidia.com/mig-<profile>: one DeviceClass
# each, selecting that profile's MIG devices.
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
# Why a backend move needs idle GPUs (as a MIG change does).
BACKEND_IDLE: Final = (
    "the device plugin and the DRA driver each allocate the GPUs they serve and know nothing"
    " of the other's, so a backend move waits for the node's GPU pods to go (WaitForPods) or"
    " evicts them (Evict)"
)


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a slice, as much of it as is read."""

    name: str
    type: str | None
    memory_mib: int | None = None
    profile: str | None = None  # a MIG device's, e.g. 1g.10gb


@dataclass(frozen=True, slots=True)
class SliceRecord:
    """A ``gpu.nvidia.com`` ResourceSlice, slim: its node, pool generation and devices."""

    name: str
    node: str
    pool: str
    generation: int
    devices: tuple[Device, ...]


def slice_record(obj: Mapping[str, Any]) -> SliceRecord | None:
    """The record of a ResourceSlice; None for another driver's or one bound to no node."""
    spec = obj.get("spec") or {}
    if spec.get("driver") != DRIVER or not isinstance(spec.get("nodeName"), str):
        return None
    node = spec["nodeName"]
    pool = spec.get("pool") or {}
    generation = pool.get("generation")
    devices = tuple(
        _device(d) for d in spec.get("devices") or () if isinstance(d, Mapping) and d.get("name")
    )
    return SliceRecord(
        name=str((obj.get("metadata") or {}).get("name")),
        node=node,
        pool=node if pool.get("name") == node else str(pool.get("name") or ""),  # one string
        generation=generation if isinstance(generation, int) else 0,
        devices=devices,
    )


# Devices already read, by what was read of them: the same device (``gpu-0``, a full GPU of
# 81559 MiB) is listed by every node of a model, so its record is one shared object, and a
# slice's devices cost a pointer each.  Bounded: past the cap a device is read afresh.
_SEEN: dict[tuple[str, str | None, object, str | None], Device] = {}
_SEEN_MAX: Final = 4096


def _device(raw: Mapping[str, Any]) -> Device:
    attributes = raw.get("attributes") or {}
    kind = _attribute(attributes, "type")
    memory = ((raw.get("capacity") or {}).get("memory") or {}).get("value")
    profile = _attribute(attributes, "profile") if kind == MIG_TYPE else None
    key = (str(raw["name"]), kind, memory if isinstance(memory, str) else None, profile)
    known = _SEEN.get(key)
    if known is not None:
        return known
    mib = None
    if isinstance(memory, str):
        try:
            mib = parse_mib(memory)
        except QuantityError:
            mib = None
    device = Device(name=key[0], type=kind, memory_mib=mib, profile=profile)
    if len(_SEEN) < _SEEN_MAX:
        _SEEN[key] = device
    return device


def _attribute(attributes: Mapping[str, Any], name: str) -> str | None:
    """A string attribute, named bare or with the driver's domain (both mean the same)."""
    value = attributes.get(name) or attributes.get(f"{DRIVER}/{name}") or {}
    text = value.get("string") if isinstance(value, Mapping) else None
    return text if isinstance(text, str) else None


def node_devices(slices: Iterable[SliceRecord]) -> tuple[Device, ...]:
    """A node's devices: those of its pool's newest generation (older slices are on their way
    out, as the DRA scheduler plugin reads a pool)."""
    found = list(slices)
    if not found:
        return ()
    newest = max(s.generation for s in found)
    return tuple(d for s in found if s.generation == newest for d in s.devices)


def is_on(record: NodeRecord) -> bool:
    """Whether the node carries our DRA switch."""
    return record.labels.get(DRA_DRIVER_LABEL) == "true"


def shows(record: NodeRecord, *, dra: bool) -> bool:
    """Whether the node's labels say the backend ``dra`` asks for."""
    if dra:
        return all(record.labels.get(k) == v for k, v in ON.items())
    return DRA_DRIVER_LABEL not in record.labels


def switch(record: NodeRecord, *, dra: bool) -> Labels:
    """The DRA part of an apply: both labels on, or both left out (once the node carries ours)."""
    if dra:
        return dict(ON)
    return dict(OFF) if DRA_DRIVER_LABEL in record.labels else {}


def carried(record: NodeRecord) -> Labels:
    """The DRA labels of ours the node carries, restated by an apply that changes others."""
    return dict(ON) if is_on(record) else {}


def changes_backend(record: NodeRecord, *, dra: bool) -> bool:
    """Whether moving the node to a policy of backend ``dra`` switches what serves its GPUs."""
    return is_on(record) != dra


def disagreements(record: NodeRecord, devices: tuple[Device, ...], *, resource: str) -> list[str]:
    """What keeps a DRA node from being confirmed: its slice's GPUs against GFD's count, and
    the device plugin's ``resource`` still allocatable (kubelet keeps the resource at 0 once
    the plugin is gone; absent is as good)."""
    problems = []
    left = record.allocatable_of(resource)
    if left:
        problems.append(f"allocatable {resource} is {left}, expected 0 (the device plugin is gone)")
    gpus = gpu_count(devices)
    expected = record.gpus or 0
    if not devices:
        problems.append(f"no ResourceSlice of driver {DRIVER} lists this node's devices yet")
    elif gpus != expected:
        problems.append(f"the {DRIVER} ResourceSlice lists {gpus} GPUs, expected {expected}")
    return problems


def mig_disagreements(
    record: NodeRecord, devices: tuple[Device, ...], *, per_gpu: Mapping[str, int]
) -> list[str]:
    """What keeps a DRA MIG node from being confirmed: for each ``nvidia.com/mig-<profile>``
    of the layout (``per_gpu``: devices per GPU), the slice's MIG devices of that profile
    against GPUs times count, and the device plugin's resource still allocatable.  NVIDIA's
    kubelet plugin lists the MIG devices it found when it started, and no full GPU of a GPU in
    MIG mode (``cmd/gpu-kubelet-plugin/nvlib.go``): a slice from before a layout change names
    the old devices."""
    problems = []
    if record.mig_state != migphases.SUCCESS:
        problems.append(f"nvidia.com/mig.config.state is {record.mig_state}, expected success")
    if not devices:
        problems.append(f"no ResourceSlice of driver {DRIVER} lists this node's devices yet")
    gpus = record.gpus or 0
    for resource, count in sorted(per_gpu.items()):
        left = record.allocatable_of(resource)
        if left:
            problems.append(
                f"allocatable {resource} is {left}, expected 0 (the device plugin is gone)"
            )
        profile = mig_profile(resource)
        listed = sum(1 for d in devices if d.type == MIG_TYPE and d.profile == profile)
        if devices and listed != gpus * count:
            problems.append(
                f"the {DRIVER} ResourceSlice lists {listed} {profile} MIG devices, expected"
                f" {gpus * count}"
            )
    stray = sorted(
        {str(d.profile) for d in devices if d.type == MIG_TYPE} - {mig_profile(r) for r in per_gpu}
    )
    if stray:
        problems.append(f"the {DRIVER} ResourceSlice lists MIG devices of {', '.join(stray)}")
    full = gpu_count(devices)
    if full:
        problems.append(f"the {DRIVER} ResourceSlice lists {full} full GPUs, expected none (MIG)")
    return problems


def mig_profile(resource: str) -> str | None:
    """The MIG profile an ``nvidia.com/mig-<profile>`` resource names; None for another."""
    if resource.startswith(MIG_RESOURCE_PREFIX):
        return resource[len(MIG_RESOURCE_PREFIX) :]
    return None


def gpu_count(devices: Iterable[Device]) -> int:
    """The full GPUs a node's slice lists."""
    return sum(1 for d in devices if d.type == GPU_TYPE)


@dataclass(frozen=True, slots=True)
class Readiness:
    """What a DRA node's decision needs to know beyond the node: whether its class is there (as
    the DeviceClass informer shows it), a conflict, and the devices its slices list."""

    class_ready: bool = False
    conflict: str | None = None
    devices: tuple[Device, ...] = ()


NOT_DRA: Final = Readiness(class_ready=True)

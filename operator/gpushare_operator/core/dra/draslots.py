"""A DRA node's slots as its ResourceSlice states them: what a memory request is promised there.

On a node NVIDIA's DRA kubelet plugin serves, a pod gets one of the devices the plugin lists,
and each carries capacity ``memory``: NVML's total for a full GPU, the MIG device's own for a
slice (dra-driver-nvidia-gpu ``cmd/gpu-kubelet-plugin/deviceinfo.go``).  That figure, not GPU
Feature Discovery's labels, is what such a node can promise, so ``view`` gives the node with
GFD's memory labels replaced by the slice's lowest figure per kind of device, and every reader
of a node's slots (``core.slots.slotclasses``: the slot labels, GPUNodeState and policy status)
reads
a DRA node as it reads any other.

- Full GPUs: ``nvidia.com/gpu.memory`` becomes the lowest memory of the slice's GPUs (a node
  of mixed GPUs promises the smallest); a GPU listed without a memory the operator can read
  drops the label, so no memory is promised.
- MIG devices: ``nvidia.com/mig-<profile>.memory`` becomes the lowest of that profile's
  devices, which ``core.slots.slotclasses`` still caps by NVIDIA's tables.
- A slice that lists no device of a kind leaves that kind's labels as GFD set them (a node
  not yet confirmed: its slot labels wait for Verified, which needs the slice).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from gpushare_operator.core.dra.driver import GPU_TYPE, MIG_TYPE, Device, mig_profile
from gpushare_operator.core.records.nodes import GPU_MEMORY, NodeRecord


def view(
    record: NodeRecord, devices: tuple[Device, ...], *, resources: Iterable[str]
) -> NodeRecord:
    """The node as its slots read under DRA (the same record when the slice changes nothing)."""
    wanted: dict[str, int | None] = {}
    full = [d.memory_mib for d in devices if d.type == GPU_TYPE]
    if full:
        wanted[GPU_MEMORY] = _lowest(full)
    for resource in resources:
        profile = mig_profile(resource)
        if profile is None:
            continue
        listed = [d.memory_mib for d in devices if d.type == MIG_TYPE and d.profile == profile]
        if listed:
            wanted[f"{resource}.memory"] = _lowest(listed)
    if all(record.labels.get(k) == (None if v is None else str(v)) for k, v in wanted.items()):
        return record
    labels = {k: v for k, v in record.labels.items() if k not in wanted}
    labels.update({k: str(v) for k, v in wanted.items() if v is not None})
    return dataclasses.replace(record, labels=labels)


def _lowest(memories: list[int | None]) -> int | None:
    """The smallest memory; None when one is unknown (a promise must hold for every device)."""
    known = [m for m in memories if m is not None and m > 0]
    return min(known) if len(known) == len(memories) else None

"""``slots.classes`` in GPUNodeState and policy status: each slot class's size, and its slots.

A node offers one class per advertised resource (``core.slots.slotclasses``); a policy over nodes of
different GPU models offers one per model where the memory differs (MPS on an 80 GB and a 40 GB
GPU is two sizes of slot).  Both statuses list them, so that what a memory request can get, and
how much of it is free, can be read without looking at the nodes' labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.slots import slotclasses
from gpushare_operator.core.slots.slotclasses import SlotClass

MAX_CLASSES: Final = 16  # the status schema's bound; a policy spans few GPU models


def per_class(record: NodeRecord, policy: CompiledPolicy) -> list[tuple[SlotClass, int]]:
    """(class, slots) of the node under ``policy``: its GPUs times each class's per-GPU slots."""
    gpus = record.gpus or 0
    found = slotclasses.classes(record, policy)
    if policy.mig is not None:
        per_gpu = policy.mig.slots_per_gpu(record.product)
        return [(slot, gpus * per_gpu.get(slot.resource, 0)) for slot in found]
    return [(slot, gpus * (policy.replicas or 0)) for slot in found]


def entry(slot: SlotClass, *, capacity: int, allocated: int) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "resource": slot.resource,
        "isolation": str(slot.isolation),
        "capacity": capacity,
        "allocated": allocated,
    }
    if slot.enforced:
        rendered["memoryMiB"] = slot.memory_mib
    return rendered


def node_classes(
    record: NodeRecord, policy: CompiledPolicy, *, allocated_by: Mapping[str, int]
) -> list[dict[str, Any]] | None:
    """The node's ``slots.classes``; None when it offers none."""
    rendered = [
        entry(slot, capacity=capacity, allocated=allocated_by.get(slot.resource, 0))
        for slot, capacity in per_class(record, policy)
    ]
    return rendered or None


class ClassTally:
    """A policy's classes over its nodes: slots, slots held and nodes, per class."""

    def __init__(self) -> None:
        self._counts: dict[SlotClass, list[int]] = {}

    def add(self, record: NodeRecord, policy: CompiledPolicy, *, held: Mapping[str, int]) -> None:
        for slot, capacity in per_class(record, policy):
            counts = self._counts.setdefault(slot, [0, 0, 0])
            counts[0] += capacity
            counts[1] += held.get(slot.resource, 0)
            counts[2] += 1

    def render(self) -> list[dict[str, Any]] | None:
        """The policy's ``slots.classes`` (by resource, then size); None when it has none."""
        rendered = []
        for slot in sorted(self._counts, key=_order)[:MAX_CLASSES]:
            capacity, allocated, nodes = self._counts[slot]
            item = entry(slot, capacity=capacity, allocated=allocated)
            item["nodes"] = nodes
            rendered.append(item)
        return rendered or None


def _order(slot: SlotClass) -> tuple[str, int, str]:
    return (slot.resource, slot.memory_mib or 0, str(slot.isolation))

"""``explain node``: what the node's slots promise of GPU memory, and why.

The classes are the operator's (``core.slots.slotclasses`` with the policy governing the node); this
module only says where each figure comes from, from the same inputs ``classes`` reads: the
GPU's memory (GPU Feature Discovery's ``nvidia.com/gpu.memory``, or NVIDIA's tables when GFD
shows MIG slices under single), the replicas of MPS, a MIG profile's memory in NVIDIA's tables
(``core.hardware.miggeometry``) or GFD's ``<resource>.memory`` where lower.  Then the slot labels:
those
the node carries, those its class calls for (written once it is Verified), or why it carries
none (several classes, not Verified yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.decisions import NodeDecision
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.labelling.rewrittenlabels import mig_profile_of
from gpushare_operator.core.records.nodes import GPU_MEMORY, NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.slots.slotclasses import Isolation, SlotClass
from gpushare_operator.kubectl.freeslots import SEVERAL, NodeSlots, node_slots
from gpushare_operator.kubectl.memoryplan import class_dict
from gpushare_operator.kubectl.output import Style


def explain(record: NodeRecord, decision: NodeDecision, *, phase: str) -> dict[str, Any]:
    """The node's ``slotPromise`` section; ``phase`` as published (else as decided now)."""
    policy = decision.policy
    if policy is None:
        return {"classes": [], "promise": "no slot promise: no policy governs the node"}
    if decision.phase is NodePhase.UNSUPPORTED:
        return {
            "classes": [],
            "promise": f"no slot promise: policy {policy.name} cannot work here",
        }
    found = node_slots(record, policy, phase=phase)
    classes = [
        {**(class_dict(slot) or {}), "slots": capacity, "why": _why(record, policy, slot)}
        for slot, capacity in found.classes
    ]
    return {
        "classes": classes,
        "promise": _promise(found),
        "labels": {
            "carried": {k: v for k, v in found.carried.items() if v is not None},
            "wanted": {k: v for k, v in found.wanted.items() if v is not None},
            "offered": found.offered,
            "state": _labelled(found),
        },
    }


def _promise(found: NodeSlots) -> str:
    if not found.classes:
        return "no slot promise: its policy offers no slot class here"
    if len(found.classes) > 1:
        return f"{len(found.classes)} slot classes, one per resource"
    [(slot, _)] = found.classes
    if not slot.enforced:
        return f"no memory enforced ({slot.resource}, isolation {slot.isolation})"
    return f"each slot enforces {slot.memory_mib} MiB ({slot.resource}, {slot.isolation})"


def _memory_source(record: NodeRecord) -> str:
    if dra.is_on(record):
        memory = record.labels.get(GPU_MEMORY)
        return f"the lowest memory its {dra.DRIVER} ResourceSlice lists, {memory} MiB"
    if mig_profile_of(record.labels.get("nvidia.com/gpu.product")) is None:
        return f"GPU Feature Discovery's label {GPU_MEMORY}={record.labels.get(GPU_MEMORY)}"
    return f"NVIDIA's tables for {record.product} (GFD shows MIG slices under single)"


def _why(record: NodeRecord, policy: CompiledPolicy, slot: SlotClass) -> str:
    sharing = policy.sharing
    if policy.mig is not None:
        return _why_mig(record, policy, slot)
    if sharing is not None and sharing.strategy == devconfigs.MPS:
        replicas = max(1, sharing.replicas)
        if slot.memory_mib is None:
            return (
                f"MPS at {replicas} replicas, but the GPU's memory is unknown (no {GPU_MEMORY}"
                " label from GPU Feature Discovery): no limit can be promised"
            )
        memory = record.memory_mib
        return (
            f"MPS, floor({memory} MiB / {replicas} replicas), the MPS control daemon's"
            f" per-client pinned memory limit; the GPU's memory: {_memory_source(record)}"
        )
    if slot.isolation is Isolation.EXCLUSIVE:
        if slot.memory_mib is None:
            return f"Exclusive, the whole GPU, whose memory is unknown (no {GPU_MEMORY} label)"
        return f"Exclusive: the whole GPU, one pod a GPU; its memory: {_memory_source(record)}"
    return "time-slicing shares the whole GPU: every replica sees all its memory, none is capped"


def _why_mig(record: NodeRecord, policy: CompiledPolicy, slot: SlotClass) -> str:
    mig = policy.mig
    assert mig is not None
    profile = next((p for p, r in mig.resources.items() if r == slot.resource), "?")
    if not slot.enforced:
        return (
            f"time-sliced MIG devices ({mig.replicas} replicas of each {profile} slice) share"
            " the slice's memory: none is capped"
        )
    model = miggeometry.model(record.product)
    known = model.profiles.get(profile) if model is not None else None
    table = known.memory_mib if known is not None else None
    seen = record.labels.get(f"{slot.resource}.memory")
    if table is not None and slot.memory_mib == table:
        source = f"NVIDIA's tables for {record.product}"
        if seen is not None:
            source += f" (GPU Feature Discovery's {slot.resource}.memory={seen} is not lower)"
    else:
        source = f"GPU Feature Discovery's {slot.resource}.memory={seen}"
        if table is not None:
            source += f", lower than NVIDIA's tables' {table} MiB for {record.product}"
    return f"a MIG {profile} slice, a hardware partition of the GPU; its memory from {source}"


def _labelled(found: NodeSlots) -> str:
    carried = _pairs(found.carried)
    if found.offered:
        return f"labelled {carried}"
    if found.why_not == SEVERAL:
        extra = f" (it still carries {carried}, to go)" if carried else ""
        return "no slot labels: one label cannot speak for several classes" + extra
    if not found.classes or not _pairs(found.wanted):
        return f"no slot labels: {found.why_not}"
    wanted = _pairs(found.wanted)
    if not carried and found.phase != NodePhase.VERIFIED:
        return (
            f"not labelled yet: the node is {found.phase} (slot labels are written once it is"
            f" Verified: {wanted})"
        )
    if not carried:
        return f"not labelled yet: Verified, the operator writes {wanted} next"
    if found.phase != NodePhase.VERIFIED:
        return (
            f"labelled {carried}: for the config it runs now; {wanted} once it is Verified on"
            " its policy's"
        )
    return f"labelled {carried}; the operator rewrites them as {wanted}"


def _pairs(labels: Mapping[str, str | None]) -> str:
    return ", ".join(f"{k}={v}" for k, v in labels.items() if v is not None)


def render(section: Mapping[str, Any], style: Style) -> str:
    lines = [style.heading(f"Slot promise: {section['promise']}")]
    classes = section.get("classes") or []
    for entry in classes if len(classes) > 1 else ():
        memory = entry.get("memoryMiB")
        shown = f"{memory} MiB" if memory is not None else "no memory enforced"
        lines.append(
            f"  {entry['resource']} ({entry['isolation']}): {shown}, {entry['slots']} slots"
        )
        lines.append(f"    why: {entry['why']}")
    if len(classes) == 1:
        lines.append(f"  why: {classes[0]['why']}")
    labels = section.get("labels")
    if labels is not None:
        lines.append(f"  {labels['state']}")
        if labels["offered"] and classes and classes[0].get("memoryMiB") is not None:
            lines.append(
                "  the memory-request webhook may give this node's slots to requests of up to"
                f" {classes[0]['memoryMiB']} MiB"
            )
    return "\n".join(lines)

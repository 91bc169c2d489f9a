"""``kubectl gpushare status``: the free slots of each slot class over the cluster.

A slot class (``core.slots.slotclasses``: a resource, its isolation, the GPU memory a slot enforces)
is what a pod created with ``gpushare.dev/gpu-memory`` can be given: the operator's webhook
chooses the smallest enforced class that holds the request among those the nodes' slot labels
offer (``core.slots.memoryrequests``, ``cache.slotoffers``).  Per node, the classes and their slots
come from the operator's own code with the policy governing it (``slotstatus.per_class``, the
figures of ``slots.classes`` in the statuses), the slots held from the usage ledger; a node's
slots count as offered only where it carries the slot labels its class calls for
(``slotclasses.labels``), which the operator writes once the node is Verified.  The rest are
counted apart, with why: not Verified yet, several classes on the node (a MIG layout of several
profiles: one label cannot speak for them), or labels not rewritten yet.

Time-slicing classes (isolation ``none``) are listed for their slots, never for memory: they
enforce none, and the webhook never gives them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.pods import MEMORY_REQUEST_LABEL
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.slots import slotclasses, slotstatus
from gpushare_operator.core.slots.slotclasses import SlotClass
from gpushare_operator.kubectl.output import Style, plural, slots, table
from gpushare_operator.reconcile import tallies
from gpushare_operator.reconcile.planner import Planner

SEVERAL: Final = "several classes on the node: one label cannot speak for several classes"
TOO_LONG: Final = "its resource name is too long for a label value: no slot labels"
Labels = dict[str, str | None]


@dataclass(frozen=True, slots=True)
class NodeSlots:
    """A node's slot classes under its policy, and whether its labels offer them."""

    classes: tuple[tuple[SlotClass, int], ...]  # (class, its slots on the node)
    wanted: Labels  # the slot labels the operator writes for it once Verified (None: absent)
    carried: Labels  # the slot labels it carries now
    phase: str
    offered: bool  # its labels say what its class is: the webhook may choose it
    why_not: str | None  # why not, when not


def node_slots(record: NodeRecord, policy: CompiledPolicy, *, phase: str) -> NodeSlots:
    """``phase``: the node's as published (else as the operator would decide it now)."""
    found = tuple(slotstatus.per_class(record, policy))
    wanted = slotclasses.labels(slotclasses.promise(record, policy))
    carried: Labels = {key: record.labels.get(key) for key in slotclasses.LABELS}
    labelled = any(value is not None for value in wanted.values())
    offered = labelled and carried == wanted
    why = None
    if len(found) > 1:
        why = SEVERAL
    elif not found:
        why = "its policy offers no slot class here"
    elif not labelled:
        why = TOO_LONG
    elif not offered:
        why = _unlabelled(phase, carries=any(value is not None for value in carried.values()))
    return NodeSlots(found, wanted, carried, phase, offered, why)


def _unlabelled(phase: str, *, carries: bool) -> str:
    verified = phase == NodePhase.VERIFIED
    if carries and not verified:
        return f"{phase}: its slot labels are the config's it runs now, rewritten once Verified"
    if carries:
        return "Verified, its slot labels say another class: not rewritten yet"
    if not verified:
        return f"{phase}: slot labels are written once it is Verified"
    return "Verified, its slot labels not written yet"


def phase_of(planner: Planner, record: NodeRecord, decided: NodePhase) -> str:
    published = planner.cache.node_states.get(record.name) or {}
    return str(published.get("phase") or decided)


@dataclass
class _Count:
    nodes: int = 0
    capacity: int = 0
    allocated: int = 0

    def add(self, capacity: int, allocated: int) -> None:
        self.nodes += 1
        self.capacity += capacity
        self.allocated += allocated

    def as_dict(self) -> dict[str, int]:
        return {"nodes": self.nodes, "capacity": self.capacity, "allocated": self.allocated}


@dataclass
class _Class:
    policies: set[str] = field(default_factory=set)
    offered: _Count = field(default_factory=_Count)
    waiting: _Count = field(default_factory=_Count)
    why: Counter[str] = field(default_factory=Counter)


def slot_classes(planner: Planner) -> list[dict[str, Any]]:
    """Every slot class the governed nodes have, with its slots where the labels offer it
    (``capacity``, ``allocated``, ``free``) and apart where they do not (``notOffered``)."""
    cache = planner.cache
    totals: dict[SlotClass, _Class] = {}
    for name in sorted(cache.nodes):
        record = cache.nodes[name]
        decision = planner.decide(record)
        policy = decision.policy
        if policy is None or decision.phase is NodePhase.UNSUPPORTED:
            continue
        view = tallies.slot_view(cache, record, policy)  # a DRA node: its slice's memory
        found = node_slots(view, policy, phase=phase_of(planner, record, decision.phase))
        for slot, capacity in found.classes:
            allocated = tallies.usage(cache, record, policy, slot.resource)[0]
            total = totals.setdefault(slot, _Class())
            total.policies.add(policy.name)
            if found.offered:
                total.offered.add(capacity, allocated)
            else:
                total.waiting.add(capacity, allocated)
                total.why[found.why_not or "-"] += 1
    return [_entry(slot, totals[slot]) for slot in sorted(totals, key=_order)]


def _order(slot: SlotClass) -> tuple[bool, int, str, str]:
    """Enforced classes first, smallest first (the webhook's order), then the others."""
    return (not slot.enforced, slot.memory_mib or 0, slot.resource, str(slot.isolation))


def _entry(slot: SlotClass, total: _Class) -> dict[str, Any]:
    offered = total.offered
    entry: dict[str, Any] = {
        "resource": slot.resource,
        "isolation": str(slot.isolation),
        "enforced": slot.enforced,
    }
    if slot.enforced:
        entry["memoryMiB"] = slot.memory_mib
    entry.update(
        {
            "policies": sorted(total.policies),
            "nodes": offered.nodes,
            "capacity": offered.capacity,
            "allocated": offered.allocated,
            "free": max(0, offered.capacity - offered.allocated),
            "notOffered": {**total.waiting.as_dict(), "why": dict(sorted(total.why.items()))},
        }
    )
    return entry


def memory_cell(entry: Mapping[str, Any]) -> str:
    return f"{entry['memoryMiB']} MiB" if entry["enforced"] else "no memory enforced"


def render(classes: Sequence[Mapping[str, Any]], style: Style) -> str:
    heading = style.heading(
        f"Slot classes ({MEMORY_REQUEST_LABEL} requests get the smallest enforced class that"
        " holds them):"
    )
    if not classes:
        return heading + "\n  none: no node is governed by a policy"
    rows = [
        (
            c["resource"],
            c["isolation"],
            memory_cell(c),
            ", ".join(c["policies"]),
            c["nodes"],
            slots(c["allocated"], c["capacity"], style),
            c["free"],
        )
        for c in classes
    ]
    headers = ("RESOURCE", "ISOLATION", "MEMORY/SLOT", "POLICIES", "NODES", "SLOTS", "FREE")
    lines = [heading, table(headers, rows, indent="  ")]
    note = "  NODES, SLOTS and FREE count the nodes whose slot labels offer the class (Verified)"
    if any(not c["enforced"] for c in classes):
        note += "; a class of no memory enforced has free slots, never free memory"
    lines.append(note + ".")
    for c in classes:
        apart = c["notOffered"]
        if not apart["nodes"]:
            continue
        why = "; ".join(f"{reason} ({n})" for reason, n in apart["why"].items())
        lines.append(
            f"  not offered: {c['resource']} {c['isolation']} {memory_cell(c)} on"
            f" {plural(apart['nodes'], 'node')} ({apart['capacity']} slots): {why}"
        )
    return "\n".join(lines)

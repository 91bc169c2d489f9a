"""The plan's memory requests: pods that asked for GPU memory and whose slot the change would
take away or shrink under their request.

The rule is the operator's own (``core.slots.memoryfits``): for each such pod on a node, the node's
slot classes before the planned change (under the policy that governs it now) and after (under
the policy governing it in the forecast's standings, as GFD will label the node), and what the
pod loses.  The operator holds such a node (``podPolicy: WaitForPods``, reason
``MemoryNoLongerEnforced``) or evicts the pod first (``Evict``): an evicted pod is listed but
makes no problem, as an eviction is no overcommit; any other makes the plan exit 2.

The node's records are taken before the forecast settles them (``Snapshot``): the forecast
rewrites some GPU Feature Discovery labels as the agents would, but not the memory ones, so the
classes after are worked out from the node as it is (``memoryfits.after_view``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import quantities
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.pods import MEMORY_REQUEST_LABEL, PodRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.slots import memoryfits, slotclasses
from gpushare_operator.core.slots.slotchanges import SlotChange
from gpushare_operator.core.slots.slotclasses import SlotClass
from gpushare_operator.kubectl.forecast import Forecast
from gpushare_operator.kubectl.output import Style, table
from gpushare_operator.kubectl.standings import GOVERNED, NodeStanding


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The nodes and the memory-requesting pods on them, before the forecast runs."""

    records: Mapping[str, NodeRecord]
    pods: tuple[PodRecord, ...]

    @classmethod
    def take(cls, cache: ClusterCache) -> Snapshot:
        pods = tuple(
            sorted(
                (p for p in cache.usage if p.memory_mib is not None and p.holds_slots),
                key=lambda p: (p.namespace, p.name),
            )
        )
        return cls(records=dict(cache.nodes), pods=pods)


@dataclass(frozen=True, slots=True)
class MemoryMisfit:
    """A pod whose slot would no longer hold its memory request."""

    pod: PodRecord
    node: str
    pool: str
    policy_before: str | None
    policy_after: str | None
    change: SlotChange
    evicted: bool = False  # the operator evicts it before the change (podPolicy Evict)
    waits: bool = False  # the operator holds the node until it is gone (WaitForPods)


def find(
    forecast: Forecast,
    snapshot: Snapshot,
    *,
    before: Mapping[str, CompiledPolicy],
    after: Mapping[str, CompiledPolicy],
) -> list[MemoryMisfit]:
    """The pods of ``snapshot`` whose slot the forecast's change removes or shrinks below
    their request; ``before`` and ``after`` are the policies as they are and as planned."""
    found = []
    held = {h.node for h in forecast.held if h.reason == memoryfits.REASON}
    for pod in snapshot.pods:
        node = pod.node
        record = snapshot.records.get(node or "")
        if node is None or record is None:
            continue
        was, now = forecast.before.get(node), forecast.after.get(node)
        old, new = _governing(was, before), _governing(now, after)
        layout = old.mig.layouts.get(record.product or "") if old and old.mig else None
        classes_before = slotclasses.classes(record, old) if old is not None else ()
        classes_after = memoryfits.classes_after(record, new, layout_before=layout)
        for misfit in memoryfits.misfits([pod], before=classes_before, after=classes_after):
            pool = forecast.pools.get(node, "-")
            evictions = forecast.evictions.get(node)
            evicted = evictions is not None and evictions.drains and pod in evictions.pods
            names = _name(old), _name(new)
            found.append(
                MemoryMisfit(pod, node, pool, *names, misfit.change, evicted, node in held)
            )
    return found


def _governing(
    standing: NodeStanding | None, policies: Mapping[str, CompiledPolicy]
) -> CompiledPolicy | None:
    if standing is None or standing.standing != GOVERNED or standing.policy is None:
        return None
    return policies.get(standing.policy)


def _name(policy: CompiledPolicy | None) -> str | None:
    return policy.name if policy is not None else None


# -- the report -----------------------------------------------------------------------------------


def class_dict(slot: SlotClass | None) -> dict[str, Any] | None:
    if slot is None:
        return None
    shown: dict[str, Any] = {"resource": slot.resource, "isolation": str(slot.isolation)}
    if slot.enforced:
        shown["memoryMiB"] = slot.memory_mib
    return shown


def as_dicts(misfits: Sequence[MemoryMisfit]) -> list[dict[str, Any]]:
    """``memoryRequests`` in the plan's JSON."""
    return [
        {
            "namespace": m.pod.namespace,
            "name": m.pod.name,
            "node": m.node,
            "pool": m.pool,
            "requestMiB": m.change.request_mib,
            "resource": m.change.resource,
            "loss": str(m.change.loss),
            "before": {"policy": m.policy_before, "class": class_dict(m.change.before)},
            "after": {
                "policy": m.policy_after,
                "class": class_dict(m.change.after),
                "classes": [class_dict(s) for s in m.change.others],
            },
            "why": m.change.describe(),
            "evicted": m.evicted,
            "waitsForPods": m.waits,
        }
        for m in misfits
    ]


def problems(items: Sequence[Mapping[str, Any]]) -> list[str]:
    return [
        f"pod {i['namespace']}/{i['name']} on node {i['node']} would lose the slot its GPU"
        f" memory request holds: {i['why']}"
        + (f"; the node waits for it ({memoryfits.REASON})" if i.get("waitsForPods") else "")
        for i in items
        if not i.get("evicted")
    ]


def _cell(side: Mapping[str, Any]) -> str:
    shown = side.get("class")
    if shown is None:
        others = side.get("classes") or []
        text = ", ".join(_short(c) for c in others) if others else "no slot class"
    else:
        text = _short(shown)
    return f"{text} ({side['policy']})" if side.get("policy") else text


def _short(shown: Mapping[str, Any]) -> str:
    memory = shown.get("memoryMiB")
    if memory is None:
        return f"{shown['resource']} {shown['isolation']}: no memory enforced"
    return f"{memory} MiB {shown['isolation']}"


def render(items: Sequence[Mapping[str, Any]], style: Style) -> str:
    """The plan's section on them (empty when there are none)."""
    if not items:
        return ""
    heading = style.heading(
        f"Pods whose GPU memory request ({MEMORY_REQUEST_LABEL}) their node's slot would no"
        " longer hold:"
    )
    rows = [
        (
            f"{i['namespace']}/{i['name']}" + (" (evicted)" if i.get("evicted") else ""),
            quantities.describe_mib(i["requestMiB"]),
            i["node"],
            _cell(i["before"]),
            _cell(i["after"]),
        )
        for i in items
    ]
    headers = ("POD", "REQUEST", "NODE", "SLOT BEFORE", "SLOT AFTER")
    return heading + "\n" + table(headers, rows, indent="  ")

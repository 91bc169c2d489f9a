"""The node lifecycle controller's NoSchedule pass, as a pure function.

kube-apiserver's ``TaintNodesByCondition`` admission plugin (on by default) taints every new
Node ``node.kubernetes.io/not-ready:NoSchedule``; the node lifecycle controller in
kube-controller-manager then keeps the NoSchedule taints in line with the node's conditions
(``pkg/controller/nodelifecycle/node_lifecycle_controller.go``, ``doNoScheduleTaintingPass``):
a Ready node loses that taint, and kube-scheduler can place pods on it.  The controller manager
of the test control plane does not run that controller (its heartbeat checks would mark every
simulated node unreachable), so ``GpuClusterSimulator`` runs this pass on the nodes it creates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["no_schedule_taints"]

NO_SCHEDULE: Final = "NoSchedule"
UNSCHEDULABLE: Final = "node.kubernetes.io/unschedulable"
# nodeConditionToTaintKeyStatusMap: condition type -> status -> taint key.
_CONDITION_TAINTS: Final[Mapping[str, Mapping[str, str]]] = {
    "Ready": {"False": "node.kubernetes.io/not-ready", "Unknown": "node.kubernetes.io/unreachable"},
    "MemoryPressure": {"True": "node.kubernetes.io/memory-pressure"},
    "DiskPressure": {"True": "node.kubernetes.io/disk-pressure"},
    "NetworkUnavailable": {"True": "node.kubernetes.io/network-unavailable"},
    "PIDPressure": {"True": "node.kubernetes.io/pid-pressure"},
}
_MANAGED: Final = {key for keys in _CONDITION_TAINTS.values() for key in keys.values()}


def no_schedule_taints(node: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The node's taints once the pass ran, or ``None`` when it changes nothing.

    Only the NoSchedule taints that stand for a condition (or for ``spec.unschedulable``) are
    the controller's; every other taint is kept as it is.
    """
    wanted = set()
    for condition in (node.get("status") or {}).get("conditions") or ():
        key = _CONDITION_TAINTS.get(condition.get("type"), {}).get(condition.get("status"))
        if key is not None:
            wanted.add(key)
    if (node.get("spec") or {}).get("unschedulable"):
        wanted.add(UNSCHEDULABLE)
    current = list((node.get("spec") or {}).get("taints") or ())

    def managed(taint: Mapping[str, Any]) -> bool:
        key = taint.get("key")
        return taint.get("effect") == NO_SCHEDULE and (key in _MANAGED or key == UNSCHEDULABLE)

    present = {t["key"] for t in current if managed(t)}
    if present == wanted:
        return None
    kept = [t for t in current if not managed(t) or t["key"] in wanted]
    return kept + [{"key": key, "effect": NO_SCHEDULE} for key in sorted(wanted - present)]

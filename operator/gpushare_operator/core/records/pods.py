"""Slim Pod records and the scheduler's effective-request rule for shared GPU resources.

Only pods that request a tracked resource are kept, and of them only what usage accounting
and the choice of eviction victims read: identity, node, phase, the effective requests, and
the labels that PodDisruptionBudgets select on (``core.rollout.budgets``).  Everything else in
a ~8 KB Pod body (managedFields, env, volumes, status) is left behind at ingest.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from gpushare_operator.core import quantities

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

Requests = tuple[tuple[str, int], ...]  # sorted (resource, amount) pairs, amount > 0
Quantity = Callable[[object], int]  # one resource quantity as the caller counts it

_intern = sys.intern
_shared_requests: dict[Requests, Requests] = {}


@dataclass(frozen=True, slots=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    node: str | None  # spec.nodeName; None while unscheduled
    phase: str
    requests: Requests
    # What podPolicy Evict chooses by (kube-scheduler's preemption order) and never evicts.
    priority: int = 0  # spec.priority, as the priority admission plugin set it
    # metadata.creationTimestamp as the number YYYYMMDDhhmmss (sorts as the time does; 0 when
    # absent or not RFC 3339): a small int, not its 20-character text.
    created: int = 0
    evictable: bool = True  # False for a mirror (static) pod or a DaemonSet's pod
    terminating: bool = False  # metadata.deletionTimestamp is set: it is on its way out
    # What its gpushare.dev/gpu-memory label asks for, in MiB; None: no (valid) label.  A
    # change that would leave it a smaller slot is what `kubectl gpushare plan` warns of.
    memory_mib: int | None = None
    # Its labels under the keys some PodDisruptionBudget's selector reads, sorted by key, and
    # no others (``core.rollout.budgets``); None: the pod has no labels at all.
    labels: tuple[tuple[str, str], ...] | None = None

    @property
    def holds_slots(self) -> bool:
        """Bound and not finished: the scheduler counts it against the node."""
        return self.node is not None and self.phase not in TERMINAL_PHASES

    def amount(self, resource: str) -> int:
        for name, value in self.requests:
            if name == resource:
                return value
        return 0


def _quantity(raw: object) -> int:
    """Extended resources are whole numbers; anything else counts as nothing."""
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw)
        except ValueError:
            return 0
    return 0


def container_request(
    container: Mapping[str, Any], resource: str, *, quantity: Quantity = _quantity
) -> int:
    """A container's request of an extended resource; a limit alone stands in for it.

    ``quantity`` reads one value (whole units by default; the simulated kubelet passes its own
    parser for cpu and memory).
    """
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    if resource in requests:
        return quantity(requests[resource])
    return quantity((resources.get("limits") or {}).get(resource))


def _is_sidecar(container: Mapping[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def effective_request(
    spec: Mapping[str, Any], resource: str, *, quantity: Quantity = _quantity
) -> int:
    """What the scheduler reserves for the pod: max(init phase, steady state).

    A regular init container runs alongside the sidecars (restartable init containers)
    declared before it; app containers run alongside every sidecar.
    """
    sidecars_so_far = 0
    init_peak = 0
    for container in spec.get("initContainers") or ():
        amount = container_request(container, resource, quantity=quantity)
        if _is_sidecar(container):
            sidecars_so_far += amount
        else:
            init_peak = max(init_peak, amount + sidecars_so_far)
    steady = sidecars_so_far + sum(
        container_request(c, resource, quantity=quantity) for c in spec.get("containers") or ()
    )
    return max(init_peak, steady)


def _requested_names(spec: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or ():
            resources = container.get("resources") or {}
            names.update(resources.get("requests") or ())
            names.update(resources.get("limits") or ())
    return names


def effective_requests(spec: Mapping[str, Any], *, tracked: Callable[[str], bool]) -> Requests:
    """Effective requests of every tracked resource the pod asks for, shared when equal."""
    pairs = []
    for name in sorted(n for n in _requested_names(spec) if tracked(n)):
        amount = effective_request(spec, name)
        if amount > 0:
            pairs.append((_intern(name), amount))
    key = tuple(pairs)
    return _shared_requests.setdefault(key, key)


def project_pod(
    obj: Mapping[str, Any],
    *,
    tracked: Callable[[str], bool],
    label_keys: AbstractSet[str] = frozenset(),
) -> PodRecord | None:
    """The one copy of a pod we keep, or None for a pod that asks for no tracked resource;
    of its labels, those under ``label_keys`` (what PodDisruptionBudgets select on)."""
    spec = obj.get("spec") or {}
    requests = effective_requests(spec, tracked=tracked)
    if not requests:
        return None
    metadata = obj.get("metadata") or {}
    node = spec.get("nodeName")
    return PodRecord(
        uid=str(metadata.get("uid", "")),
        namespace=_intern(str(metadata.get("namespace", ""))),
        name=str(metadata.get("name", "")),
        node=_intern(node) if isinstance(node, str) and node else None,
        phase=_intern(str((obj.get("status") or {}).get("phase") or "Pending")),
        requests=requests,
        priority=_priority(spec.get("priority")),
        created=_timestamp(metadata.get("creationTimestamp")),
        evictable=_evictable(metadata),
        terminating=bool(metadata.get("deletionTimestamp")),
        memory_mib=_memory_request(metadata),
        labels=_labels(metadata, label_keys),
    )


def _labels(
    metadata: Mapping[str, Any], keys: AbstractSet[str]
) -> tuple[tuple[str, str], ...] | None:
    labels = metadata.get("labels")
    if not isinstance(labels, Mapping) or not labels:
        return None
    return tuple(
        sorted((_intern(k), v) for k, v in labels.items() if k in keys and isinstance(v, str))
    )


MEMORY_REQUEST_LABEL = "gpushare.dev/gpu-memory"  # memoryrequests.REQUEST_LABEL


def _memory_request(metadata: Mapping[str, Any]) -> int | None:
    text = (metadata.get("labels") or {}).get(MEMORY_REQUEST_LABEL)
    if not isinstance(text, str):
        return None
    try:
        return quantities.parse_mib(text)
    except quantities.QuantityError:
        return None


def _timestamp(text: object) -> int:
    """``2026-12-02T18:41:00Z`` -> 20261202184100; 0 for anything else."""
    if not isinstance(text, str) or len(text) < 19:
        return 0
    digits = text[0:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16] + text[17:19]
    return int(digits) if digits.isdigit() else 0


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _priority(raw: object) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0


def _evictable(metadata: Mapping[str, Any]) -> bool:
    """Neither a mirror pod (kubelet runs its static pod whatever the API says) nor a
    DaemonSet's (its controller would put it straight back on the same node)."""
    if MIRROR_ANNOTATION in (metadata.get("annotations") or {}):
        return False
    owners = metadata.get("ownerReferences") or ()
    return not any(
        isinstance(o, Mapping) and o.get("kind") == "DaemonSet" and o.get("controller")
        for o in owners
    )


def uid_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def total(records: Iterable[PodRecord], *, node: str, resource: str) -> tuple[int, int]:
    """(slots, pods) on ``node`` from scratch: the reference the incremental ledger must equal."""
    slots = pods = 0
    for record in records:
        if record.node == node and record.holds_slots:
            amount = record.amount(resource)
            if amount:
                slots += amount
                pods += 1
    return slots, pods

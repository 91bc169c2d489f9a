"""Which pods ``podPolicy: Evict`` takes off a node so that the rest fit its new config.

The choice is kube-scheduler's own for preemption (``SelectVictimsOnNode`` in its
``defaultpreemption`` plugin): take every pod that may go off the node, then give back each pod
that still fits beside those already given back: first the pods whose eviction would violate
a PodDisruptionBudget (``core.rollout.budgets.violating``, counted as the scheduler counts), then
the
others, each group most important first.  Most important is the higher ``spec.priority``, then
the older pod (kube-scheduler compares ``status.startTime``; we compare
``metadata.creationTimestamp``, which every pod has), then the name, so that ties are settled
the same way by every leader.  What is left over are the victims, least important first, and
no more of them than needed: giving any one of them back would overfill the node (the set is
minimal, though a different set could be smaller in count).  So a pod its budget protects
stays whenever pods no budget holds back can make the room; it goes only when they cannot.

Pods that are never evicted stay whatever happens: a DaemonSet's pod (its controller would put
it straight back), a mirror pod (kubelet runs the static pod whatever the API says).  Pods that
ask for no GPU resource are not in our records at all.  A pod already on its way out
(``deletionTimestamp`` set) is neither evicted nor counted as staying: the node waits for it.

``select`` applies the rule to each resource of the new config by itself (a MIG layout of
several profiles offers each its own count: only what overflows a resource goes), and before it
takes off the pods that go whatever the count: a pod whose GPU memory request its new slot would
not hold (``core.slots.memoryfits``), and a pod of a resource the new config does not advertise.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpushare_operator.core import backends
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.mig.migconfigs import MigLayout
from gpushare_operator.core.records.nodes import GPU_RESOURCE, NodeRecord
from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.rollout import budgets as core_budgets
from gpushare_operator.core.rollout.budgets import BudgetRecord


@dataclass(frozen=True, slots=True)
class Victims:
    evict: tuple[PodRecord, ...] = ()  # to evict, in the order to evict them
    leaving: tuple[PodRecord, ...] = ()  # on their way out already: waited for
    stuck: str | None = None  # why the node cannot fit even so (pods we never evict); None: it can


def importance(pod: PodRecord) -> tuple[int, int, str, str]:
    """Sort key, most important first: higher priority, then older, then by name."""
    return (-pod.priority, pod.created, pod.namespace, pod.name)


def choose(
    pods: Iterable[PodRecord],
    *,
    resource: str | None,
    capacity: int,
    budgets: Iterable[BudgetRecord] = (),
) -> Victims:
    """The pods to evict for the rest to fit ``capacity`` slots of ``resource`` (and nothing
    of any other GPU resource); ``resource`` None: the GPUs must be left with no pod at all.
    ``budgets``: the PodDisruptionBudgets of the pods' namespaces, as they allow now."""
    staying: list[PodRecord] = []
    leaving: list[PodRecord] = []
    candidates: list[PodRecord] = []
    for pod in pods:
        if not pod.holds_slots or not pod.requests:
            continue
        if pod.terminating:
            leaving.append(pod)
        elif not pod.evictable:
            staying.append(pod)
        else:
            candidates.append(pod)
    stuck = _stuck(staying, resource=resource, capacity=capacity)
    if stuck is not None:
        return Victims(leaving=tuple(leaving), stuck=stuck)
    held = sum(pod.amount(resource) for pod in staying) if resource is not None else 0
    evict: list[PodRecord] = []
    for pod in _reprieve_order(candidates, budgets):
        amount = pod.amount(resource) if resource is not None else 0
        fits = resource is not None and _only(pod, resource) and held + amount <= capacity
        if fits:
            held += amount
        else:
            evict.append(pod)
    evict.sort(key=importance, reverse=True)  # least important first
    return Victims(tuple(evict), tuple(leaving))


def _reprieve_order(
    candidates: list[PodRecord], budgets: Iterable[BudgetRecord]
) -> list[PodRecord]:
    """kube-scheduler's order of giving back: the pods whose eviction would violate a budget
    first, then the rest, each most important first."""
    ranked = sorted(candidates, key=importance)
    protected = core_budgets.violating(ranked, budgets)
    if not protected:
        return ranked
    return [p for p in ranked if p.uid in protected] + [p for p in ranked if p.uid not in protected]


def _only(pod: PodRecord, resource: str) -> bool:
    """Whether the pod asks for no GPU resource but ``resource`` (the new config advertises
    nothing else: a pod holding another would keep a device the plugin no longer offers)."""
    return all(name == resource for name, _ in pod.requests)


def _stuck(staying: list[PodRecord], *, resource: str | None, capacity: int) -> str | None:
    if not staying:
        return None
    names = ", ".join(sorted(f"{p.namespace}/{p.name}" for p in staying))
    if resource is None:
        return f"pods that are never evicted (DaemonSet or static pods) hold GPUs: {names}"
    if not all(_only(pod, resource) for pod in staying):
        return (
            "pods that are never evicted (DaemonSet or static pods) hold a resource the new"
            f" config does not advertise: {names}"
        )
    held = sum(pod.amount(resource) for pod in staying)
    if held > capacity:
        return (
            f"pods that are never evicted (DaemonSet or static pods) hold {held} {resource};"
            f" the new config has {capacity}: {names}"
        )
    return None


def room(
    record: NodeRecord,
    policy: CompiledPolicy | None,
    *,
    layouts: Mapping[str, MigLayout | None] | None,
) -> dict[str, int] | None:
    """The slots of each resource the node's new config advertises (``policy`` None: the
    default config); None where every GPU pod must go: a change of MIG layout (only idle GPUs
    change; ``layouts`` as ``migphases.changes_mig`` takes them).  A MIG layout of several
    profiles has a count per resource, each judged by itself (``select``)."""
    gpus = record.gpus or 0
    if backends.needs_idle(record, policy, layouts=layouts):
        return None
    if policy is not None and policy.mig is not None:
        slots = policy.mig.slots_per_gpu(record.product)
        return {resource: gpus * per_gpu for resource, per_gpu in slots.items()}
    if policy is None or policy.sharing is None:
        return {GPU_RESOURCE: gpus}
    return {devconfigs.advertised_resource(policy.sharing): gpus * (policy.replicas or 1)}


def select(
    pods: Iterable[PodRecord],
    *,
    room: Mapping[str, int] | None,
    forced: Collection[str] = (),
    budgets: Iterable[BudgetRecord] = (),
) -> Victims:
    """The pods to evict for the rest to fit ``room`` (``room`` above; None: every GPU pod
    goes), ``choose``'s rule applied to each resource by itself.  Pods that go whatever the
    count says: those in ``forced`` (uids: pods whose memory request the new slot would not
    hold, ``core.slots.memoryfits``), those holding a resource the new config does not advertise,
    and those holding several resources (never given back: harsher than needed, and rare).
    A pod that must go but is never evicted makes the node stuck.  ``budgets``: as ``choose``."""
    budgets = tuple(budgets)
    if room is None:
        return choose(pods, resource=None, capacity=0, budgets=budgets)
    groups: dict[str, list[PodRecord]] = {resource: [] for resource in room}
    must: list[PodRecord] = []
    for pod in pods:
        if not pod.holds_slots or not pod.requests:
            continue
        [(resource, _)] = pod.requests if len(pod.requests) == 1 else [(None, 0)]
        if pod.uid in forced or resource is None or resource not in room:
            must.append(pod)
        else:
            groups[resource].append(pod)
    parts = [
        choose(group, resource=r, capacity=room[r], budgets=budgets)
        for r, group in sorted(groups.items())
    ]
    parts.append(_forced(must))
    stuck = [part.stuck for part in parts if part.stuck is not None]
    if stuck:
        return Victims(leaving=_merged(p.leaving for p in parts), stuck="; ".join(stuck))
    evict = sorted((pod for part in parts for pod in part.evict), key=importance, reverse=True)
    return Victims(tuple(evict), _merged(p.leaving for p in parts))


def _forced(pods: list[PodRecord]) -> Victims:
    """Pods that must go, however many slots are left: evicted, waited for while they end,
    or, for one that is never evicted, the reason the node is stuck."""
    staying = [p for p in pods if not p.terminating and not p.evictable]
    leaving = tuple(p for p in pods if p.terminating)
    if staying:
        names = ", ".join(sorted(f"{p.namespace}/{p.name}" for p in staying))
        return Victims(
            leaving=leaving,
            stuck=(
                "pods that are never evicted (DaemonSet or static pods) do not fit the new"
                " config (a resource it does not advertise, or a GPU memory request its slot"
                f" would not hold): {names}"
            ),
        )
    evict = sorted((p for p in pods if not p.terminating), key=importance, reverse=True)
    return Victims(tuple(evict), leaving)


def _merged(groups: Iterable[tuple[PodRecord, ...]]) -> tuple[PodRecord, ...]:
    return tuple(sorted((pod for group in groups for pod in group), key=importance))

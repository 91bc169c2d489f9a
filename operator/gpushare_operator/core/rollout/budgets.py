"""PodDisruptionBudgets as kube-scheduler reads them when it chooses preemption victims.

kube-scheduler's ``SelectVictimsOnNode`` (its ``defaultpreemption`` plugin) sets aside every
pod that may go, then gives them back most important first, but the pods whose eviction would
violate a budget before all the others (``filterPodsWithPDBViolation``): a pod a budget
protects stays whenever a pod it does not protect can make the room instead.
``core.rollout.victims``
makes the same choice; this module keeps what that rule reads of a budget and says which pods
would violate one.

The rule is the scheduler's, not the Eviction API's (``kubectl.disruptions`` is about that one):

- a budget covers the pods of its namespace that its selector selects; a missing or empty
  selector covers none (the Eviction API reads an empty one as every pod), nor does one that
  does not parse; a pod with no labels at all is covered by none;
- a pod named in the budget's ``status.disruptedPods`` has been let go by the API server
  already: it takes nothing from the budget and violates nothing;
- walking the candidates most important first, each pod a budget covers takes one from what the
  budget allows (``status.disruptionsAllowed``, counted down per choice, never written back);
  a pod that takes one the budget no longer has (the count goes below 0) violates it.

A pod's labels are kept (``PodRecord.labels``) only under the keys some budget's selector reads
(``label_keys``): a selector sees only its own keys, so the match is the same as on the whole
label set, and the rest of a pod's labels are never held.  The one difference the projection
must keep is "no labels at all" (covered by nothing, even by ``key DoesNotExist``), which is
why a pod without labels keeps ``None`` and one without the keys read keeps ``()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare_operator.core.labelling.selectors import (
    CompiledSelector,
    SelectorError,
    compile_selector,
)
from gpushare_operator.core.records.pods import PodRecord


@dataclass(frozen=True, slots=True)
class BudgetRecord:
    """The slim record of one PodDisruptionBudget: what the victim choice reads, nothing else."""

    namespace: str
    name: str
    selector: CompiledSelector | None  # None: covers no pod (missing, empty or unreadable)
    allowed: int  # status.disruptionsAllowed; 0 until the disruption controller has said
    disrupted: frozenset[str] = frozenset()  # status.disruptedPods: pod names let go already

    @property
    def key(self) -> str:
        """``namespace/name``, as a refusal names it."""
        return f"{self.namespace}/{self.name}"

    @property
    def label_keys(self) -> frozenset[str]:
        """The pod label keys its selector reads."""
        return self.selector.keys if self.selector is not None else frozenset()

    def covers(self, pod: PodRecord) -> bool:
        """Whether the budget counts ``pod`` (its labels as kept: ``PodRecord.labels``)."""
        if self.selector is None or pod.labels is None or pod.namespace != self.namespace:
            return False
        return self.selector.matches(dict(pod.labels))


def project_budget(obj: Mapping[str, Any]) -> BudgetRecord:
    """The one copy of a budget kept: its selector compiled once, its status counts."""
    metadata = obj.get("metadata") or {}
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    disrupted = status.get("disruptedPods")
    return BudgetRecord(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        selector=_selector(spec.get("selector")),
        allowed=_count(status.get("disruptionsAllowed")),
        disrupted=frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
    )


def _selector(raw: object) -> CompiledSelector | None:
    if not isinstance(raw, Mapping):
        return None
    try:
        compiled = compile_selector(raw)
    except SelectorError:
        return None  # the API server validated it; what we cannot read covers nothing
    return None if compiled.selects_everything else compiled


def _count(raw: object) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0


def violating(ranked: Sequence[PodRecord], budgets: Iterable[BudgetRecord]) -> frozenset[str]:
    """The uids of the pods of ``ranked`` (most important first) whose eviction would violate a
    budget, counted as kube-scheduler counts them for one choice of victims."""
    covering = [b for b in budgets if b.selector is not None]
    left = [b.allowed for b in covering]
    found = set()
    for pod in ranked:
        if pod.labels is None:
            continue  # a pod without labels is covered by no budget
        for index, budget in enumerate(covering):
            if pod.name in budget.disrupted or not budget.covers(pod):
                continue
            left[index] -= 1
            if left[index] < 0:
                found.add(pod.uid)
    return frozenset(found)


def label_keys(budgets: Iterable[BudgetRecord]) -> frozenset[str]:
    """Every pod label key the budgets' selectors read: what pod records must keep."""
    return frozenset(key for budget in budgets for key in budget.label_keys)

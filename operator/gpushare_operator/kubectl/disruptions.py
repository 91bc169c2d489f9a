"""Which PodDisruptionBudgets would refuse the evictions a plan foresees, now.

Which pods are evicted is the operator's choice (``core.rollout.victims`` with
``core.rollout.budgets``:
kube-scheduler's rule, under which an empty selector covers no pod); this module says which
budgets would refuse those evictions, by the Eviction API's rule, which differs from it.

Under ``podPolicy: Evict`` the operator evicts through the Eviction API, which refuses (HTTP
429) while a budget the pod falls under allows no disruption.  The plan says so beforehand, by
the API server's own rules (``pkg/registry/core/pod/storage/eviction.go``):

- a budget covers the pods of its namespace its selector matches; an empty selector matches
  them all, a missing one none;
- a Pending pod is evicted whatever its budgets say, and so is a pod already terminating (the
  plan never evicts those: they are waited for);
- a pod under more than one budget is never evicted (the API server does not support it): all
  of them are named;
- a budget whose status the disruption controller has not caught up with (no status, or
  ``observedGeneration`` behind ``generation``) refuses, as does one with
  ``disruptionsAllowed`` 0;
- a pod that is not Ready is let go by a budget with ``unhealthyPodEvictionPolicy:
  AlwaysAllow``, and by any other while the budget has the healthy pods it wants.

The pods' labels (and what else the rules need) are not in the slim records the operator keeps:
``DetailSink`` keeps them beside the records while the pods are listed, for the plan only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.labelling.selectors import SelectorError, compile_selector
from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.kube import reading

# What a pod's own terminationGracePeriodSeconds is when its spec leaves it out.
DEFAULT_GRACE_PERIOD = 30


@dataclass(frozen=True, slots=True)
class PodDetails:
    """What the eviction rules read of a pod, beyond its slim record."""

    labels: Mapping[str, str]
    ready: bool
    grace_period: int  # its terminationGracePeriodSeconds


class DetailSink:
    """A pod sink that also keeps ``PodDetails`` of each pod the cache keeps (by uid)."""

    def __init__(self, inner: reading.Sink, cache: ClusterCache) -> None:
        self.inner = inner
        self.cache = cache
        self.details: dict[str, PodDetails] = {}

    def begin_relist(self) -> None:
        self.inner.begin_relist()

    def relist_item(self, obj: dict[str, Any]) -> None:
        self.inner.relist_item(obj)
        self._keep(obj)

    def end_relist(self) -> None:
        self.inner.end_relist()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self.inner.apply(event_type, obj)
        self._keep(obj)

    def _keep(self, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        uid = str(metadata.get("uid", ""))
        if uid not in self.cache.usage.pods:
            self.details.pop(uid, None)
            return
        grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds")
        self.details[uid] = PodDetails(
            labels=dict(metadata.get("labels") or {}),
            ready=_ready(obj),
            grace_period=grace if isinstance(grace, int) else DEFAULT_GRACE_PERIOD,
        )


def _ready(obj: Mapping[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def budget_name(budget: Mapping[str, Any]) -> str:
    metadata = budget.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


def covering(
    pod: PodRecord, labels: Mapping[str, str], budgets: Iterable[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The budgets of the pod's namespace whose selector matches its labels."""
    found = []
    for budget in budgets:
        if (budget.get("metadata") or {}).get("namespace") != pod.namespace:
            continue
        selector = (budget.get("spec") or {}).get("selector")
        if selector is None:
            continue  # policy/v1: a missing selector matches no pod
        try:
            matched = compile_selector(selector).matches(labels)
        except SelectorError:
            continue  # the API server validated it; what we cannot read, we cannot match
        if matched:
            found.append(budget)
    return found


def blocking(
    pod: PodRecord, details: PodDetails | None, budgets: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The budgets (namespace/name) that would refuse the pod's eviction now, sorted."""
    if pod.phase == "Pending" or pod.terminating:
        return []
    labels = details.labels if details is not None else {}
    covers = covering(pod, labels, budgets)
    if len(covers) > 1:
        return sorted(budget_name(b) for b in covers)
    ready = details.ready if details is not None else True
    return [budget_name(b) for b in covers if _refuses(b, ready=ready)]


def _refuses(budget: Mapping[str, Any], *, ready: bool) -> bool:
    spec, status = budget.get("spec") or {}, budget.get("status") or {}
    generation = (budget.get("metadata") or {}).get("generation") or 0
    if not ready:
        if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return False
        desired = _count(status.get("desiredHealthy"))
        if desired > 0 and _count(status.get("currentHealthy")) >= desired:
            return False
    if _count(status.get("observedGeneration")) < generation:
        return True  # the disruption controller has not seen this budget's spec yet
    return _count(status.get("disruptionsAllowed")) <= 0


def _count(raw: object) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0

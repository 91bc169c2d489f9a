"""The pods a planned change would evict from a node under ``podPolicy: Evict``, and how long.

The choice is the operator's own (``core.rollout.victims.select``, with the slots of each resource
the
node's new config advertises, and the PodDisruptionBudgets the plan read, as kube-scheduler's
preemption chooses): the fewest pods whose slots must go, those no budget holds back before
those one protects, lowest priority then youngest first, never a DaemonSet's or a static pod,
and every pod whose GPU memory request its new slot would not hold (``core.slots.memoryfits``).  A
change of MIG layout needs idle
GPUs: every GPU pod goes, as ``reconcile.drains`` has it (``fit`` below says the same).  A
node whose pods cannot be made to fit even so (pods that are never evicted hold what the new
config lacks) is ``stuck``: the operator gives it up at once (``EvictionBlocked``,
NotEvictable) and it keeps its old config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_operator.core.api.models import PodPolicy
from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy
from gpushare_operator.core.rollout import victims
from gpushare_operator.kubectl.disruptions import DEFAULT_GRACE_PERIOD, PodDetails
from gpushare_operator.kubectl.standings import DRA_SHARING, GOVERNED, standing_of
from gpushare_operator.reconcile.planner import Planner
from gpushare_operator.reconcile.rollouts import RolloutBook


@dataclass(frozen=True, slots=True)
class NodeEvictions:
    """A node drained for its change: what goes, or why nothing can."""

    node: str
    policy: str  # the policy whose rollout drains it (for a release: the one it leaves)
    pods: tuple[PodRecord, ...]  # to evict, in the order the operator evicts them
    leaving: tuple[PodRecord, ...]  # terminating already: waited for, not evicted
    stuck: str | None  # why the node cannot be drained; None: it can
    grace_period: int | None  # what the operator's evictions ask for; None: each pod's own
    timeout: str  # the policy's eviction.timeout

    @property
    def drains(self) -> bool:
        """Whether its evictions let the change go ahead (the node is no overcommit then)."""
        return self.stuck is None


def may_evict(policies: Iterable[CompiledPolicy], bodies: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a policy as the plan leaves it drains nodes: one planned (``bodies``, the edit
    or the deletion it plans) or one it leaves as it is.  Only then are the pods' details kept
    and PodDisruptionBudgets read (a change is charged to a policy's spec as planned)."""
    planned = {str((body.get("metadata") or {}).get("name")): body for body in bodies}
    specs = [p.spec for p in policies if p.name not in planned]
    for name, body in planned.items():
        compiled = compile_policy(
            name=name, uid="", generation=0, spec=body.get("spec"), dra_sharing=DRA_SHARING
        )
        specs.append(compiled.spec)
    return any(s is not None and s.rollout.podPolicy is PodPolicy.EVICT for s in specs)


def foresee(*, node: str, planner: Planner, book: RolloutBook) -> NodeEvictions | None:
    """The evictions of a node whose pods would not fit its change, if that change goes by
    podPolicy Evict: the spec of the policy the rollout charges it to, as ``reconcile.drains``
    reads it, and the resource and slots of its new config (the default one for a release)."""
    record = planner.cache.nodes[node]
    decision = planner.decide(record)
    charged = book.judge(record, decision).placement.charged
    spec, _ = book.spec_of(charged)
    if spec.podPolicy is not PodPolicy.EVICT:
        return None
    standing = standing_of(record, decision)
    policy = decision.policy if standing.standing == GOVERNED else None  # None: released
    room = victims.room(record, policy, layouts=planner.cache.mig_config.layouts)
    forced = {m.pod.uid for m in book.memory_misfits(record, policy)}
    pods = planner.cache.usage.node_pods(node)
    budgets = planner.cache.budgets.around(pods)
    chosen = victims.select(pods, room=room, forced=forced, budgets=budgets)
    return NodeEvictions(
        node=node,
        policy=charged,
        pods=chosen.evict,
        leaving=chosen.leaving,
        stuck=chosen.stuck,
        grace_period=spec.eviction.grace_period,  # as the operator asks: never 0
        timeout=spec.eviction.timeout,
    )


def drain_seconds(
    evictions: NodeEvictions, details: Mapping[str, PodDetails], *, write_qps: float
) -> float:
    """From the taint to the last pod gone, if no budget holds an eviction back: the taint and
    one eviction per pod at the write rate (all asked for at once), then the longest grace
    period (the policy's, or each pod's own terminationGracePeriodSeconds)."""
    gone = (*evictions.pods, *evictions.leaving)
    if evictions.grace_period is not None:
        grace = evictions.grace_period if gone else 0
    else:
        grace = max(
            (_grace(details.get(pod.uid)) for pod in gone),
            default=0,
        )
    return (len(evictions.pods) + 1) / write_qps + grace


def _grace(details: PodDetails | None) -> int:
    return details.grace_period if details is not None else DEFAULT_GRACE_PERIOD

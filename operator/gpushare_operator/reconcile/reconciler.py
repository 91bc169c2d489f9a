"""The reconcile layer as the write loop sees it: plan a key, learn from its write, tick.

``plan`` is pure.  ``learn`` is the one place where what a plan saw (a node's placement in the
rollout book, its Mismatch clock, a held-back status) and what its write achieved (the Node
the apply returned, a refusal, a status field the CRD dropped) enter the cache, the book, the
clocks and the write memory; it returns ``Orders`` for the loop's queue instead of touching
it.  ``tick`` runs the timers that belong to no key: the rollout's admission pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import data_owners
from gpushare_operator.core import statusdiff
from gpushare_operator.core.workqueue import CONFIG, MIG_CONFIG, NODE, POLICY, Key
from gpushare_operator.reconcile import admissions
from gpushare_operator.reconcile.appliedclocks import AppliedClocks
from gpushare_operator.reconcile.memory import WriteMemory
from gpushare_operator.reconcile.outcomes import (
    ConfigWritten,
    Done,
    NodeWritten,
    Orders,
    PolicyWritten,
    Refused,
    Written,
)
from gpushare_operator.reconcile.planner import Planner, Timings, rfc3339_now
from gpushare_operator.reconcile.plans import ConfigPlan, NodePlan, Plan, PolicyPlan, Stage
from gpushare_operator.reconcile.rollouts import RolloutBook


def eviction_backoff(attempts: int) -> float:
    """Seconds before asking again for an eviction a PodDisruptionBudget refused ``attempts``
    times in a row: 1, 2, 4, 8, then every 10 s (a budget frees up as soon as a replacement
    pod is Ready, so a long wait costs drain time and a short one costs little)."""
    return float(min(10, 2 ** (attempts - 1)))


@dataclass(frozen=True, slots=True)
class Tick:
    orders: Orders
    again_at: float | None  # when the admission pass wants to look again


class Reconciler:
    def __init__(
        self,
        cache: ClusterCache,
        *,
        timings: Timings,
        max_unavailable: int | str,
        wallclock: Callable[[], str] = rfc3339_now,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.memory = WriteMemory()
        self.book = RolloutBook(cache, max_unavailable=max_unavailable)
        self.clocks = AppliedClocks(
            clock=cache.clock,
            epoch=epoch,
            published=cache.node_states,
            mismatch_timeout=timings.mismatch_timeout,
        )
        self.planner = Planner(
            cache,
            timings=timings,
            book=self.book,
            clocks=self.clocks,
            memory=self.memory,
            wallclock=wallclock,
            epoch=epoch,
        )
        self._pacing = admissions.Pacing()

    # -- planning (pure) -------------------------------------------------------------------------

    def plan(self, key: Key, *, stage: Stage = Stage.FIRST) -> Plan:
        kind, name = key
        if kind == NODE:
            return self.planner.plan_node(name, stage=stage)
        if kind == POLICY:
            return self.planner.plan_policy(name, stage=stage)
        if kind == CONFIG:
            return self.planner.plan_config(name)
        raise ValueError(f"no planner for {kind!r}")

    def policy_unsettled(self, name: str, *, busy: set[str]) -> bool:
        return self.planner.policy_unsettled(name, busy=busy)

    # -- learning (the one place) ------------------------------------------------------------------

    def learn(self, plan: Plan, written: Written | None) -> Orders:
        """Take in what ``plan`` saw and what its write (None: nothing was sent) achieved."""
        if isinstance(plan, NodePlan):
            assert written is None or isinstance(written, NodeWritten)
            return self._learn_node(plan, written)
        if isinstance(plan, PolicyPlan):
            assert written is None or isinstance(written, PolicyWritten)
            return self._learn_policy(plan, written)
        assert written is None or isinstance(written, ConfigWritten)
        return self._learn_config(plan, written)

    def _learn_node(self, plan: NodePlan, written: NodeWritten | None) -> Orders:
        name, facts, memory = plan.name, plan.facts, self.memory
        if facts.decision is None or facts.placement is None:  # the node is gone
            memory.held.pop(name, None)
            memory.node_problems.pop(name, None)
            memory.release_blocked.pop(name, None)
            self.clocks.forget(name)
            self.book.forget(name)
            return Orders()
        self.book.record(facts.placement)
        self.clocks.track(name, facts.decision)
        if facts.held_until is None:
            memory.held.pop(name, None)
        else:
            memory.held[name] = facts.held_until
        at = () if facts.recheck_at is None else ((plan.key, facts.recheck_at),)
        self._learn_evictions(plan, written)
        if written is None:
            return Orders(at=at)
        cache, mark = self.cache, set[Key]()
        if written.labels is not None:
            cache.sent("node", name, written.labels)
            self._release_outcome(name, written)
        current = cache.nodes.get(name)
        if written.node is not None and current is not None and current.uid == plan.uid:
            # Not if a DELETED event came while we waited: a response must not revive a node.
            cache.upsert_node(written.node, answer=True)
        if written.status is not None:
            cache.sent("nodestate", name, written.status)
            if written.echo is not None:
                mark |= self._echoed("nodestate", written.status, written.echo.get("status"))
            # The node's phase feeds its policies' counts and conditions.
            mark |= {(POLICY, p) for p in cache.index.policies_of(name)}
        again = None
        if plan.stage is Stage.FIRST and plan.labels is not None:
            if isinstance(written.outcome, Refused):
                memory.node_problems[name] = written.outcome.problem
                again = Stage.STATUS  # its status says why
            elif written.labels is not None:
                if memory.node_problems.pop(name, None) is not None:
                    mark.add(plan.key)  # its status drops the condition
                again = Stage.LABELLED
        return Orders(written.outcome, frozenset(mark), at=at, again=again)

    def _learn_evictions(self, plan: NodePlan, written: NodeWritten | None) -> None:
        """podPolicy Evict: what the API server accepted (not asked again while its watch
        event is on its way), refused (asked again after a back-off), and what is gone."""
        memory = self.memory
        for uid in plan.evictions_done:
            memory.evicted.pop(uid, None)
        pods = self.cache.usage.pods
        for uid in [u for u in memory.eviction_refused if u not in pods]:
            memory.eviction_refused.pop(uid, None)
            memory.eviction_blockers.pop(uid, None)
        if written is None:
            return
        now = self.cache.clock()
        for uid in written.evicted:
            memory.evicted[uid] = (now, plan.name)
            memory.eviction_refused.pop(uid, None)
            memory.eviction_blockers.pop(uid, None)
        for uid, budgets in written.refused.items():
            attempts = memory.eviction_refused.get(uid, (0, now))[0] + 1
            memory.eviction_refused[uid] = (attempts, now + eviction_backoff(attempts))
            memory.eviction_blockers[uid] = budgets

    def _release_outcome(self, name: str, written: NodeWritten) -> None:
        """After a release apply: labels that other field managers own too stay on the node."""
        assert written.labels is not None
        releasing = all(value is None for value in written.labels.values())
        if releasing and written.co_owners:
            self.memory.release_blocked[name] = written.co_owners
        else:
            self.memory.release_blocked.pop(name, None)

    def _learn_policy(self, plan: PolicyPlan, written: PolicyWritten | None) -> Orders:
        name, cache = plan.name, self.cache
        if plan.gone:
            self.memory.rendered_policies.pop(name, None)  # nothing to report for it
            return Orders()
        if plan.rendered is not None:
            self.memory.rendered_policies[name] = plan.rendered
        # A rollout standing still: look again when its progress deadline passes.
        at = () if plan.recheck_at is None else ((plan.key, plan.recheck_at),)
        if written is None:
            return Orders(at=at)
        mark = set[Key]()
        if written.policy is not None:
            cache.upsert_policy(written.policy)
        elif written.finalized:  # no object in the answer: the patch's own result
            cache.finalizers_set(name, self.planner.finalizers_after(name))
        if written.status is not None:
            cache.sent("policy", name, written.status)
            if written.echo is not None:
                mark |= self._echoed("policy", written.status, written.echo.get("status"))
        proceed = plan.finalizer is not None and written.proceed and name in cache.policies
        if proceed and self.planner.policy_unsettled(name, busy=cache.queue.processing(NODE)):
            # The finalizer went at once (the nodes wait for it); the status waits its turn
            # like any other, until the counts it would show stop moving.
            return Orders(written.outcome, frozenset(mark | {(POLICY, name)}), at=at)
        again = Stage.STATUS if proceed else None
        return Orders(written.outcome, frozenset(mark), at=at, again=again)

    def _learn_mig_config(self, plan: ConfigPlan, written: ConfigWritten | None) -> Orders:
        memory, cache = self.memory, self.cache
        mig_policies = frozenset((POLICY, p.name) for p in cache.policies.values() if p.mig)
        mark: frozenset[Key] = frozenset()
        if dict(plan.foreign_keys) != memory.mig_foreign:
            mark = mig_policies  # they report it (or that it is over)
        memory.mig_foreign = dict(plan.foreign_keys)
        memory.mig_unused_since = dict(plan.unused_since)
        at = () if plan.recheck_at is None else ((plan.key, plan.recheck_at),)
        if written is None:
            return Orders(mark=mark, at=at)
        if written.problem is not None and written.problem != memory.mig_config_error:
            memory.mig_config_error = written.problem
            mark = mig_policies
        if isinstance(written.outcome, Done) and written.data is not None:
            answer = written.answer
            if answer is not None and isinstance(answer.get("data"), dict):
                version = (answer.get("metadata") or {}).get("resourceVersion")
                cache.set_mig_config(
                    answer["data"], initial=False, version=version, owners=data_owners(answer)
                )
            else:
                cache.sent("configmap", MIG_CONFIG, written.data)
            if memory.mig_config_error is not None:
                memory.mig_config_error = None
                mark = mig_policies
        return Orders(written.outcome, mark, at=at)

    def _learn_config(self, plan: ConfigPlan, written: ConfigWritten | None) -> Orders:
        memory, cache = self.memory, self.cache
        if plan.target == MIG_CONFIG:
            return self._learn_mig_config(plan, written)
        memory.foreign_keys = dict(plan.foreign_keys)
        memory.unused_since = dict(plan.unused_since)
        at = () if plan.recheck_at is None else ((plan.key, plan.recheck_at),)
        if written is None:
            return Orders(at=at)
        every_policy = frozenset((POLICY, name) for name in cache.policies)
        mark: frozenset[Key] = frozenset()
        if written.problem is not None and written.problem != memory.config_error:
            memory.config_error = written.problem
            mark = every_policy  # they all report it
        if isinstance(written.outcome, Done) and written.data is not None:
            self._config_written(written.data, written.answer)
            if memory.config_error is not None:
                memory.config_error = None
                mark = every_policy
        return Orders(written.outcome, mark, at=at)

    def _config_written(self, data: dict[str, str], answer: dict[str, Any] | None) -> None:
        if answer is not None and isinstance(answer.get("data"), dict):
            # Take the answer as the new state at once: the nodes waiting on a new key start
            # their propagation wait now, not when the watch event arrives.
            version = (answer.get("metadata") or {}).get("resourceVersion")
            self.cache.set_config_data(
                answer["data"], initial=False, version=version, owners=data_owners(answer)
            )
        else:
            self.cache.sent("configmap", "", data)

    def _echoed(self, kind: str, written: Any, echoed: object) -> frozenset[Key]:
        """Compare a status write's answer with what was sent; once the installed CRD of
        ``kind`` is seen to drop the same fields twice in a row, leave them out of renders
        and have every policy report it."""
        memory = self.memory
        known = memory.pruned.get(kind, frozenset())
        dropped = statusdiff.dropped_paths(written, echoed) - known
        suspected = memory.suspected.pop(kind, frozenset())
        if not dropped:
            return frozenset()
        confirmed = dropped & suspected
        if not confirmed:
            memory.suspected[kind] = dropped
            return frozenset()
        memory.pruned[kind] = known | confirmed
        return frozenset((POLICY, name) for name in self.cache.policies)

    # -- time and leadership -----------------------------------------------------------------------

    def tick(self, *, busy: bool) -> Tick:
        """The timers of no key: forget old tombstones, and run the admission pass."""
        self.cache.expire_tombstones()
        passed = admissions.admit(
            book=self.book, pacing=self._pacing, busy=busy, now=self.cache.clock()
        )
        self._pacing = passed.pacing
        if passed.ran:
            self.book.stale = False  # what moved since is looked at by the next pass
            self.book.primed = True
            for placement in passed.admitted:
                self.book.record(placement)
        orders = Orders(
            mark=frozenset((NODE, node) for node in passed.restate),
            first=tuple(p.node for p in passed.admitted),
        )
        return Tick(orders, passed.again_at)

    def restart(self) -> None:
        """Leading (again): admissions of an earlier term are void; the first admission pass
        waits for a whole look at every node."""
        self.book.restart()
        self._pacing = replace(self._pacing, primed=False)

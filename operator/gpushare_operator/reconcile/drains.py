"""``podPolicy: Evict``: an admitted change whose pods do not fit drains the node first.

Between the rollout book's judgement and the writes: a node admitted to a change that its pods
would not fit (``RolloutBook.misfit``) is not labelled yet.  It is tainted, the fewest pods
that must go (``core.rollout.victims``, as kube-scheduler chooses preemption victims: pods whose
PodDisruptionBudget allows no disruption are kept first) are evicted through the Eviction API,
and once they are gone (the pods' records leave the node: terminated, not just terminating)
the change goes ahead.  Meanwhile it is ``Evicting`` and counts against its policy's budget,
as admitted.  The victims are chosen again at every judgement, from the budgets as they
allow now: a 429 moves the choice to pods their budgets let go, where there are such.

A MIG change repartitions the GPUs, so its layout label waits for more than an empty ledger:
the cache may not show yet a pod the scheduler bound a moment ago, its choice made before our
taint reached it.  An admitted MIG change whose pods are gone is tainted first; once the taint
is in the node cache as the informer delivered it, the plan asks the kube layer for a pod list
taken then (``NodePlan.idle_check``) and labels only if it shows no GPU pod on the node.  Both
halves are read from the cluster (the taint on the Node, a fresh list), so a new leader halfway
reaches the same answer.

What a deadline depends on is in the node's GPUNodeState (``status.eviction``): when the first
eviction was asked for, for which policy generation and target.  A new leader reads the same
start and gives up at the same moment.  Given up (the timeout passed, or pods we never evict
hold what the new config lacks), the node keeps its old config, says ``EvictionBlocked`` with
the pods and the PodDisruptionBudgets that refused, counts as available again, and waits
like a ``WaitForPods`` node: it changes once its pods fit by themselves, and an edit of the
policy's spec (a new generation) arms the evictions again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import backends, migphases
from gpushare_operator.core.api.models import NodePhase, PodPolicy
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.core.rollout import rollouts, victims
from gpushare_operator.core.rollout.budgets import BudgetRecord
from gpushare_operator.core.stamps import epoch_of, rfc3339
from gpushare_operator.reconcile.memory import WriteMemory
from gpushare_operator.reconcile.rollouts import Judgement, RolloutBook, Step

# An accepted eviction's watch event (the pod turning Terminating) normally follows within
# a second; until then the pod is not asked again.
RESEND_AFTER = 10.0
# The Ready reason of an admitted MIG change between our taint and its layout label.
CONFIRMING_IDLE: Final = "ConfirmingIdle"


class IdleGate(enum.Enum):
    """Where an admitted MIG change whose pods are gone stands on its way to the label."""

    TAINT_FIRST = "taint-first"  # our taint is not in the node cache yet: taint, then wait
    CHECK = "check"  # it is: label with a pod list taken now, if it shows no GPU pod


@dataclass(frozen=True, slots=True)
class Eviction:
    """One ``POST pods/NAME/eviction``, and the Event it leaves on the pod."""

    namespace: str
    name: str
    uid: str
    grace_period: int | None  # deleteOptions.gracePeriodSeconds, >= 1; None: the pod's own
    message: str


@dataclass(frozen=True, slots=True)
class Drain:
    judgement: Judgement  # as judged, or turned into Evicting / EvictionBlocked
    evictions: tuple[Eviction, ...] = ()  # to ask for now
    draining: bool = False  # evicting (or a MIG change): the node must carry our taint first
    done: tuple[str, ...] = ()  # uids of pods we evicted that are gone now
    # A MIG change with no pod left in the cache (None: no such change): never labelled
    # before our taint is in the cache, and then only with an idle pod list.
    idle: IdleGate | None = None


class Drains:
    def __init__(
        self,
        *,
        cache: ClusterCache,
        book: RolloutBook,
        memory: WriteMemory,
        epoch: Callable[[], float],
    ) -> None:
        self.cache = cache
        self.book = book
        self.memory = memory
        self._epoch = epoch

    def judge(
        self, record: NodeRecord, planned: nodephases.NodeDecision, judged: Judgement
    ) -> Drain:
        """The node's judgement under podPolicy Evict (unchanged under any other)."""
        done = self._done(record.name)
        place = judged.placement
        spec, _ = self.book.spec_of(place.charged)
        policy = None if nodephases.releases(planned) else planned.policy
        layouts = self.cache.mig_config.layouts
        mig = planned.labels is not None and backends.needs_idle(record, policy, layouts=layouts)
        if planned.labels is None or (spec.podPolicy is not PodPolicy.EVICT and not mig):
            return Drain(judged, done=done)
        misfit = self.book.misfit(record, policy)
        if misfit is None and mig and place.step is Step.ADMITTED:
            return Drain(judged, done=done, draining=True, idle=self._gate(record))
        if misfit is None:
            return Drain(judged, done=done)  # the pods fit: the change goes ahead
        if spec.podPolicy is not PodPolicy.EVICT:
            admitted = place.step is Step.ADMITTED  # tainted while it waits its pods out
            message = f"tainted; {misfit}: the change goes ahead once they are gone"
            waiting = self._idle_wait(
                planned,
                judged,
                reason="WaitingForPods",
                message=f"{message} (podPolicy WaitForPods)",
            )
            return Drain(waiting, done=done, draining=admitted)
        target = "" if policy is None else str(policy.config_key)
        generation = self._generation(place.charged)
        prior = self._prior(record.name, place.charged, generation, target)
        pods = self.cache.usage.node_pods(record.name)
        forced = {m.pod.uid for m in self.book.memory_misfits(record, policy)}
        room = victims.room(record, policy, layouts=layouts)
        budgets = self._budgets(pods)
        chosen = victims.select(pods, room=room, forced=forced, budgets=budgets)
        if prior is not None and prior.get("blockedAt"):
            return Drain(self._blocked(record, planned, judged, dict(prior)), done=done)
        if place.step is not Step.ADMITTED:
            return Drain(judged, done=done)  # waiting its turn
        now = self._epoch()
        block = {
            "policy": place.charged,
            "generation": generation,
            "target": target,
            "startedAt": (prior or {}).get("startedAt") or rfc3339(now),
            "pods": [_name(p) for p in (*chosen.evict, *chosen.leaving)][:50],
            "blockedBy": self._blockers(chosen),
        }
        started = epoch_of(block["startedAt"]) or now
        deadline = started + spec.eviction.timeout_seconds
        if chosen.stuck is not None or now >= deadline:
            block["blockedAt"] = rfc3339(now)
            block["reason"] = "NotEvictable" if chosen.stuck else "EvictionTimedOut"
            block["message"] = chosen.stuck or (
                f"the pods that had to go were not gone {spec.eviction.timeout} after the first"
                " eviction was asked for"
            )
            return Drain(self._blocked(record, planned, judged, block))
        message = _evicting_message(block, target)
        evicting = nodephases.NodeDecision(
            planned.policy,
            NodePhase.EVICTING,
            "Evicting",
            message,
            None,
            recheck_at=self.cache.clock() + max(0.0, deadline - now),
            released_from=planned.released_from,
            eviction=block,
        )
        grace = spec.eviction.grace_period  # never 0, whatever an older CRD let in
        event = f"Evicted by gpushare: policy {place.charged} changes node {record.name}"
        evictions = tuple(
            Eviction(p.namespace, p.name, p.uid, grace, event)
            for p in chosen.evict
            if self._due(p.uid)
        )
        again = self._next_attempt(chosen.evict)
        if again is not None and evicting.recheck_at is not None:
            evicting = replace(evicting, recheck_at=min(evicting.recheck_at, again))
        return Drain(replace(judged, decision=evicting), evictions, draining=True, done=done)

    def tainting(self, planned: nodephases.NodeDecision, judged: Judgement) -> Judgement:
        """``IdleGate.TAINT_FIRST``: what the node shows while our taint goes on and the
        cache has yet to show it: waiting, admitted (``idleWait``), with no label.  The
        judgement ``judge`` returned keeps its labels, for whoever only asks whether the
        change goes ahead (the plugin's forecast)."""
        message = (
            f"tainted {rollouts.TAINT_KEY}; the layout changes once the node cache shows the"
            " taint and a list of the node's pods taken after it shows no GPU pod"
        )
        return self._idle_wait(planned, judged, reason=CONFIRMING_IDLE, message=message)

    # -- pieces ----------------------------------------------------------------------------------

    def _gate(self, record: NodeRecord) -> IdleGate:
        """CHECK once the node cache has our taint as the informer delivered it (a write's
        answer alone is not enough: the watchers of the API server may not have it yet)."""
        tainted = any(rollouts.is_ours(taint) for taint in record.taints)
        if tainted and self.cache.watch_shows(record.name):
            return IdleGate.CHECK
        return IdleGate.TAINT_FIRST

    def _idle_wait(
        self, planned: nodephases.NodeDecision, judged: Judgement, *, reason: str, message: str
    ) -> Judgement:
        """A MIG change admitted while GPU pods may run: the node is tainted and keeps its
        layout until none does, counting against the budget.  The admission is written in the
        GPUNodeState (``idleWait``): a new leader reads it back (``RolloutBook.judge``) and
        keeps the node admitted and tainted."""
        place = judged.placement
        if place.step is not Step.ADMITTED or place.grant is None:
            return judged  # waiting its turn, untainted
        target, charged = place.grant
        status = self._status(place.node)
        prior = status.get("idleWait")
        prior = prior if isinstance(prior, Mapping) else {}
        same = (prior.get("policy"), prior.get("target")) == (charged, target)
        block = {
            "policy": charged,
            "target": target,
            "since": prior.get("since") if same else rfc3339(self._epoch()),
        }
        waiting = nodephases.NodeDecision(
            planned.policy,
            NodePhase.PENDING,
            reason,
            message,
            None,
            released_from=planned.released_from,
            idle_wait=block,
        )
        return replace(judged, decision=waiting)

    def _status(self, node: str) -> Mapping[str, Any]:
        """The node's GPUNodeState status: as being written, else as last seen."""
        cache = self.cache
        return cache.in_flight.get(("nodestate", node)) or cache.node_states.get(node) or {}

    def _blocked(
        self,
        record: NodeRecord,
        planned: nodephases.NodeDecision,
        judged: Judgement,
        block: dict[str, Any],
    ) -> Judgement:
        """Given up: its old config stays; available again; held until its pods fit."""
        pods = ", ".join(block.get("pods") or ()) or "none"
        budgets = ", ".join(block.get("blockedBy") or ()) or "none seen"
        reason = str(block.get("reason") or "EvictionTimedOut")
        message = (
            f"{block.get('message') or 'eviction given up'}; pods left: {pods};"
            f" PodDisruptionBudgets that refused: {budgets}. The node keeps its config until its"
            " pods fit (or the policy's spec is edited)"
        )
        held = nodephases.held_back(planned, reason=reason, message=message)
        held = replace(held, eviction=block)
        place = replace(
            judged.placement,
            step=Step.BLOCKED,
            grant=None,
            down=self.book.unavailable_for(record, planned, drained=False),
            wanted=judged.placement.wanted or _wanted(planned),
        )
        return Judgement(held, place)

    def _prior(
        self, node: str, policy: str, generation: int, target: str
    ) -> Mapping[str, Any] | None:
        """The eviction block the node's GPUNodeState carries for this very change."""
        block = self._status(node).get("eviction")
        if not isinstance(block, Mapping):
            return None
        same = (block.get("policy"), block.get("generation"), block.get("target") or "")
        return block if same == (policy, generation, target) else None

    def _budgets(self, pods: list[PodRecord]) -> list[BudgetRecord]:
        """The PodDisruptionBudgets of the pods' namespaces as they allow now, for the choice
        of victims, which is made again on every judgement: after a 429 too, so that pods the
        budgets protect are kept and others go in their place where they can.  A budget that
        refused an eviction allows nothing until the refused pod is due again, even while the
        cache still shows the allowance the API server's answer just contradicted."""
        budgets = self.cache.budgets.around(pods)
        now, memory = self.cache.clock(), self.memory
        refusing = {
            name
            for uid, (_, due) in memory.eviction_refused.items()
            if now < due
            for name in memory.eviction_blockers.get(uid, ())
        }
        if not refusing:
            return budgets
        return [
            replace(b, allowed=0) if b.key in refusing and b.allowed > 0 else b for b in budgets
        ]

    def _generation(self, policy: str) -> int:
        compiled = self.cache.policies.get(policy)
        return compiled.generation if compiled is not None else 0

    def _blockers(self, chosen: victims.Victims) -> list[str]:
        seen: set[str] = set()
        for pod in chosen.evict:
            seen.update(self.memory.eviction_blockers.get(pod.uid, ()))
        return sorted(seen)[:50]

    def _due(self, uid: str) -> bool:
        now = self.cache.clock()
        sent = self.memory.evicted.get(uid)
        if sent is not None and now - sent[0] < RESEND_AFTER:
            return False
        refused = self.memory.eviction_refused.get(uid)
        return refused is None or now >= refused[1]

    def _next_attempt(self, pods: tuple[PodRecord, ...]) -> float | None:
        times = [
            self.memory.eviction_refused[p.uid][1]
            for p in pods
            if p.uid in self.memory.eviction_refused
        ]
        times += [
            self.memory.evicted[p.uid][0] + RESEND_AFTER
            for p in pods
            if p.uid in self.memory.evicted
        ]
        return min(times, default=None)

    def _done(self, node: str) -> tuple[str, ...]:
        """Pods evicted from ``node`` that are gone (deleted, or finished)."""
        pods = self.cache.usage.pods
        return tuple(
            uid
            for uid, (_, where) in self.memory.evicted.items()
            if where == node and (uid not in pods or not pods[uid].holds_slots)
        )


def _wanted(planned: nodephases.NodeDecision) -> str:
    policy = planned.policy
    if policy is None or policy.config_key is None or nodephases.releases(planned):
        return ""
    return policy.config_key


def _name(pod: PodRecord) -> str:
    return f"{pod.namespace}/{pod.name}"


def _evicting_message(block: Mapping[str, Any], target: str) -> str:
    pods = block.get("pods") or []
    goal = f"config {target}" if target else "the default config"
    message = (
        f"evicting {len(pods)} pod(s) so that the rest fit {goal} (podPolicy Evict):"
        f" {', '.join(pods)}"
    )
    if block.get("blockedBy"):
        message += f"; refused for now by PodDisruptionBudget(s) {', '.join(block['blockedBy'])}"
    return message


def keeps_joiner_taint(record: NodeRecord, decision: nodephases.NodeDecision) -> bool:
    """Whether our taint stays on a node that waits to join a MIG pool, whatever the rollout
    says: it carries none of our labels (the taint is one it registered with, a startup taint,
    or ours from a leader before us) and a MIG policy governs it and can work there.  Lifted,
    it would take the pods its layout must then wait out; it goes once the layout is Verified,
    as any MIG change's taint does."""
    policy = decision.policy
    if policy is None or policy.mig is None or nodephases.releases(decision):
        return False
    if decision.phase in (NodePhase.UNSUPPORTED, NodePhase.MISMATCH):
        return False
    if record.config_label is not None or record.policy_label is not None:
        return False
    return not migphases.carries_ours(record)

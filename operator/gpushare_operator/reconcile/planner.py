"""Desired output from current state: what each write should say, and only if it differs.

Level-based, in the controller-runtime sense: a plan never looks at the event that made an
object dirty; it reads the caches, computes the whole desired object with the pure builders of
``core``, and compares it with what the API server last showed us (and with what we wrote and
have not yet seen back).  Planning changes nothing, not even the rollout book or the clocks:
what a plan saw travels in the plan (``reconcile.plans``) to ``Reconciler.learn``.  A plan with
no writes means no API call at all.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import backends, listpatches, migphases, policystatus, statusdiff
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.conditions import Cond
from gpushare_operator.core.dra import draclasses
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.listpatches import JsonPatch
from gpushare_operator.core.phases import nodelabels, nodephases
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.core.rollout.rollouts import FINALIZER
from gpushare_operator.core.slots import memoryfits
from gpushare_operator.core.stamps import epoch_of, rfc3339
from gpushare_operator.core.workqueue import MIG_CONFIG
from gpushare_operator.reconcile import tallies
from gpushare_operator.reconcile.appliedclocks import AppliedClocks
from gpushare_operator.reconcile.configplan import ConfigPlanner
from gpushare_operator.reconcile.drains import Drains, IdleGate, keeps_joiner_taint
from gpushare_operator.reconcile.memory import WriteMemory
from gpushare_operator.reconcile.migconfigplan import MigConfigPlanner
from gpushare_operator.reconcile.plans import ConfigPlan, NodeFacts, NodePlan, PolicyPlan, Stage
from gpushare_operator.reconcile.rollouts import Placement, RolloutBook, Step

# Reasons of a node the rollout holds back (see RolloutBook.judge).
HELD_BY_ROLLOUT = frozenset(
    {"RolloutWaiting", "WaitingForPods", "RolloutHalted", "Paused", memoryfits.REASON}
)
# Keeps a deleted policy until its nodes are released (under its rollout budget).


def rfc3339_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Timings:
    propagation_delay: float
    key_grace_period: float
    mismatch_timeout: float
    # A Pending status due to be replaced within this many seconds is not published: with a
    # short propagation delay it would only cost each node of a rollout one more write.
    pending_hold: float = 2.0


class Planner:
    """Pure planning over the cache, the rollout book, the clocks and the write memory."""

    def __init__(
        self,
        cache: ClusterCache,
        *,
        timings: Timings,
        book: RolloutBook,
        clocks: AppliedClocks,
        memory: WriteMemory,
        wallclock: Callable[[], str] = rfc3339_now,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self._epoch = epoch
        self.timings = timings
        self.book = book
        self.clocks = clocks
        self.memory = memory
        self.configs = ConfigPlanner(cache, grace_period=timings.key_grace_period, memory=memory)
        self.mig_configs = MigConfigPlanner(
            cache, grace_period=timings.key_grace_period, memory=memory
        )
        self.drains = Drains(cache=cache, book=book, memory=memory, epoch=epoch)
        self._wallclock = wallclock

    # -- nodes -----------------------------------------------------------------------------------

    def key_readiness(self, key: str | None) -> nodephases.KeyReadiness:
        data = self.cache.config_data
        if key is None or data is None or key not in data:
            return nodephases.KeyReadiness(present=False)
        delay = self.timings.propagation_delay
        seen = self.cache.key_seen_at.get(key, float("-inf"))
        wall = self.cache.key_seen_wall.get(key, float("-inf"))
        ready_wall = None if wall == float("-inf") else rfc3339(wall + delay)
        return nodephases.KeyReadiness(
            present=True, ready_at=seen + delay, ready_at_wall=ready_wall
        )

    def mig_readiness(self, name: str | None) -> nodephases.KeyReadiness:
        """The same for a layout name of the mig-parted ConfigMap."""
        state = self.cache.mig_config
        if name is None or name not in (state.layouts or {}):
            return nodephases.KeyReadiness(present=False)
        delay = self.timings.propagation_delay
        seen = state.seen_at.get(name, float("-inf"))
        wall = state.seen_wall.get(name, float("-inf"))
        ready_wall = None if wall == float("-inf") else rfc3339(wall + delay)
        return nodephases.KeyReadiness(
            present=True, ready_at=seen + delay, ready_at_wall=ready_wall
        )

    def backend_readiness(self, record: NodeRecord, policy: CompiledPolicy | None) -> dra.Readiness:
        """For a DRA policy: its DeviceClass as the informer shows it, and the node's devices."""
        if policy is None or not policy.dra or policy.sharing is None:
            return dra.NOT_DRA
        ready = self.cache.dra.readiness(*policy.resources, config=policy.gpu_config)
        return replace(ready, devices=self.cache.dra.devices(record.name))

    def decide(self, record: NodeRecord) -> nodephases.NodeDecision:
        policy = self.cache.governing(record.name)
        mig_key = nodephases.MIG_NOT_NEEDED
        if policy is not None and policy.mig is not None:
            mig_key = self.mig_readiness(migphases.layout_name(record, policy))
        decision = nodephases.decide(
            record=record,
            policy=policy,
            mig_key=mig_key,
            key=self.key_readiness(policy.config_key if policy else None),
            applied_since=self.clocks.of(record.name, policy),
            now=self.cache.clock(),
            mismatch_timeout=self.timings.mismatch_timeout,
            published=self.published(record.name),
            backend=self.backend_readiness(record, policy),
        )
        if decision.phase is NodePhase.UNSUPPORTED and record.policy_label is not None:
            claimants = {p.name for p in self.cache.candidates(record.name)}
            decision = nodephases.orphan_released(
                decision,
                record=record,
                claimants=claimants,
                published=self.published(record.name),
                now=self.cache.clock(),
            )
        blocked = self.memory.release_blocked.get(record.name)
        if blocked is not None and nodephases.releases(decision):
            return nodephases.release_blocked(record, owners=blocked)
        return decision

    def published(self, name: str) -> nodephases.Published:
        """What the node's GPUNodeState says (what we wrote, if its echo is still on its way),
        with its transition time on our monotonic clock."""
        cache = self.cache
        status = cache.in_flight.get(("nodestate", name)) or cache.node_states.get(name)
        stamp = epoch_of((status or {}).get("lastTransitionTime"))
        # The stamp has whole seconds: the transition came at most a second after it.  The
        # latest moment is the safe one: a release stops counting against the budget, and a
        # lasting Degraded node loses our taint, never before their time.
        since = None if stamp is None else cache.clock() - max(0.0, self._epoch() - stamp - 1)
        return nodephases.Published.of(status, since=since)

    def governing(self, node: str) -> CompiledPolicy | None:
        return self.cache.governing(node)

    def plan_node(self, name: str, *, stage: Stage = Stage.FIRST) -> NodePlan:
        """The node's writes, in order: our taint, then its labels; its status only when the
        labels need no change (after a label write, the LABELLED stage plans it from the Node
        the API server returned; after a refusal, the STATUS stage says why).  A MIG layout's
        labels never go with the taint: they wait for the cache to show it, and then go only
        if the pod list they ask for (``idle_check``) shows the node idle."""
        cache = self.cache
        record = cache.nodes.get(name)
        if record is None:  # gone: its GPUNodeState follows through the ownerReference
            return NodePlan(name, "", NodeFacts(None, None, None, None), stage)
        planned = self.decide(record)
        drain = self.drains.judge(record, planned, self.book.judge(record, planned))
        judged = drain.judgement
        if drain.idle is IdleGate.TAINT_FIRST:  # no layout label before the cache has our taint
            judged = self.drains.tainting(planned, judged)
        decision = judged.decision
        held_until = self._held_until(decision)
        taint, uncordon_at = self._taint(
            record, judged.placement, decision, draining=drain.draining
        )
        recheck = [when for when in (decision.recheck_at, uncordon_at) if when is not None]
        facts = NodeFacts(decision, judged.placement, held_until, min(recheck, default=None))
        slots_of = tallies.slot_view(cache, record, decision.policy)
        labels = nodelabels.wanted(slots_of, decision)  # the config's, and the slots' promise
        if labels is not None and nodephases.labels_satisfied(record, labels):
            labels = None
        if labels is not None and cache.in_flight.get(("node", name)) == labels:
            labels = None
        create = name not in cache.node_states
        if stage is not Stage.FIRST:
            if labels is not None and stage is Stage.LABELLED:
                return NodePlan(name, record.uid, facts, stage)  # its watch event re-plans
            status = self._node_status(record, decision) if held_until is None else None
            return NodePlan(name, record.uid, facts, stage, status=status, create_state=create)
        status = None
        if labels is None and held_until is None:
            status = self._node_status(record, decision)
        return NodePlan(
            name,
            record.uid,
            facts,
            stage,
            taint,
            labels,
            status,
            create,
            evictions=drain.evictions,
            evictions_done=drain.done,
            idle_check=labels is not None and drain.idle is IdleGate.CHECK,
        )

    def _taint(
        self,
        record: NodeRecord,
        placement: Placement,
        decision: nodephases.NodeDecision,
        *,
        draining: bool,
    ) -> tuple[JsonPatch | None, float | None]:
        """Our NoSchedule taint: on from just before a cordoned change's label write until the
        node is available again; only ever ours (key and effect), added and removed in place.

        A node waiting to join a MIG pool keeps it (a startup taint it registered with too)
        until its layout is Verified.  A node that will not recover by itself loses it: at
        once when it turns Mismatch (it has been unconfirmed for a whole --mismatch-timeout
        since its label changed), and after one --mismatch-timeout in Degraded (time for a
        device plugin to restart).  Also returns when the taint is due to go, to look again
        then."""
        tainted = any(rollouts.is_ours(taint) for taint in record.taints)
        target = None if nodephases.releases(decision) else decision.policy
        layouts = self.cache.mig_config.layouts
        mig = backends.needs_idle(record, target, layouts=layouts) and decision.labels is not None
        # Kept through the MIG manager's work until the node is available again; not put on a
        # node whose GPUs already show the layout its label names (another policy's identical
        # layout: the MIG manager has nothing to do).
        mig = mig or (
            placement.down is not None
            and migphases.carries_ours(record)
            and (tainted or not migphases.in_force(record, layouts=layouts))
        )
        wanted = self.book.wants_taint(placement, tainted=tainted, draining=draining, mig=mig)
        wanted = wanted or (tainted and keeps_joiner_taint(record, decision))
        due = None
        if wanted and decision.phase is NodePhase.MISMATCH:
            wanted = False
        elif wanted and decision.phase is NodePhase.DEGRADED:
            since = self.published(record.name)
            started = since.since if since.phase == NodePhase.DEGRADED else None
            due = self.cache.clock() if started is None else started
            due += self.timings.mismatch_timeout
            wanted = self.cache.clock() < due
        if wanted:
            return (None if tainted else rollouts.taint_added(record.taints)), due
        return (rollouts.taint_removed(record.taints) if tainted else None), None

    def _held_until(self, decision: nodephases.NodeDecision) -> float | None:
        """Until when to keep a soon-outdated Pending status to ourselves (see
        ``pending_hold``); None: publish it."""
        until = decision.recheck_at
        now = self.cache.clock()
        # A rollout's wait carries its own quiet time (most nodes are admitted within it).
        limit = float("inf") if decision.reason in HELD_BY_ROLLOUT else self.timings.pending_hold
        if (
            decision.phase is NodePhase.PENDING
            and decision.labels is None
            and until is not None
            and until - now <= limit
        ):
            return until
        return None

    def policy_unsettled(self, name: str, *, busy: Collection[str]) -> bool:
        """Whether some node the policy counts has a write still to come (dirty, being
        written, or holding back a Pending status): its tally would change in a moment.  A
        finalizer to add or remove never waits: the policy's nodes wait for it."""
        if self.plan_finalizer(name) is not None:
            return False
        nodes = self.cache.index.nodes_of(name)
        if _meets(nodes, self.cache.queue.nodes) or _meets(nodes, busy):
            return True
        now = self.cache.clock()
        return any(until > now and node in nodes for node, until in self.memory.held.items())

    def _node_status(
        self, record: NodeRecord, decision: nodephases.NodeDecision
    ) -> dict[str, Any] | None:
        cache = self.cache
        exists = record.name in cache.node_states
        if not exists and decision.policy is None and not cache.index.policies_of(record.name):
            return None  # never matched by any policy: no GPUNodeState at all
        # What we last wrote, if its watch event is still on its way: its transition times
        # are the ones to keep, or a re-plan a second later would differ and write again.
        previous = cache.in_flight.get(("nodestate", record.name)) or cache.node_states.get(
            record.name
        )
        allocated, pods, devices = 0, 0, None
        held_by: dict[str, int] = {}
        supported = decision.phase is not NodePhase.UNSUPPORTED
        if supported and decision.policy is not None and decision.policy.sharing is not None:
            for resource, (held, holders) in tallies.held(cache, record, decision.policy).items():
                allocated, pods = allocated + held, pods + holders
                held_by[resource] = held
            devices = tallies.devices(cache, record, decision.policy)
        status = nodephases.render_status(
            record=tallies.slot_view(cache, record, decision.policy),
            decision=decision,
            previous=previous,
            now=self._wallclock(),
            allocated=allocated,
            allocated_by=held_by,
            pods=pods,
            devices=devices,
            write_problem=self.memory.node_problems.get(record.name),
        )
        status = statusdiff.without(status, self.memory.pruned.get("nodestate", frozenset()))
        if previous == status or cache.in_flight.get(("nodestate", record.name)) == status:
            return None
        return status

    # -- policies ----------------------------------------------------------------------------------

    def _device_class(self, policy: CompiledPolicy) -> Cond | None:
        if not policy.dra or policy.sharing is None:
            return None
        resources = policy.resources
        ready = self.cache.dra.readiness(*resources, config=policy.gpu_config)
        return draclasses.class_condition(resources, ready)

    def tally(self, policy: CompiledPolicy) -> policystatus.PolicyTally:
        return tallies.tally(self, policy)

    def plan_policy(self, name: str, *, stage: Stage = Stage.FIRST) -> PolicyPlan:
        """Our finalizer first, if it needs a change; otherwise (or after it) the status."""
        policy = self.cache.policies.get(name)
        if policy is None:
            return PolicyPlan(name, "", stage, gone=True)
        if stage is Stage.FIRST:
            finalizer = self.plan_finalizer(name)
            if finalizer is not None:
                return PolicyPlan(name, policy.uid, stage, finalizer=finalizer)
        previous = self.cache.in_flight.get(("policy", name)) or self.cache.policy_status.get(name)
        now = self._wallclock()
        status = policystatus.render_policy_status(
            policy=policy,
            tally=self.tally(policy),
            previous=previous,
            now=now,
            config_problem=self.config_problem(policy),
            schema_problem=self.schema_problem(),
            rollout=self._rollout_view(name),
            device_class=self._device_class(policy),
        )
        status = statusdiff.without(status, self.memory.pruned.get("policy", frozenset()))
        written = (
            _same_status(previous, status) or self.cache.in_flight.get(("policy", name)) == status
        )
        left = policystatus.deadline_recheck(status, policy, now=now)
        return PolicyPlan(
            name,
            policy.uid,
            stage,
            status=None if written else status,
            rendered=status,
            recheck_at=None if left is None else self.cache.clock() + left,
        )

    def _rollout_view(self, name: str) -> policystatus.RolloutView:
        book = self.book
        releasing = None
        if name in self.cache.deleting:
            releasing = self.labelled_nodes(name)
        return policystatus.RolloutView(
            counts=book.counts(name),
            failed_nodes=book.nodes_at(name, Step.FAILED),
            releasing=releasing,
            unavailable_nodes=book.down_nodes(name),
            blocked_nodes=book.nodes_at(name, Step.BLOCKED),
            waiting_nodes=book.nodes_at(name, Step.WAITING) + book.nodes_at(name, Step.PREPARING),
            degraded_nodes=book.nodes_at(name, Step.DEGRADED),
        )

    def labelled_nodes(self, name: str) -> int:
        """Nodes carrying the policy's label that we can still release (a label another field
        manager owns too is not ours to remove: such a node is reported, not waited for)."""
        blocked = sum(
            1
            for node in self.memory.release_blocked
            if (record := self.cache.nodes.get(node)) is not None and record.policy_label == name
        )
        return max(0, self.cache.policy_label_counts.get(name, 0) - blocked)

    def plan_finalizer(self, name: str) -> JsonPatch | None:
        """Our finalizer: on every policy, so that deleting one releases its nodes under its
        budget; removed once no node carries its label (the finalizer goes last)."""
        if name not in self.cache.policies:
            return None
        current = self.cache.policy_finalizers.get(name, ())
        if name not in self.cache.deleting:
            if FINALIZER in current:
                return None
            return listpatches.appended("/metadata/finalizers", current, FINALIZER)
        if self.labelled_nodes(name) > 0:
            return None
        return listpatches.removed("/metadata/finalizers", current, FINALIZER.__eq__)

    def finalizers_after(self, name: str) -> tuple[str, ...]:
        """The policy's finalizers once ``plan_finalizer``'s patch has been applied."""
        current = self.cache.policy_finalizers.get(name, ())
        others = tuple(f for f in current if f != FINALIZER)
        return others if name in self.cache.deleting else (*others, FINALIZER)

    def schema_problem(self) -> str | None:
        crds = {"nodestate": "gpunodestates", "policy": "gpusharingpolicies"}
        parts = [
            f"{crds.get(kind, kind)}.gpushare.dev drops {statusdiff.describe(paths)}"
            for kind, paths in sorted(self.memory.pruned.items())
            if paths
        ]
        if not parts:
            return None
        return (
            "the installed CRDs are older than this operator: "
            + "; ".join(parts)
            + ". Apply the current CRDs (kubectl apply --server-side -f crds/)"
        )

    # -- the device-plugin ConfigMap -------------------------------------------------------------

    def plan_config(self, target: str = "") -> ConfigPlan:
        if target == MIG_CONFIG:
            return self.mig_configs.plan()
        return self.configs.plan()

    def config_problem(self, policy: CompiledPolicy) -> str | None:
        """Why the policy's configs cannot be written: the device-plugin ConfigMap's problem,
        and for a MIG policy the mig-parted ConfigMap's too."""
        memory = self.memory
        if memory.config_error is not None or policy.mig is None:
            return memory.config_error
        if memory.mig_config_error is not None:
            return memory.mig_config_error
        for key, why in memory.mig_foreign.items():
            return (
                f"ConfigMap {self.cache.mig_config_name} key {key} is {why}: gpushare leaves it"
                " alone and writes no MIG layout (delete it, or the other manager's fields, to"
                " hand it over)"
            )
        return None

    def desired_config(self) -> dict[str, str]:
        return self.configs.desired().data


def _meets(a: Collection[str], b: Collection[str]) -> bool:
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return any(item in large for item in small)


def _same_status(previous: Mapping[str, Any] | None, status: Mapping[str, Any]) -> bool:
    return previous is not None and dict(previous) == dict(status)

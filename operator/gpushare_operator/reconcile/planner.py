"""Desired output from current state: what each write should say, and only if it differs.

Level-based, in the controller-runtime sense: a plan never looks at the event that made an
object dirty; it reads the caches, computes the whole desired object with the pure builders of
``core``, and compares it with what the API server last showed us (and with what we wrote and
have not yet seen back).  An empty plan means no API call at all.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_operator.cache.state import ClusterState
from gpushare_operator.core import (
    devconfigs,
    listpatches,
    nodestates,
    policystatus,
    resolution,
    rollouts,
    statusdiff,
)
from gpushare_operator.core.listpatches import JsonPatch
from gpushare_operator.core.models import NodePhase
from gpushare_operator.core.nodes import NodeRecord
from gpushare_operator.core.policies import CompiledPolicy
from gpushare_operator.reconcile.appliedclocks import AppliedClocks
from gpushare_operator.reconcile.configplan import ConfigPlanner
from gpushare_operator.reconcile.rollouts import RolloutBook, Step

# Reasons of a node the rollout holds back (see RolloutBook.gate).
HELD_BY_ROLLOUT = frozenset({"RolloutWaiting", "WaitingForPods", "RolloutHalted", "Paused"})
# Keeps a deleted policy until its nodes are released (under its rollout budget).
FINALIZER = "gpushare.dev/release-nodes"


def rfc3339_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class NodePlan:
    name: str
    uid: str
    labels: nodestates.Labels | None  # SSA of our two labels; None: no label write
    status: dict[str, Any] | None  # GPUNodeState status; None: no status write
    create_state: bool  # the GPUNodeState object does not exist yet
    taint: JsonPatch | None = None  # our NoSchedule taint added or removed, before the labels


@dataclass(frozen=True, slots=True)
class Timings:
    propagation_delay: float
    key_grace_period: float
    mismatch_timeout: float
    # A Pending status due to be replaced within this many seconds is not published: with a
    # short propagation delay it would only cost each node of a rollout one more write.
    pending_hold: float = 2.0


class Planner:
    def __init__(
        self,
        state: ClusterState,
        *,
        timings: Timings,
        wallclock: Callable[[], str] = rfc3339_now,
        epoch: Callable[[], float] = time.time,
        max_unavailable: int | str = "10%",
    ) -> None:
        self.state = state
        self.timings = timings
        self.rollouts = RolloutBook(state, max_unavailable=max_unavailable)
        self.configs = ConfigPlanner(
            state, grace_period=timings.key_grace_period, recheck=self.recheck
        )
        self._wallclock = wallclock
        self.applied = AppliedClocks(
            clock=state.clock,
            epoch=epoch,
            published=state.node_states,
            mismatch_timeout=timings.mismatch_timeout,
        )
        self.held: dict[str, float] = {}  # node -> when its held-back Pending status ends
        # Set by the writer while the ConfigMap cannot be written (e.g. namespace missing).
        self.config_error: str | None = None
        # The last status rendered per policy (what /metrics reports), written or not.
        self.rendered_policies: dict[str, dict[str, Any]] = {}
        # Status fields the installed CRDs drop, per kind ("nodestate", "policy"): left out of
        # renders, so that an older schema costs a condition, not a rewrite loop.
        self.pruned: dict[str, frozenset[statusdiff.Path]] = {}
        # node -> why its labels cannot be written (a 403 after an RBAC change, a 422): shown
        # in its status until a label write succeeds.
        self.node_problems: dict[str, str] = {}
        self._suspected: dict[str, frozenset[statusdiff.Path]] = {}

    # -- what the API server kept of our writes --------------------------------------------------

    def echoed(self, kind: str, *, written: Mapping[str, Any], echoed: object) -> bool:
        """Compare a status write's answer with what was sent; True when this confirms that
        the installed CRD of ``kind`` drops fields (the same ones twice in a row)."""
        known = self.pruned.get(kind, frozenset())
        dropped = statusdiff.dropped_paths(written, echoed) - known
        suspected = self._suspected.pop(kind, frozenset())
        if not dropped:
            return False
        confirmed = dropped & suspected
        if not confirmed:
            self._suspected[kind] = dropped
            return False
        self.pruned[kind] = known | confirmed
        self.state.dirty.many_policies(self.state.policies)  # they report it
        return True

    def schema_problem(self) -> str | None:
        crds = {"nodestate": "gpunodestates", "policy": "gpusharingpolicies"}
        parts = [
            f"{crds.get(kind, kind)}.gpushare.dev drops {statusdiff.describe(paths)}"
            for kind, paths in sorted(self.pruned.items())
            if paths
        ]
        if not parts:
            return None
        return (
            "the installed CRDs are older than this operator: "
            + "; ".join(parts)
            + ". Apply the current CRDs (kubectl apply --server-side -f crds/)"
        )

    # -- time ------------------------------------------------------------------------------------

    def recheck(self, when: float | None, kind: str, name: str) -> None:
        """Look at (kind, name) again at ``when`` (the queue keeps the earliest per key; each
        plan asks again for what it still waits on)."""
        if when is not None:
            self.state.dirty.add_at((kind, name), when)

    def due(self) -> float | None:
        """Queue whatever a timer has come due for; return when the next timer fires."""
        self.state.expire_tombstones()
        again = self.rollouts.advance()
        timer = self.state.dirty.next_due()
        return again if timer is None else (timer if again is None else min(again, timer))

    # -- nodes -----------------------------------------------------------------------------------

    def governing(self, node: str) -> CompiledPolicy | None:
        return self.state.governing(node)

    def key_state(self, key: str | None) -> nodestates.KeyState:
        data = self.state.config_data
        if key is None or data is None or key not in data:
            return nodestates.KeyState(present=False)
        delay = self.timings.propagation_delay
        seen = self.state.key_seen_at.get(key, float("-inf"))
        wall = self.state.key_seen_wall.get(key, float("-inf"))
        ready_wall = None if wall == float("-inf") else _rfc3339(wall + delay)
        return nodestates.KeyState(present=True, ready_at=seen + delay, ready_at_wall=ready_wall)

    def decide(self, record: NodeRecord) -> nodestates.NodeDecision:
        policy = self.governing(record.name)
        since = self.applied.of(record.name, policy)
        decision = nodestates.decide(
            record=record,
            policy=policy,
            key=self.key_state(policy.config_key if policy else None),
            applied_since=since,
            now=self.state.clock(),
            mismatch_timeout=self.timings.mismatch_timeout,
        )
        if decision.phase is not NodePhase.UNSUPPORTED or record.policy_label is None:
            return decision
        claimants = {p.name for p in self.state.candidates(record.name)}
        return nodestates.orphan_released(decision, record=record, claimants=claimants)

    def plan_node(self, name: str) -> NodePlan | None:
        state = self.state
        record = state.nodes.get(name)
        if record is None:
            self.held.pop(name, None)
            self.node_problems.pop(name, None)
            self.applied.forget(name)
            self.rollouts.forget(name)
            return None  # gone: its GPUNodeState follows through the ownerReference
        decision = self.rollouts.gate(record, self.decide(record))
        self.applied.track(name, decision)
        self.recheck(decision.recheck_at, "node", name)
        labels = decision.labels
        if labels is not None and nodestates.labels_satisfied(record, labels):
            labels = None
        if labels is not None and state.in_flight.get(("node", name)) == labels:
            labels = None
        status = self._node_status(record, decision) if not self._hold(name, decision) else None
        taint = self._taint(record)
        if labels is None and status is None and taint is None:
            return None
        return NodePlan(name, record.uid, labels, status, name not in state.node_states, taint)

    def _taint(self, record: NodeRecord) -> JsonPatch | None:
        """Our NoSchedule taint: on from just before a cordoned change's label write until the
        node is Verified; only ever ours, added and removed in place."""
        tainted = record.has_taint(rollouts.TAINT_KEY)
        if self.rollouts.wants_taint(record.name, tainted=tainted):
            return None if tainted else rollouts.taint_added(record.taints)
        return rollouts.taint_removed(record.taints) if tainted else None

    def _hold(self, name: str, decision: nodestates.NodeDecision) -> bool:
        """Whether to keep a soon-outdated Pending status to ourselves (see ``pending_hold``)."""
        until = decision.recheck_at
        now = self.state.clock()
        # A rollout's wait carries its own quiet time (most nodes are admitted within it).
        limit = float("inf") if decision.reason in HELD_BY_ROLLOUT else self.timings.pending_hold
        if (
            decision.phase is NodePhase.PENDING
            and decision.labels is None
            and until is not None
            and until - now <= limit
        ):
            self.held[name] = until
            return True
        self.held.pop(name, None)
        return False

    def policy_unsettled(self, name: str, *, busy: Collection[str]) -> bool:
        """Whether some node the policy counts has a write still to come (dirty, being
        written, or holding back a Pending status): its tally would change in a moment."""
        nodes = self.state.index.nodes_of(name)
        if _meets(nodes, self.state.dirty.nodes) or _meets(nodes, busy):
            return True
        now = self.state.clock()
        return any(until > now and node in nodes for node, until in self.held.items())

    def _node_status(
        self, record: NodeRecord, decision: nodestates.NodeDecision
    ) -> dict[str, Any] | None:
        state = self.state
        exists = record.name in state.node_states
        if not exists and decision.policy is None and not state.index.policies_of(record.name):
            return None  # never matched by any policy: no GPUNodeState at all
        # What we last wrote, if its watch event is still on its way: its transition times
        # are the ones to keep, or a re-plan a second later would differ and write again.
        previous = state.in_flight.get(("nodestate", record.name)) or state.node_states.get(
            record.name
        )
        allocated, pods = 0, 0
        supported = decision.phase is not NodePhase.UNSUPPORTED
        if supported and decision.policy is not None and decision.policy.sharing is not None:
            resource = devconfigs.advertised_resource(decision.policy.sharing)
            allocated, pods = state.usage.node_usage(record.name, resource)
        status = nodestates.render_status(
            record=record,
            decision=decision,
            previous=previous,
            now=self._wallclock(),
            allocated=allocated,
            pods=pods,
            write_problem=self.node_problems.get(record.name),
        )
        status = statusdiff.without(status, self.pruned.get("nodestate", frozenset()))
        if previous == status or state.in_flight.get(("nodestate", record.name)) == status:
            return None
        return status

    # -- policies ----------------------------------------------------------------------------------

    def tally(self, policy: CompiledPolicy) -> policystatus.PolicyTally:
        tally = policystatus.PolicyTally()
        for node in sorted(self.state.index.nodes_of(policy.name)):
            record = self.state.nodes.get(node)
            if record is None:
                continue
            tally.matched += 1
            decision = self.decide(record)
            winner = decision.policy
            if winner is not None and winner.name == policy.name:
                self._count(tally, record, decision, policy)
                continue
            problem = nodestates.unsupported(record, policy)
            outranks = winner is None or resolution.rank_key(policy) < resolution.rank_key(winner)
            if problem is not None and outranks and policy.usable:
                tally.unsupported += 1  # skipped here: the next usable policy governs it
                tally.skipped.append((node, problem[1]))
            else:
                tally.conflicts.append((node, winner.name if winner else "none"))
        tally.allocated = self.state.usage.policy_slots(policy.name)
        return tally

    @staticmethod
    def _count(
        tally: policystatus.PolicyTally,
        record: NodeRecord,
        decision: nodestates.NodeDecision,
        policy: CompiledPolicy,
    ) -> None:
        tally.governed += 1
        phase = decision.phase
        if phase is NodePhase.UNSUPPORTED:
            tally.unsupported += 1
            tally.unusable += 1
            problem = nodestates.unsupported(record, policy)
            tally.skipped.append((record.name, problem[1] if problem else decision.message))
            return
        gpus = record.gpus or 0
        tally.gpus += gpus
        tally.capacity += gpus * (policy.replicas or 0)
        if phase in (NodePhase.APPLIED, NodePhase.VERIFIED, NodePhase.MISMATCH):
            tally.applied += 1
        if phase is NodePhase.VERIFIED:
            tally.verified += 1
        elif phase is NodePhase.MISMATCH:
            tally.mismatched += 1
        elif phase is NodePhase.PENDING:
            tally.pending += 1

    def plan_policy(self, name: str) -> dict[str, Any] | None:
        policy = self.state.policies.get(name)
        if policy is None:
            self.rendered_policies.pop(name, None)  # gone: nothing to report for it
            return None
        previous = self.state.in_flight.get(("policy", name)) or self.state.policy_status.get(name)
        status = policystatus.render_policy_status(
            policy=policy,
            tally=self.tally(policy),
            previous=previous,
            now=self._wallclock(),
            config_problem=self.config_error,
            schema_problem=self.schema_problem(),
            rollout=self._rollout_view(name),
        )
        status = statusdiff.without(status, self.pruned.get("policy", frozenset()))
        self.rendered_policies[name] = status
        if _same_status(previous, status) or self.state.in_flight.get(("policy", name)) == status:
            return None
        return status

    def _rollout_view(self, name: str) -> policystatus.RolloutView:
        book = self.rollouts
        releasing = None
        if name in self.state.deleting:
            releasing = self.state.policy_label_counts.get(name, 0)
        return policystatus.RolloutView(
            counts=book.counts(name),
            failed_nodes=book.nodes_at(name, Step.FAILED),
            releasing=releasing,
        )

    def plan_finalizer(self, name: str) -> JsonPatch | None:
        """Our finalizer: on every policy, so that deleting one releases its nodes under its
        budget; removed once no node carries its label (the finalizer goes last)."""
        if name not in self.state.policies:
            return None
        current = self.state.policy_finalizers.get(name, ())
        if name not in self.state.deleting:
            if FINALIZER in current:
                return None
            return listpatches.appended("/metadata/finalizers", current, FINALIZER)
        if self.state.policy_label_counts.get(name, 0) > 0:
            return None
        return listpatches.removed("/metadata/finalizers", current, FINALIZER.__eq__)

    def finalizers_after(self, name: str) -> tuple[str, ...]:
        """The policy's finalizers once ``plan_finalizer``'s patch has been applied."""
        current = self.state.policy_finalizers.get(name, ())
        others = tuple(f for f in current if f != FINALIZER)
        return others if name in self.state.deleting else (*others, FINALIZER)

    # -- the device-plugin ConfigMap -------------------------------------------------------------

    @property
    def foreign_keys(self) -> dict[str, str]:
        """ConfigMap keys shaped like ours that another field manager owns: key -> manager."""
        return self.configs.foreign_keys

    def desired_config(self) -> dict[str, str]:
        return self.configs.desired()

    def plan_config(self) -> dict[str, str] | None:
        """The ConfigMap data to apply, or None when the cluster already shows it."""
        return self.configs.plan()


def _rfc3339(epoch: float) -> str:
    moment = datetime.datetime.fromtimestamp(math.floor(epoch), datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _meets(a: Collection[str], b: Collection[str]) -> bool:
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return any(item in large for item in small)


def _same_status(previous: Mapping[str, Any] | None, status: Mapping[str, Any]) -> bool:
    return previous is not None and dict(previous) == dict(status)

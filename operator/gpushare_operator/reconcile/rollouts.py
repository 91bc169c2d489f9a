"""Which node may change now: the rollout bookkeeping between the planner and ``core.rollouts``.

Every node the planner looks at is *placed*: charged to a policy (the one that takes it, or,
when none does, the one that loses it) at a step of that policy's rollout.  A node that wants
a label change goes ahead only once it is *admitted*; ``advance`` admits waiting nodes in order
(fewest allocated slots, then name) while the policy's ``maxUnavailable``, its canary and the
cluster-wide budget leave room, and marks them dirty so that the writer labels them.

Level-based where it can be: a node on its policy's current config and not Verified is
unavailable whoever changed it, so a new leader counts what the last one left in flight.  What
state cannot show (a node we changed whose target has moved on since, a release whose device
plugin has not come back unshared yet) is remembered in ``changing`` for as long as it lasts.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass

from gpushare_operator.cache.state import ClusterState
from gpushare_operator.core import devconfigs, nodestates, resolution, rollouts
from gpushare_operator.core.models import NodePhase, PodPolicy, RolloutSpec
from gpushare_operator.core.nodes import GPU_RESOURCE, NodeRecord
from gpushare_operator.core.policies import CompiledPolicy
from gpushare_operator.core.workqueue import NODE

RELEASE = ""  # the target of a node to be released (config keys are never empty)
CLUSTER = ""  # charged to no policy, only to the cluster-wide budget (names are never empty)
FULL_LOOK_EVERY = 2.0  # seconds between admissions while node events keep arriving


class Step(enum.Enum):
    UPDATED = "updated"  # on the target, Verified
    CHANGING = "changing"  # on the target, not Verified yet
    FAILED = "failed"  # on the target, Mismatch
    ADMITTED = "admitted"  # cleared to change; label not written yet
    WAITING = "waiting"  # wants to change; waits for its turn
    BLOCKED = "blocked"  # wants to change; waits for its pods to fit
    PREPARING = "preparing"  # to change once its config key has propagated (or unpaused)


_SETTLED_STEP = {
    NodePhase.VERIFIED: Step.UPDATED,
    NodePhase.APPLIED: Step.CHANGING,
    NodePhase.MISMATCH: Step.FAILED,
}


@dataclass(frozen=True, slots=True)
class Place:
    policy: str  # charged to; CLUSTER: to the cluster-wide budget only
    step: Step


class RolloutBook:
    def __init__(
        self,
        state: ClusterState,
        *,
        max_unavailable: int | str = "10%",
        interval: float = 0.05,
        quiet: float = 5.0,
    ) -> None:
        self.state = state
        self.max_unavailable = max_unavailable
        self.interval = interval
        # A node held back says so only after this long: most are admitted sooner, and
        # would otherwise cost one more status write each (a rollout with room for all).
        self.quiet = quiet
        self._held_since: dict[str, float] = {}
        self._where: dict[str, Place] = {}
        self._steps: defaultdict[str, dict[Step, set[str]]] = defaultdict(
            lambda: {step: set() for step in Step}
        )
        self._down: dict[str, str] = {}  # unavailable node -> charged policy
        self._down_by: defaultdict[str, set[str]] = defaultdict(set)
        self._wanted: dict[str, str] = {}  # waiting node -> its target
        self.admitted: dict[str, tuple[str, str]] = {}  # node -> (target, charged)
        self.changing: dict[str, str] = {}  # changed by us, not settled -> charged
        self._stale = True
        self._primed = False
        self._busy_since: float | None = None
        self._halted: set[str] = set()  # policies whose waiting nodes were told so
        self._last = float("-inf")

    # -- lifecycle -------------------------------------------------------------------------------

    def restart(self) -> None:
        """Leading (again): admissions of an earlier term are void; count everything afresh
        before admitting anything (``advance`` waits until every queued node was placed)."""
        self.admitted.clear()
        self._primed = False
        self._stale = True

    def forget(self, node: str) -> None:
        self.admitted.pop(node, None)
        self.changing.pop(node, None)
        self._place(node, CLUSTER, None)

    # -- placing a node ------------------------------------------------------------------------

    def gate(
        self, record: NodeRecord, decision: nodestates.NodeDecision
    ) -> nodestates.NodeDecision:
        """Place the node; return the decision to act on: the planned one, or a wait."""
        name = record.name
        charged = self._charged(record, decision)
        target = self._target(decision)
        wants = decision.labels is not None
        self._granted(record, target=target, wants=wants)
        self._settle(record, decision)
        down = self.changing.get(name)  # None: available
        if not wants:
            step = _SETTLED_STEP.get(decision.phase)
            if step is None and decision.phase is NodePhase.PENDING:
                step = Step.PREPARING
            if down is None and decision.phase in (NodePhase.APPLIED, NodePhase.MISMATCH):
                down = charged
            self._place(name, charged, step, down=down)
            return decision
        old = self._where.get(name)
        if old is not None and old.step is Step.FAILED:
            self._place(name, charged, None, down=down)  # no longer a failure of the rollout
        grant = self.admitted.get(name)
        if (grant is not None and grant[0] == target) or self._fresh(record, target, charged):
            self.admitted.setdefault(name, (target, charged))
            self._place(name, charged, Step.ADMITTED, down=charged if down is None else down)
            return decision
        return self._hold(record, decision, charged=charged, target=target, down=down)

    def _hold(
        self,
        record: NodeRecord,
        decision: nodestates.NodeDecision,
        *,
        charged: str,
        target: str,
        down: str | None,
    ) -> nodestates.NodeDecision:
        spec, paused = self._spec(charged)
        self._wanted[record.name] = target
        misfit = None
        if spec.podPolicy is PodPolicy.WAIT_FOR_PODS:
            misfit = self._misfit(record, None if target == RELEASE else decision.policy)
        step = Step.WAITING if misfit is None else Step.BLOCKED
        self._place(record.name, charged, step, down=down)
        quiet = self._held_since[record.name] + self.quiet
        quiet_until = quiet if self.state.clock() < quiet else None
        if misfit is not None:
            message = f"{misfit}: the node keeps its config until they fit (podPolicy WaitForPods)"
            return nodestates.held_back(
                decision, reason="WaitingForPods", message=message, quiet_until=quiet_until
            )
        who = f"GPUSharingPolicy {charged}" if charged else "the cluster"
        if paused:
            reason, message = "Paused", f"{who} is paused: the node is left as it is"
        elif charged and rollouts.halted(self.counts(charged), spec):
            reason = "RolloutHalted"
            message = f"the rollout of {who} is halted: too many of its nodes ended in Mismatch"
        else:
            reason = "RolloutWaiting"
            message = f"waiting for its turn in the rollout of {who}"
        return nodestates.held_back(
            decision, reason=reason, message=message, quiet_until=quiet_until
        )

    def _charged(self, record: NodeRecord, decision: nodestates.NodeDecision) -> str:
        if decision.policy is not None and not nodestates.releases(decision):
            return decision.policy.name
        losing = record.policy_label
        return losing if losing is not None and losing in self.state.policies else CLUSTER

    @staticmethod
    def _target(decision: nodestates.NodeDecision) -> str:
        policy = decision.policy
        if policy is None or policy.config_key is None or nodestates.releases(decision):
            return RELEASE
        return policy.config_key

    def _granted(self, record: NodeRecord, *, target: str, wants: bool) -> None:
        """An admission is used up once the node shows its target (the change is under way:
        remembered in ``changing``), and void once the node wants something else."""
        grant = self.admitted.get(record.name)
        if grant is None or (wants and grant[0] == target):
            return
        del self.admitted[record.name]
        target = grant[0]
        if (record.config_label == target) if target else (record.policy_label is None):
            self.changing[record.name] = grant[1]

    def _settle(self, record: NodeRecord, decision: nodestates.NodeDecision) -> None:
        if record.name not in self.changing:
            return
        phase = decision.phase
        released = (
            decision.policy is None
            and record.policy_label is None
            and rollouts.release_settled(record)
        )
        if phase in (NodePhase.VERIFIED, NodePhase.UNSUPPORTED) or released:
            del self.changing[record.name]

    def _fresh(self, record: NodeRecord, target: str, charged: str) -> bool:
        """A node joining the pool (none of our config, no GPU pods) is configured at once,
        so that autoscaled nodes are usable quickly, unless its rollout is halted or paused."""
        if target == RELEASE or record.config_label is not None or record.policy_label is not None:
            return False
        if self.state.usage.node_total(record.name):
            return False
        spec, paused = self._spec(charged)
        return not paused and not (charged and rollouts.halted(self.counts(charged), spec))

    def _spec(self, charged: str) -> tuple[RolloutSpec, bool]:
        policy = self.state.policies.get(charged)
        if policy is None or policy.spec is None:
            return rollouts.DEFAULT_ROLLOUT, False
        return policy.spec.rollout, policy.paused

    def _misfit(self, record: NodeRecord, policy: CompiledPolicy | None) -> str | None:
        held = self.state.usage.node_slots(record.name)
        if not held:
            return None
        gpus = record.gpus or 0
        if policy is None or policy.sharing is None:
            return rollouts.misfit(held, resource=GPU_RESOURCE, capacity=gpus)
        resource = devconfigs.advertised_resource(policy.sharing)
        return rollouts.misfit(held, resource=resource, capacity=gpus * (policy.replicas or 1))

    def _place(self, node: str, policy: str, step: Step | None, *, down: str | None = None) -> None:
        place = None if step is None else Place(policy, step)
        old = self._where.get(node)
        if old != place:
            self._stale = True
            if old is not None:
                self._steps[old.policy][old.step].discard(node)
                self._drop_empty(old.policy)
            if place is None:
                self._where.pop(node, None)
            else:
                self._where[node] = place
                self._steps[policy][place.step].add(node)
        if place is None or place.step not in (Step.WAITING, Step.BLOCKED):
            self._wanted.pop(node, None)
            self._held_since.pop(node, None)
        else:
            self._held_since.setdefault(node, self.state.clock())
        self._set_down(node, down)

    def _set_down(self, node: str, down: str | None) -> None:
        """Unavailable (charged to ``down``) or, for None, available."""
        if self._down.get(node) == down:
            return
        self._stale = True
        was = self._down.pop(node, None)
        if was is not None:
            self._down_by[was].discard(node)
            if not self._down_by[was]:
                del self._down_by[was]
        if down is not None:
            self._down[node] = down
            self._down_by[down].add(node)

    def _drop_empty(self, policy: str) -> None:
        steps = self._steps.get(policy)
        if steps is not None and not any(steps.values()) and not self._down_by.get(policy):
            del self._steps[policy]

    # -- reading ---------------------------------------------------------------------------------

    def counts(self, policy: str) -> rollouts.Counts:
        steps = self._steps.get(policy)
        down = len(self._down_by.get(policy, ()))
        if steps is None:
            return rollouts.Counts(unavailable=down)
        size = {step: len(nodes) for step, nodes in steps.items()}
        return rollouts.Counts(
            total=sum(size.values()),
            updated=size[Step.UPDATED],
            changing=size[Step.CHANGING],
            failed=size[Step.FAILED],
            admitted=size[Step.ADMITTED],
            waiting=size[Step.WAITING] + size[Step.PREPARING],
            blocked=size[Step.BLOCKED],
            unavailable=down,
        )

    def nodes_at(self, policy: str, step: Step) -> list[str]:
        return sorted(self._steps.get(policy, {}).get(step, ()))

    def unavailable(self) -> int:
        return len(self._down)

    def cluster_budget(self) -> int:
        return rollouts.max_unavailable(self.max_unavailable, total=len(self.state.nodes))

    def wants_taint(self, node: str, *, tainted: bool) -> bool:
        """Whether the node is in a change of a policy that cordons during changes: admitted,
        or changed and not yet settled (by us, or, if it carries the taint, by a leader
        before us)."""
        if node not in self._down:
            return False
        ours = node in self.admitted or node in self.changing or tainted
        policy = self._down[node]
        if not ours or not policy:
            return False
        spec, _ = self._spec(policy)
        return spec.cordonDuringChange

    # -- admitting ---------------------------------------------------------------------------------

    def advance(self) -> float | None:
        """Admit the next nodes if anything moved; returns when to look again, if it must.

        Only once every node queued for planning has been placed (taken by a job counts as
        queued until planned): the counts are then whole and the order global.  Under a stream
        of node events that never lets the queue run dry, at most ``FULL_LOOK_EVERY`` seconds
        pass between admissions, with what has been placed by then.  Before the first whole
        look after gaining leadership, never.
        """
        if not self._stale:
            return None
        now = self.state.clock()
        dirty = self.state.dirty
        busy = bool(dirty.nodes) or bool(dirty.processing(NODE))
        if not busy:
            self._primed = True
            self._busy_since = None
        elif not self._primed:
            return None  # a restart, a failover: one node not yet planned may be mid-change
        elif self._busy_since is None:
            self._busy_since = now
        if busy and now - (self._busy_since or now) < FULL_LOOK_EVERY:
            return now + FULL_LOOK_EVERY / 10
        if now - self._last < self.interval:
            return self._last + self.interval
        self._stale = False
        self._last = now
        self._restate_halts()
        self._admit_all()
        return None

    def _restate_halts(self) -> None:
        """A rollout that halts (or resumes) changes what its waiting nodes say: look again."""
        halted = set()
        for policy, steps in self._steps.items():
            if policy and (steps[Step.WAITING] or steps[Step.BLOCKED]):
                spec, _ = self._spec(policy)
                if rollouts.halted(self.counts(policy), spec):
                    halted.add(policy)
        for policy in halted ^ self._halted:
            held = self._steps.get(policy)
            if held is not None:
                self.state.dirty.many_nodes(held[Step.WAITING] | held[Step.BLOCKED])
        self._halted = halted

    def _admit_all(self) -> None:
        room = self.cluster_budget() - len(self._down)
        waiting = [p for p, steps in self._steps.items() if steps[Step.WAITING]]
        for policy in self._by_rank(waiting):
            # Even with no room left, a node already unavailable may take its new target.
            room -= self._admit(policy, cluster_room=max(0, room))

    def _by_rank(self, names: list[str]) -> list[str]:
        policies = self.state.policies
        known = [policies[n] for n in names if n in policies]
        return [p.name for p in resolution.ranked(known)] + [n for n in names if n not in policies]

    def _admit(self, policy: str, *, cluster_room: int) -> int:
        spec, paused = self._spec(policy)
        waiting = self._steps[policy][Step.WAITING]
        if not policy:
            room, canary = cluster_room, None
        else:
            counts = self.counts(policy)
            room = rollouts.room(counts, spec, cluster_room=cluster_room, paused=paused)
            deleting = policy in self.state.deleting
            canary = None if deleting else rollouts.canary_room(counts, spec)
        usage = self.state.usage
        order = sorted(
            waiting,
            key=lambda n: rollouts.order_key(allocated=usage.node_total(n), name=n),
        )
        used = 0
        admitted: list[str] = []
        for node in order:
            # A node still unavailable from its last change (its target moved on meanwhile)
            # costs nothing more: changing it again leaves as many nodes unavailable.
            was_down = self._down.get(node)
            if was_down is None and used >= room:
                continue
            target = self._wanted.get(node, RELEASE)
            if target != RELEASE and canary is not None:
                if canary <= 0:
                    continue
                canary -= 1
            self.admitted[node] = (target, policy)
            self._place(node, policy, Step.ADMITTED, down=was_down or policy)
            admitted.append(node)
            used += was_down is None
        self.state.dirty.first(NODE, admitted)  # label writes before queued status writes
        return used

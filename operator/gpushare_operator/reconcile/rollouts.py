"""Which node may change now: the rollout book between the planner and ``core.rollout.rollouts``.

Every node the planner looks at is *placed*: charged to a policy (the one that takes it, or,
when none does, the one that loses it) at a step of that policy's rollout.  A node that wants
a label change goes ahead only once it is *admitted*; the admission pass
(``reconcile.admissions``) admits waiting nodes in order (fewest allocated slots, then name)
while the policy's ``maxUnavailable``, its canary and the cluster-wide budget leave room.

``judge`` works out a node's placement without changing the book (planning is pure);
``record`` enters it, from ``Reconciler.learn`` alone.

Whether a node is unavailable is read from the cluster, never remembered: a node whose label
names a config that GPU Feature Discovery and kubelet do not confirm (whatever the current
target is: a key the spec has moved on from is judged by its own text), or whose release is
not yet confirmed (its GPUNodeState still says Releasing), is unavailable whoever changed it,
so that any leader, at any moment, counts the same nodes.  The only process memory that counts
is an admission not yet written: it can only make the count larger.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import replace

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import backends, migphases
from gpushare_operator.core.api.models import NodePhase, PodPolicy, RolloutSpec
from gpushare_operator.core.backends import deviceplugin
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.mig.migconfigs import ALL_DISABLED
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.rollout import rollouts, victims
from gpushare_operator.core.slots import memoryfits
from gpushare_operator.reconcile.placements import CLUSTER as CLUSTER
from gpushare_operator.reconcile.placements import HELD_STEPS as HELD_STEPS
from gpushare_operator.reconcile.placements import RELEASE as RELEASE
from gpushare_operator.reconcile.placements import SETTLED_STEP, UNDER_WAY
from gpushare_operator.reconcile.placements import Judgement as Judgement
from gpushare_operator.reconcile.placements import Place as Place
from gpushare_operator.reconcile.placements import Placement as Placement
from gpushare_operator.reconcile.placements import Step as Step

# The reason of a node held back until its pods fit by their slots (podPolicy WaitForPods).
WAITING_FOR_PODS = "WaitingForPods"


class RolloutBook:
    def __init__(
        self,
        cache: ClusterCache,
        *,
        max_unavailable: int | str,
        quiet: float = 5.0,
    ) -> None:
        self.cache = cache
        self.max_unavailable = max_unavailable
        # A node held back says so only after this long: most are admitted sooner, and
        # would otherwise cost one more status write each (a rollout with room for all).
        self.quiet = quiet
        # node -> when it began to be held back; only for nodes at a HELD_STEPS step.
        self._held_since: dict[str, float] = {}
        # node -> its place; every node here is in _steps[place.policy][place.step] too.
        self._where: dict[str, Place] = {}
        self._steps: defaultdict[str, dict[Step, set[str]]] = defaultdict(
            lambda: {step: set() for step in Step}
        )
        # unavailable node -> the policy charged; _down_by is the same, the other way round.
        self._down: dict[str, str] = {}
        self._down_by: defaultdict[str, set[str]] = defaultdict(set)
        # node at a HELD_STEPS step -> the target it waits for.
        self._wanted: dict[str, str] = {}
        # node -> (target, charged): admitted, its label not written yet.  Process memory, but
        # it only ever adds to what the cluster shows as unavailable; a new leader starts empty.
        self.admitted: dict[str, tuple[str, str]] = {}
        # Something moved since the last admission pass (see reconcile.admissions).
        self.stale = True
        # An admission pass has run since we began leading: the book has seen every node
        # (a pass waits for a whole look).  Before that no node joins a pool at once: the
        # book cannot know yet which other nodes are under way, failed or held back.
        self.primed = False

    # -- lifecycle -------------------------------------------------------------------------------

    def restart(self) -> None:
        """Leading (again): admissions of an earlier term are void; count everything afresh."""
        self.admitted.clear()
        self.stale = True
        self.primed = False

    def forget(self, node: str) -> None:
        self.admitted.pop(node, None)
        self._place(node, CLUSTER, None)

    # -- judging a node (pure) -------------------------------------------------------------------

    def judge(self, record: NodeRecord, decision: nodephases.NodeDecision) -> Judgement:
        """The node's placement, and the decision to act on: the planned one, or a wait."""
        name = record.name
        charged = self._charged(record, decision)
        target = self._target(decision)
        wants = decision.labels is not None
        grant = self._grant(record, target=target, wants=wants)
        if grant is None and wants:
            grant = self._waiting(name, target=target, charged=charged)
        down = self.unavailable_for(record, decision)
        place = Placement(name, charged, None, down, grant)
        if not wants:
            return Judgement(decision, replace(place, step=SETTLED_STEP.get(decision.phase)))
        if (grant is not None and grant[0] == target) or self._fresh(record, target, charged):
            grant = grant or (target, charged)
            admitted = replace(place, step=Step.ADMITTED, down=down or charged, grant=grant)
            return Judgement(decision, admitted)
        return self._hold(record, decision, place=place, target=target)

    def unavailable_for(
        self, record: NodeRecord, decision: nodephases.NodeDecision, *, drained: bool = True
    ) -> str | None:
        """The policy charged while the node runs a config not yet confirmed (or a release not
        yet settled, or it is drained for a change); None while it is available.  From the
        node, its GPUNodeState and the ConfigMap alone.  ``drained`` False: leave the drain
        out (it is being given up)."""
        phase = decision.phase
        if phase is NodePhase.UNSUPPORTED or decision.reason == "ReleaseBlocked":
            return None  # not ours to change: out of every rollout
        if phase is NodePhase.RELEASING:
            return self._existing(decision.released_from)
        disabling = decision.reason in (migphases.DISABLING, migphases.DISABLE_FAILED)
        if disabling and record.mig_config_label == ALL_DISABLED:
            # MIG going off before another policy's config (or a release): a change under the
            # budget of the policy taking the node (or losing it), read from the labels alone.
            taking = decision.policy.name if decision.policy is not None else None
            return self._existing(taking or decision.released_from)
        evicting = self._evicting_for(record.name) if drained else None
        if evicting is not None:  # drained for a change (podPolicy Evict): not yet given up
            return self._existing(evicting)
        key, owner = record.config_label, record.policy_label
        if key is None or owner is None:
            return None  # none of our config on it
        policy = decision.policy
        layout = self._other_layout(record, policy)
        if policy is not None and layout is not None:
            # A new layout under the same key: judged by the layout its label names.
            confirmed = migphases.runs_layout(record, layout, policy=policy)
        elif policy is not None and (key, owner) == (policy.config_key, policy.name):
            confirmed = phase is NodePhase.VERIFIED  # decided already, on the same key
        else:
            sharing = self.cache.key_configs.get(key)
            # A key that is not (or no longer) in the ConfigMap: the config manager cannot
            # apply it, and the device plugin does not run.
            confirmed = sharing is not None and not deviceplugin.disagreements(record, sharing)
        return None if confirmed else self._existing(owner)

    def _other_layout(
        self, record: NodeRecord, policy: CompiledPolicy | None
    ) -> migconfigs.MigLayout | None:
        """The MIG layout of ours the node's label names, when it is not ``policy``'s target
        for the node but runs under ``policy``'s own key and name (a re-layout to come)."""
        if policy is None or policy.mig is None:
            return None
        if (record.config_label, record.policy_label) != (policy.config_key, policy.name):
            return None
        label = record.mig_config_label
        if label is None or label == migphases.layout_name(record, policy):
            return None
        return (self.cache.mig_config.layouts or {}).get(label)

    def _evicting_for(self, node: str) -> str | None:
        """The policy a node's GPUNodeState says it is being drained for (phase Evicting)."""
        cache = self.cache
        status = cache.in_flight.get(("nodestate", node)) or cache.node_states.get(node) or {}
        if status.get("phase") != NodePhase.EVICTING:
            return None
        block = status.get("eviction")
        policy = block.get("policy") if isinstance(block, dict) else None
        return policy if isinstance(policy, str) else CLUSTER

    def _waiting(self, node: str, *, target: str, charged: str) -> tuple[str, str] | None:
        """The admission a GPUNodeState shows (``idleWait``: a MIG change waiting, tainted, for
        its GPU pods to end), while the node still wants that change: whoever admitted it,
        it stays admitted, so a new leader neither lifts the taint nor admits another node
        in its place."""
        cache = self.cache
        status = cache.in_flight.get(("nodestate", node)) or cache.node_states.get(node) or {}
        block = status.get("idleWait")
        if status.get("phase") != NodePhase.PENDING or not isinstance(block, dict):
            return None
        if (block.get("target"), block.get("policy")) != (target, charged):
            return None
        return target, charged

    def _existing(self, policy: str | None) -> str:
        return policy if policy is not None and policy in self.cache.policies else CLUSTER

    def _hold(
        self,
        record: NodeRecord,
        decision: nodephases.NodeDecision,
        *,
        place: Placement,
        target: str,
    ) -> Judgement:
        charged = place.charged
        spec, paused = self._spec(charged)
        misfit = None
        policy = None if target == RELEASE else decision.policy
        # A MIG change waits for its pods once admitted and tainted (``reconcile.drains``):
        # held back untainted, pods would keep landing on the GPUs that must go idle.
        layouts = self.cache.mig_config.layouts
        if spec.podPolicy is PodPolicy.WAIT_FOR_PODS and not backends.needs_idle(
            record, policy, layouts=layouts
        ):
            misfit = self.held_by_pods(record, policy)
        now = self.cache.clock()
        since = self._held_since.get(record.name, now)
        place = replace(
            place,
            step=Step.WAITING if misfit is None else Step.BLOCKED,
            wanted=target,
            held_since=since,
        )
        quiet_until = since + self.quiet if now < since + self.quiet else None
        if misfit is not None:
            reason, why = misfit
            until = "they are gone" if reason == memoryfits.REASON else "they fit"
            message = f"{why}: the node keeps its config until {until} (podPolicy WaitForPods)"
            held = nodephases.held_back(
                decision, reason=reason, message=message, quiet_until=quiet_until
            )
            return Judgement(held, place)
        who = f"GPUSharingPolicy {charged}" if charged else "the cluster"
        if paused:
            reason, message = "Paused", f"{who} is paused: the node is left as it is"
        elif charged and self._halted_without(charged, record.name):
            reason = "RolloutHalted"
            message = f"the rollout of {who} is halted: too many of its nodes ended in Mismatch"
        else:
            reason = "RolloutWaiting"
            message = f"waiting for its turn in the rollout of {who}"
        held = nodephases.held_back(
            decision, reason=reason, message=message, quiet_until=quiet_until
        )
        return Judgement(held, place)

    def _charged(self, record: NodeRecord, decision: nodephases.NodeDecision) -> str:
        if decision.policy is not None and not nodephases.releases(decision):
            return decision.policy.name
        if decision.released_from is not None:
            return self._existing(decision.released_from)
        return self._existing(record.policy_label)

    @staticmethod
    def _target(decision: nodephases.NodeDecision) -> str:
        policy = decision.policy
        if policy is None or policy.config_key is None or nodephases.releases(decision):
            return RELEASE
        return policy.config_key

    def _grant(self, record: NodeRecord, *, target: str, wants: bool) -> tuple[str, str] | None:
        """The node's admission, while it stands: used up once the node shows its target (the
        change is under way, and the cluster shows it unavailable), void once it wants
        something else."""
        grant = self.admitted.get(record.name)
        if grant is None or (wants and grant[0] == target):
            return grant
        return None

    def _fresh(self, record: NodeRecord, target: str, charged: str) -> bool:
        """A node joining an established pool (none of our config, no GPU pods) is configured
        at once, so that autoscaled nodes are usable quickly: established means the policy has
        a node Verified on its current config, its canary is proven, no other node is changing,
        admitted, waiting or failed in its rollout, and it is neither halted nor paused.  The
        last node of a rollout under way is no joiner, nor is a node already held back in it:
        it goes under the budget like the rest.  A new policy over an idle pool is no such
        pool: its first node is its canary, the rest go under its budget.

        In a MIG pool "at once" keeps the layout's order (``reconcile.drains``): our taint
        (unless the node registered with it), a list of its pods that shows none, then the
        label; a pod bound before our taint makes the node no joiner any more."""
        if not self.primed:
            return False  # a new leader that has not looked at every node yet
        if record.name in self._held_since:
            return False  # held back before: a node of the rollout, not one joining it
        if target == RELEASE or record.config_label is not None or record.policy_label is not None:
            return False
        if not charged or self.cache.usage.node_total(record.name):
            return False
        if rollouts.FINALIZER not in self.cache.policy_finalizers.get(charged, ()):
            return False  # not before a deletion of the policy would release it under budget
        spec, paused = self._spec(charged)
        counts = self.counts(charged)
        if paused or counts.updated == 0 or rollouts.canary_room(counts, spec) is not None:
            return False
        if self._busy_besides(charged, record.name):
            return False  # its rollout is still under way: the node waits its turn with them
        return not self._halted_without(charged, record.name)

    def _busy_besides(self, policy: str, node: str) -> bool:
        """Whether nodes other than ``node`` are under way in the policy's rollout: waiting,
        admitted, changing and not yet confirmed, or failed."""
        steps = self._steps.get(policy, {})
        return any(steps.get(step, set()) - {node} for step in UNDER_WAY)

    def _halted_without(self, policy: str, node: str) -> bool:
        """Whether the policy's rollout is halted, not counting ``node`` (being judged anew:
        wanting a change, it is no failure of the rollout any more)."""
        spec, _ = self._spec(policy)
        failed = self._steps.get(policy, {}).get(Step.FAILED, set())
        return len(failed) - (node in failed) >= spec.failureThreshold

    def spec_of(self, charged: str) -> tuple[RolloutSpec, bool]:
        """The rollout spec a node charged to ``charged`` goes by, and whether it is paused."""
        return self._spec(charged)

    def _spec(self, charged: str) -> tuple[RolloutSpec, bool]:
        policy = self.cache.policies.get(charged)
        if policy is None or policy.spec is None:
            return rollouts.DEFAULT_ROLLOUT, False
        return policy.spec.rollout, policy.paused

    def misfit(self, record: NodeRecord, policy: CompiledPolicy | None) -> str | None:
        """Why the node's pods would not fit ``policy``'s config (None: the default one): the
        slots they hold, or the memory some of them asked for (``memory_misfits``)."""
        found = self.held_by_pods(record, policy)
        return None if found is None else found[1]

    def held_by_pods(
        self, record: NodeRecord, policy: CompiledPolicy | None
    ) -> tuple[str, str] | None:
        """(reason, message) of a node whose pods would not fit ``policy``'s config; None when
        they fit.  A broken memory promise (``memoryfits.REASON``) names its pods first."""
        slots = self.slot_misfit(record, policy)
        memory = self.memory_misfits(record, policy)
        if memory:
            also = f"; also {slots}" if slots is not None else ""
            return memoryfits.REASON, memoryfits.describe(memory) + also
        return None if slots is None else (WAITING_FOR_PODS, slots)

    def slot_misfit(self, record: NodeRecord, policy: CompiledPolicy | None) -> str | None:
        """Why the node's pods would hold more slots than ``policy``'s config advertises, per
        resource (for a change of MIG layout: any GPU pod at all)."""
        held = self.cache.usage.node_slots(record.name)
        # On a DRA node, claims hold devices too, for pods that may name no resource at all.
        claimed, claimers = self.cache.dra.held(record.name) if dra.is_on(record) else (0, 0)
        if not held and not claimed:
            return None
        room = victims.room(record, policy, layouts=self.cache.mig_config.layouts)
        if room is None:
            pods = max(len(self.cache.usage.node_pods(record.name)), claimers)
            return f"{pods} GPU pod(s) on the node: {backends.idle_reason(record, policy)}"
        return rollouts.misfit(held, room=room)

    def memory_misfits(
        self, record: NodeRecord, policy: CompiledPolicy | None
    ) -> tuple[memoryfits.MemoryMisfit, ...]:
        """The pods on the node whose GPU memory request ``policy``'s config would not hold,
        judged against what the node runs now (``memoryfits.on_node``)."""
        pods = [p for p in self.cache.usage.node_pods(record.name) if p.memory_mib is not None]
        if not pods:
            return ()
        cache = self.cache
        return memoryfits.on_node(
            record, pods, policy, configs=cache.key_configs, layouts=cache.mig_config.layouts
        )

    # -- recording -------------------------------------------------------------------------------

    def record(self, placement: Placement) -> None:
        """Enter a judged placement (from ``Reconciler.learn``, and the admission pass)."""
        node = placement.node
        if placement.grant is None:
            self.admitted.pop(node, None)
        else:
            self.admitted[node] = placement.grant
        self._place(
            node, placement.charged, placement.step, down=placement.down, since=placement.held_since
        )
        if placement.wanted is not None and placement.step in HELD_STEPS:
            self._wanted[node] = placement.wanted

    def _place(
        self,
        node: str,
        policy: str,
        step: Step | None,
        *,
        down: str | None = None,
        since: float | None = None,
    ) -> None:
        place = None if step is None else Place(policy, step)
        old = self._where.get(node)
        if old != place:
            self.stale = True
            if old is not None:
                self._steps[old.policy][old.step].discard(node)
                self._drop_empty(old.policy)
            if place is None:
                self._where.pop(node, None)
            else:
                self._where[node] = place
                self._steps[policy][place.step].add(node)
        if place is None or place.step not in HELD_STEPS:
            self._wanted.pop(node, None)
            self._held_since.pop(node, None)
        else:
            self._held_since.setdefault(node, self.cache.clock() if since is None else since)
        self._set_down(node, down)

    def _set_down(self, node: str, down: str | None) -> None:
        """Unavailable (charged to ``down``) or, for None, available."""
        if self._down.get(node) == down:
            return
        self.stale = True
        was = self._down.pop(node, None)
        if was is not None:
            self._down_by[was].discard(node)
            if not self._down_by[was]:
                del self._down_by[was]
                self._drop_empty(was)
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
            degraded=size[Step.DEGRADED],
            admitted=size[Step.ADMITTED],
            waiting=size[Step.WAITING] + size[Step.PREPARING],
            blocked=size[Step.BLOCKED],
            unavailable=down,
        )

    def down_nodes(self, policy: str) -> list[str]:
        """The nodes unavailable and charged to ``policy``."""
        return sorted(self._down_by.get(policy, ()))

    def nodes_at(self, policy: str, step: Step) -> list[str]:
        return sorted(self._steps.get(policy, {}).get(step, ()))

    def at(self, policy: str, step: Step) -> Collection[str]:
        """The nodes of a policy at a step (a live view, for the admission pass)."""
        return self._steps.get(policy, {}).get(step, set())

    def policies(self) -> Collection[str]:
        """Every policy with a node in the book (CLUSTER among them)."""
        return self._steps.keys()

    def down_of(self, node: str) -> str | None:
        """The policy an unavailable node is charged to; None when it is available."""
        return self._down.get(node)

    def wanted(self, node: str) -> str:
        """The target a held-back node waits for."""
        return self._wanted.get(node, RELEASE)

    def unavailable(self) -> int:
        return len(self._down)

    def cluster_budget(self) -> int:
        return rollouts.max_unavailable(self.max_unavailable, total=len(self.cache.nodes))

    def wants_taint(
        self, placement: Placement, *, tainted: bool, draining: bool, mig: bool = False
    ) -> bool:
        """Whether the node is in a change of a policy that cordons during changes: admitted,
        or unavailable since and carrying the taint (ours, by a leader before us or by us).
        A node drained for podPolicy Evict carries it whatever cordonDuringChange says, from
        before its first eviction until its change is confirmed."""
        if draining:
            return True
        if not placement.down or (placement.grant is None and not tainted):
            return False
        spec, _ = self._spec(placement.down)
        # A MIG change: always, so that no pod lands on the GPUs while they go idle.
        return mig or spec.cordonDuringChange or (spec.podPolicy is PodPolicy.EVICT and tainted)

"""The effect of planned policy edits, worked out by the operator's own state, planner and book.

``kubectl gpushare plan`` fills ``Forecaster.state`` through the same sinks the operator's
informers feed, then ``run`` upserts the planned policies into that same state and asks:

- each node's standing before and after, from ``Planner.decide`` and the status it would
  render (``kubectl.standings.standing_of``): who governs it, with which key and capacity;
- whose pods would hold more slots than the new config advertises, or (for a change of MIG
  layout, which needs idle GPUs) any slot at all, or lose the slot that enforces the GPU memory
  they asked for (``core.slots.memoryfits``): the rollout book's own ``misfit``;
- the rollout, by replaying the operator's own ``RolloutBook``: its gate and its admissions
  (fresh nodes at once, canary first and alone, ``maxUnavailable``, the cluster-wide budget,
  order by fewest allocated slots then name, WaitForPods), with every admitted node settled
  as NVIDIA's agents would settle it before the next batch is admitted; a MIG change admitted
  while GPU pods run waits for them under WaitForPods (tainted, charged to the budget, and
  never settled by the replay: the pods are the user's to end);
- under ``podPolicy: Evict``, which pods a change evicts (``kubectl.evictions``, by
  ``core.rollout.victims``): such a node is no misfit.  The replay judges each node through the
  operator's own drain (``reconcile.drains``): a node it would drain is admitted like any other
  and changes once its evicted pods are gone (they leave the state as it settles), in a batch
  that lasts as long as the evictions too; one it would give up at once (pods that are never
  evicted in the way) is held, as the operator holds it.

Nothing here is a second implementation of matching, resolution, rendering, slot accounting or
rollout admission: where the operator decides, this calls the code that decides.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import backends
from gpushare_operator.core.api import defaults
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.core.records.policies import compile_policy
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.core.rollout.rollouts import FINALIZER
from gpushare_operator.core.slots import memoryfits
from gpushare_operator.core.workqueue import CONFIG, MIG_CONFIG, NODE, POLICY
from gpushare_operator.kube import reading
from gpushare_operator.kubectl.disruptions import DetailSink, PodDetails
from gpushare_operator.kubectl.evictions import NodeEvictions, drain_seconds, foresee, may_evict
from gpushare_operator.kubectl.standings import (
    DRA_SHARING,
    POOL_LABELS,
    UNSUPPORTED,
    NodeStanding,
    RolloutPace,
    pool_of,
    settled_body,
    standing_of,
)
from gpushare_operator.reconcile import admissions
from gpushare_operator.reconcile.drains import Drain
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_operator.reconcile.rollouts import CLUSTER, Step

# The operator's defaults for what the plan does not depend on.
KEY_GRACE_PERIOD = defaults.CONFIG_KEY_GRACE_PERIOD
MISMATCH_TIMEOUT = defaults.MISMATCH_TIMEOUT
_HELD_STEPS = (Step.WAITING, Step.BLOCKED, Step.PREPARING)


class ManualClock:
    """The state's monotonic clock, moved by the replay from one batch to the next."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class NodeChange:
    name: str
    pool: str
    before: NodeStanding
    after: NodeStanding


@dataclass(frozen=True, slots=True)
class Misfit:
    """A node whose pods would hold more slots than its new config advertises."""

    node: str
    pool: str
    why: str
    pods: tuple[PodRecord, ...]
    mig: bool = False  # a change of MIG layout or backend: every GPU pod gone, not fewer slots
    # Only memory requests do not fit (the slots do): ``kubectl.memoryplan`` reports it.
    memory: bool = False
    backend: bool = False  # of ``mig``, a change of backend (device plugin <-> DRA)


@dataclass(frozen=True, slots=True)
class Unserved:
    """A pod on a node moving to backend DRA that asks for a resource the node's DeviceClass
    does not serve: once it is gone (the move needs idle GPUs) it could not come back there."""

    node: str
    namespace: str
    name: str
    resource: str
    served: str  # what the DRA policy's classes serve, joined


@dataclass(frozen=True, slots=True)
class Held:
    """A node that wants to change but that the rollout does not let go (and why)."""

    node: str
    policy: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Batch:
    index: int
    nodes: tuple[tuple[str, str], ...]  # (node, the policy whose budget it is charged to)
    ends_at: float  # seconds from the edit, estimated


@dataclass(frozen=True, slots=True)
class Budget:
    max_unavailable: int
    canary: int
    total: int


@dataclass
class Forecast:
    planned: list[str]
    before: dict[str, NodeStanding]  # every GPU node, under the policies as they are
    after: dict[str, NodeStanding]  # every GPU node, with the planned policies in force
    pools: dict[str, str]  # node -> pool
    products: dict[str, str | None]  # node -> its GPU model (base product), which a layout is for
    changes: list[NodeChange]
    misfits: list[Misfit]  # not those that podPolicy Evict drains
    unsupported: list[NodeChange]  # nodes the planned policies concern that end Unsupported
    keys_written: dict[str, str]
    keys_unused: list[str]
    layouts_written: dict[str, str]  # mig-parted config name -> its layout, added to the file
    start_delay: float  # the propagation wait before the first new key may be used
    batches: list[Batch] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)
    budgets: dict[str, Budget] = field(default_factory=dict)
    evictions: dict[str, NodeEvictions] = field(default_factory=dict)  # node -> its evictions
    unserved: list[Unserved] = field(default_factory=list)  # pods backend DRA would not serve

    @property
    def blocking(self) -> bool:
        """Whether a pipeline should stop here: an overcommitted or Unsupported node, or a pod
        backend DRA would not serve."""
        return bool(self.misfits or self.unsupported or self.unserved)

    def policies(self) -> list[str]:
        """Policies the plan concerns: the planned ones and those that gain or lose nodes."""
        names = set(self.planned)
        for change in self.changes:
            names.update(p for p in (change.before.policy, change.after.policy) if p)
        return sorted(names)


class Forecaster:
    """Owns a ``ClusterCache`` for the caller to fill, then forecasts planned edits on it."""

    def __init__(
        self,
        *,
        max_unavailable: int | str = defaults.MAX_UNAVAILABLE,
        pace: RolloutPace | None = None,
        pool_labels: Sequence[str] = POOL_LABELS,
    ) -> None:
        self.clock = ManualClock()
        self.cache = ClusterCache(clock=self.clock, dra_sharing=DRA_SHARING)
        self.pace = pace or RolloutPace()
        self.pool_labels = tuple(pool_labels)
        self.reconciler = Reconciler(
            self.cache,
            timings=Timings(
                propagation_delay=self.pace.propagation_delay,
                key_grace_period=KEY_GRACE_PERIOD,
                mismatch_timeout=MISMATCH_TIMEOUT,
            ),
            max_unavailable=max_unavailable,
        )
        self.planner = self.reconciler.planner
        self.book = self.reconciler.book
        self.pod_details: dict[str, PodDetails] = {}  # uid -> what evictions read; see below
        self._evictions: dict[str, NodeEvictions] = {}
        self._given_up: dict[str, Drain] = {}  # nodes the drain gave up (EvictionBlocked)
        self._idle_waits: dict[str, Held] = {}  # MIG changes admitted, waiting for their pods

    def keep_pod_details(self, inner: reading.Sink) -> reading.Sink:
        """A pod sink that keeps the pods' labels, readiness and grace periods beside their
        records (``pod_details``): what the evictions the forecast foresees are judged by."""
        sink = DetailSink(inner, self.cache)
        self.pod_details = sink.details
        return sink

    def track_resources_of(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """Keep pods asking for what the planned policies advertise too; call before the pods
        are listed (the cache keeps only pods asking for a tracked resource)."""
        for body in bodies:
            metadata = body.get("metadata") or {}
            compiled = compile_policy(
                name=str(metadata.get("name")),
                uid="",
                generation=0,
                spec=body.get("spec"),
                dra_sharing=DRA_SHARING,
            )
            self.cache.tracked_resources.update(compiled.resources)

    def may_evict(self, bodies: Iterable[Mapping[str, Any]]) -> bool:
        """Whether a policy as it is, or as planned, drains nodes (podPolicy Evict)."""
        return may_evict(self.cache.policies.values(), bodies)

    def targets(self) -> dict[str, NodeStanding]:
        planner = self.planner
        return {name: standing_of(r, planner.decide(r)) for name, r in self.cache.nodes.items()}

    def pool(self, node: str) -> str:
        record = self.cache.nodes.get(node)
        return pool_of(record.labels, self.pool_labels) if record is not None else "-"

    # -- the forecast ------------------------------------------------------------------------

    def run(self, planned: Sequence[Mapping[str, Any]]) -> Forecast:
        """Upsert ``planned`` (dry-run answers: new, edited or being deleted) and forecast."""
        cache = self.cache
        names = [str((body.get("metadata") or {}).get("name")) for body in planned]
        before = self.targets()
        concerned = self._matched(names)
        keys_before = {p.config_key for p in cache.policies.values() if p.config_key}
        for body in planned:
            cache.upsert_policy(body)
        for name in names:  # the operator's finalizer goes on before any node is changed
            current = cache.policy_finalizers.get(name, ())
            if name not in cache.deleting and FINALIZER not in current:
                cache.finalizers_set(name, (*current, FINALIZER))
        concerned |= self._matched(names)
        keys_written = self._write_keys()
        layouts_written = self._write_layouts()
        after = self.targets()
        changes = [
            NodeChange(name, self.pool(name), before[name], after[name])
            for name in sorted(after)
            if before.get(name) != after[name]
        ]
        concerned.update(change.name for change in changes)
        live = {p.config_key for p in cache.policies.values() if p.config_key}
        live -= {cache.policies[n].config_key for n in cache.deleting if n in cache.policies}
        misfits = self._misfits(changes)
        self._evictions = self._foresee(misfits)
        forecast = Forecast(
            planned=names,
            before=before,
            after=after,
            pools={name: self.pool(name) for name in after},
            products={name: cache.nodes[name].product for name in after},
            changes=changes,
            misfits=[m for m in misfits if not self._drains(m.node)],
            unsupported=[
                NodeChange(n, self.pool(n), before[n], after[n])
                for n in sorted(concerned)
                if n in after and after[n].standing == UNSUPPORTED
            ],
            keys_written=keys_written,
            keys_unused=sorted(k for k in keys_before if k not in live),
            layouts_written=layouts_written,
            start_delay=self.pace.propagation_delay if keys_written else 0.0,
            evictions=dict(self._evictions),
            unserved=self._unserved(changes),
        )
        self._replay(forecast)
        return forecast

    def _unserved(self, changes: Sequence[NodeChange]) -> list[Unserved]:
        """Pods on nodes moving to backend DRA whose GPU requests its DeviceClass does not
        serve (``nvidia.com/gpu.shared`` of a time-slicing pool; a MIG profile the new layout
        lacks, or any MIG resource for a pool of full GPUs)."""
        cache = self.cache
        found = []
        for change in changes:
            policy = cache.policies.get(change.after.policy or "")
            if policy is None or not policy.dra or policy.sharing is None:
                continue
            served = policy.resources
            for pod in cache.usage.node_pods(change.name):
                for resource, amount in pod.requests:
                    if amount and resource.startswith("nvidia.com/") and resource not in served:
                        named = ", ".join(served)
                        found.append(
                            Unserved(change.name, pod.namespace, pod.name, resource, named)
                        )
        return sorted(found, key=lambda u: (u.node, u.namespace, u.name, u.resource))

    def _matched(self, policies: Iterable[str]) -> set[str]:
        index = self.cache.index
        return {node for policy in policies for node in index.nodes_of(policy)}

    def _write_keys(self) -> dict[str, str]:
        """The keys the operator would add to the ConfigMap, written now: as in the operator,
        no node may name one before the propagation delay is over, while nodes whose key is
        already there may go at once (and take the budget first)."""
        cache = self.cache
        current = dict(cache.config_data or {})
        wanted = self.planner.desired_config()
        written = {key: text for key, text in wanted.items() if key not in current}
        cache.set_config_data({**current, **written}, initial=False)
        return written

    def _write_layouts(self) -> dict[str, str]:
        """The layouts the operator would add to the mig-parted ConfigMap, written now (its
        own plan of the file, with the same propagation wait before a node may name one)."""
        cache = self.cache
        state = cache.mig_config
        before = dict(state.layouts or {})
        plan = self.planner.plan_config(MIG_CONFIG)
        if plan.data is None:
            return {}
        cache.set_mig_config(plan.data, initial=False)
        return {  # all-disabled, always there, is no layout of a policy
            name: miggeometry.describe(layout.as_dict())
            for name, layout in sorted((state.layouts or {}).items())
            if name not in before and layout is not None
        }

    def _misfits(self, changes: Sequence[NodeChange]) -> list[Misfit]:
        """Nodes whose pods would not fit their change, judged by the rollout book itself: for
        a change of MIG layout, any GPU pod at all; a pod whose memory request its new slot
        would not hold, whatever the slots."""
        cache, usage = self.cache, self.cache.usage
        found: dict[str, tuple[str, str, bool, bool, bool]] = {}
        for change in changes:
            if not usage.node_slots(change.name) or change.after.standing == UNSUPPORTED:
                continue  # an Unsupported node is left as it is
            record = cache.nodes[change.name]
            decision = self.planner.decide(record)
            policy = None if nodephases.releases(decision) else decision.policy
            held = self.book.held_by_pods(record, policy)
            if held is not None:
                reason, why = held
                layouts = cache.mig_config.layouts
                idle = backends.disruption(record, policy, layouts=layouts)
                memory = (
                    reason == memoryfits.REASON and self.book.slot_misfit(record, policy) is None
                )
                backend = idle == dra.BACKEND_IDLE
                found[change.name] = (change.pool, why, idle is not None, memory, backend)
        pods: defaultdict[str, list[PodRecord]] = defaultdict(list)
        if found:
            for pod in usage:
                if pod.node in found and pod.holds_slots:
                    pods[pod.node].append(pod)
        return [
            Misfit(
                node,
                pool,
                why,
                tuple(sorted(pods[node], key=lambda p: (p.namespace, p.name))),
                mig,
                memory,
                backend,
            )
            for node, (pool, why, mig, memory, backend) in sorted(found.items())
        ]

    def _foresee(self, misfits: Sequence[Misfit]) -> dict[str, NodeEvictions]:
        """The evictions of each misfit whose change goes by podPolicy Evict."""
        found = {}
        for misfit in misfits:
            evictions = foresee(node=misfit.node, planner=self.planner, book=self.book)
            if evictions is not None:
                found[misfit.node] = evictions
        return found

    def _drains(self, node: str) -> bool:
        evictions = self._evictions.get(node)
        return evictions is not None and evictions.drains

    # -- replaying the rollout ---------------------------------------------------------------

    def _replay(self, forecast: Forecast) -> None:
        """Admit, batch after batch, as the operator's rollout book would, on a clock that
        moves by each batch's estimated time: a new key's nodes wait for its propagation, and
        every batch settles before the next.  A node admitted twice would mean a node that
        never settles: the replay stops there rather than loop."""
        book, start = self.book, self.clock.now
        self._drain()
        carried = self._gate(sorted(self.cache.nodes))  # fresh nodes go at once
        forecast.budgets = self._budgets()
        settled: set[str] = set()
        ticks = 0.0  # clock moves that only let the book look again: not time that passes
        for _ in range(2 * len(self.cache.nodes) + 2):
            self._drain()
            self.clock.now += 2 * admissions.INTERVAL  # one admission pass an interval at most
            ticks += 2 * admissions.INTERVAL
            passed = self.reconciler.tick(busy=False).orders
            looked = {*passed.first, *(name for kind, name in passed.mark if kind == NODE)}
            admitted = carried + self._gate(sorted(looked | set(self._dirty_nodes())))
            if not admitted:
                ready = self._next_key_ready()
                if ready is None:
                    break
                self.clock.now, ticks = ready, 0.0  # nothing to do until a key propagated
                carried = self._gate(self._preparing())
                continue
            if settled.intersection(admitted):
                break
            nodes = tuple((name, book.admitted[name][1]) for name in admitted)
            draining = max((self._drain_seconds(name) for name in admitted), default=0.0)
            for name in admitted:
                self._settle(name)
            settled.update(admitted)
            self.clock.now += draining + self.pace.batch_seconds(len(admitted))
            index = len(forecast.batches) + 1
            forecast.batches.append(Batch(index, nodes, round(self.clock.now - start - ticks, 2)))
            carried = self._gate(self._preparing())  # a key may have propagated meanwhile
        forecast.held = self._held()

    def _preparing(self) -> list[str]:
        """Nodes waiting for their new key to propagate (or for their policy to resume)."""
        book = self.book
        return sorted(
            node
            for policy in {*self.cache.policies, CLUSTER}
            for node in book.nodes_at(policy, Step.PREPARING)
        )

    def _next_key_ready(self) -> float | None:
        """When the next key some waiting node needs has propagated; None if none is due."""
        if not self._preparing():
            return None
        cache, now = self.cache, self.clock.now
        delay = self.pace.propagation_delay
        seen_at = (*cache.key_seen_at.values(), *cache.mig_config.seen_at.values())
        due = [seen + delay for seen in seen_at if seen + delay > now]
        return min(due, default=None)

    def _taken(self, kind: str) -> list[str]:
        """Everything of ``kind`` the state has marked since the last look (and forget it:
        the replay looks at what it needs itself)."""
        queue, names = self.cache.queue, []
        while (name := queue.get(kind)) is not None:
            queue.done((kind, name))
            names.append(name)
        return names

    def _drain(self) -> None:
        for kind in (NODE, POLICY, CONFIG):
            self._taken(kind)

    def _dirty_nodes(self) -> list[str]:
        return sorted(self._taken(NODE))

    def _judge(self, name: str) -> Drain:
        """The node judged as the operator's planner judges it: by the book, then the drain.
        A node the drain gave up stays given up, as the operator keeps it (from the status
        it publishes, which the forecast does not write) until the policy's next edit."""
        given_up = self._given_up.get(name)
        if given_up is not None:
            return given_up
        record = self.cache.nodes[name]
        planned = self.planner.decide(record)
        drain = self.planner.drains.judge(record, planned, self.book.judge(record, planned))
        if (drain.judgement.decision.eviction or {}).get("blockedAt"):
            self._given_up[name] = drain
        return drain

    def _place(self, name: str) -> bool:
        """Place the node in the book, as the operator's plan and learn would; True if the
        book lets it change now (for a node to drain: once its evictions are done)."""
        drain = self._judge(name)
        self.book.record(drain.judgement.placement)
        decision = drain.judgement.decision
        if decision.idle_wait:  # admitted, tainted, and waiting for the user's pods to end
            charged = drain.judgement.placement.charged
            self._idle_waits[name] = Held(name, charged, decision.reason, decision.message)
            return False
        self._idle_waits.pop(name, None)
        return decision.labels is not None or drain.draining

    def _drain_seconds(self, name: str) -> float:
        evictions = self._evictions.get(name)
        if evictions is None or not evictions.drains:
            return 0.0
        return drain_seconds(evictions, self.pod_details, write_qps=self.pace.write_qps)

    def _gate(self, names: Iterable[str]) -> list[str]:
        """Place each node in the book; those it lets change now."""
        return [name for name in names if name in self.cache.nodes and self._place(name)]

    def _settle(self, name: str) -> None:
        """The node once its change is done: its evicted pods gone, its new config in force."""
        cache, planner = self.cache, self.planner
        evictions = self._evictions.get(name)
        if evictions is not None and evictions.drains:
            for pod in (*evictions.pods, *evictions.leaving):
                cache.delete_pod(pod.uid)
        record = cache.nodes[name]
        cache.upsert_node(settled_body(record, planner.decide(record).policy))
        self._place(name)

    def _budgets(self) -> dict[str, Budget]:
        book, budgets = self.book, {}
        for name, policy in self.cache.policies.items():
            counts = book.counts(name)
            if policy.spec is None or not counts.total:
                continue
            spec = policy.spec.rollout
            budget = rollouts.max_unavailable(spec.maxUnavailable, total=counts.total)
            canary = 0 if name in self.cache.deleting else spec.canary
            budgets[name] = Budget(budget, canary, counts.total)
        return budgets

    def _held(self) -> list[Held]:
        cache, book = self.cache, self.book
        held = []
        for policy in sorted({*cache.policies, CLUSTER}):
            for step in _HELD_STEPS:
                for node in book.nodes_at(policy, step):
                    judged = self._judge(node).judgement
                    book.record(judged.placement)
                    decision = judged.decision
                    held.append(Held(node, policy, decision.reason, decision.message))
        held.extend(self._idle_waits.values())
        return sorted(held, key=lambda h: (h.policy, h.node))

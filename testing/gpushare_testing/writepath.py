"""Driving the write path without the write loop: for unit tests and the ingest benchmark.

The loop plans a key, sends its writes and learns from the answer; a test of planning alone
wants the same without I/O: ``settle`` plans each queued key and learns as if nothing needed
sending (or, with ``sent``, as if every write went through), ``drain`` just empties the queue.
"""

from __future__ import annotations

from gpushare_operator.core.listpatches import JsonPatch
from gpushare_operator.core.phases.nodephases import NodeDecision
from gpushare_operator.core.policystatus import PolicyTally
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.workqueue import CONFIG, CONFIG_KEY, NODE, POLICY, Key, WorkQueue
from gpushare_operator.reconcile.outcomes import Orders
from gpushare_operator.reconcile.plans import ConfigPlan, NodePlan, Plan, PolicyPlan, Stage
from gpushare_operator.reconcile.reconciler import Reconciler

KINDS = (CONFIG, NODE, POLICY)


def drain(queue: WorkQueue) -> dict[str, list[str]]:
    """Take every queued key and mark it done; what was queued, per kind, in order."""
    taken: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for kind in KINDS:
        while (name := queue.get(kind)) is not None:
            queue.done((kind, name))
            taken[kind].append(name)
    return taken


def take_nodes(queue: WorkQueue) -> list[str]:
    """Take every queued node (marked done), in queue order."""
    names = []
    while (name := queue.get(NODE)) is not None:
        queue.done((NODE, name))
        names.append(name)
    return names


def plan_and_learn(reconciler: Reconciler, key: Key, *, stage: Stage = Stage.FIRST) -> Plan:
    """Plan ``key`` and learn from the plan as the loop does when nothing is sent."""
    plan = reconciler.plan(key, stage=stage)
    act(reconciler.cache.queue, reconciler.learn(plan, None))
    return plan


def act(queue: WorkQueue, orders: Orders) -> None:
    """The loop's marks and timers of ``orders`` (not its outcome: there was no write)."""
    for key in orders.mark:
        queue.add(key)
    queue.first(NODE, orders.first)
    for key, when in orders.at:
        queue.add_at(key, when)


class PlanningLoop:
    """The write loop's planning half, without any API: each plan is learned from at once, as
    the loop learns from a plan with nothing to send (what its writes would have done, a test
    plays through the cache: a label write comes back as the Node's next event)."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self.cache = reconciler.cache
        self.planner = reconciler.planner
        self.book = reconciler.book
        self.memory = reconciler.memory
        self.clocks = reconciler.clocks

    def plan_node(self, name: str) -> NodePlan:
        plan = plan_and_learn(self.reconciler, (NODE, name))
        assert isinstance(plan, NodePlan)
        return plan

    def plan_policy(self, name: str, *, stage: Stage = Stage.STATUS) -> PolicyPlan:
        """The policy's status plan (its finalizer goes first in the loop: ``Stage.FIRST``)."""
        plan = plan_and_learn(self.reconciler, (POLICY, name), stage=stage)
        assert isinstance(plan, PolicyPlan)
        return plan

    def plan_config(self) -> ConfigPlan:
        plan = plan_and_learn(self.reconciler, CONFIG_KEY)
        assert isinstance(plan, ConfigPlan)
        return plan

    def due(self) -> float | None:
        """The loop's timers: the admission pass, then the queue's own; when the next is due."""
        queue = self.cache.queue
        tick = self.reconciler.tick(busy=bool(queue.nodes) or bool(queue.processing(NODE)))
        act(queue, tick.orders)
        timer = queue.next_due()
        due = [when for when in (tick.again_at, timer) if when is not None]
        return min(due, default=None)

    def plan_admitted(self, name: str) -> NodePlan:
        """Plan ``name`` as the loop would once its turn came: every queued node placed, the
        admission pass run (a change waits for its turn under the budget), then planned."""
        self.plan_queued_nodes()
        self.due()
        return self.plan_node(name)

    def plan_queued_nodes(self) -> list[NodePlan]:
        """Plan (and learn from) every queued node, in queue order, as the loop takes them."""
        return [self.plan_node(name) for name in take_nodes(self.cache.queue)]

    # What a test reads of the planner (pure), under the names the planner gives it.

    def decide(self, record: NodeRecord) -> NodeDecision:
        return self.planner.decide(record)

    def governing(self, node: str) -> CompiledPolicy | None:
        return self.planner.governing(node)

    def tally(self, policy: CompiledPolicy) -> PolicyTally:
        return self.planner.tally(policy)

    def policy_unsettled(self, name: str, *, busy: set[str]) -> bool:
        return self.planner.policy_unsettled(name, busy=busy)

    def schema_problem(self) -> str | None:
        return self.planner.schema_problem()

    def plan_finalizer(self, name: str) -> JsonPatch | None:
        return self.planner.plan_finalizer(name)

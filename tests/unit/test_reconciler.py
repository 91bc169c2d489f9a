"""The write path's pure halves: planning changes nothing, learning is the one place that does,
and whose turn it is follows from the queue alone."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.core.workqueue import CONFIG_KEY, NODE, POLICY, WorkQueue
from gpushare_operator.reconcile import turns
from gpushare_operator.reconcile.outcomes import (
    Done,
    Gone,
    LeadershipLost,
    NodeWritten,
    Orders,
    Refused,
    Retry,
)
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.plans import Stage
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing import writepath
from gpushare_testing.builders import Clock, node, policy, sync_config

TIMINGS = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=60)


def rolling_out(clock: Clock) -> tuple[ClusterCache, Reconciler]:
    """Four nodes on policy p's old key (replicas 2); p now wants replicas 4, one at a time."""
    cache = ClusterCache(clock=clock)
    cache.upsert_policy(policy("p", replicas=2))
    old = str(cache.policies["p"].config_key)
    cache.upsert_policy(
        policy("p", replicas=4, generation=2, rollout={"maxUnavailable": 1, "canary": 1})
    )
    new = str(cache.policies["p"].config_key)
    sync_config(cache, {old: "x", new: "y", "default": "z"}, initial=True)
    cache.settle_initial_keys()
    clock.now += 100
    for i in range(4):
        cache.upsert_node(node(f"n{i}", **{CONFIG_LABEL: old, POLICY_LABEL: "p"}))
    return cache, Reconciler(cache, timings=TIMINGS, max_unavailable="100%")


def held(reconciler: Reconciler) -> dict[str, Any]:
    """Everything the write path keeps in this process, as plain data."""
    book = reconciler.book
    return copy.deepcopy(
        {
            "book": {name: vars(book)[name] for name in vars(book) if name != "cache"},
            "clocks": {"since": reconciler.clocks.since},
            "memory": vars(reconciler.memory),
            "queue": reconciler.cache.queue.sizes(),
            "in_flight": reconciler.cache.in_flight,
        }
    )


def test_planning_changes_nothing_however_often_it_runs() -> None:
    clock = Clock()
    _, reconciler = rolling_out(clock)
    loop = writepath.PlanningLoop(reconciler)
    loop.plan_queued_nodes()
    loop.due()  # the canary is admitted: the book has something to lose
    before = held(reconciler)
    plans = [
        reconciler.plan(key, stage=stage)
        for _ in range(3)
        for key in [(NODE, f"n{i}") for i in range(4)] + [(POLICY, "p"), CONFIG_KEY]
        for stage in Stage
    ]
    assert held(reconciler) == before
    assert any(getattr(plan, "labels", None) for plan in plans)  # the canary's label change
    again = [reconciler.plan((NODE, f"n{i}")) for i in range(4)]
    assert again == [reconciler.plan((NODE, f"n{i}")) for i in range(4)]  # same state, same plan


def test_learning_records_the_placement_the_plan_saw() -> None:
    clock = Clock()
    cache, reconciler = rolling_out(clock)
    writepath.take_nodes(cache.queue)
    plan = reconciler.plan((NODE, "n0"))
    assert reconciler.book.counts("p").total == 0  # planned, not yet learned
    reconciler.learn(plan, None)
    assert reconciler.book.counts("p").total == 1
    assert plan.facts.placement is not None and plan.facts.placement.charged == "p"


def test_a_refused_label_write_is_shown_in_the_status_planned_next() -> None:
    clock = Clock()
    _, reconciler = rolling_out(clock)
    loop = writepath.PlanningLoop(reconciler)
    loop.plan_queued_nodes()
    loop.due()
    [canary] = [name for name, grant in reconciler.book.admitted.items() if grant]
    plan = reconciler.plan((NODE, canary))
    assert plan.labels is not None
    orders = reconciler.learn(plan, NodeWritten(Refused("HTTP 403 Forbidden")))
    assert isinstance(orders.outcome, Refused) and orders.again is Stage.STATUS
    status = reconciler.plan((NODE, canary), stage=Stage.STATUS).status
    assert status is not None
    failed = [c for c in status["conditions"] if c["type"] == "WriteFailed"]
    assert failed and failed[0]["message"] == "HTTP 403 Forbidden"
    applied = reconciler.learn(plan, NodeWritten(Done(), labels=plan.labels))
    assert applied.again is Stage.LABELLED and (NODE, canary) in applied.mark  # drops it again
    after = reconciler.plan((NODE, canary), stage=Stage.LABELLED).status
    assert after is not None and not [c for c in after["conditions"] if c["type"] == "WriteFailed"]


@pytest.mark.parametrize(
    ("first", "second", "gravest"),
    [
        (Done(), Retry("x"), Retry("x")),
        (Refused("p"), Done(), Refused("p")),
        (Retry("x"), LeadershipLost(), LeadershipLost()),
        (Gone(), Done(), Gone()),
    ],
)
def test_a_two_stage_job_reports_its_gravest_outcome(first: Any, second: Any, gravest: Any) -> None:
    both = Orders(first, frozenset({(POLICY, "a")}), again=Stage.STATUS).then(
        Orders(second, frozenset({(POLICY, "b")}))
    )
    assert both.outcome == gravest
    assert both.mark == {(POLICY, "a"), (POLICY, "b")} and both.again is None


# -- whose turn --------------------------------------------------------------------------------


class Settling:
    def __init__(self, unsettled: set[str]) -> None:
        self.unsettled = unsettled

    def policy_unsettled(self, name: str, *, busy: set[str]) -> bool:
        return name in self.unsettled


def queue_with(clock: Clock, *, nodes: list[str], policies: list[str]) -> WorkQueue:
    queue = WorkQueue(clock=clock, rng=random.Random(1))
    queue.many_nodes(nodes)
    queue.many_policies(policies)
    return queue


def test_the_configmap_goes_first_and_alone() -> None:
    clock = Clock()
    queue = queue_with(clock, nodes=["a"], policies=["p"])
    queue.config()
    turn = turns.next_turn(queue, turn=1, settling=Settling(set()), now=clock(), max_wait=60)
    assert turn == turns.Turn(CONFIG_KEY, alone=True)


def test_nodes_go_before_policies_but_a_policy_gets_every_tenth_turn() -> None:
    clock = Clock()
    queue = queue_with(clock, nodes=["a", "b"], policies=["p"])
    settled = Settling(set())
    ninth = turns.next_turn(queue, turn=9, settling=settled, now=clock(), max_wait=60)
    tenth = turns.next_turn(queue, turn=10, settling=settled, now=clock(), max_wait=60)
    assert (ninth.key, tenth.key) == ((NODE, "a"), (POLICY, "p"))
    nodes_done = queue_with(clock, nodes=[], policies=["p"])
    only = turns.next_turn(nodes_done, turn=3, settling=settled, now=clock(), max_wait=60)
    assert only.key == (POLICY, "p")


def test_an_unsettled_policy_waits_in_polls_until_its_longest_wait() -> None:
    clock = Clock()
    queue = queue_with(clock, nodes=[], policies=["busy", "idle"])
    settling = Settling({"busy"})
    turn = turns.next_turn(queue, turn=1, settling=settling, now=clock(), max_wait=60)
    assert turn.key == (POLICY, "idle")
    assert turn.deferred == (((POLICY, "busy"), clock() + turns.POLICY_POLL),)
    queue.postpone((POLICY, "busy"), clock() + turns.POLICY_POLL)
    assert queue.take((POLICY, "idle")) and not queue.take((POLICY, "busy"))
    clock.now += 60  # marked a minute ago: it goes, settled or not
    queue.next_due()
    late = turns.next_turn(queue, turn=2, settling=settling, now=clock(), max_wait=60)
    assert late.key == (POLICY, "busy") and late.deferred == ()

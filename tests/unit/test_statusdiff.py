"""An older CRD that prunes a status field costs a condition, not a rewrite loop."""

from __future__ import annotations

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import statusdiff
from gpushare_operator.reconcile.outcomes import Done, NodeWritten
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, node, policy, sync_config
from gpushare_testing.writepath import PlanningLoop

WRITTEN = {
    "phase": "Pending",
    "configReadyAt": "2026-11-30T00:00:00Z",
    "conditions": [{"type": "Ready", "status": "False", "observedGeneration": 2}],
}
ECHOED = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}


def test_dropped_paths_are_what_the_echo_lacks() -> None:
    assert statusdiff.dropped_paths(WRITTEN, ECHOED) == {
        ("configReadyAt",),
        ("conditions", 0, "observedGeneration"),
    }
    changed = {**WRITTEN, "phase": "Applied"}
    assert ("phase",) not in statusdiff.dropped_paths(WRITTEN, changed)


def test_without_drops_the_paths_from_every_list_item() -> None:
    paths = statusdiff.dropped_paths(WRITTEN, ECHOED)
    two = {
        **WRITTEN,
        "conditions": [*WRITTEN["conditions"], {"type": "X", "observedGeneration": 1}],
    }
    assert statusdiff.without(two, paths) == {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "X"}],
    }
    assert statusdiff.describe(paths) == (
        "status.conditions[].observedGeneration, status.configReadyAt"
    )


def test_a_field_dropped_twice_in_a_row_is_left_out_and_reported() -> None:
    clock = Clock()
    cache = ClusterCache(clock=clock)
    timings = Timings(propagation_delay=75, key_grace_period=300, mismatch_timeout=60)
    reconciler = Reconciler(
        cache, timings=timings, max_unavailable="10%", wallclock=lambda: "2026-11-30T00:00:00Z"
    )
    planner = PlanningLoop(reconciler)
    sync_config(cache, None, initial=True)
    cache.upsert_policy(policy("p"))
    cache.upsert_node(node("n1"))
    plan = planner.plan_node("n1")
    assert plan.status is not None
    echo = NodeWritten(Done(), status=WRITTEN, echo={"status": ECHOED})
    once = reconciler.learn(plan, echo)
    assert planner.schema_problem() is None  # once could be someone else's edit
    assert once.mark == {("policy", "p")} and planner.memory.pruned == {}  # its node counts
    twice = reconciler.learn(plan, echo)
    assert ("policy", "p") in twice.mark  # every policy reports it
    cache.upsert_node_state({"metadata": {"name": "n1"}, "status": ECHOED})  # its watch event
    problem = planner.schema_problem()
    assert problem is not None and "gpunodestates.gpushare.dev drops" in problem
    assert "kubectl apply --server-side -f crds/" in problem
    status = planner.plan_policy("p").status
    assert status is not None
    outdated = next(c for c in status["conditions"] if c["type"] == "SchemaOutdated")
    assert outdated["status"] == "True" and "status.configReadyAt" in outdated["message"]
    data = planner.plan_config().data
    assert data is not None
    sync_config(cache, data, initial=False)  # a new key: the node waits for propagation
    plan = planner.plan_node("n1")
    assert plan is not None and plan.status is not None
    assert "configReadyAt" not in plan.status  # never sent again
    cache.node_states["n1"] = plan.status  # what the old schema keeps of it
    assert not planner.plan_node("n1").writes  # so its echo is no drift

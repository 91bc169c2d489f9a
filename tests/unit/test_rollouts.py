"""Rollout arithmetic (core.rollout.rollouts) and the bookkeeping that admits nodes
(reconcile.rollouts)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import listpatches
from gpushare_operator.core.api.models import GPUSharingPolicySpec, RolloutPhase, RolloutSpec
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.core.rollout.rollouts import FINALIZER
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, config_texts, node, on, policy
from gpushare_testing.leaders import config_change
from gpushare_testing.writepath import PlanningLoop

# -- arithmetic ------------------------------------------------------------------------------


@given(total=st.integers(0, 10_000), percent=st.integers(0, 100))
def test_a_percentage_budget_rounds_down_and_is_at_least_one(total: int, percent: int) -> None:
    budget = rollouts.max_unavailable(f"{percent}%", total=total)
    assert budget == max(1, total * percent // 100)
    assert budget >= 1 and (budget == 1 or budget <= total)


def test_a_count_budget_is_taken_as_is() -> None:
    assert rollouts.max_unavailable(4, total=40) == 4
    assert rollouts.max_unavailable(4, total=2) == 4  # more than there is: all at once


def test_the_spec_refuses_a_budget_that_is_neither_a_count_nor_a_percentage() -> None:
    for bad in (0, -1, "0.5", "10", "101%", "ten%", True):
        with pytest.raises(ValueError, match="maxUnavailable"):
            RolloutSpec.model_validate({"maxUnavailable": bad})
    assert RolloutSpec.model_validate({"maxUnavailable": "25%"}).maxUnavailable == "25%"
    assert RolloutSpec.model_validate({"maxUnavailable": 3}).maxUnavailable == 3


def test_pods_fit_only_what_the_new_config_advertises() -> None:
    held = {"nvidia.com/gpu": 3}
    assert rollouts.misfit(held, room={"nvidia.com/gpu": 4}) is None
    assert rollouts.misfit(held, room={"nvidia.com/gpu": 2}) == (
        "pods hold 3 nvidia.com/gpu; the new config has 2"
    )
    # Renamed: the plugin stops advertising nvidia.com/gpu, whatever the new capacity.
    assert "does not advertise" in str(rollouts.misfit(held, room={"nvidia.com/gpu.shared": 64}))


def test_a_layout_of_several_resources_is_judged_per_resource() -> None:
    """A MIG layout of 1 x 3g.40gb and 4 x 1g.10gb per GPU: pods of both fit, each within its
    own count (before, holding two resources read as one not advertised)."""
    room = {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 8}
    assert (
        rollouts.misfit({"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 5}, room=room)
        is None
    )
    assert rollouts.misfit(
        {"nvidia.com/mig-3g.40gb": 3, "nvidia.com/mig-1g.10gb": 1}, room=room
    ) == ("pods hold 3 nvidia.com/mig-3g.40gb; the new config has 2")


def test_the_canary_goes_alone_then_the_budget_rules() -> None:
    spec = RolloutSpec(canary=1, maxUnavailable=4)
    fresh = rollouts.Counts(total=10, waiting=10)
    assert rollouts.canary_room(fresh, spec) == 1
    trying = rollouts.Counts(total=10, changing=1, waiting=9, unavailable=1)
    assert rollouts.canary_room(trying, spec) == 0  # wait until it is Verified
    proven = rollouts.Counts(total=10, updated=1, waiting=9)
    assert rollouts.canary_room(proven, spec) is None
    assert rollouts.room(proven, spec, cluster_room=100, paused=False) == 4
    assert rollouts.room(proven, spec, cluster_room=2, paused=False) == 2  # cluster-wide cap
    assert rollouts.canary_room(fresh, RolloutSpec(canary=0)) is None


def test_failures_halt_and_the_state_says_so() -> None:
    # A budget of 2: one failure leaves room to go on (one failure holding a budget of one is
    # a halt of its own, BudgetHeldByFailedNodes).
    spec = RolloutSpec(failureThreshold=2, maxUnavailable=2)
    one = rollouts.Counts(total=5, failed=1, unavailable=1, waiting=3, updated=1)
    two = rollouts.Counts(total=5, failed=2, unavailable=2, waiting=2, updated=1)
    assert rollouts.phase(one, spec, paused=False) is RolloutPhase.PROGRESSING
    assert rollouts.phase(two, spec, paused=False) is RolloutPhase.HALTED
    assert rollouts.room(two, spec, cluster_room=100, paused=False) == 0
    assert rollouts.phase(two, spec, paused=True) is RolloutPhase.PAUSED
    blocked = rollouts.Counts(total=2, updated=1, blocked=1)
    assert rollouts.phase(blocked, spec, paused=False) is RolloutPhase.WAITING_FOR_PODS
    done = rollouts.Counts(total=2, updated=2)
    assert rollouts.phase(done, spec, paused=False) is RolloutPhase.COMPLETE


# -- JSON patches that touch one member of a shared list ------------------------------------


def apply(patch: list[dict[str, Any]], doc: dict[str, Any]) -> dict[str, Any]:
    """A small RFC 6902 interpreter for the ops we emit (test, add, remove)."""
    import copy

    doc = copy.deepcopy(doc)
    for op in patch:
        parts = op["path"].strip("/").split("/")
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] == "test":
            current = parent.get(last) if isinstance(parent, dict) else parent[int(last)]
            assert current == op["value"], "test failed"
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.append(op["value"]) if last == "-" else parent.insert(int(last), op["value"])
            else:
                parent[last] = op["value"]
        else:
            del parent[int(last) if isinstance(parent, list) else last]
    return doc


TAINTS = [
    {"key": "a.example/x", "effect": "NoSchedule"},
    {"key": "b.example/y", "value": "1", "effect": "PreferNoSchedule"},
]


def test_our_taint_is_appended_and_removed_in_place() -> None:
    node_doc = {"spec": {"taints": list(TAINTS)}}
    tainted = apply(rollouts.taint_added(TAINTS), node_doc)
    assert tainted["spec"]["taints"] == [*TAINTS, dict(rollouts.TAINT)]
    # Someone adds a taint in the middle meanwhile: the removal is planned from what is there.
    edited = [
        TAINTS[0],
        {"key": "c.example/z", "effect": "NoExecute"},
        *tainted["spec"]["taints"][1:],
    ]
    patch = rollouts.taint_removed(edited)
    assert patch is not None
    after = apply(patch, {"spec": {"taints": edited}})
    assert after["spec"]["taints"] == [edited[0], edited[1], edited[2]]  # order kept
    assert rollouts.taint_removed(TAINTS) is None  # not ours: nothing to do


def test_a_stale_list_makes_the_patch_fail_instead_of_replacing() -> None:
    patch = rollouts.taint_added(TAINTS)
    with pytest.raises(AssertionError, match="test failed"):
        apply(patch, {"spec": {"taints": TAINTS[:1]}})


def test_alone_in_the_list_our_member_takes_the_list_with_it() -> None:
    patch = listpatches.removed("/metadata/finalizers", ["ours"], "ours".__eq__)
    assert patch is not None
    assert apply(patch, {"metadata": {"finalizers": ["ours"]}}) == {"metadata": {}}
    added = listpatches.appended("/metadata/finalizers", [], "ours")
    assert added[0] == {"op": "test", "path": "/metadata/finalizers", "value": None}


# -- the book: who goes when ------------------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


def cluster(
    clock: Clock, *, nodes: int, rollout: dict[str, Any]
) -> tuple[ClusterCache, PlanningLoop]:
    """``nodes`` nodes all on policy p's old config (replicas 2), p now at replicas 4."""
    cache = ClusterCache(clock=clock)
    old = policy("p", replicas=2)
    cache.upsert_policy(old)
    old_key = str(cache.policies["p"].config_key)
    old_data = config_texts(cache)
    new = policy("p", replicas=4)
    new["metadata"]["generation"] = 2
    new["spec"]["rollout"] = rollout
    cache.upsert_policy(new)
    cache.set_config_data(old_data | config_texts(cache), initial=True)
    cache.settle_initial_keys()
    clock.now += 100  # past the propagation delay
    for i in range(nodes):
        cache.upsert_node(node(f"n{i:02d}", **on(old_key, "p", 2)))  # Verified on the old key
    timings = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=60)
    return cache, PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="100%"))


def labelled(cache: ClusterCache, planner: PlanningLoop, clock: Clock) -> list[str]:
    """A few writer rounds: plan every queued node, advance the rollout; who gets labels (a
    label the test has not played back through the cache is planned again: named once)."""
    out = []
    for _ in range(3):
        out += [plan.name for plan in planner.plan_queued_nodes() if config_change(plan)]
        clock.now += 1
        planner.due()
    return sorted(set(out))


def test_a_canary_first_then_batches_in_order_of_fewest_slots(clock: Clock) -> None:
    cache, planner = cluster(clock, nodes=6, rollout={"maxUnavailable": 2, "canary": 1})
    assert labelled(cache, planner, clock) == ["n00"]  # by name: no pods anywhere
    key = str(cache.policies["p"].config_key)
    cache.upsert_node(node("n00", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))  # written
    assert labelled(cache, planner, clock) == []  # the canary is not Verified yet
    counts = planner.book.counts("p")
    assert (counts.admitted + counts.changing, counts.waiting) == (1, 5)


def test_a_node_joining_an_established_pool_is_configured_at_once(clock: Clock) -> None:
    cache, planner = cluster(clock, nodes=1, rollout={"maxUnavailable": 1, "canary": 1})
    key = str(cache.policies["p"].config_key)
    assert labelled(cache, planner, clock) == ["n00"]  # the canary
    cache.upsert_node(node("new"))
    assert planner.plan_node("new").labels is None  # the canary is not proven yet
    cache.upsert_node(node("n00", **on(key, "p", 4)))  # Verified on the new config
    planner.plan_node("n00")
    # Held back once, it is a node of the rollout now: it goes at the next admission, under
    # the budget (which has room).
    assert planner.plan_node("new").labels is None
    plan = planner.plan_admitted("new")
    assert plan.labels is not None and plan.labels[POLICY_LABEL] == "p"
    cache.upsert_node(node("new", **on(key, "p", 4)))  # Verified too
    planner.plan_node("new")
    # One joining the pool now that it is established goes at once: no budget, no wait.
    cache.upsert_node(node("newer"))
    plan = planner.plan_node("newer")
    assert plan.labels is not None and plan.labels[POLICY_LABEL] == "p"


def test_a_new_policy_has_a_canary_too(clock: Clock) -> None:
    """A brand-new policy over an idle pool: its first node goes alone and must be Verified
    before the next ones go, under the budget (nodes joining it later go at once)."""
    cache = ClusterCache(clock=clock)
    cache.upsert_policy(policy("p", rollout={"maxUnavailable": 2, "canary": 1}))
    cache.set_config_data(config_texts(cache), initial=True)
    cache.settle_initial_keys()
    clock.now += 100
    for i in range(5):
        cache.upsert_node(node(f"n{i}"))
    timings = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=60)
    planner = PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="100%"))
    assert labelled(cache, planner, clock) == ["n0"]
    key = str(cache.policies["p"].config_key)
    cache.upsert_node(node("n0", **on(key, "p", 4)))
    assert labelled(cache, planner, clock) == ["n1", "n2"]  # then maxUnavailable 2 at a time


def test_spec_rollout_defaults_are_the_documented_ones() -> None:
    spec = GPUSharingPolicySpec.model_validate({"strategy": "TimeSlicing", "replicas": 2})
    assert spec.rollout == RolloutSpec(
        maxUnavailable="10%", canary=1, failureThreshold=1, cordonDuringChange=False
    )


# -- what the status says, and what it announces ----------------------------------------------


def test_a_fresh_state_keeps_the_spec_the_status_recorded_when_the_current_one_is_broken() -> None:
    good = policy("p", replicas=4)
    cache = ClusterCache()
    cache.upsert_policy(good)
    recorded = cache.policies["p"]
    applied = {"generation": 1, "spec": recorded.applied_spec()}
    broken = policy("p", replicas=100, generation=2)  # past an older CRD
    broken["status"] = {"appliedSpec": applied}
    fresh = ClusterCache()  # a new leader: knows only what the API says
    fresh.upsert_policy(broken)
    kept = fresh.policies["p"]
    assert kept.error is not None and kept.kept_generation == 1
    assert kept.config_key == recorded.config_key and kept.usable
    # Without the record, the broken spec governs nothing (its nodes would be released).
    del broken["status"]
    bare = ClusterCache()
    bare.upsert_policy(broken)
    assert not bare.policies["p"].usable


def test_rollout_status_keeps_its_times_while_the_generation_is_the_same() -> None:
    from gpushare_operator.core import policystatus
    from gpushare_operator.core.records.policies import compile_policy

    compiled = compile_policy(name="p", uid="u", generation=3, spec=policy("p")["spec"])
    busy = policystatus.RolloutView(counts=rollouts.Counts(total=4, updated=1, waiting=3))
    first = policystatus.render_rollout(policy=compiled, view=busy, previous=None, now="T1")
    assert first is not None and first["startedAt"] == "T1" and "completedAt" not in first
    done = policystatus.RolloutView(counts=rollouts.Counts(total=4, updated=4))
    later = policystatus.render_rollout(policy=compiled, view=done, previous=first, now="T2")
    assert later is not None
    assert (later["startedAt"], later["completedAt"], later["state"]) == ("T1", "T2", "Complete")
    again = policystatus.render_rollout(policy=compiled, view=done, previous=later, now="T3")
    assert again == later  # nothing changes with the clock alone


def test_rollouts_announce_a_start_a_halt_and_a_completion_once_each() -> None:
    from gpushare_operator.core.announcements import rollout_announcements

    started = {"generation": 2, "state": "Progressing", "totalNodes": 40}
    halted = {**started, "state": "Halted", "failedNodes": 1}
    done = {**started, "state": "Complete", "updatedNodes": 40}
    old = {"generation": 1, "state": "Complete"}
    assert [a.reason for a in rollout_announcements(old, started)] == ["RolloutStarted"]
    assert [a.reason for a in rollout_announcements(started, started)] == []
    [halt] = rollout_announcements(started, halted)
    assert (halt.type, halt.reason) == ("Warning", "RolloutHalted")
    assert [a.reason for a in rollout_announcements(halted, done)] == ["RolloutComplete"]
    assert [a.reason for a in rollout_announcements(done, done)] == []


def test_a_node_still_changing_when_the_spec_moves_on_is_not_stuck_behind_itself(
    clock: Clock,
) -> None:
    cache, planner = cluster(clock, nodes=1, rollout={"maxUnavailable": 1, "canary": 0})
    assert labelled(cache, planner, clock) == ["n00"]
    key = str(cache.policies["p"].config_key)
    cache.upsert_node(node("n00", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))  # restarting
    planner.plan_node("n00")
    assert planner.book.counts("p").unavailable == 1
    newer = policy("p", replicas=8, generation=3, rollout={"maxUnavailable": 1, "canary": 0})
    cache.upsert_policy(newer)
    newest = str(cache.policies["p"].config_key)
    cache.set_config_data({key: "y", newest: "w", "default": "z"}, initial=False)
    clock.now += 10  # past the new key's propagation delay
    # Still unavailable from the last change, it takes the newest config at once: the budget
    # of one is its own, and changing it again leaves no more nodes unavailable.
    assert labelled(cache, planner, clock) == ["n00"]
    assert planner.book.counts("p").unavailable == 1


def test_a_wait_is_published_only_if_it_outlasts_the_quiet_time(clock: Clock) -> None:
    _, planner = cluster(clock, nodes=3, rollout={"maxUnavailable": 1, "canary": 0})
    first = planner.plan_queued_nodes()
    # Nobody is admitted yet and nobody says so: most waits end sooner than that.
    assert first and all(plan.status is None for plan in first)
    clock.now += planner.book.quiet + 1
    planner.due()  # admits one; the others' quiet timers are due
    said = {}
    for plan in planner.plan_queued_nodes():
        if plan.labels is not None:
            said[plan.name] = "LabelPending"  # admitted: its label goes first
        elif plan.status is not None:
            said[plan.name] = plan.status["conditions"][0]["reason"]
    assert sorted(said.values()) == ["LabelPending", "RolloutWaiting", "RolloutWaiting"]


def test_the_cluster_budget_caps_all_policies_together(clock: Clock) -> None:
    cache = ClusterCache(clock=clock)
    unpaced = {"maxUnavailable": "100%", "canary": 0}
    for name, pool in (("p", "a"), ("q", "b")):
        old = policy(name, pool=pool, replicas=2)
        cache.upsert_policy(old)
    keys = {n: str(cache.policies[n].config_key) for n in ("p", "q")}
    old_data = config_texts(cache)
    for i in range(4):
        cache.upsert_node(node(f"a{i}", pool="a", **on(keys["p"], "p", 2)))
        cache.upsert_node(node(f"b{i}", pool="b", **on(keys["q"], "q", 2)))
    for name, pool in (("p", "a"), ("q", "b")):
        cache.upsert_policy(policy(name, pool=pool, replicas=4, generation=2, rollout=unpaced))
    cache.set_config_data(old_data | config_texts(cache), initial=True)
    cache.settle_initial_keys()
    clock.now += 100
    timings = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=60)
    # 3 of the 8 GPU nodes:
    planner = PlanningLoop(Reconciler(cache, timings=timings, max_unavailable=3))
    assert len(labelled(cache, planner, clock)) == 3  # each policy alone would take all 4


def test_a_new_generation_lifts_a_halt(clock: Clock) -> None:
    cache, planner = cluster(clock, nodes=3, rollout={"maxUnavailable": 1, "canary": 1})
    assert labelled(cache, planner, clock) == ["n00"]
    key = str(cache.policies["p"].config_key)
    cache.upsert_node(node("n00", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    assert labelled(cache, planner, clock) == []  # Applied: its clock starts
    clock.now += 61  # past the mismatch timeout: the canary failed
    assert labelled(cache, planner, clock) == []
    counts = planner.book.counts("p")
    assert counts.failed == 1 and rollouts.halted(counts, RolloutSpec())
    fixed = policy("p", replicas=8, generation=3, rollout={"maxUnavailable": 1, "canary": 1})
    cache.upsert_policy(fixed)
    newest = str(cache.policies["p"].config_key)
    cache.set_config_data({key: "y", newest: "w", "default": "z"}, initial=False)
    clock.now += 10
    # The failed node is no failure of the new rollout: a canary goes again.
    assert labelled(cache, planner, clock) == ["n00"]
    assert planner.book.counts("p").failed == 0


def test_deleting_the_policy_an_unsupported_node_fell_through_to_releases_the_node(
    clock: Clock,
) -> None:
    """A mixed-MIG node under TimeSlicing policy ts because MPS policy mps, which outranks it,
    cannot work there: deleting ts leaves only mps, which cannot take the node either.  Its
    labels are ts's to remove (under ts's budget), or ts's finalizer would wait for ever."""
    cache = ClusterCache(clock=clock)
    cache.upsert_policy(policy("ts", priority=1))
    cache.upsert_policy(policy("mps", priority=100, strategy="MPS"))
    key = str(cache.policies["ts"].config_key)
    cache.set_config_data({key: "x", "default": "z"}, initial=True)
    cache.settle_initial_keys()
    mixed = {"nvidia.com/mig.strategy": "mixed", CONFIG_LABEL: key, POLICY_LABEL: "ts"}
    cache.upsert_node(node("n1", **mixed, **{"nvidia.com/gpu.replicas": "4"}))
    timings = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=60)
    planner = PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="100%"))
    assert labelled(cache, planner, clock) == []  # ts governs it, and it shows ts's config
    assert cache.policy_label_counts.get("ts") == 1

    gone = policy("ts", priority=1)
    gone["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    gone["metadata"]["finalizers"] = [FINALIZER]
    cache.upsert_policy(gone)
    assert labelled(cache, planner, clock) == ["n1"]
    plan = planner.plan_node("n1")
    assert plan.labels == {CONFIG_LABEL: None, POLICY_LABEL: None}
    assert planner.book.counts("ts").admitted == 1  # charged to the policy losing it

    assert planner.plan_finalizer("ts") is None  # the node still carries its label
    cache.upsert_node(node("n1", **{"nvidia.com/mig.strategy": "mixed"}))  # the labels went
    plan = planner.plan_node("n1")
    assert plan.status is not None and plan.status["phase"] == "Unsupported"
    patch = planner.plan_finalizer("ts")
    assert patch is not None and patch[-1]["op"] == "remove"
    assert labelled(cache, planner, clock) == []  # and nothing more is written to the node


def test_an_unsupported_node_keeps_the_labels_of_a_policy_that_still_selects_it(
    clock: Clock,
) -> None:
    """The other side of the release above: while the node's own policy still selects it, a
    node that turned Unsupported (here: its GPU count label broke) is never written to."""
    cache = ClusterCache(clock=clock)
    cache.upsert_policy(policy("ts", priority=1))
    key = str(cache.policies["ts"].config_key)
    cache.set_config_data({key: "x", "default": "z"}, initial=True)
    cache.settle_initial_keys()
    cache.upsert_node(node("n1", count="two", **{CONFIG_LABEL: key, POLICY_LABEL: "ts"}))
    timings = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=60)
    planner = PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="100%"))
    assert labelled(cache, planner, clock) == []
    plan = planner.plan_node("n1")
    assert plan is None or plan.labels is None


# -- a rollout that cannot move says so ---------------------------------------------------------


def test_failed_nodes_holding_the_whole_budget_halt_a_rollout_below_its_threshold() -> None:
    spec = RolloutSpec(maxUnavailable=2, failureThreshold=3)
    held = rollouts.Counts(total=6, failed=2, unavailable=2, waiting=4)
    assert rollouts.halt_reason(held, spec) == rollouts.BUDGET_HELD
    assert rollouts.phase(held, spec, paused=False) is RolloutPhase.HALTED
    assert rollouts.room(held, spec, cluster_room=100) == 0
    # A degraded node holds the budget as surely as a failed one.
    drift = rollouts.Counts(total=6, failed=1, degraded=1, unavailable=2, waiting=4)
    assert rollouts.halt_reason(drift, spec) == rollouts.BUDGET_HELD
    # The near misses: room left, a node still on its way, nothing left to change.
    room_left = rollouts.Counts(total=6, failed=1, unavailable=1, waiting=4)
    changing = rollouts.Counts(total=6, failed=2, changing=1, unavailable=3, waiting=3)
    nothing_waits = rollouts.Counts(total=6, failed=2, unavailable=2, updated=4)
    for counts in (room_left, changing, nothing_waits):
        assert rollouts.halt_reason(counts, spec) is None, counts
    assert rollouts.phase(room_left, spec, paused=False) is RolloutPhase.PROGRESSING
    # The threshold, when reached, is the reason given.
    spent = rollouts.Counts(total=6, failed=3, unavailable=3, waiting=3)
    assert rollouts.halt_reason(spent, spec) == rollouts.FAILURE_THRESHOLD


def test_progress_is_a_node_updated_or_one_fewer_waiting_and_nothing_else() -> None:
    before = {"state": "Progressing", "updatedNodes": 1, "waitingNodes": 3, "progressedAt": "T0"}
    still = {"state": RolloutPhase.PROGRESSING, "updated": 1, "waiting": 3}
    assert rollouts.progressed(before, **still, now="T1") == "T0"
    assert rollouts.progressed(before, **{**still, "updated": 2}, now="T1") == "T1"
    assert rollouts.progressed(before, **{**still, "waiting": 2}, now="T1") == "T1"
    # A node that joins the waiters, or one more failure, is no progress.
    assert rollouts.progressed(before, **{**still, "waiting": 4}, now="T1") == "T0"
    assert rollouts.progressed({}, **still, now="T1") == "T1"  # a new generation
    paused = {**before, "state": "Paused"}
    assert rollouts.progressed(paused, **still, now="T1") == "T1"  # resumed: counts anew


def test_the_progress_deadline_is_judged_from_the_recorded_time_alone() -> None:
    rollout = {"state": "Halted", "progressedAt": "2026-12-03T10:00:00Z"}
    assert rollouts.deadline_left(rollout, deadline=600, now="2026-12-03T10:01:40Z") == 500
    assert rollouts.deadline_left(rollout, deadline=600, now="2026-12-03T10:10:01Z") == -1
    later = "2026-12-03T11:00:00Z"
    for state in ("Complete", "Paused"):
        assert rollouts.deadline_left({**rollout, "state": state}, deadline=1, now=later) is None
    # No readable time on either side: not judged, never taken for a deadline long passed.
    assert rollouts.deadline_left(rollout, deadline=1, now="T1") is None
    assert rollouts.deadline_left({**rollout, "progressedAt": "T0"}, deadline=1, now=later) is None


def _status_at(
    view_counts: rollouts.Counts, *, previous: dict[str, Any] | None, now: str, **rollout: Any
) -> dict[str, Any]:
    from gpushare_operator.core import policystatus
    from gpushare_operator.core.records.policies import compile_policy

    spec = policy("p", rollout={"maxUnavailable": 2, **rollout})["spec"]
    compiled = compile_policy(name="p", uid="u", generation=3, spec=spec)
    view = policystatus.RolloutView(
        counts=view_counts, failed_nodes=["n1"], degraded_nodes=["n2"], waiting_nodes=["n3"]
    )
    return policystatus.render_policy_status(
        policy=compiled,
        tally=policystatus.PolicyTally(),
        previous=previous,
        now=now,
        rollout=view,
    )


def test_a_rollout_standing_still_past_its_deadline_is_not_progressing() -> None:
    from gpushare_operator.core.announcements import policy_announcements

    moving = rollouts.Counts(total=4, updated=1, changing=1, unavailable=1, waiting=2)
    first = _status_at(
        moving, previous=None, now="2026-12-03T10:00:00Z", progressDeadlineSeconds=60
    )
    progressing = [c for c in first["conditions"] if c["type"] == "Progressing"]
    assert [(c["status"], c["reason"]) for c in progressing] == [("True", "NodesChanging")]
    assert first["rollout"]["progressedAt"] == "2026-12-03T10:00:00Z"
    later = _status_at(
        moving, previous=first, now="2026-12-03T10:00:59Z", progressDeadlineSeconds=60
    )
    assert later == first  # nothing moved, the deadline not yet passed: nothing to write
    past = _status_at(
        moving, previous=first, now="2026-12-03T10:01:00Z", progressDeadlineSeconds=60
    )
    [cond] = [c for c in past["conditions"] if c["type"] == "Progressing"]
    assert (cond["status"], cond["reason"]) == ("False", rollouts.DEADLINE_EXCEEDED)
    assert "2026-12-03T10:00:00Z" in cond["message"]
    events = [a.reason for a in policy_announcements(first, past)]
    assert events == [rollouts.DEADLINE_EXCEEDED]
    # One node more updated: progress again, and the condition says so.
    moved = rollouts.Counts(total=4, updated=2, changing=1, unavailable=1, waiting=1)
    again = _status_at(moved, previous=past, now="2026-12-03T10:02:00Z", progressDeadlineSeconds=60)
    [cond] = [c for c in again["conditions"] if c["type"] == "Progressing"]
    assert (cond["status"], cond["reason"]) == ("True", "NodesChanging")
    assert again["rollout"]["progressedAt"] == "2026-12-03T10:02:00Z"


def test_a_budget_held_by_failed_nodes_is_a_halt_with_its_reason_the_nodes_and_an_event() -> None:
    from gpushare_operator.core.announcements import rollout_announcements

    busy = rollouts.Counts(total=6, updated=1, changing=1, unavailable=2, failed=1, waiting=3)
    held = rollouts.Counts(total=6, updated=1, unavailable=2, failed=1, degraded=1, waiting=3)
    before = _status_at(busy, previous=None, now="2026-12-03T10:00:00Z", failureThreshold=3)
    after = _status_at(held, previous=before, now="2026-12-03T10:00:05Z", failureThreshold=3)
    assert after["rollout"]["state"] == "Halted"
    assert after["rollout"]["waitingOn"] == ["n1", "n2"]
    [cond] = [c for c in after["conditions"] if c["type"] == "RolloutHalted"]
    assert (cond["status"], cond["reason"]) == ("True", rollouts.BUDGET_HELD)
    assert "n1" in cond["message"] and "n2" in cond["message"]
    [event] = rollout_announcements(before["rollout"], after["rollout"])
    assert (event.type, event.reason) == ("Warning", "RolloutHalted")
    assert "hold the whole budget" in event.message

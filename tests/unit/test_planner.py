"""The cache and planner without any API: events in, desired writes out."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import NodeSink
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, drain, node, policy, sync_config
from gpushare_testing.writepath import PlanningLoop


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> ClusterCache:
    return ClusterCache(clock=clock)


def planning(cache: ClusterCache, timings: Timings, **clocks: Any) -> PlanningLoop:
    """Plans learned from as the write loop learns from them (nothing is sent here: a write
    comes back the way it would, through the cache)."""
    return PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="10%", **clocks))


@pytest.fixture
def planner(cache: ClusterCache) -> PlanningLoop:
    timings = Timings(propagation_delay=75, key_grace_period=300, mismatch_timeout=60)
    return planning(cache, timings, wallclock=lambda: "2026-11-29T00:00:00Z")


def test_new_key_waits_for_propagation_then_labels(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    sync_config(cache, None, initial=True)
    cache.upsert_node(node("n1"))
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    plan = planner.plan_node("n1")
    assert plan is not None and plan.labels is None
    assert plan.status is not None and plan.status["conditions"][0]["reason"] == "ConfigNotWritten"

    data = planner.plan_config().data
    assert data is not None and key in data and "default" in data
    sync_config(cache, data, initial=False)  # the write comes back through the watch
    plan = planner.plan_node("n1")
    assert plan is not None and plan.labels is None
    assert plan.status is not None
    assert plan.status["conditions"][0]["reason"] == "WaitingForConfigPropagation"

    clock.now += 75
    plan = planner.plan_admitted("n1")
    assert plan is not None
    assert plan.labels == {CONFIG_LABEL: key, POLICY_LABEL: "p"}


def test_keys_present_at_startup_are_used_at_once(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1"))
    plan = planner.plan_admitted("n1")
    assert plan is not None and plan.labels == {CONFIG_LABEL: key, POLICY_LABEL: "p"}


def test_heartbeat_marks_nothing_dirty(cache: ClusterCache) -> None:
    body = node("n1")
    cache.upsert_node(body)
    drain(cache)
    heartbeat = node("n1")
    heartbeat["metadata"]["resourceVersion"] = "2"
    heartbeat["status"]["conditions"] = [{"type": "Ready", "lastHeartbeatTime": "later"}]
    record = cache.nodes["n1"]
    cache.upsert_node(heartbeat)
    assert len(cache.queue) == 0
    assert cache.nodes["n1"] is record  # not even re-projected


def test_highest_priority_wins_then_name(cache: ClusterCache, planner: PlanningLoop) -> None:
    cache.upsert_node(node("n1"))
    cache.upsert_policy(policy("b-low", priority=1))
    cache.upsert_policy(policy("z-high", priority=9))
    cache.upsert_policy(policy("a-high", priority=9))
    governing = planner.governing("n1")
    assert governing is not None and governing.name == "a-high"
    tally = planner.tally(cache.policies["b-low"])
    assert tally.matched == 1 and tally.governed == 0
    assert tally.conflicts == [("n1", "a-high")]


def admitted_plan(cache: ClusterCache, planner: PlanningLoop, name: str) -> Any:
    """Plan ``name`` as the writer would: every queued node placed, the rollout advanced
    (a release waits for its turn under the budget), then planned again."""
    planner.plan_queued_nodes()
    planner.due()
    return planner.plan_node(name)


def test_release_removes_only_our_labels(cache: ClusterCache, planner: PlanningLoop) -> None:
    ours = node("n1", **{CONFIG_LABEL: "p-ts4-abcdef", POLICY_LABEL: "p"})
    theirs = node("n2", **{CONFIG_LABEL: "hand-made"})
    cache.upsert_node(ours)
    cache.upsert_node(theirs)
    held = planner.plan_node("n1")
    assert held is None or held.labels is None  # a release waits for its turn
    plan = admitted_plan(cache, planner, "n1")
    assert plan is not None and plan.labels == {CONFIG_LABEL: None, POLICY_LABEL: None}
    assert not planner.plan_node("n2").writes  # not ours, never matched: no write, no state


def test_relabel_out_of_selector_goes_unmanaged(cache: ClusterCache, planner: PlanningLoop) -> None:
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    cache.node_states["n1"] = {"phase": "Applied"}
    cache.upsert_node(node("n1", pool="elsewhere", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    plan = admitted_plan(cache, planner, "n1")
    assert plan.labels == {CONFIG_LABEL: None, POLICY_LABEL: None}
    assert plan.status is None  # planned from the Node the label write returns
    cache.upsert_node(node("n1", pool="elsewhere"))  # the release, as the apply returns it
    plan = planner.plan_node("n1")
    assert plan.labels is None
    assert plan.status is not None and plan.status["phase"] == NodePhase.UNMANAGED
    assert "policy" not in plan.status


def test_applied_then_verified_then_mismatch(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    assert planner.decide(cache.nodes["n1"]).phase is NodePhase.APPLIED
    planner.plan_node("n1")
    clock.now += 61
    assert planner.decide(cache.nodes["n1"]).phase is NodePhase.MISMATCH
    confirmed = {
        CONFIG_LABEL: key,
        POLICY_LABEL: "p",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }
    cache.upsert_node(node("n1", **confirmed))
    assert planner.decide(cache.nodes["n1"]).phase is NodePhase.VERIFIED


def test_status_equal_to_cluster_is_not_written(cache: ClusterCache, planner: PlanningLoop) -> None:
    cache.upsert_node(node("n1"))
    cache.upsert_policy(policy("p"))
    sync_config(cache, {}, initial=True)
    plan = planner.plan_node("n1")
    assert plan is not None and plan.status is not None
    cache.node_states["n1"] = plan.status  # as if the write came back through the watch
    assert not planner.plan_node("n1").writes


def test_unused_key_is_kept_for_the_grace_period(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p", replicas=4))
    old_key = cache.policies["p"].config_key
    assert old_key is not None
    sync_config(cache, {old_key: "x", "default": "y", "someone-elses": "z"}, initial=True)
    cache.upsert_policy(policy("p", replicas=8, generation=2))
    new_key = cache.policies["p"].config_key
    data = planner.plan_config().data
    assert data is not None and old_key in data and new_key in data
    assert "someone-elses" not in data  # never ours to write or delete
    clock.now += 301
    data = planner.plan_config().data
    assert data is not None and old_key not in data


def test_key_still_named_by_a_node_is_kept(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p", replicas=4))
    old_key = cache.policies["p"].config_key
    assert old_key is not None
    sync_config(cache, {old_key: "x"}, initial=True)
    cache.upsert_node(node("n1", **{CONFIG_LABEL: old_key, POLICY_LABEL: "p"}))
    cache.upsert_policy(policy("p", replicas=8, generation=2))
    clock.now += 10_000
    data = planner.plan_config().data
    assert data is not None and old_key in data


def test_status_only_policy_update_does_not_recompile(cache: ClusterCache) -> None:
    cache.upsert_policy(policy("p"))
    compiled = cache.policies["p"]
    drain(cache)
    cache.upsert_policy({**policy("p"), "status": {"matchedNodes": 0}})
    assert cache.policies["p"] is compiled
    assert list(cache.queue.nodes) == []


def test_selector_change_reindexes_and_priority_change_does_not(cache: ClusterCache) -> None:
    for name, pool in (("n1", "a"), ("n2", "b")):
        cache.upsert_node(node(name, pool=pool))
    cache.upsert_policy(policy("p", pool="a"))
    assert cache.index.nodes_of("p") == {"n1"}
    cache.upsert_policy(policy("p", pool="b", generation=2))
    assert cache.index.nodes_of("p") == {"n2"}
    assert cache.index.policies_of("n1") == frozenset()


def test_relist_replaces_contents(cache: ClusterCache) -> None:
    sink = NodeSink(cache)
    sink.begin_relist()
    for name in ("n1", "n2"):
        sink.relist_item(node(name))
    sink.end_relist()
    sink.begin_relist()
    sink.relist_item(node("n2"))
    sink.end_relist()
    assert set(cache.nodes) == {"n2"}


def test_invalid_gpu_count_is_unsupported_without_label_write(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1", count="abc"))
    plan = planner.plan_node("n1")
    assert plan is not None and plan.labels is None
    assert plan.status is not None and plan.status["phase"] == "Unsupported"
    assert "abc" in plan.status["conditions"][0]["message"]


def test_a_key_found_at_startup_but_named_by_no_node_still_waits(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)  # a leader wrote it, then died at once
    cache.upsert_node(node("n1"))
    cache.settle_initial_keys()
    plan = planner.plan_node("n1")
    assert plan is not None
    assert plan.labels is None
    assert plan.status is not None
    assert plan.status["conditions"][0]["reason"] == "WaitingForConfigPropagation"
    clock.now += 75
    plan = planner.plan_admitted("n1")
    assert plan is not None
    assert plan.labels == {CONFIG_LABEL: key, POLICY_LABEL: "p"}


def test_a_key_some_node_names_is_used_at_once_after_startup(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    verified = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    cache.upsert_node(node("n0", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}, **verified))
    cache.upsert_node(node("n1"))
    cache.settle_initial_keys()
    plan = planner.plan_admitted("n1")
    assert plan is not None
    assert plan.labels == {CONFIG_LABEL: key, POLICY_LABEL: "p"}


def test_a_failed_policy_write_is_retried(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p"))
    drain(cache)
    cache.queue.add_at(("policy", "p"), clock.now + 5)
    clock.now += 5
    planner.due()
    assert list(cache.queue.policies) == ["p"]


def test_pods_on_an_unsupported_node_are_not_overcommitted(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("p", strategy="MPS"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1", **{"nvidia.com/mig.strategy": "mixed"}))
    pod = {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "p1"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        "status": {"phase": "Running"},
    }
    cache.upsert_pod(pod)
    plan = planner.plan_node("n1")
    assert plan is not None
    assert plan.status is not None
    assert plan.status["phase"] == "Unsupported"
    assert plan.status["slots"] == {"capacity": 0, "allocated": 0}
    overcommitted = [c for c in plan.status["conditions"] if c["type"] == "Overcommitted"]
    assert overcommitted[0]["status"] == "False"
    assert cache.usage.policy_slots("p") == 0


def test_absurd_gfd_numbers_are_unusable_not_passed_on(cache: ClusterCache) -> None:
    cache.upsert_node(node("n1", count="99999999999999999999", **{"nvidia.com/gpu.memory": "-1"}))
    record = cache.nodes["n1"]
    assert record.memory_mib is None
    assert record.gpus is None
    assert record.gpu_count_error is not None


def short_wait_planner(cache: ClusterCache) -> PlanningLoop:
    timings = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=60)
    return planning(cache, timings, wallclock=lambda: "2026-11-29T00:00:00Z")


def test_a_pending_status_replaced_within_the_hold_is_not_published(
    cache: ClusterCache, clock: Clock
) -> None:
    planner = short_wait_planner(cache)
    sync_config(cache, None, initial=True)
    cache.upsert_node(node("n1"))
    cache.upsert_policy(policy("p"))
    data = planner.plan_config().data
    assert data is not None
    sync_config(cache, data, initial=False)
    # Waiting one second for propagation: no write now, a recheck when it is over.
    assert not planner.plan_node("n1").writes
    assert planner.memory.held == {"n1": clock.now + 1}
    assert planner.due() == clock.now + 1
    clock.now += 1
    plan = planner.plan_admitted("n1")
    assert plan is not None and plan.labels is not None
    assert "n1" not in planner.memory.held


def test_a_long_propagation_wait_is_published_as_pending(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    sync_config(cache, None, initial=True)
    cache.upsert_node(node("n1"))
    cache.upsert_policy(policy("p"))
    data = planner.plan_config().data
    assert data is not None
    sync_config(cache, data, initial=False)
    plan = planner.plan_node("n1")  # 75 s: people should see why nothing happens yet
    assert plan is not None and plan.status is not None
    assert plan.status["phase"] == "Pending"
    assert planner.memory.held == {}


def test_a_policy_is_unsettled_while_a_node_of_it_has_a_write_coming(
    cache: ClusterCache, clock: Clock
) -> None:
    planner = short_wait_planner(cache)
    sync_config(cache, None, initial=True)
    for name, pool in (("n1", "a"), ("n2", "a"), ("n3", "b")):
        cache.upsert_node(node(name, pool=pool))
    cache.upsert_policy(policy("pa", pool="a"))
    cache.upsert_policy(policy("pb", pool="b"))
    drain(cache)
    assert not planner.policy_unsettled("pa", busy=set())
    cache.queue.node("n1")
    assert planner.policy_unsettled("pa", busy=set())
    assert not planner.policy_unsettled("pb", busy=set())
    drain(cache)
    assert planner.policy_unsettled("pa", busy={"n2"})  # being written right now
    assert not planner.policy_unsettled("pb", busy={"n2"})
    data = planner.plan_config().data
    assert data is not None
    sync_config(cache, data, initial=False)
    drain(cache)
    assert not planner.plan_node("n3").writes  # holds its Pending status back for a second
    assert planner.policy_unsettled("pb", busy=set())
    clock.now += 1.5  # the hold is over (its recheck makes n3 dirty again)
    assert not planner.policy_unsettled("pb", busy=set())


def test_an_older_configmap_event_after_our_own_write_is_ignored(cache: ClusterCache) -> None:
    cache.set_config_data({"default": "x"}, initial=True, version="10")
    cache.set_config_data({"default": "x", "p-ts4-abcdef": "y"}, initial=False, version="12")
    cache.set_config_data({"default": "x"}, initial=False, version="11")  # late watch event
    assert cache.config_data == {"default": "x", "p-ts4-abcdef": "y"}
    assert "p-ts4-abcdef" in cache.key_seen_at
    cache.set_config_data(None, initial=False, version="13")  # deleted
    assert cache.config_data is None


def test_timers_and_trackers_do_not_grow_with_replanning_or_departed_nodes(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    for _ in range(100):  # a busy node: planned again on every pod event
        planner.plan_node("n1")
    assert cache.queue.sizes()["timers"] == 1  # one Mismatch deadline, not a hundred
    assert "n1" in planner.clocks.since
    cache.delete_node("n1")
    planner.plan_node("n1")
    assert "n1" not in planner.clocks.since


EPOCH = 1_800_000_000.0  # the wall clock of a replica that has just started


def restarted_planner(cache: ClusterCache) -> PlanningLoop:
    return planning(
        cache,
        Timings(propagation_delay=75, key_grace_period=300, mismatch_timeout=60),
        wallclock=lambda: "2027-01-15T08:00:00Z",
        epoch=lambda: EPOCH,
    )


def policy_with_written_key(cache: ClusterCache) -> str:
    """Policy ``p`` whose config key has been in the ConfigMap since before start."""
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    return key


@pytest.mark.parametrize(
    ("published", "ago", "expected"),
    [
        ("Applied", 100, "Mismatch"),  # applied 100 s ago by an earlier leader; timeout is 60 s
        ("Applied", 10, "Applied"),  # 50 s still to wait, not a whole timeout
        ("Mismatch", 0, "Mismatch"),  # stays reported as it was
    ],
)
def test_the_mismatch_clock_survives_a_restart(
    cache: ClusterCache, clock: Clock, published: str, ago: float, expected: str
) -> None:
    planner = restarted_planner(cache)
    key = policy_with_written_key(cache)
    cache.upsert_node(node("n1", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    stamp = datetime.datetime.fromtimestamp(EPOCH - ago, datetime.UTC)
    status = {
        "policy": "p",
        "configKey": key,
        "phase": published,
        "lastTransitionTime": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    cache.upsert_node_state({"metadata": {"name": "n1"}, "status": status})
    decision = planner.decide(cache.nodes["n1"])
    assert decision.phase == expected
    if expected == "Applied":
        assert decision.recheck_at == clock.now + 50


def test_a_replan_before_our_write_is_seen_keeps_its_transition_time(
    cache: ClusterCache, clock: Clock
) -> None:
    stamps = iter(["2026-11-29T00:00:00Z", "2026-11-29T00:00:01Z"])
    planner = planning(
        cache,
        Timings(propagation_delay=75, key_grace_period=300, mismatch_timeout=60),
        wallclock=lambda: next(stamps),
    )
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    plan = planner.plan_node("n1")
    assert plan is not None and plan.status is not None
    cache.in_flight[("nodestate", "n1")] = plan.status  # written; its watch event not yet here
    assert not planner.plan_node("n1").writes  # a second later: the same status, no second write


def test_a_broken_update_keeps_the_last_good_generation_in_force(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("p", replicas=4))
    key = cache.policies["p"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    cache.upsert_policy(policy("p", replicas=100, generation=2))  # past an older CRD's admission
    kept = cache.policies["p"]
    assert not kept.valid and kept.usable and kept.kept_generation == 1
    assert cache.governing("n1") is kept
    assert kept.config_key == key and kept.replicas == 4
    plan = planner.plan_node("n1")
    assert plan is None or plan.labels is None  # the node keeps its labels: nothing is undone
    status = planner.plan_policy("p").status
    assert status is not None and status["observedGeneration"] == 2
    assert status["configKey"] == key
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "replicas" in ready["message"] and "generation 1 stays in force" in ready["message"]

    cache.upsert_policy(policy("p", replicas=100, generation=3))  # broken again: still gen 1
    assert cache.policies["p"].kept_generation == 1
    cache.upsert_policy(policy("p", replicas=6, generation=4))  # fixed
    fixed = cache.policies["p"]
    assert fixed.valid and fixed.kept_generation is None and fixed.config_key != key


def test_a_policy_that_never_worked_governs_nothing(cache: ClusterCache) -> None:
    cache.upsert_node(node("n1"))
    cache.upsert_policy(policy("p", replicas=100))
    assert not cache.policies["p"].usable
    assert cache.governing("n1") is None


def test_a_node_labelled_again_starts_a_fresh_mismatch_clock(
    cache: ClusterCache, clock: Clock
) -> None:
    planner = restarted_planner(cache)
    key = policy_with_written_key(cache)
    status = {"policy": "p", "configKey": key, "phase": "Mismatch"}
    cache.upsert_node_state({"metadata": {"name": "n1"}, "status": status})
    cache.upsert_node(node("n1", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    plan = planner.plan_node("n1")  # first sight since start: the published Mismatch stands
    assert plan is None or plan.status is None or plan.status["phase"] == "Mismatch"
    cache.upsert_node(node("n1"))  # someone strips our labels
    plan = planner.plan_admitted("n1")
    assert plan is not None and plan.labels is not None  # we label it again
    cache.upsert_node(node("n1", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))
    decision = planner.decide(cache.nodes["n1"])
    assert decision.phase == "Applied"  # GFD gets its whole window again
    assert decision.recheck_at == clock.now + 60


def test_a_key_like_ours_owned_by_someone_else_is_never_planned(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p"))
    key = str(cache.policies["p"].config_key)
    foreign = "stale-ts2-abcdef"
    owners = {
        foreign: frozenset({"hand-edit"}),
        key: frozenset({"gpushare-operator"}),
        "default": frozenset({"gpushare-operator"}),
    }
    data = {foreign: "version: v1\n", key: "x", "default": "y"}
    cache.set_config_data(data, initial=True, owners=owners)
    wanted = planner.plan_config().data
    assert planner.memory.foreign_keys == {foreign: "hand-edit"}
    assert wanted is not None and foreign not in wanted  # never taken over by our apply
    cache.set_config_data({foreign: "version: v1\n", **wanted}, initial=False, owners=owners)
    for _ in range(3):
        clock.now += 1000  # past every grace period
        assert planner.plan_config().data is None  # and never fought over

"""The rollout promise, held by the cluster's state alone: what any leader counts as unavailable,
drift that is no failure, halts an edit lifts, canaries, deletions and our own taint."""

from __future__ import annotations

from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.phases.releases import QUIET_RELEASE as QUIET
from gpushare_operator.core.phases.releases import release
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.core.rollout.rollouts import FINALIZER
from gpushare_operator.reconcile.outcomes import Done, NodeWritten
from gpushare_operator.reconcile.plans import Stage
from gpushare_testing.builders import Clock, config_texts, node, on, policy
from gpushare_testing.leaders import (
    EPOCH,
    TIMINGS,
    changed,
    confirm,
    leader,
    published,
    update,
)

TS = "time-slicing"


def pool(clock: Clock, *, nodes: int, rollout: dict[str, Any]) -> ClusterCache:
    """``nodes`` nodes Verified on policy p's replicas-2 config; p now wants replicas 4."""
    cache = ClusterCache(clock=clock, wallclock=lambda: EPOCH + clock.now)
    cache.upsert_policy(policy("p", replicas=2))
    old = str(cache.policies["p"].config_key)
    before = config_texts(cache)
    for i in range(nodes):
        cache.upsert_node(node(f"n{i}", **on(old, "p", 2)))
    cache.upsert_policy(policy("p", replicas=4, generation=2, rollout=rollout))
    cache.set_config_data(before | config_texts(cache), initial=True)
    cache.settle_initial_keys()
    clock.now += 100
    return cache


def steady(clock: Clock, *, nodes: int) -> ClusterCache:
    """``nodes`` nodes Verified on policy p's config, p unchanged since."""
    cache = ClusterCache(clock=clock, wallclock=lambda: EPOCH + clock.now)
    cache.upsert_policy(policy("p", replicas=2, rollout={"maxUnavailable": 1, "canary": 0}))
    key = str(cache.policies["p"].config_key)
    cache.set_config_data(config_texts(cache), initial=True)
    for i in range(nodes):
        cache.upsert_node(node(f"n{i}", **on(key, "p", 2)))
    clock.now += 100
    return cache


# -- unavailability is derived ----------------------------------------------------------------


def test_a_new_leader_counts_the_nodes_mid_change_that_the_last_one_left() -> None:
    clock = Clock()
    cache = pool(clock, nodes=6, rollout={"maxUnavailable": 2, "canary": 0})
    first = leader(cache)
    assert sorted(changed(first, clock)) == ["n0", "n1"]  # two at once: the budget
    newest = {"maxUnavailable": 2, "canary": 0}
    cache.upsert_policy(policy("p", replicas=8, generation=3, rollout=newest))
    cache.set_config_data(dict(cache.config_data or {}) | config_texts(cache), initial=False)
    clock.now += 10  # the second spec change: n0 and n1 still on generation 2's key
    second = leader(cache)  # a failover: nothing of the first process survives
    second.plan_queued_nodes()
    assert second.book.unavailable() == 2  # both nodes, though this process changed neither
    assert changed(second, clock) == ["n0", "n1"]  # taking the newest key costs nothing more
    assert second.book.unavailable() == 2  # and nothing more is admitted


def test_a_mismatch_node_nobody_changed_in_this_process_is_unavailable() -> None:
    clock = Clock()
    cache = pool(clock, nodes=3, rollout={"maxUnavailable": 1, "canary": 0, "failureThreshold": 5})
    key = str(cache.policies["p"].config_key)
    update(cache, node("n0", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}))  # an old leader's
    loop = leader(cache)
    loop.plan_queued_nodes()
    assert loop.book.unavailable() == 1
    assert changed(loop, clock) == []  # the budget of one is n0's, Mismatch or not


def test_a_release_counts_until_the_device_plugin_is_back_unshared() -> None:
    clock = Clock()
    cache = steady(clock, nodes=2)
    old = str(cache.policies["p"].config_key)
    loop = leader(cache)
    loop.plan_queued_nodes()
    for name in ("n0", "n1"):
        assert published(loop, name)["phase"] == NodePhase.VERIFIED
    update(cache, node("n0", pool="gone", **on(old, "p", 2)))  # no policy selects it now
    assert changed(loop, clock) == ["n0"]  # our labels go
    assert published(loop, "n0")["phase"] == NodePhase.RELEASING
    fresh = leader(cache)  # a new leader sees the same, from the GPUNodeState
    fresh.plan_queued_nodes()
    assert fresh.book.unavailable() == 1 and fresh.book.down_nodes("p") == ["n0"]
    update(cache, node("n0", pool="gone"))  # GFD and kubelet: unshared again
    assert published(fresh, "n0")["phase"] == NodePhase.UNMANAGED
    assert fresh.book.unavailable() == 0


def test_a_release_that_never_settles_stops_counting_after_the_timeout() -> None:
    clock = Clock()
    cache = steady(clock, nodes=1)
    old = str(cache.policies["p"].config_key)
    loop = leader(cache)
    loop.plan_queued_nodes()
    assert published(loop, "n0")["phase"] == NodePhase.VERIFIED
    update(cache, node("n0", pool="gone", **on(old, "p", 2)))
    changed(loop, clock)
    assert published(loop, "n0")["phase"] == NodePhase.RELEASING
    clock.now += TIMINGS.mismatch_timeout + 1
    status = published(loop, "n0")
    assert status["phase"] == NodePhase.UNMANAGED
    assert status["conditions"][0]["reason"] == "ReleaseNotConfirmed"
    assert loop.book.unavailable() == 0
    clock.now += 1000
    assert not loop.plan_node("n0").writes  # said once: no status rewritten for it


# -- drift, halts, canaries -----------------------------------------------------------------


def test_drift_on_a_verified_node_is_degraded_and_halts_nothing() -> None:
    clock = Clock()
    cache = pool(clock, nodes=3, rollout={"maxUnavailable": 1, "canary": 0})
    loop = leader(cache)
    assert changed(loop, clock) == ["n0"]
    confirm(cache, "n0", 4)
    assert published(loop, "n0")["phase"] == NodePhase.VERIFIED
    lost = node("n0", allocatable="12", **on(str(cache.nodes["n0"].config_label), "p", 4))
    update(cache, lost)  # one GPU of four gone: 12 slots, not 16
    clock.now += TIMINGS.mismatch_timeout * 3  # however long it lasts
    status = published(loop, "n0")
    assert status["phase"] == NodePhase.DEGRADED
    assert any(c["type"] == "Degraded" and c["status"] == "True" for c in status["conditions"])
    counts = loop.book.counts("p")
    assert (counts.degraded, counts.failed, counts.unavailable) == (1, 0, 1)
    assert not rollouts.halted(counts, cache.policies["p"].spec.rollout)  # type: ignore[union-attr]


def test_raising_the_failure_threshold_resumes_a_halted_rollout_at_once() -> None:
    clock = Clock()
    cache = pool(clock, nodes=3, rollout={"maxUnavailable": 2, "canary": 0})
    loop = leader(cache)
    assert sorted(changed(loop, clock)) == ["n0", "n1"]
    clock.now += TIMINGS.mismatch_timeout + 1  # both failed: the rollout halts
    assert changed(loop, clock) == []
    key = cache.policies["p"].config_key
    edit = {"maxUnavailable": 3, "canary": 0, "failureThreshold": 3}
    cache.upsert_policy(policy("p", replicas=4, generation=3, rollout=edit))
    assert cache.policies["p"].config_key == key  # a rollout-only edit: the same key
    assert changed(loop, clock) == ["n2"]


def test_a_failed_canary_is_replaced_by_the_next_node_until_the_threshold() -> None:
    clock = Clock()
    rollout = {"maxUnavailable": 2, "canary": 1, "failureThreshold": 2}
    cache = pool(clock, nodes=4, rollout=rollout)
    loop = leader(cache)
    assert changed(loop, clock) == ["n0"]
    clock.now += TIMINGS.mismatch_timeout + 1  # the canary failed: one failure of two allowed
    assert changed(loop, clock) == ["n1"]  # the next node is the canary now
    status = loop.plan_policy("p").rendered
    assert status is not None and status["rollout"]["state"] == "Progressing"
    assert status["rollout"]["waitingOn"] == ["n0", "n1"]  # what holds the budget, named


def test_deleting_a_paused_policy_releases_its_nodes_under_its_budget() -> None:
    clock = Clock()
    cache = pool(clock, nodes=3, rollout={"maxUnavailable": 1, "canary": 0})
    for i in range(3):  # converged on the new config, then paused
        confirm(cache, f"n{i}", 2)
    body = policy("p", replicas=2, generation=3, paused=True, rollout={"maxUnavailable": 1})
    body["metadata"] |= {"deletionTimestamp": "2026-12-01T00:00:00Z", "finalizers": [FINALIZER]}
    cache.upsert_policy(body)
    loop = leader(cache)
    assert changed(loop, clock) == ["n0"]  # one at a time, paused or not
    status = loop.plan_policy("p").rendered or {}
    deleting = next(c for c in status["conditions"] if c["type"] == "Deleting")
    assert deleting["status"] == "True"


def test_a_label_another_manager_owns_too_blocks_the_release_but_not_the_finalizer() -> None:
    clock = Clock()
    cache = pool(clock, nodes=1, rollout={"maxUnavailable": 1, "canary": 0})
    old = str(cache.policies["p"].config_key)
    body = policy("p", replicas=4, generation=3)
    body["metadata"] |= {"deletionTimestamp": "2026-12-01T00:00:00Z", "finalizers": [FINALIZER]}
    cache.upsert_policy(body)
    loop = leader(cache)
    plans = loop.plan_queued_nodes()
    loop.due()
    plan = loop.plan_node("n0")
    assert plan.labels == {CONFIG_LABEL: None, POLICY_LABEL: None}
    assert loop.planner.plan_finalizer("p") is None  # n0 still carries p's label
    # The apply went through, but another manager owns the labels too: they stay.
    kept = node("n0", **on(old, "p", 2))
    answer = NodeWritten(Done(), kept, labels=plan.labels, co_owners=("hand-edit",))
    loop.reconciler.learn(plan, answer)
    assert plans
    status = loop.plan_node("n0").status or {}
    assert status["conditions"][0]["reason"] == "ReleaseBlocked"
    assert "hand-edit" in status["conditions"][0]["message"]
    assert loop.planner.plan_finalizer("p") is not None  # the finalizer goes all the same


# -- our taint ---------------------------------------------------------------------------------


def test_a_taint_with_our_key_and_another_effect_is_not_ours() -> None:
    theirs = {"key": rollouts.TAINT_KEY, "effect": "NoExecute"}
    ours = dict(rollouts.TAINT)
    assert rollouts.taint_removed([theirs]) is None
    patch = rollouts.taint_removed([theirs, ours])
    assert patch is not None and patch[-1] == {"op": "remove", "path": "/spec/taints/1"}


def test_a_mismatch_node_loses_our_taint() -> None:
    clock = Clock()
    rollout = {"maxUnavailable": 1, "canary": 0, "cordonDuringChange": True}
    cache = pool(clock, nodes=1, rollout=rollout)
    loop = leader(cache)
    loop.plan_queued_nodes()
    loop.due()
    plan = loop.plan_node("n0")
    assert plan.taint is not None and plan.labels is not None  # cordoned for the change
    tainted = node("n0", **{CONFIG_LABEL: str(plan.labels[CONFIG_LABEL]), POLICY_LABEL: "p"})
    tainted["spec"] = {"taints": [dict(rollouts.TAINT)]}
    update(cache, tainted)
    assert loop.plan_node("n0").taint is None  # kept while the change is under way
    clock.now += TIMINGS.mismatch_timeout + 1
    removed = loop.plan_node("n0").taint
    assert removed is not None and removed[-1]["op"] == "remove"


# -- our finalizer comes first ------------------------------------------------------------------


def test_no_node_is_labelled_for_a_policy_before_our_finalizer_is_on_it() -> None:
    """Deleted without our finalizer, a policy would vanish and every node it configured be
    released at once; so its nodes wait for the finalizer, and go as soon as it lands."""
    clock = Clock()
    cache = ClusterCache(clock=clock, wallclock=lambda: EPOCH + clock.now)
    rollout = {"maxUnavailable": 1, "canary": 0}
    cache.upsert_policy(policy("p", finalized=False, rollout=rollout))
    cache.set_config_data(config_texts(cache), initial=True)
    cache.settle_initial_keys()
    for i in range(3):
        cache.upsert_node(node(f"n{i}"))
    loop = leader(cache)
    clock.now += 100
    assert changed(loop, clock, rounds=5) == []
    assert loop.plan_policy("p", stage=Stage.FIRST).finalizer is not None, "it goes first"

    cache.upsert_policy(policy("p", finalized=True, rollout=rollout) | {"status": {}})
    assert changed(loop, clock) == ["n0"], "then the rollout starts, under its budget"


def test_the_last_node_of_a_new_policys_rollout_goes_under_the_budget_not_at_once() -> None:
    """Once the canary is proven, the nodes still to change are no joiners of an established
    pool: the last of them waits while another is changing, as the rest did."""
    clock = Clock()
    cache = ClusterCache(clock=clock, wallclock=lambda: EPOCH + clock.now)
    cache.upsert_policy(policy("p", rollout={"maxUnavailable": 1, "canary": 1}))
    cache.set_config_data(config_texts(cache), initial=True)
    cache.settle_initial_keys()
    for i in range(3):
        cache.upsert_node(node(f"n{i}"))
    loop = leader(cache)
    clock.now += 100
    assert changed(loop, clock) == ["n0"], "the canary first"
    confirm(cache, "n0", 4)
    assert changed(loop, clock) == ["n1"]
    assert changed(loop, clock, rounds=5) == [], "n1 is still changing: n2 waits its turn"
    confirm(cache, "n1", 4)
    assert changed(loop, clock) == ["n2"]


def test_a_release_counts_its_full_timeout_though_its_stamp_has_whole_seconds() -> None:
    """The published lastTransitionTime drops the fraction of a second: read back, it must not
    make the release stop counting (or a Degraded node lose its taint) before its time."""
    clock = Clock()
    cache = steady(clock, nodes=1)
    old = str(cache.policies["p"].config_key)
    loop = leader(cache)
    loop.plan_queued_nodes()
    published(loop, "n0")
    update(cache, node("n0", pool="gone", **on(old, "p", 2)))
    assert changed(loop, clock) == ["n0"]
    clock.now = int(clock.now) + 0.9  # its Releasing status is written 0.9 s into a second
    released = clock.now
    assert published(loop, "n0")["phase"] == NodePhase.RELEASING
    clock.now = released + TIMINGS.mismatch_timeout - 0.05
    assert published(loop, "n0")["phase"] == NodePhase.RELEASING, "still within its timeout"
    assert loop.book.unavailable() == 1
    clock.now = released + TIMINGS.mismatch_timeout + 1.05
    assert published(loop, "n0")["phase"] == NodePhase.UNMANAGED


def test_the_last_node_waits_while_a_failed_one_holds_the_budget() -> None:
    """Found by the promise property test: with the canary proven and the only other node
    failed (unavailable, under the threshold), the node still waiting is no joiner."""
    clock = Clock()
    cache = ClusterCache(clock=clock, wallclock=lambda: EPOCH + clock.now)
    rollout = {"maxUnavailable": 1, "canary": 0, "failureThreshold": 2}
    cache.upsert_policy(policy("p", rollout=rollout))
    cache.set_config_data(config_texts(cache), initial=True)
    cache.settle_initial_keys()
    for i in range(3):
        cache.upsert_node(node(f"n{i}"))
    loop = leader(cache)
    clock.now += 100
    assert changed(loop, clock) == ["n0"]
    confirm(cache, "n0", 4)
    # (a round more: n0's slot labels are written once it is Verified)
    assert changed(loop, clock, rounds=4) == ["n1"]  # GFD never confirms it
    clock.now += TIMINGS.mismatch_timeout + 1
    assert published(loop, "n1")["phase"] == NodePhase.MISMATCH
    assert changed(loop, clock, rounds=5) == [], "n1 still holds the budget of 1"
    # A new leader, knowing nothing of who was held back, judges the same.
    second = leader(cache)
    second.reconciler.restart()
    cache.queue.many_nodes(set(cache.nodes))  # it looks at every node
    assert changed(second, clock, rounds=5) == []


def test_a_release_that_waited_its_turn_counts_until_it_is_confirmed() -> None:
    # Found by the promise property test (seed 43369): a node held back from its release
    # published a Pending status that named no policy, so once its labels went it was
    # watched by nobody and the next node was released beside it.
    clock = Clock()
    cache = steady(clock, nodes=3)
    old = str(cache.policies["p"].config_key)
    loop = leader(cache)
    loop.plan_queued_nodes()
    for i in range(3):
        assert published(loop, f"n{i}")["phase"] == NodePhase.VERIFIED
        update(cache, node(f"n{i}", pool="gone", **on(old, "p", 2)))  # no policy selects them
    assert changed(loop, clock) == ["n0"]
    clock.now += 60  # past the rollout's quiet time: the waits are published
    for name in ("n1", "n2"):
        waiting = published(loop, name)
        assert waiting["phase"] == NodePhase.PENDING
        assert waiting.get("policy") == "p"  # the policy it is released from
    update(cache, node("n0", pool="gone"))  # n0 runs unshared again
    assert published(loop, "n0")["phase"] == NodePhase.UNMANAGED
    assert changed(loop, clock) == ["n1"]
    assert published(loop, "n1")["phase"] == NodePhase.RELEASING
    assert changed(loop, clock, rounds=5) == []  # n2 waits for n1's confirmation
    assert loop.book.unavailable() == 1
    fresh = leader(cache)  # and a new leader counts n1 the same way
    for i in range(3):
        fresh.plan_node(f"n{i}")
    assert fresh.book.down_nodes("p") == ["n1"]


def test_a_release_is_not_confirmed_by_what_the_node_showed_before_it() -> None:
    # Found by the promise soak (seed 4294967295): a node whose shared config never took
    # effect (its agents down) looked unshared already when our labels went; the release was
    # called settled at once, and the next nodes released beside it broke the cluster budget.
    clock = Clock()
    cache = steady(clock, nodes=1)
    key = str(cache.policies["p"].config_key)
    stamp = str(int(EPOCH + clock.now))
    stale = {"nvidia.com/gfd.timestamp": stamp}
    update(cache, node("n0", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}, **stale))  # unconfirmed
    loop = leader(cache)
    loop.plan_queued_nodes()
    assert published(loop, "n0")["phase"] == NodePhase.APPLIED
    update(cache, node("n0", pool="gone", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}, **stale))
    assert changed(loop, clock) == ["n0"]  # our labels go
    assert published(loop, "n0")["phase"] == NodePhase.RELEASING  # not settled by old labels
    clock.now += 2
    assert published(loop, "n0")["phase"] == NodePhase.RELEASING
    assert loop.book.down_nodes("p") == ["n0"]
    later = {"nvidia.com/gfd.timestamp": str(int(EPOCH + clock.now) + 1)}
    update(cache, node("n0", pool="gone", **later))  # GFD's first pass since the release
    assert published(loop, "n0")["phase"] == NodePhase.UNMANAGED
    assert loop.book.unavailable() == 0


def test_a_release_that_restarts_nothing_is_taken_as_it_looks_after_a_quiet_time() -> None:
    # The config manager skips a key it already runs: a node labelled and released before it
    # applied our key restarts nothing, and GFD writes no new pass to wait for.
    clock = Clock()
    cache = steady(clock, nodes=1)
    key = str(cache.policies["p"].config_key)
    stale = {"nvidia.com/gfd.timestamp": str(int(EPOCH + clock.now))}
    update(cache, node("n0", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}, **stale))
    loop = leader(cache)
    loop.plan_queued_nodes()
    published(loop, "n0")
    update(cache, node("n0", pool="gone", **{CONFIG_LABEL: key, POLICY_LABEL: "p"}, **stale))
    assert changed(loop, clock) == ["n0"]
    status = published(loop, "n0")
    assert status["phase"] == NodePhase.RELEASING
    plan = loop.plan_node("n0")
    assert plan.facts.recheck_at is not None and plan.facts.recheck_at <= clock.now + QUIET
    clock.now += QUIET + 1
    assert published(loop, "n0")["phase"] == NodePhase.UNMANAGED
    assert loop.book.unavailable() == 0


def test_a_node_unsupported_for_the_policy_it_leaves_is_unmanaged_at_once() -> None:
    # Never configured by us (the policy could not work there): nothing restarts, so there is
    # no GFD pass to wait for (found by the plugin's prediction test in CI).
    clock = Clock()
    cache = ClusterCache(clock=clock, wallclock=lambda: EPOCH + clock.now)
    cache.upsert_node(node("n0", **{"nvidia.com/gfd.timestamp": "1796140000"}))
    published = nodephases.Published(policy="p", phase=NodePhase.UNSUPPORTED)
    decision = release(cache.nodes["n0"], published=published, now=clock.now, timeout=60)
    assert decision.phase is NodePhase.UNMANAGED and decision.reason == "NoPolicy"

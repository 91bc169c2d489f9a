"""The plan's forecast: standings before/after and the rollout replayed by the operator's book."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.phases import nodephases
from gpushare_operator.kubectl.forecast import Forecaster
from gpushare_operator.kubectl.standings import (
    GOVERNED,
    UNMANAGED,
    UNSUPPORTED,
    RolloutPace,
    pool_of,
    settled_body,
    standing_of,
)
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import config_texts, converged, node, on, pod, policy

PACE = RolloutPace(propagation_delay=75, write_qps=100, verify_seconds=60)


# -- the pure pieces -----------------------------------------------------------------------------


def test_a_settled_node_is_verified_on_its_policy_and_a_released_one_is_back_unshared() -> None:
    cache = ClusterCache()
    cache.upsert_policy(policy("p", replicas=4, strategy="MPS", renameByDefault=True))
    compiled = cache.policies["p"]
    cache.upsert_node(node("n"))
    settled = settled_body(cache.nodes["n"], compiled)
    cache.upsert_node(settled)
    decision = nodephases.decide(
        record=cache.nodes["n"],
        policy=compiled,
        key=nodephases.KeyReadiness(present=True),
        applied_since=None,
        now=0,
        mismatch_timeout=60,
    )
    assert decision.phase is NodePhase.VERIFIED, decision.message
    cache.upsert_node(settled_body(cache.nodes["n"], None))
    released = cache.nodes["n"]
    assert released.policy_label is None and nodephases.release_settled(released)


def test_the_target_is_what_the_published_status_says() -> None:
    cache = ClusterCache()
    cache.upsert_policy(policy("p", replicas=3))
    cache.upsert_node(node("n", count="2"))
    planner = Reconciler(cache, timings=Timings(75, 300, 300), max_unavailable="10%").planner
    decision = planner.decide(cache.nodes["n"])
    target = standing_of(cache.nodes["n"], decision)
    status = nodephases.render_status(
        record=cache.nodes["n"], decision=decision, previous=None, now="t"
    )
    assert (target.policy, target.config_key, target.capacity) == (
        status["policy"],
        status["configKey"],
        status["slots"]["capacity"],
    )
    assert (target.standing, target.capacity) == (GOVERNED, 6)


def test_pools_come_from_the_first_pool_label_else_the_gpu_product() -> None:
    assert pool_of({"pool": "a", "karpenter.sh/nodepool": "k"}) == "a"
    assert pool_of({"karpenter.sh/nodepool": "k"}) == "k"
    assert pool_of({"nvidia.com/gpu.product": "NVIDIA-A10G-SHARED"}) == "NVIDIA-A10G"
    assert pool_of({}) == "-"
    assert pool_of({"rack": "r1"}, ["rack"]) == "r1"


def test_a_batch_takes_its_writes_at_the_write_rate_then_the_verify_wait() -> None:
    assert PACE.batch_seconds(100) == 100 * 3 / 100 + 60


# -- the forecast --------------------------------------------------------------------------------


def test_a_replicas_edit_goes_canary_first_then_by_budget_in_order_of_fewest_slots() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    rollout = {"maxUnavailable": 2, "canary": 1}
    old_key = converged(forecaster, 6, rollout=rollout)
    forecaster.cache.upsert_pod(pod("busy", "n0", 5))
    forecast = forecaster.run([policy("p", replicas=4, generation=2, rollout=rollout)])
    assert [c.name for c in forecast.changes] == [f"n{i}" for i in range(6)]
    assert {(c.before.capacity, c.after.capacity) for c in forecast.changes} == {(8, 16)}
    assert [[n for n, _ in b.nodes] for b in forecast.batches] == [
        ["n1"],  # the canary: no slots, first by name
        ["n2", "n3"],
        ["n4", "n5"],
        ["n0"],  # the most allocated, last
    ]
    assert [b.ends_at for b in forecast.batches] == [135.03, 195.09, 255.15, 315.18]
    assert forecast.keys_unused == [old_key] and len(forecast.keys_written) == 1
    assert forecast.budgets["p"].max_unavailable == 2 and not forecast.blocking


def test_a_fresh_node_goes_at_once_and_the_cluster_budget_caps_every_policy() -> None:
    forecaster = Forecaster(max_unavailable=1, pace=PACE)
    converged(forecaster, 2, rollout={"maxUnavailable": "100%", "canary": 0})
    forecaster.cache.upsert_node(node("fresh"))
    forecast = forecaster.run(
        [policy("p", replicas=4, generation=2, rollout={"maxUnavailable": "100%", "canary": 0})]
    )
    batches = [[n for n, _ in b.nodes] for b in forecast.batches]
    # The fresh node is configured at once and takes the only cluster-wide slot while it is
    # unavailable; then one node at a time.
    assert batches == [["fresh"], ["n0"], ["n1"]]


def test_nodes_whose_key_exists_go_while_a_new_key_propagates_and_take_the_budget_first() -> None:
    """As in the operator: a new key is not named before the propagation delay is over, so a
    node moving to a policy whose key is already there is admitted at once, and holds the
    cluster-wide budget while the new key's nodes wait."""
    forecaster = Forecaster(max_unavailable=1, pace=PACE)
    cache = forecaster.cache
    cache.upsert_policy(policy("p", replicas=2, priority=100))
    cache.upsert_policy(policy("r", pool="b", priority=50))
    wide = policy("q", replicas=3, priority=10)
    wide["spec"]["nodeSelector"] = {
        "matchExpressions": [{"key": "pool", "operator": "In", "values": ["b", "c"]}]
    }
    cache.upsert_policy(wide)
    keys = {n: str(p.config_key) for n, p in cache.policies.items()}
    cache.set_config_data(config_texts(cache), initial=True)
    for name, pool, owner, replicas in (
        ("a0", "a", "p", 2),
        ("a1", "a", "p", 2),
        ("b0", "b", "r", 4),
        ("c0", "c", "q", 3),
    ):
        cache.upsert_node(node(name, pool=pool, **on(keys[owner], owner, replicas)))
    forecast = forecaster.run(
        [
            policy("p", replicas=4, priority=100, generation=2),
            policy("r", pool="b", priority=5, generation=2),
        ]
    )
    assert [[n for n, _ in b.nodes] for b in forecast.batches] == [["b0"], ["a0"], ["a1"]]
    assert [b.ends_at for b in forecast.batches] == [60.03, 135.03, 195.06]


def test_pods_that_would_not_fit_hold_their_node_and_block_the_plan() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 2, rollout={"maxUnavailable": "100%", "canary": 0})
    forecaster.cache.upsert_pod(pod("big", "n0", 7))
    forecast = forecaster.run([policy("p", replicas=1, generation=2, strategy="Exclusive")])
    [misfit] = forecast.misfits
    assert (misfit.node, [p.name for p in misfit.pods]) == ("n0", ["big"])
    assert misfit.why == "pods hold 7 nvidia.com/gpu; the new config has 4"
    assert [(h.node, h.reason) for h in forecast.held] == [("n0", "WaitingForPods")]
    assert "n0" not in {n for b in forecast.batches for n, _ in b.nodes}
    assert forecast.blocking


def test_with_proceed_the_overcommitted_node_changes_anyway() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 1)
    forecaster.cache.upsert_pod(pod("big", "n0", 7))
    spec = {"rollout": {"podPolicy": "Proceed", "canary": 0}, "strategy": "Exclusive"}
    forecast = forecaster.run([policy("p", replicas=1, generation=2, **spec)])
    assert forecast.misfits and not forecast.held
    assert [[n for n, _ in b.nodes] for b in forecast.batches] == [["n0"]]


def test_an_overlapping_policy_wins_nodes_and_rolls_them_under_its_own_budget() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 4)
    for i in range(2):
        forecaster.cache.upsert_node(
            node(f"n{i}", rack="r0", **forecaster.cache.nodes[f"n{i}"].labels)
        )
    greedy = policy("greedy", replicas=8, priority=100, rollout={"maxUnavailable": 1, "canary": 0})
    greedy["spec"]["nodeSelector"] = {"matchLabels": {"rack": "r0"}}
    forecast = forecaster.run([greedy])
    assert {(c.name, c.before.policy, c.after.policy) for c in forecast.changes} == {
        ("n0", "p", "greedy"),
        ("n1", "p", "greedy"),
    }
    assert [b.nodes for b in forecast.batches] == [(("n0", "greedy"),), (("n1", "greedy"),)]


def test_a_deletion_releases_the_nodes_under_the_policys_budget_without_a_canary() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    key = converged(forecaster, 3, rollout={"maxUnavailable": 2, "canary": 1})
    gone = policy("p", replicas=2, rollout={"maxUnavailable": 2, "canary": 1})
    gone["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    forecast = forecaster.run([gone])
    assert {c.after.standing for c in forecast.changes} == {UNMANAGED}
    assert [len(b.nodes) for b in forecast.batches] == [2, 1]
    assert {charged for b in forecast.batches for _, charged in b.nodes} == {"p"}
    assert forecast.keys_unused == [key] and forecast.keys_written == {}
    assert forecast.start_delay == 0  # a release needs no new key


def test_a_release_of_nodes_gfd_stamped_is_foreseen_as_unshared() -> None:
    # GFD stamps every pass; a settled node in the replay is one after its pass, or the
    # release would look unconfirmed and the node still governed by the policy it leaves.
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    cache = forecaster.cache
    cache.upsert_policy(policy("p", replicas=2, rollout={"maxUnavailable": 3, "canary": 0}))
    key = str(cache.policies["p"].config_key)
    cache.set_config_data(config_texts(cache), initial=True)
    for i in range(2):
        labels = on(key, "p", 2) | {"nvidia.com/gfd.timestamp": "1796140000"}
        cache.upsert_node(node(f"n{i}", **labels))
        status = {"policy": "p", "configKey": key, "phase": "Verified"}
        cache.upsert_node_state({"metadata": {"name": f"n{i}"}, "status": status})
    gone = policy("p", replicas=2, rollout={"maxUnavailable": 3, "canary": 0})
    gone["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    forecast = forecaster.run([gone])
    assert {c.name: c.after.standing for c in forecast.changes} == {
        "n0": UNMANAGED,
        "n1": UNMANAGED,
    }
    assert {c.after.policy for c in forecast.changes} == {None}


def test_a_policy_that_cannot_work_on_a_node_leaves_it_unsupported() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 2)
    labels = dict(forecaster.cache.nodes["n1"].labels)
    forecaster.cache.upsert_node(node("n1", **{**labels, "nvidia.com/mig.strategy": "mixed"}))
    forecast = forecaster.run([policy("p", replicas=2, generation=2, strategy="MPS")])
    assert [(c.name, c.after.standing) for c in forecast.unsupported] == [("n1", UNSUPPORTED)]
    assert (
        forecast.unsupported[0].after.why is not None
        and "mixed" in forecast.unsupported[0].after.why
    )
    assert forecast.blocking


# -- every node that has to change is accounted for -----------------------------------------------

edits = st.fixed_dictionaries(
    {
        "replicas": st.sampled_from([2, 3, 4]),
        "priority": st.integers(0, 3),
        "pool": st.sampled_from(["a", "b"]),
        "maxUnavailable": st.sampled_from([1, 2, "50%", "100%"]),
        "canary": st.integers(0, 2),
        "podPolicy": st.sampled_from(["WaitForPods", "Proceed", "Evict"]),
    }
)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 6)), min_size=1, max_size=8
    ),
    edit=edits,
    cluster=st.sampled_from([1, 3, "100%"]),
)
def test_every_node_to_change_is_in_exactly_one_batch_or_held(
    nodes: list[tuple[str, int]], edit: dict[str, Any], cluster: int | str
) -> None:
    forecaster = Forecaster(max_unavailable=cluster, pace=PACE)
    cache = forecaster.cache
    for name, pool in (("p", "a"), ("q", "b")):
        cache.upsert_policy(policy(name, pool=pool, replicas=2))
    keys = {n: str(p.config_key) for n, p in cache.policies.items()}
    cache.set_config_data(config_texts(cache), initial=True)
    for i, (pool, slots) in enumerate(nodes):
        owner = "p" if pool == "a" else "q"
        cache.upsert_node(node(f"n{i}", pool=pool, **on(keys[owner], owner, 2)))
        if slots:
            cache.upsert_pod(pod(f"pod{i}", f"n{i}", slots))
    rollout = {key: edit[key] for key in ("maxUnavailable", "canary", "podPolicy")}
    planned = policy(
        "p",
        pool=edit["pool"],
        replicas=edit["replicas"],
        priority=edit["priority"],
        generation=2,
        rollout=rollout,
    )
    forecast = forecaster.run([planned])
    relabelled = {c.name for c in forecast.changes if c.before.config_key != c.after.config_key}
    batched = [n for b in forecast.batches for n, _ in b.nodes]
    held = [h.node for h in forecast.held]
    assert len(batched) == len(set(batched)) and not set(batched) & set(held)
    assert set(batched) | set(held) == relabelled
    # Under Evict a node whose pods do not fit is drained and changes: no misfit, never held.
    if edit["podPolicy"] == "Evict":
        assert not forecast.misfits
        assert all(e.drains and n in batched for n, e in forecast.evictions.items())
    for batch in forecast.batches:  # never more at once than the budgets allow
        for charged in {c for _, c in batch.nodes}:
            budget = forecast.budgets[charged].max_unavailable
            assert sum(c == charged for _, c in batch.nodes) <= budget
    # Each node ends where a fresh state with the planned policy in force would put it.
    fresh = ClusterCache()
    fresh.upsert_policy(planned)
    fresh.upsert_policy(policy("q", pool="b", replicas=2))
    for i, (pool, _) in enumerate(nodes):
        fresh.upsert_node(node(f"n{i}", pool=pool))
    for name, target in forecast.after.items():
        governing = fresh.governing(name)
        assert target.policy == (governing.name if governing else None)


def test_a_mig_layout_that_does_not_fit_a_pools_gpus_blocks_the_plan() -> None:
    """The H200s have no 1g.10gb profile: the plan says so per node (exit 2), the H100 goes."""
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    forecaster.cache.upsert_node(
        node("h100", **{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    )
    forecaster.cache.upsert_node(
        node("h200", **{"nvidia.com/gpu.product": "NVIDIA-H200-141GB-HBM3e"})
    )
    body = policy("m", strategy="MIG", mig={"profile": "1g.10gb"})
    del body["spec"]["replicas"]
    forecast = forecaster.run([body])
    assert [(c.name, c.after.standing) for c in forecast.unsupported] == [("h200", UNSUPPORTED)]
    why = forecast.unsupported[0].after.why
    assert why is not None and "has no MIG profile 1g.10gb" in why
    assert forecast.blocking
    assert forecast.unsupported[0].after.reason == "MIGLayoutDoesNotFit"


# -- MIG -----------------------------------------------------------------------------------------

H100 = "NVIDIA-H100-80GB-HBM3"
MIXED = {"profile": "1g.10gb", "migStrategy": "mixed"}


def mig_body(mig: dict[str, Any], **rollout: Any) -> dict[str, Any]:
    body = policy(
        "p",
        generation=2,
        strategy="MIG",
        mig=mig,
        rollout={"maxUnavailable": "100%", "canary": 0, **rollout},
    )
    del body["spec"]["replicas"]
    return body


def time_sliced_h100s(forecaster: Forecaster, nodes: int) -> None:
    """``nodes`` H100 nodes of 2 GPUs Verified on policy p (time-slicing, 4 replicas), with
    the mig-parted ConfigMap read and absent (no MIG policy has written one yet)."""
    cache = forecaster.cache
    cache.upsert_policy(policy("p", replicas=4, rollout={"maxUnavailable": "100%", "canary": 0}))
    key = str(cache.policies["p"].config_key)
    cache.set_config_data(config_texts(cache), initial=True)
    cache.set_mig_config(None, initial=True)
    for i in range(nodes):
        labels = {**on(key, "p", 4), "nvidia.com/gpu.product": H100}
        cache.upsert_node(node(f"n{i}", count="2", **labels))


def test_a_mig_layout_is_written_then_named_and_slots_change_resource() -> None:
    """A time-sliced pool turned into 1g.10gb MIG devices: the layout lands in the mig-parted
    file first and the nodes wait its propagation; then each settles Verified on 7 MIG devices
    per GPU of a new resource, and no node waits for a layout name the operator would write."""
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    time_sliced_h100s(forecaster, 2)
    forecast = forecaster.run([mig_body(MIXED)])
    mig = forecaster.cache.policies["p"].mig
    assert mig is not None
    name = mig.names[H100]
    assert forecast.layouts_written[name] == "7x 1g.10gb"
    assert not forecast.held and not forecast.blocking
    assert [[n for n, _ in b.nodes] for b in forecast.batches] == [["n0", "n1"]]
    assert forecast.batches[0].ends_at >= PACE.propagation_delay
    change = forecast.changes[0]
    assert change.before.slots == (("nvidia.com/gpu", 8),)
    assert change.after.slots == (("nvidia.com/mig-1g.10gb", 14),)
    assert (change.after.mig_config, change.after.layout) == (name, "7x 1g.10gb")
    record = forecaster.cache.nodes["n0"]
    assert forecaster.planner.decide(record).phase is NodePhase.VERIFIED


def test_a_mig_change_waits_for_every_gpu_pod_or_evicts_every_one() -> None:
    """A pod that would fit the new slots still holds the GPUs a layout change needs idle:
    under WaitForPods the node is held (charged, never settled), under Evict it goes."""
    waiting = Forecaster(max_unavailable="100%", pace=PACE)
    time_sliced_h100s(waiting, 2)
    waiting.cache.upsert_pod(pod("small", "n0", 1))
    forecast = waiting.run([mig_body(MIXED)])
    [misfit] = forecast.misfits
    assert (misfit.node, misfit.mig, [p.name for p in misfit.pods]) == ("n0", True, ["small"])
    assert "1 GPU pod(s) on the node" in misfit.why
    assert [(h.node, h.reason) for h in forecast.held] == [("n0", "WaitingForPods")]
    assert [[n for n, _ in b.nodes] for b in forecast.batches] == [["n1"]]
    assert forecast.blocking

    evicting = Forecaster(max_unavailable="100%", pace=PACE)
    time_sliced_h100s(evicting, 2)
    evicting.cache.upsert_pod(pod("small", "n0", 1))
    forecast = evicting.run([mig_body(MIXED, podPolicy="Evict")])
    assert not forecast.misfits and not forecast.held
    assert [p.name for p in forecast.evictions["n0"].pods] == ["small"]
    assert sorted(n for b in forecast.batches for n, _ in b.nodes) == ["n0", "n1"]


def test_a_re_layout_evicts_even_the_pods_of_the_resource_it_keeps() -> None:
    """From 7x 1g.10gb to 3g.40gb + 2g.20gb + 1g.10gb: the pod on a 1g.10gb device fits the
    new slots, but the layout changes only on idle GPUs."""
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    cache = forecaster.cache
    cache.tracked_resources.add("nvidia.com/mig-1g.10gb")
    time_sliced_h100s(forecaster, 1)
    first = forecaster.run([mig_body(MIXED, podPolicy="Evict")])
    assert [n for b in first.batches for n, _ in b.nodes] == ["n0"]  # settled on 7x 1g.10gb
    cache.upsert_pod(pod("one", "n0", 1, resource="nvidia.com/mig-1g.10gb"))
    explicit = {"devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, "migStrategy": "mixed"}
    body = mig_body(explicit, podPolicy="Evict")
    body["metadata"]["generation"] = 3
    forecast = forecaster.run([body])
    assert [p.name for p in forecast.evictions["n0"].pods] == ["one"]
    [change] = forecast.changes
    assert change.before.layout == "7x 1g.10gb"
    assert change.after.layout == "1x 3g.40gb + 1x 2g.20gb + 1x 1g.10gb"
    assert dict(change.after.slots) == {  # one device of each on each of the 2 GPUs
        "nvidia.com/mig-1g.10gb": 2,
        "nvidia.com/mig-2g.20gb": 2,
        "nvidia.com/mig-3g.40gb": 2,
    }

"""What the real GPU agents do back to a node, as the cache and planner see it (no API).

GFD rewrites the product label and its sharing labels, the device plugin restarts with an
allocatable of 0 for a moment, and some policies cannot work on some nodes: none of that may
move a node between policies, and Verified must mean the slots exist.
"""

from __future__ import annotations

import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.labelling import rewrittenlabels, selectors
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.core.records.policies import compile_policy
from gpushare_operator.core.slots import slotclasses
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, node, policy, sync_config
from gpushare_testing.writepath import PlanningLoop

PRODUCT = "nvidia.com/gpu.product"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> ClusterCache:
    return ClusterCache(clock=clock, wallclock=lambda: 1_800_000_000.0 + clock.now)


@pytest.fixture
def planner(cache: ClusterCache) -> PlanningLoop:
    timings = Timings(propagation_delay=75, key_grace_period=300, mismatch_timeout=60)
    reconciler = Reconciler(
        cache, timings=timings, max_unavailable="100%", wallclock=lambda: "2026-11-29T00:00:00Z"
    )
    return PlanningLoop(reconciler)


def by_product(name: str, *products: str, **spec: object) -> dict[str, object]:
    selector = {"matchExpressions": [{"key": PRODUCT, "operator": "In", "values": list(products)}]}
    return policy(name, nodeSelector=selector, **spec)


def applied(cache: ClusterCache, name: str, *, pool: str = "a", **labels: str) -> None:
    """The node as the agents leave it once the governing policy's config is in force."""
    winner = cache.governing(name)
    assert winner is not None and winner.config_key is not None
    cache.upsert_node(
        node(
            name,
            pool=pool,
            **{CONFIG_LABEL: winner.config_key, POLICY_LABEL: winner.name},
            **labels,
        )
    )


# -- selectors never see our own effects -------------------------------------------------------


@pytest.mark.parametrize("operator", ["In", "NotIn"])
def test_product_is_matched_on_its_base_name(operator: str) -> None:
    compiled = selectors.compile_selector(
        {"matchExpressions": [{"key": PRODUCT, "operator": operator, "values": ["NVIDIA-A10G"]}]}
    )
    plain = compiled.matches({PRODUCT: "NVIDIA-A10G"})
    assert compiled.matches({PRODUCT: "NVIDIA-A10G-SHARED"}) is plain
    assert compiled.matches({PRODUCT: "NVIDIA-L4-SHARED"}) is not plain
    equals = selectors.compile_selector({"matchLabels": {PRODUCT: "NVIDIA-A10G"}})
    assert equals.matches({PRODUCT: "NVIDIA-A10G-SHARED"})


@pytest.mark.parametrize("key", sorted(rewrittenlabels.REWRITTEN_LABELS))
def test_a_policy_selecting_a_rewritten_label_governs_nothing(key: str) -> None:
    for selector in (
        {"matchLabels": {key: "x"}},
        {"matchExpressions": [{"key": key, "operator": "Exists"}]},
    ):
        compiled = compile_policy(
            name="p", uid="u", generation=1, spec=policy("p", nodeSelector=selector)["spec"]
        )
        assert not compiled.usable
        assert compiled.error_reason == "InvalidSelector"
        assert compiled.error is not None and key in compiled.error


def test_a_shared_product_value_is_refused_with_why() -> None:
    spec = by_product("p", "NVIDIA-A10G-SHARED")["spec"]
    compiled = compile_policy(name="p", uid="u", generation=1, spec=spec)  # type: ignore[arg-type]
    assert compiled.error_reason == "InvalidSelector"
    assert compiled.error is not None and "appends -SHARED" in compiled.error


def test_gfd_suffix_keeps_the_node_with_its_policy(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(by_product("a10g", "NVIDIA-A10G"))
    key = cache.policies["a10g"].config_key
    assert key is not None
    sync_config(cache, {key: "x"}, initial=True)
    cache.upsert_node(node("n1", **{PRODUCT: "NVIDIA-A10G"}))
    plan = planner.plan_admitted("n1")
    assert plan is not None and plan.labels == {CONFIG_LABEL: key, POLICY_LABEL: "a10g"}
    applied(
        cache,
        "n1",
        **{
            PRODUCT: "NVIDIA-A10G-SHARED",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
        },
    )
    decision = planner.decide(cache.nodes["n1"])
    assert decision.phase is NodePhase.VERIFIED and decision.labels is None
    plan = planner.plan_node("n1")  # Verified: first the slot labels (time-slicing: none)
    assert plan.labels is not None and plan.labels[slotclasses.ISOLATION_LABEL] == "none"
    assert plan.labels[slotclasses.MEMORY_LABEL] is None  # nothing enforces memory
    gfd = {
        PRODUCT: "NVIDIA-A10G-SHARED",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }
    slots = {k: v for k, v in plan.labels.items() if k in slotclasses.LABELS and v is not None}
    applied(cache, "n1", **gfd, **slots)
    plan = planner.plan_node("n1")
    assert plan is not None and plan.status is not None
    assert plan.status["product"] == "NVIDIA-A10G"  # base name, never -SHARED


# -- Verified means the slots exist ---------------------------------------------------------


def test_verified_needs_allocatable_and_says_what_disagrees(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p"))
    sync_config(cache, {str(cache.policies["p"].config_key): "x"}, initial=True)
    cache.upsert_node(node("n1"))
    gfd = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    applied(cache, "n1", allocatable="4", **gfd)  # GFD agrees, the plugin still shows 4
    decision = planner.decide(cache.nodes["n1"])
    assert decision.phase is NodePhase.APPLIED
    assert "expected" not in decision.message  # what is seen changes: said at the timeout
    planner.plan_node("n1")
    clock.now += 61
    decision = planner.decide(cache.nodes["n1"])
    assert decision.phase is NodePhase.MISMATCH
    assert "allocatable nvidia.com/gpu is 4, expected 16" in decision.message
    applied(cache, "n1", **gfd)  # now 16
    assert planner.decide(cache.nodes["n1"]).phase is NodePhase.VERIFIED


def test_a_restart_window_of_a_verified_node_is_no_mismatch(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p"))
    sync_config(cache, {str(cache.policies["p"].config_key): "x"}, initial=True)
    cache.upsert_node(node("n1"))
    gfd = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    applied(cache, "n1", **gfd)
    planner.plan_node("n1")
    clock.now += 600  # long confirmed
    assert planner.decide(cache.nodes["n1"]).phase is NodePhase.VERIFIED
    planner.plan_node("n1")
    applied(cache, "n1", allocatable="0", **gfd)  # the device plugin restarts
    decision = planner.decide(cache.nodes["n1"])
    assert decision.phase is NodePhase.APPLIED
    assert decision.recheck_at == clock.now + 60
    planner.plan_node("n1")
    clock.now += 2
    applied(cache, "n1", **gfd)
    assert planner.decide(cache.nodes["n1"]).phase is NodePhase.VERIFIED


def test_renamed_resource_is_checked_under_its_shared_name(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    cache.upsert_policy(policy("p", renameByDefault=True))
    sync_config(cache, {str(cache.policies["p"].config_key): "x"}, initial=True)
    cache.upsert_node(node("n1"))
    gfd = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    applied(cache, "n1", **gfd)  # 16 of nvidia.com/gpu: the wrong resource
    planner.plan_node("n1")  # the Mismatch clock starts
    clock.now += 61
    decision = planner.decide(cache.nodes["n1"])
    assert decision.phase is NodePhase.MISMATCH
    assert "allocatable nvidia.com/gpu.shared is None, expected 16" in decision.message
    body = node("n1", allocatable="0", **gfd)
    body["metadata"]["labels"].update(
        {CONFIG_LABEL: str(cache.policies["p"].config_key), POLICY_LABEL: "p"}
    )
    body["status"]["allocatable"]["nvidia.com/gpu.shared"] = "16"
    cache.upsert_node(body)
    assert planner.decide(cache.nodes["n1"]).phase is NodePhase.VERIFIED


# -- Exclusive and fall-through ---------------------------------------------------------------


def test_exclusive_carves_a_pool_out_of_a_wider_sharing_policy(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("everything", nodeSelector={}, priority=10))
    carve = {"matchLabels": {"team": "training"}}
    body = policy("training", nodeSelector=carve, priority=200, strategy="Exclusive")
    del body["spec"]["replicas"]  # type: ignore[attr-defined]
    cache.upsert_policy(body)
    exclusive = cache.policies["training"]
    assert exclusive.config_key is not None and "-excl-" in exclusive.config_key
    sync_config(
        cache,
        {str(p.config_key): "x" for p in cache.policies.values()},
        initial=True,
    )
    cache.upsert_node(node("t1", team="training"))
    cache.upsert_node(node("s1"))
    assert planner.governing("t1") is exclusive
    governing = planner.governing("s1")
    assert governing is not None and governing.name == "everything"
    applied(cache, "t1", team="training")  # no sharing labels: an old GFD; 4 GPUs, 4 allocatable
    assert planner.decide(cache.nodes["t1"]).phase is NodePhase.VERIFIED
    plan = planner.plan_node("t1")  # Verified: first the slot labels (a whole GPU each)
    assert plan.labels is not None
    assert plan.labels[slotclasses.ISOLATION_LABEL] == "exclusive"
    slots = {k: v for k, v in plan.labels.items() if k in slotclasses.LABELS and v is not None}
    applied(cache, "t1", team="training", **slots)
    plan = planner.plan_node("t1")
    assert plan is not None and plan.status is not None
    assert plan.status["slots"]["capacity"] == 4 and plan.status["replicas"] == 1
    assert plan.status["strategy"] == "Exclusive"


def test_an_unsupported_winner_falls_through_to_the_next_policy(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("mps", priority=100, strategy="MPS"))
    cache.upsert_policy(policy("ts", priority=1))
    sync_config(cache, {str(p.config_key): "x" for p in cache.policies.values()}, initial=True)
    cache.upsert_node(node("mig", **{"nvidia.com/mig.strategy": "mixed"}))
    cache.upsert_node(node("plain"))
    governing = planner.governing("mig")
    assert governing is not None and governing.name == "ts"
    plan = planner.plan_admitted("mig")
    assert plan is not None and plan.labels == {
        CONFIG_LABEL: cache.policies["ts"].config_key,
        POLICY_LABEL: "ts",
    }
    mps = planner.plan_policy("mps").status
    assert mps is not None
    assert (mps["unsupportedNodes"], mps["conflictingNodes"], mps["matchedNodes"]) == (1, 0, 2)
    unsupported = next(c for c in mps["conditions"] if c["type"] == "Unsupported")
    assert unsupported["status"] == "True" and "mig: MPS cannot share" in unsupported["message"]
    ts = planner.plan_policy("ts").status
    assert ts is not None and (ts["unsupportedNodes"], ts["conflictingNodes"]) == (0, 1)
    assert ts["slots"]["capacity"] == 16  # the fallen-through node's slots count for ts


def test_when_no_policy_can_work_the_node_is_unsupported_and_left_alone(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("mps", strategy="MPS"))
    sync_config(cache, {str(cache.policies["mps"].config_key): "x"}, initial=True)
    cache.upsert_node(node("mig", **{"nvidia.com/mig.strategy": "mixed"}))
    plan = planner.plan_node("mig")
    assert plan is not None and plan.labels is None
    assert plan.status is not None and plan.status["phase"] == "Unsupported"
    status = planner.plan_policy("mps").status
    assert status is not None and status["unsupportedNodes"] == 1


# -- the published wait does not count down --------------------------------------------------


def test_a_propagation_wait_is_published_once_as_an_absolute_time(
    cache: ClusterCache, planner: PlanningLoop, clock: Clock
) -> None:
    sync_config(cache, None, initial=True)
    cache.upsert_node(node("n1"))
    cache.upsert_policy(policy("p"))
    data = planner.plan_config().data
    assert data is not None
    sync_config(cache, data, initial=False)
    first = planner.plan_node("n1")
    assert first is not None and first.status is not None
    ready_at = first.status["configReadyAt"]
    assert ready_at == "2027-01-15T08:17:55Z"  # 1.8e9 + 1000 + 75 s, whole seconds down
    assert ready_at in first.status["conditions"][0]["message"]
    cache.node_states["n1"] = first.status  # as written
    for _ in range(3):  # other policies' ConfigMap changes re-plan every node
        clock.now += 10
        sync_config(cache, {**data, f"other-ts2-{clock.now:06.0f}"[-16:]: "y"}, initial=False)
        assert not planner.plan_node("n1").writes


def test_capacity_alone_makes_and_unmakes_a_gpu_node(cache: ClusterCache) -> None:
    cache.upsert_policy(policy("p", nodeSelector={}))
    bare = {
        "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "1", "labels": {"pool": "a"}},
        "status": {"capacity": {"nvidia.com/gpu": "2"}},
    }
    cache.upsert_node(bare)
    assert cache.index.policies_of("n1") == {"p"}
    gone = {**bare, "metadata": {**bare["metadata"], "resourceVersion": "2"}, "status": {}}
    cache.upsert_node(gone)
    assert cache.index.policies_of("n1") == frozenset()

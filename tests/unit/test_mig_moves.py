"""MIG moves compare layouts, not names: a node moving to another policy whose layout is the
same is only a label change (no taint, no wait for idle GPUs, no eviction), as the MIG manager
takes an applied config as a no-op; and a layout of several resources is judged per resource,
so a change that overflows one evicts only what overflows it."""

from __future__ import annotations

from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import ConfigMapSink
from gpushare_operator.core import migphases
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.records.nodes import MIG_CONFIG_LABEL, project_node
from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy
from gpushare_operator.core.rollout import victims
from gpushare_operator.kubectl.standings import settled_body
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, config_texts, node, policy, sync_config
from gpushare_testing.writepath import PlanningLoop

H100 = "NVIDIA-H100-80GB-HBM3"
BIG, SMALL = "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb"
LAYOUT = {"3g.40gb": 1, "1g.10gb": 4}  # per GPU: one 3g.40gb and four 1g.10gb


def mig_policy(name: str, *, priority: int = 0, **mig: Any) -> dict[str, Any]:
    rollout = mig.pop("rollout", {"canary": 0})
    body = policy(
        name,
        priority=priority,
        strategy="MIG",
        mig={"devices": LAYOUT, **mig},
        rollout=rollout,
    )
    del body["spec"]["replicas"]
    return body


def compiled(body: dict[str, Any]) -> CompiledPolicy:
    meta = body["metadata"]
    result = compile_policy(name=meta["name"], uid=meta["uid"], generation=1, spec=body["spec"])
    assert result.error is None, result.error
    return result


def loop(clock: Clock) -> PlanningLoop:
    cache = ClusterCache(clock=clock)
    timings = Timings(propagation_delay=0.0, key_grace_period=60.0, mismatch_timeout=60.0)
    return PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="100%"))


def sync_mig(cache: ClusterCache) -> None:
    """The mig-parted ConfigMap as the operator writes it for the policies the cache holds."""
    entries: dict[str, migconfigs.MigLayout] = {}
    for compiled_policy in cache.policies.values():
        if compiled_policy.mig is not None:
            entries.update(compiled_policy.mig.entries)
    sink = ConfigMapSink(cache, mig=True)
    sink.begin_relist()
    sink.relist_item({"data": {migconfigs.CONFIGMAP_KEY: migconfigs.render_text(entries)}})
    sink.end_relist()


def settled_on(cache: ClusterCache, name: str, policy_name: str) -> None:
    """The node as NVIDIA's agents leave it once ``policy_name``'s layout is in force."""
    cache.upsert_node(node(name, count="1", **{"nvidia.com/gpu.product": H100}))
    cache.upsert_node(settled_body(cache.nodes[name], cache.policies[policy_name]))


def mig_pod(name: str, resource: str, *, day: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": f"uid-{name}",
            "namespace": "ns",
            "name": name,
            "creationTimestamp": f"2026-01-{day:02d}T00:00:00Z",
        },
        "spec": {"nodeName": "n0", "containers": [{"resources": {"requests": {resource: "1"}}}]},
        "status": {"phase": "Running"},
    }


def fleet(clock: Clock, *, taker: dict[str, Any]) -> PlanningLoop:
    """n0 (one H100) settled on policy a's layout, pods on both of its resources; then
    ``taker`` (priority 10, the same pool) takes the node."""
    planner = loop(clock)
    cache = planner.cache
    cache.upsert_policy(mig_policy("a"))
    sync_config(cache, config_texts(cache), initial=True)
    sync_mig(cache)
    settled_on(cache, "n0", "a")
    cache.upsert_pod(mig_pod("big", BIG))
    cache.upsert_pod(mig_pod("small", SMALL))
    cache.upsert_policy(taker)
    sync_config(cache, config_texts(cache), initial=False)
    sync_mig(cache)
    return planner


# -- changes_mig ---------------------------------------------------------------------------------


def test_the_same_layout_under_another_policy_is_no_mig_change() -> None:
    a, b = compiled(mig_policy("a")), compiled(mig_policy("b"))
    other = compiled(mig_policy("c", devices={"1g.10gb": 7}))
    assert a.mig is not None and b.mig is not None and other.mig is not None
    assert a.mig.names[H100] != b.mig.names[H100]  # the names differ by their policy
    record = project_node(node("n0", **{"nvidia.com/gpu.product": H100}))
    record = project_node(settled_body(record, a))
    layouts: dict[str, migconfigs.MigLayout | None] = {**a.mig.entries, **b.mig.entries}
    assert not migphases.changes_mig(record, b, layouts=layouts)
    assert migphases.changes_mig(record, other, layouts=layouts | other.mig.entries)
    assert migphases.changes_mig(record, None, layouts=layouts)  # released: MIG goes off
    # A name whose content we do not know is taken to be another layout: never less safe.
    assert migphases.changes_mig(record, b, layouts={})
    assert migphases.changes_mig(record, b, layouts=None)


def test_a_node_whose_gpus_show_its_labels_layout_has_it_in_force() -> None:
    a = compiled(mig_policy("a"))
    assert a.mig is not None
    record = project_node(
        settled_body(project_node(node("n0", count="2", **{"nvidia.com/gpu.product": H100})), a)
    )
    layouts = dict(a.mig.entries)
    assert migphases.in_force(record, layouts=layouts)
    assert not migphases.in_force(record, layouts={})  # unknown name
    pending = dict(record.labels) | {"nvidia.com/mig.config.state": "pending"}
    assert not migphases.in_force(project_node(node("n0", **pending)), layouts=layouts)
    fewer = dict(record.labels) | {f"{SMALL}.count": "4"}  # 2 GPUs x 4 is 8
    assert not migphases.in_force(project_node(node("n0", **fewer)), layouts=layouts)


# -- the planner: an identical layout is a label change ------------------------------------------


def test_moving_to_an_identical_layout_writes_the_label_at_once_untainted() -> None:
    clock = Clock()
    for pod_policy in ("WaitForPods", "Evict"):
        taker = mig_policy("b", priority=10, rollout={"canary": 0, "podPolicy": pod_policy})
        planner = fleet(clock, taker=taker)
        plan = planner.plan_admitted("n0")
        b = planner.cache.policies["b"]
        assert b.mig is not None
        assert plan.labels is not None, pod_policy
        assert plan.labels[MIG_CONFIG_LABEL] == b.mig.names[H100]  # the new policy's name
        assert plan.taint is None and plan.evictions == ()
        decision = plan.facts.decision
        assert decision is not None and decision.reason == "LabelPending"


def test_moving_to_another_layout_still_waits_for_idle_gpus_under_our_taint() -> None:
    clock = Clock()
    planner = fleet(clock, taker=mig_policy("b", priority=10, devices={"1g.10gb": 7}))
    plan = planner.plan_admitted("n0")
    assert plan.labels is None and plan.taint is not None
    assert plan.facts.decision is not None and plan.facts.decision.reason == "WaitingForPods"


# -- several resources: per resource --------------------------------------------------------------


def replicas_fleet(clock: Clock, *, before: int, after: int, pod_policy: str) -> PlanningLoop:
    """n0 settled on m's layout time-sliced ``before`` ways; m now wants ``after``."""
    planner = loop(clock)
    cache = planner.cache
    old = mig_policy("m", replicas=before) if before > 1 else mig_policy("m")
    cache.upsert_policy(old)
    sync_config(cache, config_texts(cache), initial=True)
    sync_mig(cache)
    settled_on(cache, "n0", "m")
    keys = config_texts(cache)
    rollout = {"canary": 0, "podPolicy": pod_policy}
    new = mig_policy("m", rollout=rollout, **({"replicas": after} if after > 1 else {}))
    new["metadata"]["generation"] = 2
    cache.upsert_policy(new)
    sync_config(cache, keys | config_texts(cache), initial=False)
    return planner


def test_a_layout_of_several_resources_evicts_only_what_overflows_one() -> None:
    """Two slots per MIG device become one: the 3g.40gb's two pods are one too many, the
    1g.10gb's three fit in four; only the younger 3g.40gb pod goes (before: every GPU pod)."""
    clock = Clock()
    planner = replicas_fleet(clock, before=2, after=1, pod_policy="Evict")
    cache = planner.cache
    cache.upsert_pod(mig_pod("big-old", BIG, day=1))
    cache.upsert_pod(mig_pod("big-young", BIG, day=2))
    for i in range(3):
        cache.upsert_pod(mig_pod(f"small-{i}", SMALL, day=3))
    plan = planner.plan_admitted("n0")
    assert plan.labels is None and plan.taint is not None
    assert [e.name for e in plan.evictions] == ["big-young"]
    assert plan.status is not None and plan.status["phase"] == NodePhase.EVICTING


def test_pods_of_several_resources_that_fit_each_let_the_change_go() -> None:
    """One slot per device becomes two: every pod fits its own resource (before, a pod of a
    second resource read as one the new config does not advertise, and held the node)."""
    clock = Clock()
    planner = replicas_fleet(clock, before=1, after=2, pod_policy="WaitForPods")
    planner.cache.upsert_pod(mig_pod("big", BIG))
    planner.cache.upsert_pod(mig_pod("small", SMALL))
    plan = planner.plan_admitted("n0")
    assert plan.labels is not None and plan.taint is None


def test_room_counts_each_resource_of_a_layout() -> None:
    m = compiled(mig_policy("m", replicas=2))
    assert m.mig is not None
    record = project_node(
        settled_body(project_node(node("n0", count="2", **{"nvidia.com/gpu.product": H100})), m)
    )
    layouts = dict(m.mig.entries)
    assert victims.room(record, m, layouts=layouts) == {BIG: 4, SMALL: 16}
    assert victims.room(record, None, layouts=layouts) is None  # MIG goes off: all must go


def record(name: str, resource: str, *, day: int = 1, **flags: Any) -> PodRecord:
    return PodRecord(
        f"uid-{name}",
        "ns",
        name,
        "n0",
        "Running",
        ((resource, 1),),
        created=int(f"202601{day:02d}000000"),
        **flags,
    )


def names(pods: tuple[PodRecord, ...]) -> list[str]:
    return [p.name for p in pods]


def test_select_chooses_per_resource_and_takes_forced_pods_whatever_the_count() -> None:
    pods = [
        record("big-1", BIG, day=1),
        record("big-2", BIG, day=2),
        record("small-1", SMALL, day=3),
        record("memory", SMALL, day=1),  # forced: its memory request would not hold
        record("whole", "nvidia.com/gpu"),  # a resource the new config does not advertise
    ]
    chosen = victims.select(pods, room={BIG: 1, SMALL: 4}, forced={"uid-memory"})
    assert chosen.stuck is None
    assert sorted(names(chosen.evict)) == ["big-2", "memory", "whole"]
    # A forced pod that is never evicted leaves the node stuck, named.
    stuck = victims.select(
        [record("ds", SMALL, evictable=False)], room={SMALL: 4}, forced={"uid-ds"}
    )
    assert stuck.evict == () and stuck.stuck is not None and "ns/ds" in stuck.stuck
    going = victims.select(
        [record("going", SMALL, terminating=True)], room={SMALL: 4}, forced={"uid-going"}
    )
    assert names(going.leaving) == ["going"] and going.evict == ()


def single_policy(name: str) -> dict[str, Any]:
    body = policy(name, strategy="MIG", mig={"profile": "1g.10gb"})
    del body["spec"]["replicas"]
    return body


def test_a_single_strategy_node_shows_its_one_profile_layout_in_force() -> None:
    single, other = compiled(single_policy("s")), compiled(single_policy("t"))
    assert single.mig is not None and other.mig is not None
    record = project_node(
        settled_body(
            project_node(node("n0", count="2", **{"nvidia.com/gpu.product": H100})), single
        )
    )
    layouts = {**single.mig.entries, **other.mig.entries}
    assert migphases.in_force(record, layouts=layouts)
    assert not migphases.changes_mig(record, other, layouts=layouts)
    bigger = compiled(mig_policy("u", devices={"3g.40gb": 2}))
    assert migphases.changes_mig(record, bigger, layouts=layouts)

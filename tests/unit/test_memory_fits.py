"""Memory is part of "fits": a pod that asked for GPU memory misfits a change whose new slot
enforces less than its request, or nothing (core.slots.memoryfits), and the rollout holds the node
(podPolicy WaitForPods, reason MemoryNoLongerEnforced) or evicts the pod (Evict), whatever
the slot count says.  The example: an A100 80GB pool going from MPS x2 (40960 MiB a client)
to x8 (10240 MiB), or to time-slicing, under a pod that asked for 30Gi."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.records.nodes import NodeRecord, project_node
from gpushare_operator.core.records.pods import PodRecord, project_pod
from gpushare_operator.core.records.policies import compile_policy
from gpushare_operator.core.slots import memoryfits
from gpushare_operator.core.slots.slotchanges import Loss
from gpushare_operator.core.slots.slotclasses import Isolation, SlotClass
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_operator.reconcile.rollouts import Step
from gpushare_testing.builders import Clock, config_texts, node, on, pod, policy, sync_config
from gpushare_testing.writepath import PlanningLoop

A100 = "NVIDIA-A100-SXM4-80GB"
A100_MIB = 81920  # GFD's nvidia.com/gpu.memory for it
GPU = "nvidia.com/gpu"
GIB30 = 30720
LABELS = {"nvidia.com/gpu.product": A100, "nvidia.com/gpu.memory": str(A100_MIB)}


def memory_pod(name: str, node_name: str, request: str, slots: int = 1) -> dict[str, Any]:
    body = pod(name, node_name, slots)
    body["metadata"]["labels"] = {"gpushare.dev/gpu-memory": request}
    return body


def a100() -> NodeRecord:
    return project_node(node("n0", count="1", **LABELS))


def classes_of(**spec: Any) -> tuple[SlotClass, ...]:
    body = policy("p", **spec)
    if spec.get("strategy") == "MIG":
        del body["spec"]["replicas"]
    compiled = compile_policy(name="p", uid="u", generation=1, spec=body["spec"])
    assert compiled.error is None, compiled.error
    return memoryfits.classes_after(a100(), compiled, layout_before=None)


MPS2 = devconfigs.SharingConfig(strategy=devconfigs.MPS, replicas=2)


@pytest.mark.parametrize(
    ("after", "loss"),
    [
        ({"strategy": "MPS", "replicas": 8}, Loss.SHRINKS),  # 10240 MiB a client
        ({"strategy": "MPS", "replicas": 4}, Loss.SHRINKS),  # 20480 MiB: still under 30Gi
        ({"strategy": "TimeSlicing", "replicas": 8}, Loss.UNENFORCED),  # nothing enforced
        ({"strategy": "MIG", "mig": {"profile": "1g.10gb"}}, Loss.SHRINKS),  # a small slice
        ({"strategy": "MIG", "mig": {"profile": "3g.40gb"}}, None),  # 40 GB: it holds 30Gi
        ({"strategy": "MPS", "replicas": 2}, None),  # unchanged
        ({"strategy": "Exclusive"}, None),  # the whole GPU
    ],
)
def test_a_30gi_pod_on_mps_x2_misfits_a_slot_that_enforces_less_or_nothing(
    after: dict[str, Any], loss: Loss | None
) -> None:
    record = a100()
    before = memoryfits.running(record, sharing=MPS2, layout=None)
    assert before == (SlotClass(GPU, Isolation.MPS, 40960),)
    if after.get("strategy") == "Exclusive":
        after = {**after, "replicas": 1}
    train = project(memory_pod("train", "n0", "30Gi"))
    found = memoryfits.misfits([train], before=before, after=classes_of(**after))
    assert [m.change.loss for m in found] == ([loss] if loss else [])


def test_the_default_config_of_a_released_node_takes_the_promise_away() -> None:
    before = memoryfits.running(a100(), sharing=MPS2, layout=None)
    after = memoryfits.classes_after(a100(), None, layout_before=None)
    [found] = memoryfits.misfits(
        [project(memory_pod("t", "n0", "30Gi"))], before=before, after=after
    )
    assert found.change.loss is Loss.REMOVED


def test_only_pods_that_asked_for_memory_and_more_than_the_slot_misfit() -> None:
    before = memoryfits.running(a100(), sharing=MPS2, layout=None)
    after = classes_of(strategy="MPS", replicas=8)
    pods = [
        project(memory_pod("fits", "n0", "10Gi")),  # 10240 MiB: exactly what x8 enforces
        project(pod("plain", "n0", 1)),  # asked for no memory: slots alone
        project(memory_pod("big", "n0", "30Gi")),
    ]
    [found] = memoryfits.misfits(pods, before=before, after=after)
    assert found.pod.name == "big"
    assert found.describe() == (
        "pod ns/big asked for 30Gi (30720 MiB): its slot shrinks from 40960 MiB mps to 10240"
        " MiB mps, under the 30Gi (30720 MiB) it asked for"
    )


def project(body: dict[str, Any]) -> PodRecord:
    record = project_pod(body, tracked=lambda name: name.startswith("nvidia.com/"))
    assert record is not None
    return record


# -- the rollout: WaitForPods holds the node, Evict evicts the pod --------------------------------


def loop(clock: Clock) -> PlanningLoop:
    cache = ClusterCache(clock=clock)
    timings = Timings(propagation_delay=0.0, key_grace_period=60.0, mismatch_timeout=60.0)
    return PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="100%"))


def pool(clock: Clock, *, rollout: dict[str, Any], **after: Any) -> PlanningLoop:
    """n0 (one A100 80GB) Verified on p's MPS x2 config, a 30Gi pod on it holding 1 of its 2
    slots; p's spec is now ``after``: every slot count fits, the memory may not."""
    planner = loop(clock)
    cache = planner.cache
    cache.upsert_policy(policy("p", strategy="MPS", replicas=2))
    key = str(cache.policies["p"].config_key)
    before = config_texts(cache)
    cache.upsert_node(node("n0", count="1", **LABELS, **on(key, "p", 2)))
    cache.upsert_pod(memory_pod("train", "n0", "30Gi"))
    spec: dict[str, Any] = {"strategy": "MPS", "replicas": 8, "rollout": {"canary": 0, **rollout}}
    spec |= after
    cache.upsert_policy(policy("p", generation=2, **spec))
    sync_config(cache, before | config_texts(cache), initial=True)
    return planner


@pytest.mark.parametrize(
    "after", [{"replicas": 8}, {"strategy": "TimeSlicing", "replicas": 8}], ids=["mps8", "sliced"]
)
def test_wait_for_pods_holds_the_node_naming_the_pod_and_why(after: dict[str, Any]) -> None:
    clock = Clock()
    planner = pool(clock, rollout={"podPolicy": "WaitForPods"}, **after)
    held = planner.plan_admitted("n0")
    assert held.labels is None and held.taint is None  # its config stays, untainted
    decision = held.facts.decision
    assert decision is not None and decision.reason == memoryfits.REASON
    assert "pod ns/train asked for 30Gi (30720 MiB)" in decision.message
    assert "40960 MiB mps" in decision.message
    assert "the node keeps its config until they are gone" in decision.message
    assert planner.book.nodes_at("p", Step.BLOCKED) == ["n0"]
    clock.now += 10  # past the quiet time: the hold is published
    status = planner.plan_node("n0").status
    assert status is not None and status["phase"] == NodePhase.PENDING
    [ready] = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == memoryfits.REASON and "ns/train" in ready["message"]
    planner.cache.delete_pod("train")
    assert planner.plan_admitted("n0").labels is not None  # gone: the change goes ahead


def test_a_pod_without_a_memory_request_does_not_hold_the_same_change() -> None:
    clock = Clock()
    planner = pool(clock, rollout={"podPolicy": "WaitForPods"})
    planner.cache.delete_pod("train")
    planner.cache.upsert_pod(pod("plain", "n0", 1))
    assert planner.plan_admitted("n0").labels is not None  # 1 slot of 8: it fits


def test_evict_takes_the_memory_pod_off_whatever_the_slot_count_says() -> None:
    clock = Clock()
    planner = pool(clock, rollout={"podPolicy": "Evict"})
    planner.cache.upsert_pod(pod("plain", "n0", 1))  # 2 of 8 slots: both fit by count
    plan = planner.plan_admitted("n0")
    assert plan.labels is None and plan.taint is not None
    assert [e.name for e in plan.evictions] == ["train"]  # the memory pod only
    assert plan.status is not None and plan.status["phase"] == NodePhase.EVICTING
    planner.cache.delete_pod("train")
    assert planner.plan_node("n0").labels is not None  # gone: the change goes ahead


def test_the_slot_before_is_what_the_node_runs_not_what_its_policy_says_now() -> None:
    """An edited policy has only its new spec: the class before comes from the config the
    node's key names (our ConfigMap), so the operator sees the x2 -> x8 shrink."""
    cache = ClusterCache()
    cache.upsert_policy(policy("p", strategy="MPS", replicas=2))
    old = str(cache.policies["p"].config_key)
    configs = {old: devconfigs.parse_config_text(config_texts(cache)[old])}
    cache.upsert_policy(policy("p", strategy="MPS", replicas=8, generation=2))
    record = project_node(node("n0", count="1", **LABELS, **on(old, "p", 2)))
    train = project(memory_pod("train", "n0", "30Gi"))
    edited = cache.policies["p"]
    [found] = memoryfits.on_node(record, [train], edited, configs=configs, layouts=None)
    assert found.change.before == SlotClass(GPU, Isolation.MPS, 40960)
    assert found.change.after == SlotClass(GPU, Isolation.MPS, 10240)
    # The policy's own classes would compare x8 with x8 and see nothing.
    same = memoryfits.classes_after(record, edited, layout_before=None)
    assert memoryfits.misfits([train], before=same, after=same) == ()

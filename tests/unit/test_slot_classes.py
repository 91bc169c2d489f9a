"""What a slot enforces (core.slots.slotclasses), the labels that say so (core.phases.nodelabels),
the
index the webhook reads (cache.slotoffers) and slots.classes in both statuses: no API."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.slotoffers import SlotOffers
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.decisions import NodeDecision
from gpushare_operator.core.phases import nodelabels
from gpushare_operator.core.records.nodes import CONFIG_LABEL, MIG_CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.core.records.nodes import project_node as project
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy
from gpushare_operator.core.slots import slotclasses
from gpushare_operator.core.slots.slotclasses import Isolation, Offer, SlotClass
from gpushare_testing.builders import Clock, node, on, policy, sync_config
from gpushare_testing.leaders import leader, published

H100 = "NVIDIA-H100-80GB-HBM3"
H100_MIB = 81559
MEMORY = {"nvidia.com/gpu.memory": str(H100_MIB), "nvidia.com/gpu.product": H100}


def compiled(name: str = "p", **spec: Any) -> CompiledPolicy:
    return compile_policy(
        name=name, uid=f"uid-{name}", generation=1, spec=policy(name, **spec)["spec"]
    )


# -- what a slot enforces ------------------------------------------------------------------------


def test_mps_enforces_the_daemons_per_client_limit_floor_of_memory_over_replicas() -> None:
    record = project(node("n", **MEMORY))
    slot = slotclasses.promise(record, compiled(strategy="MPS", replicas=4))
    # k8s-device-plugin's MPS daemon: totalMemory / replicas / MiB, rounded down.
    assert slot == SlotClass("nvidia.com/gpu", Isolation.MPS, H100_MIB // 4)
    assert slot is not None and slot.enforced and slot.memory_mib == 20389


def test_mps_renamed_is_the_shared_resource() -> None:
    record = project(node("n", **MEMORY))
    slot = slotclasses.promise(record, compiled(strategy="MPS", replicas=2, renameByDefault=True))
    assert slot is not None and slot.resource == "nvidia.com/gpu.shared"
    assert slot.memory_mib == H100_MIB // 2


def test_exclusive_enforces_the_whole_gpu_and_time_slicing_nothing() -> None:
    record = project(node("n", **MEMORY))
    exclusive = compile_policy(
        name="x", uid="u", generation=1, spec={"nodeSelector": {}, "strategy": "Exclusive"}
    )
    assert slotclasses.promise(record, exclusive) == SlotClass(
        "nvidia.com/gpu", Isolation.EXCLUSIVE, H100_MIB
    )
    sliced = slotclasses.promise(record, compiled(strategy="TimeSlicing", replicas=4))
    assert sliced == SlotClass("nvidia.com/gpu", Isolation.NONE, None)
    assert sliced is not None and not sliced.enforced


def test_a_node_without_a_memory_label_promises_no_memory() -> None:
    record = project(node("n"))  # GFD has not labelled the memory
    slot = slotclasses.promise(record, compiled(strategy="MPS", replicas=4))
    assert slot is not None and not slot.enforced
    assert slotclasses.labels(slot)[slotclasses.MEMORY_LABEL] is None


def test_mig_slices_enforce_the_profiles_memory_from_nvidias_tables_and_time_sliced_none() -> None:
    record = project(node("n", **{"nvidia.com/gpu.product": H100}))
    mig = {"profile": "1g.10gb", "migStrategy": "mixed"}
    slot = slotclasses.promise(record, compiled(strategy="MIG", mig=mig, replicas=None))
    assert slot is not None and slot.isolation is Isolation.MIG
    assert slot.resource == "nvidia.com/mig-1g.10gb"
    assert slot.memory_mib == 10240  # go-nvml's table for the H100
    # A real driver reports the slice a little smaller (GFD's label): the lower figure holds.
    lower = project(
        node("n", **{"nvidia.com/gpu.product": H100}, **{f"{slot.resource}.memory": "9984"})
    )
    smaller = slotclasses.promise(lower, compiled(strategy="MIG", mig=mig, replicas=None))
    assert smaller is not None and smaller.memory_mib == 9984
    shared = {**mig, "replicas": 2}
    sliced = slotclasses.promise(record, compiled(strategy="MIG", mig=shared, replicas=None))
    assert sliced is not None and sliced.isolation is Isolation.NONE and not sliced.enforced


def test_a_layout_of_several_profiles_has_one_class_each_and_no_single_promise() -> None:
    record = project(node("n", **{"nvidia.com/gpu.product": H100}))
    devices = {"devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, "migStrategy": "mixed"}
    mixed = compiled(strategy="MIG", mig=devices, replicas=None)
    found = slotclasses.classes(record, mixed)
    assert [s.resource for s in found] == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    assert all(s.enforced for s in found)
    assert slotclasses.promise(record, mixed) is None
    assert slotclasses.labels(None) == dict(slotclasses.NO_SLOT_LABELS)


@given(
    domain=st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z]{2,5}){1,2}", fullmatch=True),
    name=st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?", fullmatch=True),
)
def test_a_resource_round_trips_through_its_label_value(domain: str, name: str) -> None:
    resource = f"{domain}/{name}"
    value = slotclasses.encode_resource(resource)
    if len(resource) > 63:
        assert value is None
        return
    assert value is not None and "/" not in value
    assert slotclasses.decode_resource(value) == resource


def test_a_resource_too_long_for_a_label_gets_no_labels_at_all() -> None:
    slot = SlotClass("example.com/" + "g" * 60, Isolation.MPS, 100)
    assert slotclasses.labels(slot) == dict(slotclasses.NO_SLOT_LABELS)


# -- the labels of one apply ---------------------------------------------------------------------


def decision(policy_: CompiledPolicy | None, phase: NodePhase, labels: Any = None) -> NodeDecision:
    return NodeDecision(policy_, phase, str(phase), "", labels)


def test_verified_gains_the_labels_restating_its_config_labels() -> None:
    mps = compiled(strategy="MPS", replicas=4)
    record = project(node("n", **MEMORY, **on(str(mps.config_key), "p", 4)))
    wanted = nodelabels.wanted(record, decision(mps, NodePhase.VERIFIED))
    assert wanted is not None
    assert wanted == {
        CONFIG_LABEL: mps.config_key,
        POLICY_LABEL: "p",
        slotclasses.MEMORY_LABEL: "20389",
        slotclasses.ISOLATION_LABEL: "mps",
        slotclasses.RESOURCE_LABEL: "nvidia.com_gpu",
    }
    shown = project(node("n", **MEMORY, **_present(wanted)))
    assert nodelabels.wanted(shown, decision(mps, NodePhase.VERIFIED)) is None


def _present(labels: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if v is not None}


def test_a_config_change_removes_them_in_the_same_apply() -> None:
    mps = compiled(strategy="MPS", replicas=4)
    slots = _present(slotclasses.labels(SlotClass("nvidia.com/gpu", Isolation.MPS, 20389)))
    record = project(node("n", **MEMORY, **on("p-mps4-aaaaaa", "p", 4), **slots))
    change = {CONFIG_LABEL: mps.config_key, POLICY_LABEL: "p"}
    wanted = nodelabels.wanted(record, decision(mps, NodePhase.PENDING, change))
    assert wanted == {**change, **slotclasses.NO_SLOT_LABELS}


@pytest.mark.parametrize("phase", [NodePhase.DEGRADED, NodePhase.MISMATCH, NodePhase.UNSUPPORTED])
def test_they_go_when_the_node_stops_confirming_its_config(phase: NodePhase) -> None:
    mps = compiled(strategy="MPS", replicas=4)
    slots = _present(slotclasses.labels(SlotClass("nvidia.com/gpu", Isolation.MPS, 20389)))
    ours = {**on(str(mps.config_key), "p", 4), MIG_CONFIG_LABEL: "all-disabled"}
    record = project(node("n", **MEMORY, **ours, **slots))
    wanted = nodelabels.wanted(record, decision(mps, phase))
    assert wanted == {
        CONFIG_LABEL: mps.config_key,
        POLICY_LABEL: "p",
        MIG_CONFIG_LABEL: "all-disabled",  # ours (no other owner): restated, so kept
        **slotclasses.NO_SLOT_LABELS,
    }


def test_a_node_held_back_by_its_rollout_keeps_them() -> None:
    mps = compiled(strategy="MPS", replicas=8)
    slots = _present(slotclasses.labels(SlotClass("nvidia.com/gpu", Isolation.MPS, 20389)))
    record = project(node("n", **MEMORY, **on("p-mps4-aaaaaa", "p", 4), **slots))
    assert nodelabels.wanted(record, decision(mps, NodePhase.PENDING)) is None


def test_a_node_we_never_labelled_gets_none() -> None:
    mps = compiled(strategy="MPS", replicas=4)
    record = project(node("n", **MEMORY))
    assert nodelabels.wanted(record, decision(mps, NodePhase.VERIFIED)) is None


# -- the webhook's index -------------------------------------------------------------------------


def labelled(memory: str, *, policy_name: str = "p", isolation: str = "mps") -> dict[str, str]:
    return {
        POLICY_LABEL: policy_name,
        slotclasses.MEMORY_LABEL: memory,
        slotclasses.ISOLATION_LABEL: isolation,
        slotclasses.RESOURCE_LABEL: "nvidia.com_gpu",
    }


def test_offers_follow_the_labels_node_by_node() -> None:
    offers = SlotOffers()
    offers.update("a", labelled("20389"))
    offers.update("b", labelled("20389"))
    offers.update("c", labelled("81559", policy_name="x", isolation="exclusive"))
    small = Offer(20389, "nvidia.com/gpu", Isolation.MPS, "p")
    assert offers.offers() == (small, Offer(81559, "nvidia.com/gpu", Isolation.EXCLUSIVE, "x"))
    assert offers.nodes(small) == 2
    offers.update("a", None)
    offers.update("c", {POLICY_LABEL: "x"})  # its labels gone
    assert offers.offers() == (small,) and offers.nodes(small) == 1


@pytest.mark.parametrize(
    "broken",
    [
        {slotclasses.MEMORY_LABEL: "lots"},
        {slotclasses.MEMORY_LABEL: "0"},
        {slotclasses.ISOLATION_LABEL: "none"},
        {slotclasses.ISOLATION_LABEL: "sandbox"},
        {POLICY_LABEL: None},
    ],
)
def test_labels_that_promise_nothing_or_do_not_parse_offer_nothing(broken: dict[str, Any]) -> None:
    labels = {k: v for k, v in {**labelled("100"), **broken}.items() if v is not None}
    assert slotclasses.offer_of(labels, policy_label=POLICY_LABEL) is None


# -- end to end through the planner (no API) -----------------------------------------------------


def test_a_verified_mps_pool_offers_its_class_and_both_statuses_show_it() -> None:
    clock = Clock()
    cache = ClusterCache(clock=clock, wallclock=lambda: 1_800_000_000.0 + clock.now)
    cache.upsert_policy(policy("p", strategy="MPS", replicas=4))
    key = str(cache.policies["p"].config_key)
    sync_config(cache, {key: "x"}, initial=True)
    gfd = {**MEMORY, **on(key, "p", 4), "nvidia.com/gpu.sharing-strategy": "mps"}
    cache.upsert_node(node("n0", **gfd))
    assert cache.slot_offers.offers() == ()  # not labelled yet
    loop = leader(cache)
    status = published(loop, "n0")  # the slot labels are written, then the status
    assert status["phase"] == NodePhase.VERIFIED
    assert status["slots"]["classes"] == [
        {
            "resource": "nvidia.com/gpu",
            "isolation": "mps",
            "memoryMiB": 20389,
            "capacity": 16,
            "allocated": 0,
        }
    ]
    assert cache.slot_offers.offers() == (Offer(20389, "nvidia.com/gpu", Isolation.MPS, "p"),)
    rendered = loop.plan_policy("p").rendered
    assert rendered is not None
    assert rendered["slots"]["classes"] == [{**status["slots"]["classes"][0], "nodes": 1}]

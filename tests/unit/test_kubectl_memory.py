"""The plugin's part of memory requests, without an API: what a change takes from a pod's slot
(core.slots.slotchanges, kubectl.memoryplan), the free slots per class of ``status``
(kubectl.freeslots) and the slot promise of ``explain node`` (kubectl.promises)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.records.nodes import project_node
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy
from gpushare_operator.core.slots import memoryfits, slotchanges, slotclasses
from gpushare_operator.core.slots.slotchanges import Loss
from gpushare_operator.core.slots.slotclasses import Isolation, SlotClass
from gpushare_operator.kubectl import freeslots, manifests, memoryplan, output, planview, promises
from gpushare_operator.kubectl.forecast import Forecaster
from gpushare_operator.kubectl.plan import PlanOptions, report
from gpushare_operator.kubectl.standings import RolloutPace, settled_body
from gpushare_operator.kubectl.status import new_planner
from gpushare_testing.builders import config_texts, node, pod, policy

H100 = "NVIDIA-H100-80GB-HBM3"
H100_MIB = 81559
MEMORY = {"nvidia.com/gpu.memory": str(H100_MIB), "nvidia.com/gpu.product": H100}
GPU = "nvidia.com/gpu"
GIB20 = 20480
STYLE = output.Style()


def mps(memory: int | None) -> SlotClass:
    return SlotClass(GPU, Isolation.MPS, memory)


SLICED = SlotClass(GPU, Isolation.NONE, None)


# -- core.slots.slotchanges: what a change takes from a pod
# --------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "loss"),
    [
        ([mps(20389)], [mps(10194)], Loss.SHRINKS),  # MPS 4 -> 8 replicas under 20Gi
        ([mps(20389)], [mps(40779)], None),  # 4 -> 2: it holds 20Gi now
        ([mps(20389)], [mps(20389)], None),  # unchanged
        ([mps(40779)], [mps(20389)], Loss.SHRINKS),  # 2 -> 4: smaller, and under 20Gi
        ([mps(81559)], [mps(40779)], None),  # smaller, but it still holds 20Gi
        ([mps(10194)], [mps(20389)], None),  # still under 20Gi, but no worse than before
        ([mps(20389)], [], Loss.REMOVED),  # released, or Unsupported
        ([mps(20389)], [SlotClass("nvidia.com/gpu.shared", Isolation.MPS, 40779)], Loss.RESOURCE),
        ([mps(20389)], [SLICED], Loss.UNENFORCED),  # to time-slicing
        ([SLICED], [mps(10194)], Loss.SHRINKS),  # a cap appears under the request
        ([SLICED], [mps(40779)], None),
        ([SLICED], [], None),  # nothing enforced was taken from it
        ([], [mps(10194)], Loss.SHRINKS),  # an unmanaged whole GPU capped under the request
    ],
)
def test_a_change_takes_a_pods_slot_when_it_removes_or_shrinks_it_under_the_request(
    before: list[SlotClass], after: list[SlotClass], loss: Loss | None
) -> None:
    change = slotchanges.judge(GIB20, [GPU], before, after)
    assert (change.loss if change else None) == loss
    if change is not None:
        assert change.describe()


def test_the_reason_names_both_classes_and_the_request() -> None:
    change = slotchanges.judge(GIB20, [GPU], [mps(20389)], [mps(10194)])
    assert change is not None and change.describe() == (
        "its slot shrinks from 20389 MiB mps to 10194 MiB mps, under the 20Gi (20480 MiB) it"
        " asked for"
    )
    moved = slotchanges.judge(
        GIB20, [GPU], [mps(20389)], [SlotClass("nvidia.com/mig-3g.40gb", Isolation.MIG, 40960)]
    )
    assert moved is not None and moved.describe() == (
        "the node's slots become 40960 MiB mig: no slot of nvidia.com/gpu any more"
    )


# -- kubectl.memoryplan: the plan lists them and exits 2 -----------------------------------------


def mps_fleet(replicas: int = 4) -> tuple[Forecaster, dict[str, CompiledPolicy]]:
    """Nodes n0 and n1 (2 H100s each) Verified on MPS policy p; a 20Gi pod on n0 and a pod
    without a memory request on n1."""
    forecaster = Forecaster(max_unavailable="100%", pace=RolloutPace())
    cache = forecaster.cache
    cache.upsert_policy(policy("p", strategy="MPS", replicas=replicas))
    cache.set_config_data(config_texts(cache), initial=True)
    for name in ("n0", "n1"):
        cache.upsert_node(node(name, count="2", **MEMORY))
        cache.upsert_node(settled_body(cache.nodes[name], cache.policies["p"]))
    cache.upsert_pod(memory_pod("train-0", "n0", "20Gi"))
    cache.upsert_pod(pod("plain", "n1", 1))
    return forecaster, dict(cache.policies)


def memory_pod(name: str, node_name: str, request: str) -> dict[str, Any]:
    body = pod(name, node_name, 1)
    body["metadata"]["labels"] = {"gpushare.dev/gpu-memory": request}
    return body


def plan_of(edited: dict[str, Any], *, replicas: int = 4) -> dict[str, Any]:
    forecaster, current = mps_fleet(replicas)
    snapshot = memoryplan.Snapshot.take(forecaster.cache)
    forecast = forecaster.run([edited])
    after = dict(forecaster.cache.policies)
    memory = memoryplan.find(forecast, snapshot, before=current, after=after)
    old = policy("p", strategy="MPS", replicas=replicas)
    planned = manifests.Planned("p", "update", old, edited)
    return report(
        forecast=forecast,
        planned=[planned],
        current=current,
        after=after,
        options=PlanOptions(),
        memory=memory,
    )


def test_more_mps_replicas_shrink_the_slot_under_a_20gi_request_and_the_plan_exits_2() -> None:
    plan = plan_of(policy("p", strategy="MPS", replicas=8, generation=2))
    [item] = plan["memoryRequests"]
    assert item == {
        "namespace": "ns",
        "name": "train-0",
        "node": "n0",
        "pool": "a",
        "requestMiB": GIB20,
        "resource": GPU,
        "loss": "shrinks",
        "before": {
            "policy": "p",
            "class": {"resource": GPU, "isolation": "mps", "memoryMiB": 20389},
        },
        "after": {
            "policy": "p",
            "class": {"resource": GPU, "isolation": "mps", "memoryMiB": H100_MIB // 8},
            "classes": [],
        },
        "why": item["why"],
        "evicted": False,
        "waitsForPods": True,  # the operator holds n0: the same rule (core.slots.memoryfits)
    }
    assert plan["exitCode"] == 2 and not plan["overcommitted"]
    assert plan["problems"] == [
        "pod ns/train-0 on node n0 would lose the slot its GPU memory request holds: "
        + item["why"]
        + "; the node waits for it (MemoryNoLongerEnforced)"
    ]
    [policy_p] = plan["policies"]
    [held] = policy_p["rollout"]["held"]
    assert (held["node"], held["reason"]) == ("n0", "MemoryNoLongerEnforced")
    assert "pod ns/train-0 asked for 20Gi (20480 MiB)" in held["message"]
    text = planview.render(plan, STYLE)
    assert "Pods whose GPU memory request (gpushare.dev/gpu-memory)" in text
    row = next(line for line in text.splitlines() if line.startswith("  ns/train-0"))
    assert row.split() == [
        "ns/train-0", "20Gi", "(20480", "MiB)", "n0", "20389", "MiB", "mps", "(p)",
        "10194", "MiB", "mps", "(p)",
    ]  # fmt: skip
    assert "Result: blocked (exit 2)" in text
    json.dumps(plan)


def test_fewer_replicas_hold_the_request_and_the_plan_is_clean() -> None:
    plan = plan_of(policy("p", strategy="MPS", replicas=2, generation=2))
    assert plan["memoryRequests"] == [] and plan["exitCode"] == 0
    assert "GPU memory request" not in planview.render(plan, STYLE)


def test_time_slicing_and_a_deletion_take_the_promise_away() -> None:
    sliced = plan_of(policy("p", strategy="TimeSlicing", replicas=4, generation=2))
    [item] = sliced["memoryRequests"]
    assert item["loss"] == "unenforced" and item["after"]["class"]["isolation"] == "none"
    assert sliced["exitCode"] == 2
    gone = policy("p", strategy="MPS", replicas=4, generation=2)
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleted = plan_of(gone)
    [item] = deleted["memoryRequests"]
    assert item["loss"] == "removed" and item["after"] == {
        "policy": None,
        "class": None,
        "classes": [],
    }
    assert "no slot class" in planview.render(deleted, STYLE)


def test_a_new_single_mig_layout_reads_the_slice_from_the_tables_not_the_old_gfd_label() -> None:
    """Under single, GFD's nvidia.com/gpu.memory is the slice's: the old one's until GFD
    relabels, so the plan's class after a re-layout is NVIDIA's table for the new profile."""
    labels = {
        "nvidia.com/gpu.product": f"{H100}-MIG-1g.10gb",
        "nvidia.com/gpu.memory": "9984",
        "nvidia.com/mig.capable": "true",
    }
    record = project_node(node("n", count="14", **labels))
    old, new = mig_policy("1g.10gb"), mig_policy("3g.40gb")
    assert slotclasses.promise(record, old) == SlotClass(GPU, Isolation.MIG, 9984)
    layout = old.mig.layouts[H100] if old.mig else None
    viewed = memoryfits.after_view(record, new, layout_before=layout)
    assert slotclasses.promise(viewed, new) == SlotClass(GPU, Isolation.MIG, 40960)
    assert memoryfits.after_view(record, old, layout_before=layout) is record


def mig_policy(profile: str | None = None, **mig: Any) -> CompiledPolicy:
    block = {"profile": profile, "migStrategy": "single"} if profile else mig
    spec = policy("m", strategy="MIG", mig=block)["spec"]
    del spec["replicas"]
    return compile_policy(name="m", uid="uid-m", generation=1, spec=spec)


# -- kubectl.freeslots: free slots per class ------------------------------------------------------


def cluster() -> ClusterCache:
    """Policy p (MPS 4, pool a): n0 Verified and labelled, n1 Verified without labels yet, n2
    not configured yet; policy t (time-slicing 4, pool b): t0 Verified and labelled."""
    cache = ClusterCache()
    cache.upsert_policy(policy("p", strategy="MPS", replicas=4))
    cache.upsert_policy(policy("t", pool="b", replicas=4))
    cache.set_config_data(config_texts(cache), initial=True)
    verified(cache, "n0", "p")
    verified(cache, "n1", "p", labelled=False)
    cache.upsert_node(node("n2", count="2", **MEMORY))
    verified(cache, "t0", "t", pool="b")
    cache.upsert_pod(memory_pod("train-0", "n0", "20Gi"))
    cache.upsert_pod(pod("t-pod", "t0", 3))
    return cache


def verified(
    cache: ClusterCache, name: str, policy_name: str, *, pool: str = "a", labelled: bool = True
) -> None:
    cache.upsert_node(node(name, pool=pool, count="2", **MEMORY))
    record, compiled = cache.nodes[name], cache.policies[policy_name]
    body = settled_body(record, compiled)
    if labelled:
        wanted = slotclasses.labels(slotclasses.promise(record, compiled))
        body["metadata"]["labels"].update({k: v for k, v in wanted.items() if v is not None})
    cache.upsert_node(body)


def test_status_counts_free_slots_per_class_on_the_nodes_whose_labels_offer_it() -> None:
    classes = freeslots.slot_classes(new_planner(cluster()))
    enforced, sliced = classes
    assert enforced == {
        "resource": GPU,
        "isolation": "mps",
        "enforced": True,
        "memoryMiB": 20389,
        "policies": ["p"],
        "nodes": 1,
        "capacity": 8,
        "allocated": 1,
        "free": 7,
        "notOffered": {
            "nodes": 2,
            "capacity": 16,
            "allocated": 0,
            "why": {
                "Pending: slot labels are written once it is Verified": 1,
                "Verified, its slot labels not written yet": 1,
            },
        },
    }
    # Time-slicing: slots, and never memory.
    assert "memoryMiB" not in sliced and not sliced["enforced"]
    assert (sliced["nodes"], sliced["allocated"], sliced["free"]) == (1, 3, 5)
    text = freeslots.render(classes, STYLE)
    rows = [line.split() for line in text.splitlines()[1:4]]
    assert rows == [
        ["RESOURCE", "ISOLATION", "MEMORY/SLOT", "POLICIES", "NODES", "SLOTS", "FREE"],
        [GPU, "mps", "20389", "MiB", "p", "1", "1/8", "7"],
        [GPU, "none", "no", "memory", "enforced", "t", "1", "3/8", "5"],
    ]
    assert "not offered: nvidia.com/gpu mps 20389 MiB on 2 nodes (16 slots)" in text


def test_a_layout_of_several_profiles_is_not_offered_one_label_cannot_speak_for_it() -> None:
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/mig.capable": "true"}
    record = project_node(node("n", count="1", **labels))
    mixed = mig_policy(devices={"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, migStrategy="mixed")
    found = freeslots.node_slots(record, mixed, phase="Verified")
    assert [(s.resource, s.memory_mib, n) for s, n in found.classes] == [
        ("nvidia.com/mig-1g.10gb", 10240, 1),
        ("nvidia.com/mig-2g.20gb", 20480, 1),
        ("nvidia.com/mig-3g.40gb", 40960, 1),
    ]
    assert not found.offered and found.why_not == freeslots.SEVERAL


# -- kubectl.promises: explain node ---------------------------------------------------------------


def promise_of(cache: ClusterCache, name: str) -> dict[str, Any]:
    record = cache.nodes[name]
    decision = new_planner(cache).decide(record)
    return promises.explain(record, decision, phase=str(decision.phase))


def test_explain_says_what_an_mps_slot_enforces_where_it_comes_from_and_its_labels() -> None:
    cache = cluster()
    shown = promise_of(cache, "n0")
    assert shown["promise"] == "each slot enforces 20389 MiB (nvidia.com/gpu, mps)"
    [entry] = shown["classes"]
    assert entry["why"].startswith(
        "MPS, floor(81559 MiB / 4 replicas), the MPS control daemon's per-client pinned memory"
        " limit; the GPU's memory: GPU Feature Discovery's label nvidia.com/gpu.memory=81559"
    )
    assert shown["labels"]["offered"]
    assert shown["labels"]["state"] == (
        "labelled gpushare.dev/slot-memory-mib=20389, gpushare.dev/slot-isolation=mps,"
        " gpushare.dev/slot-resource=nvidia.com_gpu"
    )
    text = promises.render(shown, STYLE)
    assert (
        text.splitlines()[0] == "Slot promise: each slot enforces 20389 MiB (nvidia.com/gpu, mps)"
    )
    assert "requests of up to 20389 MiB" in text


def test_explain_says_why_a_node_carries_no_slot_labels() -> None:
    cache = cluster()
    pending = promise_of(cache, "n2")["labels"]["state"]
    assert pending.startswith(
        "not labelled yet: the node is Pending (slot labels are written once it is Verified"
    )
    sliced = promise_of(cache, "t0")
    assert sliced["promise"] == "no memory enforced (nvidia.com/gpu, isolation none)"
    assert sliced["classes"][0]["why"].startswith("time-slicing shares the whole GPU")
    assert "requests of up to" not in promises.render(sliced, STYLE)
    cache.upsert_node(node("free", pool="z", count="2", **MEMORY))
    assert promise_of(cache, "free") == {
        "classes": [],
        "promise": "no slot promise: no policy governs the node",
    }


def test_explain_lists_each_class_of_a_mixed_layout_and_says_none_is_labelled() -> None:
    cache = ClusterCache()
    body = policy("m", strategy="MIG", mig={"devices": {"3g.40gb": 1, "1g.10gb": 1}})
    del body["spec"]["replicas"]
    body["spec"]["mig"]["migStrategy"] = "mixed"
    cache.upsert_policy(body)
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/mig.capable": "true"}
    cache.upsert_node(node("n", count="1", **labels, **{"nvidia.com/mig-1g.10gb.memory": "9984"}))
    section = promise_of(cache, "n")
    small, large = section["classes"]
    assert small["memoryMiB"] == 9984 and "GPU Feature Discovery's" in small["why"]
    assert "lower than NVIDIA's tables' 10240 MiB" in small["why"]
    assert large["memoryMiB"] == 40960 and "NVIDIA's tables" in large["why"]
    text = promises.render(section, STYLE)
    assert "Slot promise: 2 slot classes, one per resource" in text
    assert "no slot labels: one label cannot speak for several classes" in text

"""A DRA node's usage: its capacity from its ResourceSlice, its allocations from ResourceClaims.

Pure core and cache, no API: claims in, the GPUNodeState and policy status the planner renders
out.  The same counts on the real control plane are in tests/integration/test_dra_usage.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import ClaimSink
from gpushare_operator.core.dra import draclaims, draclasses
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, config_texts, node, pod, policy
from gpushare_testing.writepath import PlanningLoop

ON = {dra.DEPLOY_DEVICE_PLUGIN: "false", dra.DRA_DRIVER_LABEL: "true"}


def claim(
    uid: str,
    *results: tuple[str, str],
    pods: tuple[str, ...] = (),
    driver: str = dra.DRIVER,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim as the API returns it once kube-scheduler allocated ``results``
    ((pool, device) pairs) and reserved it for ``pods`` (uids)."""
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": driver, "pool": pool, "device": device}
                    for pool, device in results
                ]
            }
        }
        status["reservedFor"] = [
            {"resource": "pods", "name": f"pod-{p}", "uid": p} for p in pods
        ] + [{"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "job-1"}]
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": f"claim-{uid}", "managedFields": []},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": status,
    }


def gpu_slice(node_name: str, gpus: int) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(gpus)]
    return {
        "metadata": {"name": f"{node_name}-gpu.nvidia.com-x"},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_a_claim_record_keeps_nvidias_devices_and_the_pods_it_serves_only() -> None:
    record = draclaims.claim_record(
        claim("c1", ("n1", "gpu-1"), ("n1", "gpu-0"), ("n1", "gpu-0"), pods=("p2", "p1"))
    )
    assert record == draclaims.ClaimRecord.of(
        "c1", [("n1", "gpu-0"), ("n1", "gpu-1")], pods=("p1", "p2")
    )
    assert record.devices == [("n1", "gpu-0"), ("n1", "gpu-1")]
    assert record.nodes == {"n1"}
    assert draclaims.claim_record(claim("c2", ("n1", "nic-0"), driver="nic.example.com")) is None
    assert draclaims.claim_record(claim("c3", allocated=False)) is None, (
        "not allocated: nothing held"
    )


def test_devices_held_are_counted_once_per_node_with_their_pods() -> None:
    claims = [
        draclaims.ClaimRecord.of("a", [("n1", "gpu-0")], pods=("p1",)),
        # Admin access: a second claim on the same device holds no second slot.
        draclaims.ClaimRecord.of("b", [("n1", "gpu-0"), ("n2", "gpu-0")], pods=("p2",)),
        draclaims.ClaimRecord.of("c", [("n2", "gpu-1")], pods=("p3",)),
    ]
    assert draclaims.held_on("n1", claims) == ({"gpu-0"}, 2)
    assert draclaims.held_on("n2", claims) == ({"gpu-0", "gpu-1"}, 2)
    assert draclaims.held_on("n3", claims) == (frozenset(), 0)


def test_claim_events_index_by_node_mark_only_real_changes_and_leave_with_a_relist() -> None:
    cache = ClusterCache()
    sink = ClaimSink(cache)
    seen: list[str] = []
    cache.dra.on_usage = seen.append
    sink.apply("ADDED", claim("c1", ("n1", "gpu-0"), pods=("p1",)))
    assert cache.dra.held("n1") == (1, 1) and seen == ["n1"]
    sink.apply("MODIFIED", claim("c1", ("n1", "gpu-0"), pods=("p1",)))
    assert seen == ["n1"], "a change of nothing read marks nothing"
    # Re-allocated elsewhere: both nodes look again, the old one holds nothing.
    sink.apply("MODIFIED", claim("c1", ("n2", "gpu-3"), pods=("p1",)))
    assert cache.dra.held("n1") == (0, 0) and cache.dra.held("n2") == (1, 1)
    assert sorted(seen[1:]) == ["n1", "n2"]
    # Deallocated (the pod finished): forgotten, as a deleted claim is.
    sink.apply("MODIFIED", claim("c1", allocated=False))
    assert cache.dra.claim_uids() == [] and cache.dra.held("n2") == (0, 0)
    sink.apply("ADDED", claim("c2", ("n1", "gpu-0")))
    sink.begin_relist()
    sink.relist_item(claim("c3", ("n1", "gpu-1")))
    sink.end_relist()
    assert cache.dra.claim_uids() == ["c3"], "what a relist does not mention is gone"


@pytest.fixture
def cache() -> ClusterCache:
    return ClusterCache(clock=Clock())


@pytest.fixture
def planner(cache: ClusterCache) -> PlanningLoop:
    timings = Timings(propagation_delay=0, key_grace_period=300, mismatch_timeout=60)
    reconciler = Reconciler(cache, timings=timings, max_unavailable="10%")
    return PlanningLoop(reconciler)


def on_dra(cache: ClusterCache, name: str, *, gpus: int) -> None:
    compiled = cache.policies["d"]
    labels = {CONFIG_LABEL: str(compiled.config_key), POLICY_LABEL: "d", **ON}
    cache.upsert_node(node(name, count=str(gpus), allocatable="0", **labels))
    cache.dra.upsert_class(draclasses.device_class("nvidia.com/gpu", (), api_version="x/v1"))


def test_a_dra_nodes_status_counts_claims_not_pod_specs(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("d", strategy="Exclusive", replicas=None, backend="DRA"))
    cache.set_config_data(config_texts(cache), initial=True)
    on_dra(cache, "n1", gpus=4)
    # The slice lists three of GFD's four GPUs (one failed its health check, say): capacity is
    # what claims can be allocated from.
    cache.dra.upsert_slice(gpu_slice("n1", 3))
    # A pod asking nvidia.com/gpu, served by the claim kube-scheduler made for it, and a pod
    # asking through a ResourceClaimTemplate, naming no resource.
    cache.upsert_pod(pod("p1", "n1", 1))
    cache.dra.upsert_claim(claim("c1", ("n1", "gpu-0"), pods=("p1",)))
    cache.dra.upsert_claim(claim("c2", ("n1", "gpu-2"), pods=("p2",)))
    plan = planner.plan_node("n1")
    assert plan is not None and plan.status is not None
    status = plan.status
    assert status["phase"] == "Applied", "one GPU short of GFD's count: not confirmed"
    assert status["slots"]["capacity"] == 3 and status["gpus"] == 4
    assert (status["slots"]["allocated"], status["pods"]) == (2, 2), (
        "each GPU once, no double count"
    )
    tally = planner.reconciler.planner.tally(cache.policies["d"])
    assert (tally.capacity, tally.allocated) == (3, 2)
    # The pod's claim goes with it (deallocated): the count follows the claims alone.
    cache.dra.upsert_claim(claim("c1", allocated=False))
    cache.delete_pod("p1")
    assert planner.reconciler.planner.tally(cache.policies["d"]).allocated == 1


def test_a_device_plugin_node_still_counts_pod_requests(
    cache: ClusterCache, planner: PlanningLoop
) -> None:
    cache.upsert_policy(policy("e", strategy="Exclusive", replicas=None))
    cache.set_config_data(config_texts(cache), initial=True)
    compiled = cache.policies["e"]
    labels = {CONFIG_LABEL: str(compiled.config_key), POLICY_LABEL: "e"}
    cache.upsert_node(node("n1", count="2", **labels))
    cache.upsert_pod(pod("p1", "n1", 1))
    # A stray claim naming this node's pool (no DRA switch on it) is not what serves it.
    cache.dra.upsert_claim(claim("c1", ("n1", "gpu-1"), pods=("p9",)))
    tally = planner.reconciler.planner.tally(compiled)
    assert (tally.capacity, tally.allocated) == (2, 1)

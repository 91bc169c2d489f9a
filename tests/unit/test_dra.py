"""Backend DRA in the pure core: admission, keys, labels, slices, confirmation, classes."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import backends
from gpushare_operator.core.api.models import (
    DRA_MIG_MIXED,
    DRA_SHARING_ALPHA,
    GPUSharingPolicySpec,
    NodePhase,
)
from gpushare_operator.core.dra import draclasses
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.phases import nodelabels, nodephases
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL, project_node
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy
from gpushare_operator.core.rollout import victims
from gpushare_operator.kubectl import manifests
from gpushare_operator.kubectl.forecast import Forecaster
from gpushare_operator.kubectl.plan import PlanOptions, report
from gpushare_operator.kubectl.standings import RolloutPace
from gpushare_operator.reconcile import classplan
from gpushare_testing.builders import converged, node, pod, policy

BASE = {"nodeSelector": {"matchLabels": {"pool": "a"}}, "strategy": "Exclusive"}
ON = {dra.DEPLOY_DEVICE_PLUGIN: "false", dra.DRA_DRIVER_LABEL: "true"}


def compiled(name: str = "p", **spec: Any) -> CompiledPolicy:
    policy = compile_policy(name=name, uid=f"uid-{name}", generation=1, spec={**BASE, **spec})
    assert policy.error is None, policy.error
    return policy


def slice_obj(node_name: str, gpus: int, *, generation: int = 1, driver: str = dra.DRIVER) -> Any:
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{i}"}},
            "capacity": {"memory": {"value": "81559Mi"}},
        }
        for i in range(gpus)
    ]
    return {
        "metadata": {"name": f"{node_name}-slice-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.mark.parametrize("strategy", ["TimeSlicing", "MPS"])
def test_sharing_under_dra_is_refused_naming_nvidias_alpha_gates(strategy: str) -> None:
    """Unless the operator runs with --dra-sharing (tests/unit/test_dra_sharing.py)."""
    with pytest.raises(pydantic.ValidationError, match="TimeSlicingSettings, MPSSupport"):
        GPUSharingPolicySpec.model_validate(
            {**BASE, "strategy": strategy, "replicas": 4, "backend": "DRA"}
        )
    assert "alpha feature gates" in DRA_SHARING_ALPHA and "--dra-sharing" in DRA_SHARING_ALPHA


def test_mig_under_dra_takes_the_mixed_strategy_and_no_replicas() -> None:
    def mig(**layout: Any) -> dict[str, Any]:
        return {**BASE, "strategy": "MIG", "mig": layout, "backend": "DRA"}

    with pytest.raises(pydantic.ValidationError, match=r"takes mig\.migStrategy mixed"):
        GPUSharingPolicySpec.model_validate(mig(profile="1g.10gb"))  # single by default
    with pytest.raises(pydantic.ValidationError, match=r"mig\.replicas under backend DRA"):
        GPUSharingPolicySpec.model_validate(mig(profile="1g.10gb", migStrategy="mixed", replicas=2))
    assert "one DeviceClass only" in DRA_MIG_MIXED
    GPUSharingPolicySpec.model_validate(mig(profile="1g.10gb", migStrategy="mixed"))
    GPUSharingPolicySpec.model_validate(mig(devices={"3g.40gb": 1, "1g.10gb": 4}))


def test_a_backend_move_is_a_new_config_key() -> None:
    plugin, moved = compiled(), compiled(backend="DRA")
    assert not plugin.dra and moved.dra
    assert plugin.config_key != moved.config_key
    assert moved.config_key is not None and "-draexcl-" in moved.config_key
    assert plugin.config_text == moved.config_text  # GFD reads the same (exclusive) config


def test_a_dra_node_is_labelled_with_both_switches_once_its_class_is_there() -> None:
    policy = compiled(backend="DRA")
    record = project_node(node("n1", count="2"))

    def decide(backend: dra.Readiness) -> nodephases.NodeDecision:
        return nodephases.decide(
            record=record,
            policy=policy,
            key=nodephases.KeyReadiness(present=True),
            applied_since=None,
            now=0.0,
            mismatch_timeout=60,
            backend=backend,
        )

    waiting = decide(dra.Readiness(class_ready=False))
    assert (waiting.reason, waiting.labels) == ("DeviceClassNotWritten", None)
    clash = decide(dra.Readiness(class_ready=True, conflict="theirs"))
    assert (clash.reason, clash.labels) == ("DeviceClassConflict", None)
    labelled = decide(dra.Readiness(class_ready=True))
    assert labelled.labels == {CONFIG_LABEL: policy.config_key, POLICY_LABEL: "p", **ON}


def on_dra(policy: CompiledPolicy, *, allocatable: str, **labels: str) -> Any:
    extra = {CONFIG_LABEL: str(policy.config_key), POLICY_LABEL: policy.name, **ON, **labels}
    return project_node(node("n1", count="2", allocatable=allocatable, **extra))


def applied(policy: CompiledPolicy, record: Any, devices: tuple[dra.Device, ...]) -> Any:
    return nodephases.decide(
        record=record,
        policy=policy,
        key=nodephases.KeyReadiness(present=True),
        applied_since=0.0,
        now=1.0,
        mismatch_timeout=60,
        backend=dra.Readiness(class_ready=True, devices=devices),
    )


def test_a_dra_node_is_verified_by_its_slice_and_no_device_plugin_resource() -> None:
    policy = compiled(backend="DRA")
    devices = dra.node_devices([dra.slice_record(slice_obj("n1", 2))])  # type: ignore[list-item]
    done = applied(policy, on_dra(policy, allocatable="0"), devices)
    assert done.phase is NodePhase.VERIFIED and "lists 2 GPUs" in done.message
    # The device plugin still serves its GPUs: not confirmed, whatever the slice says.
    early = applied(policy, on_dra(policy, allocatable="2"), devices)
    assert early.phase is NodePhase.APPLIED
    assert "ResourceSlice" in early.message
    # No slice yet, or one short of a GPU.
    assert applied(policy, on_dra(policy, allocatable="0"), ()).phase is NodePhase.APPLIED
    short = dra.node_devices([dra.slice_record(slice_obj("n1", 1))])  # type: ignore[list-item]
    problems = dra.disagreements(on_dra(policy, allocatable="0"), short, resource="nvidia.com/gpu")
    assert problems == ["the gpu.nvidia.com ResourceSlice lists 1 GPUs, expected 2"]


def test_only_the_newest_pool_generation_and_only_nvidias_driver_count() -> None:
    old = dra.slice_record(slice_obj("n1", 1, generation=1))
    new = dra.slice_record(slice_obj("n1", 2, generation=2))
    assert old is not None and new is not None
    assert [d.name for d in dra.node_devices([old, new])] == ["gpu-0", "gpu-1"]
    assert dra.slice_record(slice_obj("n1", 2, driver="example.com")) is None
    assert new.devices[0].memory_mib == 81559


def test_a_node_not_on_dra_is_not_shown_as_a_dra_target() -> None:
    policy = compiled(backend="DRA")
    plugin_side = project_node(
        node("n1", count="2", **{CONFIG_LABEL: str(policy.config_key), POLICY_LABEL: "p"})
    )
    assert not nodephases.shows_target(plugin_side, policy)
    back = compiled()
    on = on_dra(back, allocatable="2")
    assert not nodephases.shows_target(on, back), "a DevicePlugin target has no DRA switch"
    moving = nodephases.decide(
        record=on,
        policy=back,
        key=nodephases.KeyReadiness(present=True),
        applied_since=None,
        now=0.0,
        mismatch_timeout=60,
    )
    assert moving.labels == {
        CONFIG_LABEL: back.config_key,
        POLICY_LABEL: "p",
        dra.DEPLOY_DEVICE_PLUGIN: None,
        dra.DRA_DRIVER_LABEL: None,
    }


def test_a_backend_move_needs_idle_gpus_as_a_mig_change_does() -> None:
    record = project_node(node("n1", count="2"))
    assert backends.needs_idle(record, compiled(backend="DRA"), layouts={})
    assert not backends.needs_idle(record, compiled(), layouts={})
    assert victims.room(record, compiled(backend="DRA"), layouts={}) is None
    assert "backend move" in backends.idle_reason(record, compiled(backend="DRA"))


def test_a_slot_label_apply_restates_the_dra_switch() -> None:
    policy = compiled(backend="DRA")
    record = on_dra(policy, allocatable="0")
    devices = dra.node_devices([dra.slice_record(slice_obj("n1", 2))])  # type: ignore[list-item]
    verified = applied(policy, record, devices)
    labels = nodelabels.wanted(record, verified)
    assert labels is not None
    assert {k: labels[k] for k in ON} == ON, "SSA would drop a switch the apply left out"


def test_the_class_serves_nvidia_gpu_for_the_dra_policies_and_stays_while_nodes_are_on_dra() -> (
    None
):
    cache = ClusterCache()
    assert classplan.wanted(cache) == {}
    for name, backend in (("a", "DRA"), ("b", "DRA"), ("c", "DevicePlugin")):
        cache.upsert_policy(
            {
                "metadata": {"name": name, "uid": f"uid-{name}", "generation": 1},
                "spec": {**BASE, "backend": backend},
            }
        )
    wanted = classplan.wanted(cache)
    assert list(wanted) == ["gpu.gpushare.dev"]
    body = wanted["gpu.gpushare.dev"]
    assert body["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert [r["name"] for r in body["metadata"]["ownerReferences"]] == ["a", "b"]
    assert "type == 'gpu'" in body["spec"]["selectors"][0]["cel"]["expression"]
    # Policy c moves back from DRA: while one of its nodes still carries the switch, its class
    # stays (owned by it too).
    cache.upsert_node(node("n1", count="2", **{POLICY_LABEL: "c", **ON}))
    owners = classplan.wanted(cache)["gpu.gpushare.dev"]["metadata"]["ownerReferences"]
    assert [r["name"] for r in owners] == ["a", "b", "c"]


def test_a_foreign_class_for_the_same_resource_is_a_conflict_and_ours_must_be_ours() -> None:
    cache = ClusterCache()
    assert not cache.dra.readiness("nvidia.com/gpu").class_ready
    ours = draclasses.device_class(
        "nvidia.com/gpu", [draclasses.Owner("a", "uid-a")], api_version="x/v1"
    )
    cache.dra.upsert_class(ours)
    ready = cache.dra.readiness("nvidia.com/gpu")
    assert ready.class_ready and ready.conflict is None
    theirs = {
        "metadata": {"name": "gpu.example.com"},
        "spec": {"extendedResourceName": "nvidia.com/gpu"},
    }
    cache.dra.upsert_class(theirs)
    clash = cache.dra.readiness("nvidia.com/gpu")
    assert clash.conflict is not None and "gpu.example.com" in clash.conflict
    # A class with our name that someone else wrote is not ours.
    cache.dra.upsert_class({"metadata": {"name": "gpu.gpushare.dev"}, "spec": {}})
    assert not cache.dra.readiness("nvidia.com/gpu").class_ready


def test_slice_events_mark_their_node_dirty_and_leave_with_a_relist() -> None:
    cache = ClusterCache()
    cache.dra.upsert_slice(slice_obj("n1", 2))
    assert "n1" in cache.queue.nodes
    assert len(cache.dra.devices("n1")) == 2
    cache.dra.delete_slice("n1-slice-1")
    assert cache.dra.devices("n1") == ()


def test_a_plan_names_the_pods_dra_would_not_serve_and_exits_2() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=RolloutPace())
    converged(forecaster, 2, rollout={"maxUnavailable": 1, "canary": 1}, renameByDefault=True)
    forecaster.cache.upsert_pod(pod("shared", "n0", 1, resource="nvidia.com/gpu.shared"))
    current = dict(forecaster.cache.policies)
    old = policy("p", replicas=2, renameByDefault=True)
    new = policy("p", generation=2, strategy="Exclusive", backend="DRA")
    new["spec"].pop("replicas")
    forecast = forecaster.run([new])
    assert [(u.node, u.name, u.resource) for u in forecast.unserved] == [
        ("n0", "shared", "nvidia.com/gpu.shared")
    ]
    plan = report(
        forecast=forecast,
        planned=[manifests.Planned("p", "update", old, new)],
        current=current,
        after=dict(forecaster.cache.policies),
        options=PlanOptions(),
    )
    assert plan["exitCode"] == 2
    assert plan["unservedByDRA"] == [
        {"node": "n0", "pod": "ns/shared", "resource": "nvidia.com/gpu.shared"}
    ]
    assert any("backend DRA does not serve" in p for p in plan["problems"])
    # The same move of a pool whose pods ask nvidia.com/gpu: nothing unserved.
    other = Forecaster(max_unavailable="100%", pace=RolloutPace())
    converged(other, 2)
    other.cache.upsert_pod(pod("plain", "n0", 1))
    moved = policy("p", generation=2, strategy="Exclusive", backend="DRA")
    moved["spec"].pop("replicas")
    assert other.run([moved]).unserved == []


def test_a_dra_policy_says_whether_its_class_is_there() -> None:
    resource = ("nvidia.com/gpu",)
    missing = draclasses.class_condition(resource, dra.Readiness(class_ready=False))
    assert (missing.status, missing.reason) == ("False", "DeviceClassNotWritten")
    clash = draclasses.class_condition(resource, dra.Readiness(class_ready=True, conflict="theirs"))
    assert (clash.status, clash.reason, clash.message) == ("False", "DeviceClassConflict", "theirs")
    ready = draclasses.class_condition(resource, dra.Readiness(class_ready=True))
    assert (ready.status, ready.reason) == ("True", "DeviceClassWritten")
    assert "gpu.gpushare.dev" in ready.message

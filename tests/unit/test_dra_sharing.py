"""TimeSlicing and MPS under backend DRA (``--dra-sharing``): refused without the flag, and
with it rendered as NVIDIA's DRA driver GpuConfig on the DeviceClass (``core.drasharing``)."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import drasharing, policystatus
from gpushare_operator.core.api.models import DRA_SHARING, GPUSharingPolicySpec
from gpushare_operator.core.dra import draclasses
from gpushare_operator.core.records.policies import DRA_SHARING_DISABLED, compile_policy
from gpushare_operator.reconcile import classplan

BASE = {"nodeSelector": {"matchLabels": {"pool": "a"}}, "backend": "DRA"}
TS = {**BASE, "strategy": "TimeSlicing", "replicas": 4}
MPS = {**BASE, "strategy": "MPS", "replicas": 4}


def test_the_flag_lifts_the_refusal_and_nothing_else() -> None:
    GPUSharingPolicySpec.model_validate(TS, context={DRA_SHARING: True})
    with pytest.raises(pydantic.ValidationError, match="--dra-sharing"):
        GPUSharingPolicySpec.model_validate(TS, context={DRA_SHARING: False})
    # mig.replicas under DRA stays refused: the flag is about full GPUs.
    mig = {**BASE, "strategy": "MIG", "mig": {"devices": {"1g.10gb": 7}, "replicas": 2}}
    with pytest.raises(pydantic.ValidationError, match=r"mig\.replicas under backend DRA"):
        GPUSharingPolicySpec.model_validate(mig, context={DRA_SHARING: True})


def test_without_the_flag_the_policy_compiles_to_an_error_of_its_own_reason() -> None:
    refused = compile_policy(name="p", uid="u", generation=1, spec=TS)
    assert not refused.usable and refused.error_reason == DRA_SHARING_DISABLED
    assert refused.error is not None and "TimeSlicingSettings" in refused.error


def test_time_slicing_is_one_slot_per_gpu_with_the_drivers_default_interval() -> None:
    policy = compile_policy(name="p", uid="u", generation=1, spec=TS, dra_sharing=True)
    assert policy.valid and policy.replicas == 1 and policy.resources == ("nvidia.com/gpu",)
    assert policy.gpu_config is not None
    assert json.loads(policy.gpu_config) == {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}},
    }
    # GFD, the one reader of the device-plugin text on a DRA node, is told one slot a GPU.
    assert policy.config_text is not None and "timeSlicing" not in policy.config_text
    assert policy.config_key is not None and "-draexcl-" in policy.config_key


def test_mps_replicas_become_each_clients_share_of_the_sms() -> None:
    policy = compile_policy(name="p", uid="u", generation=1, spec=MPS, dra_sharing=True)
    assert policy.gpu_config is not None
    sharing = json.loads(policy.gpu_config)["sharing"]
    assert sharing == {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}}
    renamed = compile_policy(
        name="p", uid="u", generation=1, spec={**MPS, "renameByDefault": True}, dra_sharing=True
    )
    assert renamed.resources == ("nvidia.com/gpu.shared",)


def test_the_condition_says_alpha_the_gate_and_what_replicas_became() -> None:
    for spec, gate, mapped in (
        (TS, "TimeSlicingSettings", "no per-class equivalent"),
        (MPS, "MPSSupport", "defaultActiveThreadPercentage 25"),
    ):
        policy = compile_policy(name="p", uid="u", generation=1, spec=spec, dra_sharing=True)
        assert policy.spec is not None
        cond = drasharing.condition(policy.spec)
        assert cond is not None and (cond.type, cond.status, cond.reason) == (
            "DRASharing",
            "True",
            "Alpha",
        )
        assert gate in cond.message and mapped in cond.message
    exclusive = compile_policy(
        name="p", uid="u", generation=1, spec={**BASE, "strategy": "Exclusive"}
    )
    assert exclusive.spec is not None and drasharing.condition(exclusive.spec) is None
    assert exclusive.gpu_config is None


def test_the_status_carries_the_condition() -> None:
    policy = compile_policy(name="p", uid="u", generation=1, spec=TS, dra_sharing=True)
    tally = policystatus.PolicyTally()
    status = policystatus.render_policy_status(policy=policy, tally=tally, previous=None, now="t")
    assert "DRASharing" in {c["type"] for c in status["conditions"]}


def test_a_class_carries_the_config_and_reads_back_equal() -> None:
    policy = compile_policy(name="p", uid="u", generation=1, spec=TS, dra_sharing=True)
    body = draclasses.device_class(
        "nvidia.com/gpu", [draclasses.Owner("p", "u")], api_version="x/v1", config=policy.gpu_config
    )
    (entry,) = body["spec"]["config"]
    assert entry["opaque"]["driver"] == "gpu.nvidia.com"
    assert entry["opaque"]["parameters"]["kind"] == "GpuConfig"
    # What the informer holds compares equal, or the writer would apply it on every pass.
    assert draclasses.class_record(body).config == policy.gpu_config
    plain = draclasses.device_class("nvidia.com/gpu", [], api_version="x/v1")
    assert "config" not in plain["spec"] and draclasses.class_record(plain).config is None


def policy_body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "spec": spec}


def test_two_dra_policies_sharing_one_resource_unalike_is_a_conflict_never_a_silent_winner() -> (
    None
):
    cache = ClusterCache(dra_sharing=True)
    cache.upsert_policy(policy_body("b-shared", TS))
    cache.upsert_policy(policy_body("a-whole", {**BASE, "strategy": "Exclusive"}))
    (body,) = classplan.wanted(cache).values()
    assert "config" not in body["spec"]  # a-whole's (first by name): no config
    cache.dra.upsert_class(body)
    shared, whole = cache.policies["b-shared"], cache.policies["a-whole"]
    assert cache.dra.readiness("nvidia.com/gpu", config=whole.gpu_config).conflict is None
    clash = cache.dra.readiness("nvidia.com/gpu", config=shared.gpu_config)
    assert not clash.class_ready and clash.conflict is not None
    assert "GpuConfig TimeSlicing" in clash.conflict and "renameByDefault" in clash.conflict
    # The class keeps the config it carries while a policy wants it (a new leader agrees).
    with_config = draclasses.device_class(
        "nvidia.com/gpu",
        [draclasses.Owner("b-shared", "uid-b-shared")],
        api_version="x/v1",
        config=shared.gpu_config,
    )
    cache.dra.upsert_class(with_config)
    (kept,) = classplan.wanted(cache).values()
    assert kept["spec"]["config"] == with_config["spec"]["config"]


def test_a_renamed_shared_pool_has_a_class_of_its_own() -> None:
    cache = ClusterCache(dra_sharing=True)
    cache.upsert_policy(policy_body("b-shared", {**TS, "renameByDefault": True}))
    cache.upsert_policy(policy_body("a-whole", {**BASE, "strategy": "Exclusive"}))
    wanted = classplan.wanted(cache)
    assert sorted(wanted) == ["gpu-shared.gpushare.dev", "gpu.gpushare.dev"]
    assert "config" in wanted["gpu-shared.gpushare.dev"]["spec"]
    assert "config" not in wanted["gpu.gpushare.dev"]["spec"]

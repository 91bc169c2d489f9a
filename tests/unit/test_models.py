"""The API models: each admission rule of the CRDs, checked again in Python, clearly worded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpushare_operator.core.api import models
from gpushare_operator.core.api.models import (
    GPUSharingPolicySpec,
    LabelSelector,
    NodePhase,
    SharingStrategy,
)
from gpushare_operator.core.api.statuses import (
    Condition,
    GPUNodeStateStatus,
    GPUSharingPolicyStatus,
    Slots,
)

ROOT = Path(__file__).resolve().parents[2]
PREFIX_253 = ".".join(["a" * 63] * 3 + ["b" * 61])
PREFIX_255 = ".".join(["a" * 63] * 4)
BASE: dict[str, Any] = {"strategy": "TimeSlicing", "replicas": 4}


def spec(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


def expression(key: str = "pool", operator: str = "In", **extra: Any) -> dict[str, Any]:
    selector = {"matchExpressions": [{"key": key, "operator": operator, **extra}]}
    return spec(nodeSelector=selector)


def labels(mapping: dict[str, str]) -> dict[str, Any]:
    return spec(nodeSelector={"matchLabels": mapping})


def test_minimal_spec_takes_the_documented_defaults() -> None:
    parsed = GPUSharingPolicySpec.model_validate(BASE)
    assert parsed.model_dump(mode="json") == {
        "nodeSelector": {"matchLabels": None, "matchExpressions": None},
        "priority": 0,
        "strategy": "TimeSlicing",
        "replicas": 4,
        "mig": None,
        "resourceName": "nvidia.com/gpu",
        "renameByDefault": False,
        "failRequestsGreaterThanOne": None,
        "paused": False,
        "rollout": {
            "maxUnavailable": "10%",
            "canary": 1,
            "failureThreshold": 1,
            "podPolicy": "WaitForPods",
            "eviction": {"timeout": "10m", "gracePeriodSeconds": None},
            "progressDeadlineSeconds": 600,
            "cordonDuringChange": False,
        },
        "backend": "DevicePlugin",
    }
    assert parsed.strategy is SharingStrategy.TIME_SLICING
    assert parsed.fail_requests_greater_than_one is False  # the plugin's time-slicing default


def test_fail_requests_defaults_to_the_plugins_default_per_strategy() -> None:
    mps = GPUSharingPolicySpec.model_validate({"strategy": "MPS", "replicas": 4})
    assert mps.failRequestsGreaterThanOne is None
    assert mps.fail_requests_greater_than_one is True
    told = GPUSharingPolicySpec.model_validate(
        {"strategy": "MPS", "replicas": 4, "failRequestsGreaterThanOne": False}
    )
    assert told.fail_requests_greater_than_one is False


def test_exclusive_needs_no_replicas_and_has_one_slot_per_gpu() -> None:
    for body in ({"strategy": "Exclusive"}, {"strategy": "Exclusive", "replicas": 1}):
        parsed = GPUSharingPolicySpec.model_validate(body)
        assert parsed.strategy is SharingStrategy.EXCLUSIVE
        assert parsed.slots_per_gpu == 1


def test_full_spec_from_the_design_round_trips() -> None:
    body = {
        "nodeSelector": {
            "matchLabels": {"pool": "inference"},
            "matchExpressions": [
                {
                    "key": "nvidia.com/gpu.product",
                    "operator": "In",
                    "values": ["NVIDIA-H100-80GB-HBM3"],
                }
            ],
        },
        "priority": 100,
        "strategy": "TimeSlicing",
        "replicas": 4,
        "resourceName": "nvidia.com/gpu",
        "renameByDefault": False,
        "failRequestsGreaterThanOne": True,
        "paused": False,
        "rollout": {
            "maxUnavailable": 4,
            "canary": 2,
            "failureThreshold": 3,
            "podPolicy": "Evict",
            "eviction": {"timeout": "1h30m", "gracePeriodSeconds": 30},
            "progressDeadlineSeconds": 900,
            "cordonDuringChange": True,
        },
        "backend": "DevicePlugin",
    }
    parsed = GPUSharingPolicySpec.model_validate(body)
    assert parsed.model_dump(mode="json", exclude_none=True) == body


def test_spec_is_frozen() -> None:
    parsed = GPUSharingPolicySpec.model_validate(BASE)
    with pytest.raises(ValidationError, match="frozen"):
        parsed.replicas = 8  # type: ignore[misc]


def mig(**overrides: Any) -> dict[str, Any]:
    """A valid MIG spec with ``overrides``; None removes a field."""
    body = {"strategy": "MIG", "mig": {"profile": "1g.10gb"}, **overrides}
    return {key: value for key, value in body.items() if value is not None}


def test_mig_strategy_defaults_to_single_for_a_profile_and_mixed_for_devices() -> None:
    one = GPUSharingPolicySpec.model_validate(mig())
    several = GPUSharingPolicySpec.model_validate(
        mig(mig={"devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, "replicas": 3})
    )
    assert one.mig is not None and several.mig is not None
    assert (one.mig.strategy, one.slots_per_gpu) == ("single", 1)
    assert (several.mig.strategy, several.slots_per_gpu) == ("mixed", 3)
    assert several.mig.profiles == ("1g.10gb", "2g.20gb", "3g.40gb")


GOOD_SPECS = {
    "mps": spec(strategy="MPS"),
    "replicas-2": spec(replicas=2),
    "replicas-64": spec(replicas=64),
    "priority-max": spec(priority=1_000_000_000),
    "resource-other-domain": spec(resourceName="example.com/gpu"),
    "resource-mig": spec(resourceName="nvidia.com/mig-1g.10gb"),
    "resource-63": spec(resourceName="nvidia.com/" + "g" * 52),
    "exists": expression(operator="Exists"),
    "exists-empty-values": expression(operator="Exists", values=[]),
    "does-not-exist": expression(operator="DoesNotExist"),
    "not-in": expression(operator="NotIn", values=["a", "b"]),
    "key-prefixed": expression(key="nvidia.com/gpu.product", values=["x"]),
    "key-underscore-upper": expression(key="My_Label", values=["x"]),
    "key-name-63": expression(key="k" * 63, values=["x"]),
    "key-prefix-253": expression(key=PREFIX_253 + "/x", values=["x"]),
    "value-empty": expression(values=[""]),
    "value-63": expression(values=["v" * 63]),
    "match-labels": labels({"nvidia.com/gpu.present": "true", "pool": ""}),
    "match-labels-64": labels({f"k{i}": "v" for i in range(64)}),
    "empty-selector": spec(nodeSelector={}),
}


@pytest.mark.parametrize("body", GOOD_SPECS.values(), ids=GOOD_SPECS.keys())
def test_valid_specs_are_accepted(body: dict[str, Any]) -> None:
    assert GPUSharingPolicySpec.model_validate(body).replicas == body["replicas"]


BAD_SPECS = {
    "no-strategy": ({"replicas": 4}, "strategy", "Field required"),
    "no-replicas": ({"strategy": "MPS"}, "", "replicas must be 2 to 64 when strategy is MPS"),
    "unknown-strategy": (
        spec(strategy="Slices"),
        "strategy",
        "'TimeSlicing', 'MPS', 'Exclusive' or 'MIG'",
    ),
    "mig-without-block": (mig(mig=None), "", "mig is required when strategy is MIG"),
    "mig-on-mps": (
        spec(strategy="MPS", mig={"profile": "1g.10gb"}),
        "",
        f"mig is refused with strategy MPS: {models.MPS_ON_MIG}",
    ),
    "mig-on-time-slicing": (spec(mig={"profile": "1g.10gb"}), "", "mig applies only"),
    "mig-with-replicas": (mig(replicas=4), "", "replicas must be absent when strategy is MIG"),
    "mig-resource": (mig(resourceName="nvidia.com/x"), "", "resourceName must be left"),
    "mig-rename": (mig(renameByDefault=True), "", "renameByDefault applies only"),
    "mig-proceed": (mig(rollout={"podPolicy": "Proceed"}), "", "Proceed is refused"),
    "mig-both": (
        mig(mig={"profile": "1g.10gb", "devices": {"1g.10gb": 7}}),
        "mig",
        "exactly one of profile and devices",
    ),
    "mig-single-two-profiles": (
        mig(mig={"devices": {"3g.40gb": 1, "4g.40gb": 1}, "migStrategy": "single"}),
        "mig",
        "migStrategy single advertises every MIG device as nvidia.com/gpu",
    ),
    "mig-single-devices": (
        mig(mig={"devices": {"1g.10gb": 7}, "migStrategy": "single"}),
        "mig",
        "it needs the one-profile layout",
    ),
    "mig-profile-name": (mig(mig={"profile": "5g.50gb"}), "mig.profile", "should match"),
    "mig-count-8": (mig(mig={"devices": {"1g.10gb": 8}}), "mig.devices", "less than or equal"),
    "replicas-1": (spec(replicas=1), "", "replicas must be 2 to 64 when strategy is TimeSlicing"),
    "mps-49": (spec(strategy="MPS", replicas=49), "", "at most 48 when strategy is MPS"),
    "exclusive-4": (
        spec(strategy="Exclusive", replicas=4),
        "",
        "replicas must be absent or 1 when strategy is Exclusive",
    ),
    "exclusive-renamed": (
        {"strategy": "Exclusive", "renameByDefault": True},
        "",
        "renameByDefault applies only to TimeSlicing and MPS",
    ),
    "replicas-65": (spec(replicas=65), "replicas", "less than or equal to 64"),
    "replicas-string": (spec(replicas="4"), "replicas", "valid integer"),
    "replicas-bool": (spec(replicas=True), "replicas", "valid integer"),
    "paused-string": (spec(paused="true"), "paused", "valid boolean"),
    "priority-negative": (spec(priority=-1), "priority", "greater than or equal to 0"),
    "priority-too-high": (spec(priority=1_000_000_001), "priority", "less than or equal to"),
    "resource-unprefixed": (spec(resourceName="gpu"), "resourceName", "domain-prefixed"),
    "resource-64": (spec(resourceName="nvidia.com/" + "g" * 53), "resourceName", "at most 63"),
    "resource-kubernetes-io": (
        spec(resourceName="kubernetes.io/gpu"),
        "resourceName",
        "kubernetes.io",
    ),
    "resource-sub-kubernetes-io": (
        spec(resourceName="x.kubernetes.io/gpu"),
        "resourceName",
        "kubernetes.io",
    ),
    "resource-requests": (
        spec(resourceName="requests.nvidia.com/gpu"),
        "resourceName",
        "requests.",
    ),
    "resource-uppercase": (spec(resourceName="nvidia.com/GPU"), "resourceName", "name part"),
    "resource-underscore": (spec(resourceName="nvidia.com/a_b"), "resourceName", "name part"),
    "resource-two-slashes": (spec(resourceName="nvidia.com/a/b"), "resourceName", "name part"),
    "resource-empty-domain": (
        spec(resourceName="/gpu"),
        "resourceName",
        "domain must not be empty",
    ),
    "operator-gt": (expression(operator="Gt", values=["1"]), "operator", "'In', 'NotIn'"),
    "in-without-values": (expression(), "matchExpressions.0", "non-empty when operator is In"),
    "in-empty-values": (expression(values=[]), "matchExpressions.0", "non-empty"),
    "not-in-without-values": (expression(operator="NotIn"), "matchExpressions.0", "NotIn"),
    "exists-with-values": (
        expression(operator="Exists", values=["a"]),
        "matchExpressions.0",
        "empty when operator is Exists",
    ),
    "does-not-exist-with-values": (
        expression(operator="DoesNotExist", values=["a"]),
        "matchExpressions.0",
        "DoesNotExist",
    ),
    "key-empty": (expression(key="", values=["a"]), "key", "name part must not be empty"),
    "key-two-slashes": (expression(key="a/b/c", values=["a"]), "key", "more than one '/'"),
    "key-empty-prefix": (
        expression(key="/x", values=["a"]),
        "key",
        "prefix before '/' must not be empty",
    ),
    "key-uppercase-prefix": (
        expression(key="Nvidia.com/x", values=["a"]),
        "key",
        "prefix before '/' must be a lowercase DNS subdomain",
    ),
    "key-prefix-255": (expression(key=PREFIX_255 + "/x", values=["a"]), "key", "at most 253"),
    "key-name-64": (expression(key="k" * 64, values=["a"]), "key", "at most 63"),
    "key-leading-dash": (
        expression(key="-a", values=["a"]),
        "key",
        "must start and end with a letter or digit",
    ),
    "value-64": (expression(values=["v" * 64]), "values.0", "at most 63"),
    "value-space": (expression(values=["a b"]), "values.0", "is not valid: a non-empty value"),
    "value-trailing-dash": (
        expression(values=["a-"]),
        "values.0",
        "must start and end with a letter or digit",
    ),
    "values-257": (expression(values=[f"v{i}" for i in range(257)]), "values", "at most 256"),
    "expressions-65": (
        spec(
            nodeSelector={
                "matchExpressions": [{"key": f"k{i}", "operator": "Exists"} for i in range(65)]
            }
        ),
        "matchExpressions",
        "at most 64",
    ),
    "label-key-space": (labels({"bad key": "x"}), "matchLabels", "label key 'bad key'"),
    "label-key-64": (labels({"k" * 64: "x"}), "matchLabels", "at most 63"),
    "label-key-prefix-255": (labels({PREFIX_255 + "/x": "x"}), "matchLabels", "at most 253"),
    "label-value-dash": (labels({"pool": "-x"}), "matchLabels.pool", "label value '-x'"),
    "label-value-64": (labels({"pool": "x" * 64}), "matchLabels.pool", "at most 63"),
    "labels-65": (labels({f"k{i}": "v" for i in range(65)}), "matchLabels", "at most 64"),
}


@pytest.mark.parametrize(("body", "where", "message"), BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_invalid_specs_are_refused_with_a_clear_message(
    body: dict[str, Any], where: str, message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        GPUSharingPolicySpec.model_validate(body)
    (error,) = caught.value.errors()
    location = ".".join(str(part) for part in error["loc"])
    assert where in location
    assert message in error["msg"]


LABEL_KEYS = {
    "pool": True,
    "nvidia.com/gpu.present": True,
    "A_b.c-D": True,
    "9": True,
    f"{PREFIX_253}/x": True,
    "k" * 63: True,
    "": False,
    "/x": False,
    "a/": False,
    "a/b/c": False,
    "UPPER.com/x": False,
    "a_b.com/x": False,
    "-x": False,
    "x.": False,
    "k" * 64: False,
    f"{PREFIX_255}/x": False,
    "a b": False,
}


@pytest.mark.parametrize(("key", "valid"), LABEL_KEYS.items(), ids=range(len(LABEL_KEYS)))
def test_label_key_syntax(key: str, valid: bool) -> None:
    assert models.is_valid_label_key(key) is valid
    assert (models.label_key_error(key) is None) is valid


LABEL_VALUES = {
    "": True,
    "true": True,
    "NVIDIA-H100-80GB-HBM3": True,
    "a.b_c-d": True,
    "v" * 63: True,
    "v" * 64: False,
    "-v": False,
    "v_": False,
    "a/b": False,
    "a b": False,
}


@pytest.mark.parametrize(("value", "valid"), LABEL_VALUES.items(), ids=range(len(LABEL_VALUES)))
def test_label_value_syntax(value: str, valid: bool) -> None:
    assert models.is_valid_label_value(value) is valid


POLICY_NAMES = {"inference": True, "a.b-c": True, "n" * 50: True, "n" * 51: False, "Up": False}


@pytest.mark.parametrize(("name", "valid"), POLICY_NAMES.items(), ids=range(len(POLICY_NAMES)))
def test_policy_names_fit_in_a_config_key_label(name: str, valid: bool) -> None:
    assert models.is_valid_policy_name(name) is valid


def _admits_key(key: str) -> bool:
    """The key rule as the CRD states it: the pattern, the length bound and the prefix rule."""
    pattern = re.fullmatch(f"^{models.LABEL_KEY_PATTERN}$", key) is not None
    return pattern and len(key) <= models.LABEL_KEY_MAX_LENGTH and key.find("/") <= 253


_KEY_CHARS = st.sampled_from(["a", "Z", "0", "-", "_", ".", "/", " "])


@given(st.lists(_KEY_CHARS, max_size=12).map("".join) | st.sampled_from(list(LABEL_KEYS)))
def test_crd_key_pattern_agrees_with_the_python_check(key: str) -> None:
    assert _admits_key(key) is models.is_valid_label_key(key)


@given(st.lists(st.sampled_from(["a", "Z", "0", "-", "_", ".", "/"]), max_size=70).map("".join))
def test_crd_value_pattern_agrees_with_the_python_check(value: str) -> None:
    pattern = re.fullmatch(f"^{models.LABEL_VALUE_PATTERN}$", value) is not None
    admitted = pattern and len(value) <= models.LABEL_VALUE_MAX_LENGTH
    assert admitted is models.is_valid_label_value(value)


@given(st.lists(st.sampled_from(["a", "0", "-", ".", "/", "_", "A"]), max_size=20).map("".join))
def test_crd_resource_name_rules_agree_with_the_python_check(name: str) -> None:
    admitted = (
        re.fullmatch(f"^{models.RESOURCE_NAME_PATTERN}$", name) is not None
        and len(name) <= models.RESOURCE_NAME_MAX_LENGTH
        and "kubernetes.io/" not in name
        and not name.startswith("requests.")
    )
    assert admitted is models.is_valid_resource_name(name)


def test_selector_default_is_the_empty_selector() -> None:
    assert GPUSharingPolicySpec.model_validate(BASE).nodeSelector == LabelSelector()
    assert LabelSelector().model_dump(exclude_none=True) == {}


def _condition(**changes: Any) -> dict[str, Any]:
    body = {
        "type": "Ready",
        "status": "True",
        "reason": "AllVerified",
        "message": "3 of 3 nodes verified",
        "lastTransitionTime": "2025-01-31T12:00:00Z",
        "observedGeneration": 2,
    }
    return {**body, **changes}


def test_policy_status_dumps_api_shaped_with_a_slots_summary() -> None:
    status = GPUSharingPolicyStatus(
        observedGeneration=2,
        matchedNodes=3,
        appliedNodes=3,
        gpus=8,
        slots=Slots(capacity=32, allocated=3),
        configKey="inference-ts4-0a1b2c",
        conditions=[Condition.model_validate(_condition())],
    )
    dumped = status.model_dump(mode="json")
    assert dumped["slotsSummary"] == "3/32"
    assert dumped["slots"] == {
        "capacity": 32,
        "allocated": 3,
        "byResource": None,
        "classes": None,
    }
    assert dumped["conditions"][0]["lastTransitionTime"] == "2025-01-31T12:00:00Z"
    # What the operator wrote reads back equal, the derived summary being ignored as input.
    assert GPUSharingPolicyStatus.model_validate(dumped) == status


def test_node_state_status_summary_follows_its_slots() -> None:
    status = GPUNodeStateStatus(
        phase=NodePhase.VERIFIED,
        policy="batch",
        strategy=SharingStrategy.MPS,
        gpus=8,
        replicas=8,
        slots=Slots(capacity=64, allocated=70),
        pods=5,
        lastTransitionTime="2025-01-31T12:00:00.5+01:00",
    )
    assert status.slotsSummary == "70/64"
    assert status.model_dump(mode="json")["phase"] == "Verified"
    assert GPUNodeStateStatus(phase=NodePhase.UNMANAGED).slotsSummary == "0/0"


BAD_STATUSES = {
    "condition-status": ({"conditions": [_condition(status="Yes")]}, "'True', 'False'"),
    "condition-reason": ({"conditions": [_condition(reason="not ok")]}, "match pattern"),
    "condition-no-reason": ({"conditions": [_condition(reason="")]}, "at least 1"),
    "condition-time": ({"conditions": [_condition(lastTransitionTime="yesterday")]}, "RFC 3339"),
    "condition-date": (
        {"conditions": [_condition(lastTransitionTime="2025-02-30T12:00:00Z")]},
        "not a real date",
    ),
    "negative-count": ({"matchedNodes": -1}, "greater than or equal to 0"),
    "negative-slots": ({"slots": {"capacity": -1}}, "greater than or equal to 0"),
    "too-many-conditions": ({"conditions": [_condition()] * 33}, "at most 32"),
}


@pytest.mark.parametrize(("body", "message"), BAD_STATUSES.values(), ids=BAD_STATUSES.keys())
def test_invalid_policy_statuses_are_refused(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        GPUSharingPolicyStatus.model_validate(body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "Field required"),
        ({"phase": "Done"}, "'Pending', 'Applied'"),
        ({"phase": "Applied", "replicas": 0}, "greater than or equal to 1"),
        ({"phase": "Applied", "strategy": "Slices"}, "'TimeSlicing', 'MPS', 'Exclusive' or 'MIG'"),
        ({"phase": "Applied", "lastTransitionTime": "2025-01-31 12:00"}, "RFC 3339"),
    ],
    ids=["no-phase", "phase", "replicas", "strategy", "time"],
)
def test_invalid_node_statuses_are_refused(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        GPUNodeStateStatus.model_validate(body)


def test_enums_carry_the_api_spellings() -> None:
    assert [s.value for s in SharingStrategy] == ["TimeSlicing", "MPS", "Exclusive", "MIG"]
    assert [p.value for p in NodePhase] == [
        "Pending",
        "Applied",
        "Verified",
        "Degraded",
        "Mismatch",
        "Releasing",
        "Evicting",
        "Unsupported",
        "Unmanaged",
    ]


def test_example_policies_are_valid_and_overlap_as_described() -> None:
    documents = list(yaml.safe_load_all((ROOT / "examples" / "policies.yaml").read_text()))
    policies = {doc["metadata"]["name"]: doc for doc in documents}
    assert set(policies) == {"inference", "batch", "training-shared", "mig-slices"}
    for name, doc in policies.items():
        assert doc["apiVersion"] == models.API_VERSION
        assert doc["kind"] == models.POLICY_KIND
        assert models.is_valid_policy_name(name)
    specs = {
        name: GPUSharingPolicySpec.model_validate(doc["spec"]) for name, doc in policies.items()
    }
    assert (specs["inference"].strategy, specs["inference"].replicas) == ("TimeSlicing", 4)
    assert (specs["batch"].strategy, specs["batch"].replicas) == ("MPS", 8)
    assert specs["batch"].renameByDefault
    # training-shared selects the batch pool too, and batch wins it on priority.
    (requirement,) = specs["training-shared"].nodeSelector.matchExpressions or []
    assert (requirement.key, requirement.operator) == ("pool", "In")
    assert "batch" in (requirement.values or [])
    assert specs["batch"].nodeSelector.matchLabels == {"pool": "batch"}
    assert specs["batch"].priority > specs["training-shared"].priority
    mig = specs["mig-slices"].mig
    assert mig is not None and (mig.profile, mig.strategy) == ("1g.10gb", "single")

"""Every admission rule of docs/api.md, proven against the real kube-apiserver.

The CRDs in ``crds/`` are installed with the real kubectl, then bad objects are POSTed and must
come back 422 with a message that names the field and the rule, good objects must be admitted
with the server's defaults, the printer columns and short names must work in ``kubectl get``,
and ``kubectl apply -f crds/`` must upgrade an older copy of the CRDs in place.
"""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from gpushare_operator.core.api import models, statuses
from gpushare_operator.core.labelling import rewrittenlabels
from gpushare_testing.controlplane import ControlPlane

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"
POLICY_CRD = f"{models.POLICY_PLURAL}.{models.GROUP}"
NODE_STATE_CRD = f"{models.NODE_STATE_PLURAL}.{models.GROUP}"
API = f"/apis/{models.GROUP}/{models.VERSION}"
POLICIES = f"{API}/{models.POLICY_PLURAL}"
NODE_STATES = f"{API}/{models.NODE_STATE_PLURAL}"
MERGE_PATCH = "application/merge-patch+json"

Json = dict[str, Any]
T = TypeVar("T")


# -- helpers -------------------------------------------------------------------------------------


def unique_name(prefix: str = "adm") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def poll(probe: Callable[[], T], *, until: Callable[[T], bool], timeout: float, what: str) -> T:
    """Call ``probe`` until ``until(result)`` holds; fail with the last result on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if until(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {result!r}")
        time.sleep(0.2)


def _get_status(plane: ControlPlane, path: str) -> int:
    return plane.request("GET", path)[0]


def wait_served(plane: ControlPlane) -> None:
    """Wait until both kinds can be listed: a changed CRD briefly answers 429 while the apiserver
    re-initialises its storage ("storage is (re)initializing")."""
    for collection in (POLICIES, NODE_STATES):
        poll(
            functools.partial(_get_status, plane, collection),
            until=lambda status: status == 200,
            timeout=30,
            what=f"{collection} to be served",
        )


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl, as the admin, with its own discovery cache."""

    binary: Path
    kubeconfig: Path
    cache_dir: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [
            str(self.binary),
            "--kubeconfig",
            str(self.kubeconfig),
            "--cache-dir",
            str(self.cache_dir),
            *args,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if check:
            assert result.returncode == 0, (
                f"kubectl {' '.join(args)} exited {result.returncode}\n"
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result


@dataclass
class Objects:
    """Creates gpushare objects as the admin and deletes every one of them afterwards."""

    plane: ControlPlane
    created: list[str] = field(default_factory=list)

    def create(self, collection: str, body: Json, *, dry_run: bool = False) -> tuple[int, Json]:
        path = f"{collection}?dryRun=All" if dry_run else collection
        status, raw = self.plane.request("POST", path, body=body)
        if status == 201 and not dry_run:
            self.created.append(f"{collection}/{body['metadata']['name']}")
        return status, json.loads(raw)

    def read(self, path: str) -> Json:
        status, raw = self.plane.request("GET", path)
        assert status == 200, f"GET {path}: {status} {raw!r}"
        return dict(json.loads(raw))

    def patch_status(self, path: str, status_body: Json) -> tuple[int, Json]:
        status, raw = self.plane.request(
            "PATCH", f"{path}/status", body={"status": status_body}, content_type=MERGE_PATCH
        )
        return status, json.loads(raw)

    def delete_all(self) -> None:
        for path in reversed(self.created):
            status, raw = self.plane.request("DELETE", path)
            assert status in (200, 404), f"DELETE {path}: {status} {raw!r}"
        self.created.clear()


def policy(spec: Json | None, *, name: str | None = None) -> Json:
    """A GPUSharingPolicy; a spec of None leaves the spec out."""
    body: Json = {
        "apiVersion": models.API_VERSION,
        "kind": models.POLICY_KIND,
        "metadata": {"name": name or unique_name()},
    }
    if spec is not None:
        body["spec"] = spec
    return body


def node_state(*, name: str | None = None) -> Json:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.NODE_STATE_KIND,
        "metadata": {"name": name or unique_name("adm-node")},
    }


def spec(**overrides: Any) -> Json:
    """A valid minimal spec with `overrides`; an override of ``...`` removes the field."""
    merged: Json = {"strategy": "TimeSlicing", "replicas": 4, **overrides}
    return {key: value for key, value in merged.items() if value is not ...}


def mig_spec(**overrides: Any) -> Json:
    """A valid minimal MIG spec with `overrides` (``...`` removes a field)."""
    merged: Json = {"replicas": ..., "strategy": "MIG", "mig": {"profile": "1g.10gb"}, **overrides}
    return spec(**merged)


def expression(key: str = "pool", operator: str = "In", values: Any = ...) -> Json:
    requirement: Json = {"key": key, "operator": operator}
    if values is not ...:
        requirement["values"] = values
    return spec(nodeSelector={"matchExpressions": [requirement]})


def match_labels(labels: dict[str, str]) -> Json:
    return spec(nodeSelector={"matchLabels": labels})


def assert_invalid(status: int, body: Json, *, field_path: str | None, fragment: str) -> None:
    """A 422 Invalid whose causes include `fragment` reported at `field_path`.

    A field path of None is for rules at the root of the schema, which the apiserver reports
    with no path (the cause's field reads "<nil>").
    """
    assert status == 422, f"expected 422 Invalid, got {status}: {json.dumps(body)}"
    assert body["kind"] == "Status"
    assert body["reason"] == "Invalid"
    causes = body["details"]["causes"]
    assert any(
        (field_path is None or cause.get("field") == field_path) and fragment in cause["message"]
        for cause in causes
    ), f"no cause at {field_path!r} saying {fragment!r}: {json.dumps(causes, indent=1)}"
    assert fragment in body["message"]


# A valid label-key prefix of 253 characters and an invalid one of 255.
PREFIX_253 = ".".join(["a" * 63] * 3 + ["b" * 61])
PREFIX_255 = ".".join(["a" * 63] * 4)
RESOURCE_PATTERN = f"should match '^{models.RESOURCE_NAME_PATTERN}$'"
KEY_PATTERN = f"should match '^{models.LABEL_KEY_PATTERN}$'"
VALUE_PATTERN = f"should match '^{models.LABEL_VALUE_PATTERN}$'"
MATCH_LABELS_KEYS = "matchLabels keys must be valid label keys"
NOT_EMPTY = "values must be non-empty when operator is In or NotIn"
EMPTY = "values must be empty when operator is Exists or DoesNotExist"
ME0 = "spec.nodeSelector.matchExpressions[0]"
ML = "spec.nodeSelector.matchLabels"
NAME_RULE = f"a GPUSharingPolicy name must be at most {models.POLICY_NAME_MAX_LENGTH} characters"
REWRITTEN_KEYS = sorted(rewrittenlabels.REWRITTEN_LABELS)
PRODUCT = rewrittenlabels.GPU_PRODUCT


@dataclass(frozen=True)
class Rejected:
    id: str
    spec: Json | None
    field: str | None
    fragment: str
    name_length: int | None = None


REJECTED = [
    # strategy
    Rejected(
        "strategy-unknown", spec(strategy="Slices"), "spec.strategy", 'Unsupported value: "Slices"'
    ),
    Rejected("strategy-lowercase", spec(strategy="mps"), "spec.strategy", 'supported values: "'),
    Rejected("strategy-missing", spec(strategy=...), "spec.strategy", "Required value"),
    # rollout
    Rejected(
        "rollout-max-unavailable-0",
        spec(rollout={"maxUnavailable": 0}),
        "spec.rollout.maxUnavailable",
        "maxUnavailable must be a whole number of nodes (at least 1) or a percentage",
    ),
    Rejected(
        "rollout-max-unavailable-word",
        spec(rollout={"maxUnavailable": "half"}),
        "spec.rollout.maxUnavailable",
        "or a percentage such as 10%",
    ),
    Rejected(
        "rollout-max-unavailable-101-percent",
        spec(rollout={"maxUnavailable": "101%"}),
        "spec.rollout.maxUnavailable",
        "or a percentage such as 10%",
    ),
    Rejected(
        "rollout-canary-negative",
        spec(rollout={"canary": -1}),
        "spec.rollout.canary",
        "greater than or equal to 0",
    ),
    Rejected(
        "rollout-failure-threshold-0",
        spec(rollout={"failureThreshold": 0}),
        "spec.rollout.failureThreshold",
        "greater than or equal to 1",
    ),
    # TimeSlicing and MPS under DRA: not the CRD's to refuse (the operator's --dra-sharing
    # decides; the chart's ValidatingAdmissionPolicy refuses them: test_dra_sharing.py).
    Rejected(
        "dra-mig-single",  # a one-profile layout is single unless it says mixed
        {"strategy": "MIG", "mig": {"profile": "1g.10gb"}, "backend": "DRA"},
        "spec",
        "MIG under backend DRA takes mig.migStrategy mixed",
    ),
    Rejected(
        "dra-mig-single-explicit",
        {
            "strategy": "MIG",
            "mig": {"devices": {"1g.10gb": 7}, "migStrategy": "single"},
            "backend": "DRA",
        },
        "spec",
        "MIG under backend DRA takes mig.migStrategy mixed",
    ),
    Rejected(
        "dra-mig-replicas",
        {
            "strategy": "MIG",
            "mig": {"profile": "1g.10gb", "migStrategy": "mixed", "replicas": 2},
            "backend": "DRA",
        },
        "spec",
        "mig.replicas under backend DRA is sharing",
    ),
    Rejected(
        "backend-unknown",
        {"strategy": "Exclusive", "backend": "Magic"},
        "spec.backend",
        "Unsupported value",
    ),
    Rejected(
        "rollout-progress-deadline-0",
        spec(rollout={"progressDeadlineSeconds": 0}),
        "spec.rollout.progressDeadlineSeconds",
        "greater than or equal to 1",
    ),
    Rejected(
        "rollout-pod-policy-unknown",
        spec(rollout={"podPolicy": "Sometimes"}),
        "spec.rollout.podPolicy",
        'Unsupported value: "Sometimes"',
    ),
    Rejected(
        "eviction-timeout-zero",
        spec(rollout={"podPolicy": "Evict", "eviction": {"timeout": "0s"}}),
        "spec.rollout.eviction.timeout",
        "eviction.timeout must be a duration of at least 1s",
    ),
    Rejected(
        "eviction-timeout-no-unit",
        spec(rollout={"podPolicy": "Evict", "eviction": {"timeout": "600"}}),
        "spec.rollout.eviction.timeout",
        "should match",
    ),
    Rejected(
        "eviction-grace-negative",
        spec(rollout={"podPolicy": "Evict", "eviction": {"gracePeriodSeconds": -1}}),
        "spec.rollout.eviction.gracePeriodSeconds",
        "greater than or equal to 1",
    ),
    # 0 is a forced deletion: the refusal says so, not only that 1 is the minimum.
    Rejected(
        "eviction-grace-zero",
        spec(rollout={"podPolicy": "Evict", "eviction": {"gracePeriodSeconds": 0}}),
        "spec.rollout.eviction.gracePeriodSeconds",
        "eviction.gracePeriodSeconds must be at least 1: an eviction is never a deletion, and 0"
        " would make the API server drop the pod's record at once while its containers still run",
    ),
    # strategy MIG
    Rejected("mig-without-block", mig_spec(mig=...), "spec", "mig is required when strategy"),
    Rejected(
        "mig-on-mps",
        spec(strategy="MPS", mig={"profile": "1g.10gb"}),
        "spec",
        f"mig is refused with strategy MPS: {models.MPS_ON_MIG}",
    ),
    Rejected(
        "mig-on-time-slicing",
        spec(mig={"profile": "1g.10gb"}),
        "spec",
        "mig applies only when strategy is MIG",
    ),
    Rejected(
        "mig-with-replicas",
        mig_spec(replicas=4),
        "spec",
        "replicas must be absent when strategy is MIG",
    ),
    Rejected(
        "mig-with-resource-name",
        mig_spec(resourceName="nvidia.com/slice"),
        "spec",
        "resourceName must be left at nvidia.com/gpu when strategy is MIG",
    ),
    Rejected(
        "mig-rename-by-default",
        mig_spec(renameByDefault=True),
        "spec",
        "renameByDefault applies only to TimeSlicing and MPS",
    ),
    Rejected(
        "mig-proceed",
        mig_spec(rollout={"podPolicy": "Proceed"}),
        "spec",
        "rollout.podPolicy Proceed is refused when strategy is MIG",
    ),
    Rejected(
        "mig-profile-and-devices",
        mig_spec(mig={"profile": "1g.10gb", "devices": {"1g.10gb": 7}}),
        "spec.mig",
        "exactly one of profile and devices must be set",
    ),
    Rejected(
        "mig-neither-profile-nor-devices",
        mig_spec(mig={"migStrategy": "mixed"}),
        "spec.mig",
        "exactly one of profile and devices must be set",
    ),
    Rejected(
        "mig-single-with-two-profiles",
        mig_spec(mig={"devices": {"3g.40gb": 1, "4g.40gb": 1}, "migStrategy": "single"}),
        "spec.mig",
        "migStrategy single advertises every MIG device as nvidia.com/gpu",
    ),
    Rejected(
        "mig-single-with-devices",
        mig_spec(mig={"devices": {"1g.10gb": 7}, "migStrategy": "single"}),
        "spec.mig",
        "it needs the one-profile layout (mig.profile)",
    ),
    Rejected(
        "mig-profile-name",
        mig_spec(mig={"profile": "5g.50gb"}),
        "spec.mig.profile",
        "should match",
    ),
    Rejected(
        "mig-devices-key",
        mig_spec(mig={"devices": {"1c.3g.40gb": 1}}),
        "spec.mig.devices",
        "mig.devices keys must be MIG profile names",
    ),
    Rejected(
        "mig-devices-count",
        mig_spec(mig={"devices": {"1g.10gb": 8}}),
        "spec.mig.devices.1g.10gb",
        "less than or equal to 7",
    ),
    Rejected(
        "mig-replicas-1",
        mig_spec(mig={"profile": "1g.10gb", "replicas": 1}),
        "spec.mig.replicas",
        "greater than or equal to 2",
    ),
    Rejected(
        "mig-strategy-unknown",
        mig_spec(mig={"profile": "1g.10gb", "migStrategy": "none"}),
        "spec.mig.migStrategy",
        'Unsupported value: "none"',
    ),
    # replicas
    Rejected("replicas-1", spec(replicas=1), "spec", "replicas must be 2 to 64 when strategy"),
    Rejected("replicas-0", spec(replicas=0), "spec.replicas", "greater than or equal to 1"),
    Rejected("replicas-65", spec(replicas=65), "spec.replicas", "less than or equal to 64"),
    Rejected("replicas-string", spec(replicas="4"), "spec.replicas", "must be of type integer"),
    Rejected("replicas-float", spec(replicas=2.5), "spec.replicas", "must be of type integer"),
    Rejected("replicas-missing", spec(replicas=...), "spec", "replicas must be 2 to 64 when"),
    Rejected(
        "mps-49",
        spec(strategy="MPS", replicas=49),
        "spec",
        "replicas must be at most 48 when strategy is MPS",
    ),
    Rejected(
        "exclusive-replicas-4",
        spec(strategy="Exclusive", replicas=4),
        "spec",
        "replicas must be absent or 1 when strategy is Exclusive",
    ),
    Rejected(
        "exclusive-renamed",
        {"strategy": "Exclusive", "renameByDefault": True},
        "spec",
        "renameByDefault applies only to TimeSlicing and MPS",
    ),
    # labels that gpushare's own configuration rewrites: one case per key and place
    *(
        Rejected(f"rewritten-{place}-{key}", body, where, f"a selector on label {key} is refused")
        for key in REWRITTEN_KEYS
        for place, body, where in (
            ("matchLabels", match_labels({key: "x"}), ML),
            ("expression", expression(key=key, operator="Exists"), ME0),
        )
    ),
    Rejected(
        "shared-product-in",
        expression(key=PRODUCT, values=["A10G-SHARED"]),
        ME0,
        "ending in -SHARED for nvidia.com/gpu.product is refused",
    ),
    Rejected(
        "shared-product-matchlabels",
        match_labels({PRODUCT: "NVIDIA-A10G-SHARED"}),
        ML,
        "ending in -SHARED for nvidia.com/gpu.product is refused",
    ),
    # priority
    Rejected("priority-negative", spec(priority=-1), "spec.priority", "greater than or equal to 0"),
    Rejected(
        "priority-over-max",
        spec(priority=models.MAX_PRIORITY + 1),
        "spec.priority",
        "less than or equal to",
    ),
    # booleans are strict
    Rejected("paused-string", spec(paused="true"), "spec.paused", "must be of type boolean"),
    # resourceName
    Rejected("resource-no-domain", spec(resourceName="gpu"), "spec.resourceName", RESOURCE_PATTERN),
    Rejected(
        "resource-too-long",
        spec(resourceName="nvidia.com/" + "g" * 53),
        "spec.resourceName",
        "may not be more than 63",
    ),
    Rejected(
        "resource-uppercase",
        spec(resourceName="nvidia.com/GPU"),
        "spec.resourceName",
        RESOURCE_PATTERN,
    ),
    Rejected(
        "resource-underscore",
        spec(resourceName="nvidia.com/a_b"),
        "spec.resourceName",
        RESOURCE_PATTERN,
    ),
    Rejected(
        "resource-two-slashes",
        spec(resourceName="nvidia.com/a/b"),
        "spec.resourceName",
        RESOURCE_PATTERN,
    ),
    Rejected(
        "resource-empty-domain", spec(resourceName="/gpu"), "spec.resourceName", "should match"
    ),
    Rejected(
        "resource-kubernetes-io",
        spec(resourceName="kubernetes.io/gpu"),
        "spec.resourceName",
        "resourceName must not be in kubernetes.io",
    ),
    Rejected(
        "resource-kubernetes-io-subdomain",
        spec(resourceName="foo.kubernetes.io/gpu"),
        "spec.resourceName",
        "resourceName must not be in kubernetes.io",
    ),
    Rejected(
        "resource-requests-prefix",
        spec(resourceName="requests.nvidia.com/gpu"),
        "spec.resourceName",
        "resourceName must not start with 'requests.'",
    ),
    # selector operators and values
    Rejected(
        "operator-gt",
        expression(operator="Gt", values=["1"]),
        f"{ME0}.operator",
        'Unsupported value: "Gt"',
    ),
    Rejected(
        "operator-missing",
        spec(nodeSelector={"matchExpressions": [{"key": "pool"}]}),
        f"{ME0}.operator",
        "Required value",
    ),
    Rejected(
        "key-missing",
        spec(nodeSelector={"matchExpressions": [{"operator": "Exists"}]}),
        f"{ME0}.key",
        "Required value",
    ),
    Rejected("exists-with-values", expression(operator="Exists", values=["a"]), ME0, EMPTY),
    Rejected(
        "doesnotexist-with-values", expression(operator="DoesNotExist", values=["x"]), ME0, EMPTY
    ),
    Rejected("in-empty-values", expression(operator="In", values=[]), ME0, NOT_EMPTY),
    Rejected("in-missing-values", expression(operator="In"), ME0, NOT_EMPTY),
    Rejected("notin-missing-values", expression(operator="NotIn"), ME0, NOT_EMPTY),
    Rejected("notin-empty-values", expression(operator="NotIn", values=[]), ME0, NOT_EMPTY),
    # matchLabels keys (CEL: a map's keys have no schema of their own)
    Rejected("labels-key-leading-dash", match_labels({"-bad": "x"}), ML, MATCH_LABELS_KEYS),
    Rejected("labels-key-two-slashes", match_labels({"a/b/c": "x"}), ML, MATCH_LABELS_KEYS),
    Rejected("labels-key-name-64", match_labels({"k" * 64: "x"}), ML, MATCH_LABELS_KEYS),
    Rejected("labels-key-space", match_labels({"bad key": "x"}), ML, MATCH_LABELS_KEYS),
    Rejected("labels-key-empty", match_labels({"": "x"}), ML, MATCH_LABELS_KEYS),
    Rejected("labels-key-upper-prefix", match_labels({"UP.com/x": "x"}), ML, MATCH_LABELS_KEYS),
    Rejected("labels-key-empty-prefix", match_labels({"/x": "x"}), ML, MATCH_LABELS_KEYS),
    Rejected(
        "labels-key-prefix-255", match_labels({PREFIX_255 + "/x": "x"}), ML, MATCH_LABELS_KEYS
    ),
    # matchLabels values
    Rejected(
        "labels-value-space", match_labels({"pool": "bad value"}), f"{ML}.pool", VALUE_PATTERN
    ),
    Rejected(
        "labels-value-leading-dash", match_labels({"pool": "-x"}), f"{ML}.pool", VALUE_PATTERN
    ),
    Rejected(
        "labels-value-64", match_labels({"pool": "x" * 64}), f"{ML}.pool", "may not be more than 63"
    ),
    Rejected(
        "labels-too-many",
        match_labels({f"k{i}": "v" for i in range(models.MAX_MATCH_LABELS + 1)}),
        ML,
        f"must have at most {models.MAX_MATCH_LABELS} items",
    ),
    # matchExpressions keys
    Rejected(
        "expression-key-leading-dash",
        expression(key="-bad", values=["a"]),
        f"{ME0}.key",
        KEY_PATTERN,
    ),
    Rejected(
        "expression-key-two-slashes",
        expression(key="a/b/c", values=["a"]),
        f"{ME0}.key",
        KEY_PATTERN,
    ),
    Rejected(
        "expression-key-name-64", expression(key="a" * 64, values=["a"]), f"{ME0}.key", KEY_PATTERN
    ),
    Rejected("expression-key-empty", expression(key="", values=["a"]), f"{ME0}.key", KEY_PATTERN),
    Rejected(
        "expression-key-upper-prefix",
        expression(key="Nvidia.com/x", values=["a"]),
        f"{ME0}.key",
        KEY_PATTERN,
    ),
    Rejected(
        "expression-key-prefix-255",
        expression(key=PREFIX_255 + "/x", values=["a"]),
        f"{ME0}.key",
        "the prefix of a label key must be at most 253 characters",
    ),
    # matchExpressions values
    Rejected(
        "expression-value-space",
        expression(values=["bad value"]),
        f"{ME0}.values[0]",
        VALUE_PATTERN,
    ),
    Rejected(
        "expression-value-trailing-dash",
        expression(values=["ok", "a-"]),
        f"{ME0}.values[1]",
        VALUE_PATTERN,
    ),
    Rejected(
        "expression-value-64",
        expression(values=["v" * 64]),
        f"{ME0}.values[0]",
        "may not be more than 63",
    ),
    Rejected(
        "expression-values-too-many",
        expression(values=[f"v{i}" for i in range(models.MAX_SELECTOR_VALUES + 1)]),
        f"{ME0}.values",
        f"must have at most {models.MAX_SELECTOR_VALUES} items",
    ),
    Rejected(
        "expressions-too-many",
        spec(
            nodeSelector={
                "matchExpressions": [
                    {"key": f"k{i}", "operator": "Exists"}
                    for i in range(models.MAX_MATCH_EXPRESSIONS + 1)
                ]
            }
        ),
        "spec.nodeSelector.matchExpressions",
        f"must have at most {models.MAX_MATCH_EXPRESSIONS} items",
    ),
    # the policy's name goes into a node label value
    Rejected(
        "name-too-long", spec(), None, NAME_RULE, name_length=models.POLICY_NAME_MAX_LENGTH + 1
    ),
    # spec itself
    Rejected("spec-missing", None, "spec", "Required value"),
    Rejected("spec-empty", {}, "spec.strategy", "Required value"),
]


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kubectl(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kubectl]:
    """kubectl, after ``kubectl apply -f crds/`` has installed both CRDs and they are served.

    On the way out, checks that this module left no object of its own behind.
    """
    run = Kubectl(
        binary=control_plane.bin_dir / "kubectl",
        kubeconfig=Path(control_plane.admin_kubeconfig),
        cache_dir=tmp_path_factory.mktemp("kubectl-cache"),
    )
    applied = run("apply", "-f", str(CRD_DIR))
    assert POLICY_CRD in applied.stdout and NODE_STATE_CRD in applied.stdout, applied.stdout
    run(
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        f"crd/{POLICY_CRD}",
        f"crd/{NODE_STATE_CRD}",
    )
    wait_served(control_plane)
    yield run
    for collection in (POLICIES, NODE_STATES):
        _, raw = poll(
            functools.partial(control_plane.request, "GET", collection),
            until=lambda response: response[0] == 200,
            timeout=30,
            what=f"{collection} to be listed",
        )
        names = [item["metadata"]["name"] for item in json.loads(raw)["items"]]
        assert not [name for name in names if name.startswith("adm-")], names


@pytest.fixture
def objects(control_plane: ControlPlane, kubectl: Kubectl) -> Iterator[Objects]:
    tracker = Objects(control_plane)
    try:
        yield tracker
    finally:
        tracker.delete_all()


# -- GPUSharingPolicy: rejected ------------------------------------------------------------------


@pytest.mark.parametrize("case", REJECTED, ids=[case.id for case in REJECTED])
def test_bad_policy_is_rejected_naming_the_problem(objects: Objects, case: Rejected) -> None:
    name = unique_name()
    if case.name_length is not None:
        name = name.ljust(case.name_length, "n")
    body = policy(case.spec, name=name)

    status, response = objects.create(POLICIES, body)

    assert_invalid(status, response, field_path=case.field, fragment=case.fragment)
    assert f'"{name}" is invalid' in response["message"]
    assert objects.plane.request("GET", f"{POLICIES}/{name}")[0] == 404


def test_schema_problems_of_one_policy_are_reported_together(objects: Objects) -> None:
    body = policy(
        spec(
            strategy="Slices",
            replicas=65,
            resourceName="gpu",
            nodeSelector={"matchExpressions": [{"key": "-bad", "operator": "Gt"}]},
        )
    )

    status, response = objects.create(POLICIES, body)

    assert status == 422
    fields = {cause.get("field") for cause in response["details"]["causes"]}
    assert {
        "spec.strategy",
        "spec.replicas",
        "spec.resourceName",
        f"{ME0}.key",
        f"{ME0}.operator",
    } <= fields


NOT_CHECKED = "some validation rules were not checked because the object was invalid"


CEL_ONLY = spec(
    resourceName="kubernetes.io/gpu",
    nodeSelector={
        "matchLabels": {"a/b/c": "x"},
        "matchExpressions": [{"key": "pool", "operator": "Exists", "values": ["a"]}],
    },
)


def test_bounds_and_cel_problems_are_reported_together(objects: Objects) -> None:
    too_long = unique_name().ljust(models.POLICY_NAME_MAX_LENGTH + 1, "n")

    status, response = objects.create(POLICIES, policy({**CEL_ONLY, "replicas": 0}, name=too_long))

    assert status == 422
    messages = {cause.get("field"): cause["message"] for cause in response["details"]["causes"]}
    assert "greater than or equal to 1" in messages["spec.replicas"]
    assert EMPTY in messages[ME0]
    assert MATCH_LABELS_KEYS in messages[ML]
    assert "resourceName must not be in kubernetes.io" in messages["spec.resourceName"]
    assert NAME_RULE in response["message"]


@pytest.mark.parametrize(
    ("fault", "field_path", "fragment"),
    [
        pytest.param({"strategy": ...}, "spec.strategy", "Required value", id="required"),
        pytest.param({"strategy": "Slices"}, "spec.strategy", "Unsupported value", id="enum"),
        pytest.param({"replicas": "4"}, "spec.replicas", "must be of type integer", id="type"),
    ],
)
def test_cel_rules_wait_for_a_well_typed_object(
    objects: Objects, fault: Json, field_path: str, fragment: str
) -> None:
    """With a field missing, outside its enum or of the wrong type, the apiserver defers every
    CEL rule and says so: such a user meets the CEL messages on the next attempt."""
    too_long = unique_name().ljust(models.POLICY_NAME_MAX_LENGTH + 1, "n")
    faulty = {key: value for key, value in {**CEL_ONLY, **fault}.items() if value is not ...}

    status, response = objects.create(POLICIES, policy(faulty, name=too_long))

    assert_invalid(status, response, field_path=field_path, fragment=fragment)
    assert NOT_CHECKED in response["message"]
    for deferred in (EMPTY, MATCH_LABELS_KEYS, "must not be in kubernetes.io", NAME_RULE):
        assert deferred not in response["message"]


# -- GPUSharingPolicy: accepted ------------------------------------------------------------------

DEFAULTED_SPEC: Json = {
    "nodeSelector": {},
    "priority": 0,
    "resourceName": models.DEFAULT_RESOURCE_NAME,
    "renameByDefault": False,
    "paused": False,
    "rollout": {
        "maxUnavailable": "10%",
        "canary": 1,
        "failureThreshold": 1,
        "podPolicy": "WaitForPods",
        "eviction": {"timeout": "10m"},
        "progressDeadlineSeconds": 600,
        "cordonDuringChange": False,
    },
    "backend": "DevicePlugin",
}
DOCUMENTED_EXAMPLE: Json = {
    "nodeSelector": {
        "matchLabels": {"pool": "inference"},
        "matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
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
        "maxUnavailable": "10%",
        "canary": 1,
        "failureThreshold": 1,
        "podPolicy": "WaitForPods",
        "eviction": {"timeout": "10m"},
        "progressDeadlineSeconds": 600,
        "cordonDuringChange": False,
    },
    "backend": "DevicePlugin",
}
EVERY_ROLLOUT_FIELD: Json = {
    "maxUnavailable": 25,
    "canary": 0,
    "failureThreshold": 3,
    "podPolicy": "Evict",
    "eviction": {"timeout": "1h30m", "gracePeriodSeconds": 30},
    "progressDeadlineSeconds": 900,
    "cordonDuringChange": True,
}
ACCEPTED: list[tuple[str, Json, Json]] = [
    # (id, spec sent, spec expected back)
    ("minimal", spec(), {**DEFAULTED_SPEC, **spec()}),
    ("documented-example", DOCUMENTED_EXAMPLE, DOCUMENTED_EXAMPLE),
    ("empty-selector", spec(nodeSelector={}), {**DEFAULTED_SPEC, **spec()}),
    (
        "mps-48",
        spec(strategy="MPS", replicas=48),
        {**DEFAULTED_SPEC, **spec(strategy="MPS", replicas=48)},
    ),
    ("ts-64", spec(replicas=64), {**DEFAULTED_SPEC, **spec(replicas=64)}),
    (
        "exclusive",
        {"strategy": "Exclusive", "nodeSelector": {"matchLabels": {"team": "training"}}},
        {
            **DEFAULTED_SPEC,
            "strategy": "Exclusive",
            "nodeSelector": {"matchLabels": {"team": "training"}},
        },
    ),
    (
        "exclusive-dra",
        {"strategy": "Exclusive", "backend": "DRA"},
        {**DEFAULTED_SPEC, "strategy": "Exclusive", "backend": "DRA"},
    ),
    (
        "mig-dra-mixed-profile",
        {
            "strategy": "MIG",
            "mig": {"profile": "1g.10gb", "migStrategy": "mixed"},
            "backend": "DRA",
        },
        {
            **DEFAULTED_SPEC,
            "strategy": "MIG",
            "mig": {"profile": "1g.10gb", "migStrategy": "mixed"},
            "backend": "DRA",
        },
    ),
    (
        "mig-dra-devices",  # a layout of devices is mixed by default
        {"strategy": "MIG", "mig": {"devices": {"3g.40gb": 1, "1g.10gb": 4}}, "backend": "DRA"},
        {
            **DEFAULTED_SPEC,
            "strategy": "MIG",
            "mig": {"devices": {"3g.40gb": 1, "1g.10gb": 4}},
            "backend": "DRA",
        },
    ),
    (
        "exclusive-replicas-1",
        {"strategy": "Exclusive", "replicas": 1},
        {**DEFAULTED_SPEC, "strategy": "Exclusive", "replicas": 1},
    ),
    (
        "product-exists",
        expression(key=PRODUCT, operator="Exists"),
        {
            **DEFAULTED_SPEC,
            **spec(nodeSelector={"matchExpressions": [{"key": PRODUCT, "operator": "Exists"}]}),
        },
    ),
    ("replicas-2", spec(replicas=2), {**DEFAULTED_SPEC, **spec(replicas=2)}),
    (
        "everything-set",
        spec(
            priority=models.MAX_PRIORITY,
            resourceName="example.com/" + "g" * 51,
            renameByDefault=True,
            failRequestsGreaterThanOne=True,
            paused=True,
            rollout=EVERY_ROLLOUT_FIELD,
            backend="DevicePlugin",
        ),
        spec(
            nodeSelector={},
            backend="DevicePlugin",
            priority=models.MAX_PRIORITY,
            resourceName="example.com/" + "g" * 51,
            renameByDefault=True,
            failRequestsGreaterThanOne=True,
            paused=True,
            rollout=EVERY_ROLLOUT_FIELD,
        ),
    ),
    (
        "rollout-partly-set",
        spec(rollout={"maxUnavailable": "50%"}),
        {
            **DEFAULTED_SPEC,
            **spec(),
            "rollout": {**DEFAULTED_SPEC["rollout"], "maxUnavailable": "50%"},
        },
    ),
    (
        "exists-and-doesnotexist",
        spec(
            nodeSelector={
                "matchExpressions": [
                    {"key": "nvidia.com/gpu.present", "operator": "Exists"},
                    {"key": "nvidia.com/gpu.family", "operator": "DoesNotExist", "values": []},
                    {"key": "pool", "operator": "NotIn", "values": ["training", ""]},
                ]
            }
        ),
        {
            **DEFAULTED_SPEC,
            **spec(
                nodeSelector={
                    "matchExpressions": [
                        {"key": "nvidia.com/gpu.present", "operator": "Exists"},
                        {
                            "key": "nvidia.com/gpu.family",
                            "operator": "DoesNotExist",
                            "values": [],
                        },
                        {"key": "pool", "operator": "NotIn", "values": ["training", ""]},
                    ]
                }
            ),
        },
    ),
    (
        "longest-labels",
        match_labels({PREFIX_253 + "/" + "n" * 63: "v" * 63, "my_label": "", "k" * 63: "A.b-c_9"}),
        {
            **DEFAULTED_SPEC,
            **match_labels(
                {PREFIX_253 + "/" + "n" * 63: "v" * 63, "my_label": "", "k" * 63: "A.b-c_9"}
            ),
        },
    ),
    (
        "mig-one-profile",
        mig_spec(),
        {**DEFAULTED_SPEC, **mig_spec()},
    ),
    (
        "mig-explicit-devices-time-sliced",
        mig_spec(
            mig={
                "devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb+me": 1},
                "migStrategy": "mixed",
                "replicas": 4,
            },
            rollout={"podPolicy": "Evict"},
        ),
        {
            **DEFAULTED_SPEC,
            **mig_spec(
                mig={
                    "devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb+me": 1},
                    "migStrategy": "mixed",
                    "replicas": 4,
                },
            ),
            "rollout": {
                **DEFAULTED_SPEC["rollout"],
                "podPolicy": "Evict",
            },
        },
    ),
    (
        "unknown-field-pruned",
        spec(bogus=1, nodeSelector={"matchLabels": {"pool": "a"}, "extra": True}),
        {**DEFAULTED_SPEC, **spec(nodeSelector={"matchLabels": {"pool": "a"}})},
    ),
]


@pytest.mark.parametrize(
    ("sent", "expected"),
    [pytest.param(sent, expected, id=case_id) for case_id, sent, expected in ACCEPTED],
)
def test_good_policy_is_accepted_with_server_defaults(
    objects: Objects, sent: Json, expected: Json
) -> None:
    body = policy(copy.deepcopy(sent))

    status, response = objects.create(POLICIES, body)

    assert status == 201, json.dumps(response)
    stored = objects.read(f"{POLICIES}/{body['metadata']['name']}")
    assert stored["spec"] == expected
    assert stored["metadata"]["generation"] == 1
    # What the server admitted is what the operator's own model accepts, unchanged.
    parsed = models.GPUSharingPolicySpec.model_validate(stored["spec"])
    assert parsed.model_dump(mode="json", exclude_none=True) == expected


def test_policy_name_at_the_maximum_length_is_accepted(objects: Objects) -> None:
    name = unique_name().ljust(models.POLICY_NAME_MAX_LENGTH, "n")
    assert len(name) == models.POLICY_NAME_MAX_LENGTH

    status, response = objects.create(POLICIES, policy(spec(), name=name))

    assert status == 201, json.dumps(response)


# -- status ------------------------------------------------------------------------------------

POLICY_STATUS: Json = {
    "observedGeneration": 1,
    "matchedNodes": 3,
    "appliedNodes": 2,
    "verifiedNodes": 1,
    "conflictingNodes": 1,
    "unsupportedNodes": 0,
    "gpus": 8,
    "slots": {"capacity": 32, "allocated": 3},
    "slotsSummary": "3/32",
    "configKey": "p-ts4-abcdef",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "AllVerified",
            "message": "",
            "lastTransitionTime": "2025-01-31T12:00:00Z",
            "observedGeneration": 1,
        }
    ],
}
NODE_STATUS: Json = {
    "policy": "batch",
    "strategy": "MPS",
    "configKey": "batch-mps8-abcdef",
    "phase": "Verified",
    "gpus": 8,
    "product": "NVIDIA-H100-80GB-HBM3",
    "memoryMiBPerGPU": 81559,
    "replicas": 8,
    "slots": {"capacity": 64, "allocated": 5},
    "slotsSummary": "5/64",
    "pods": 3,
    "conditions": [],
    "lastTransitionTime": "2025-01-31T12:00:00.5+01:00",
}


def _condition(**overrides: Any) -> Json:
    return {**POLICY_STATUS, "conditions": [{**POLICY_STATUS["conditions"][0], **overrides}]}


@pytest.mark.parametrize(
    ("status_body", "field_path", "fragment"),
    [
        pytest.param(
            {"matchedNodes": -1},
            "status.matchedNodes",
            "greater than or equal to 0",
            id="negative-count",
        ),
        pytest.param(
            {"slots": {"capacity": -1}},
            "status.slots.capacity",
            "greater than or equal to 0",
            id="negative-slots",
        ),
        pytest.param(
            _condition(status="Yes"),
            "status.conditions[0].status",
            'Unsupported value: "Yes"',
            id="condition-status",
        ),
        pytest.param(
            _condition(lastTransitionTime="yesterday"),
            "status.conditions[0].lastTransitionTime",
            "must be of type date-time",
            id="condition-time",
        ),
        pytest.param(
            _condition(reason="not ok"),
            "status.conditions[0].reason",
            "should match",
            id="condition-reason",
        ),
        pytest.param(
            _condition(type="-Ready"),
            "status.conditions[0].type",
            "should match",
            id="condition-type",
        ),
    ],
)
def test_bad_policy_status_is_rejected(
    objects: Objects, status_body: Json, field_path: str, fragment: str
) -> None:
    body = policy(spec())
    assert objects.create(POLICIES, body)[0] == 201
    path = f"{POLICIES}/{body['metadata']['name']}"

    status, response = objects.patch_status(path, status_body)

    assert_invalid(status, response, field_path=field_path, fragment=fragment)
    assert "status" not in objects.read(path)


def test_policy_status_is_written_only_through_the_status_subresource(objects: Objects) -> None:
    body = policy(spec())
    body["status"] = POLICY_STATUS
    assert objects.create(POLICIES, body)[0] == 201
    path = f"{POLICIES}/{body['metadata']['name']}"
    assert "status" not in objects.read(path), "create must not set status"

    status, raw = objects.plane.request(
        "PATCH", path, body={"status": POLICY_STATUS}, content_type=MERGE_PATCH
    )
    assert status == 200, raw
    assert "status" not in objects.read(path), "a patch of the main resource must not set status"

    status, response = objects.patch_status(path, POLICY_STATUS)
    assert status == 200, json.dumps(response)
    stored = objects.read(path)
    assert stored["status"] == POLICY_STATUS
    assert stored["metadata"]["generation"] == 1, "a status write is not a spec change"
    statuses.GPUSharingPolicyStatus.model_validate(stored["status"])


@pytest.mark.parametrize(
    ("status_body", "field_path", "fragment"),
    [
        pytest.param(
            {"phase": "Bogus"}, "status.phase", 'Unsupported value: "Bogus"', id="phase-bogus"
        ),
        pytest.param({"gpus": 1}, "status.phase", "Required value", id="phase-missing"),
        pytest.param(
            {**NODE_STATUS, "strategy": "Slices"},
            "status.strategy",
            'Unsupported value: "Slices"',
            id="strategy",
        ),
        pytest.param(
            {**NODE_STATUS, "replicas": 0},
            "status.replicas",
            "greater than or equal to 1",
            id="replicas-0",
        ),
        pytest.param(
            {**NODE_STATUS, "replicas": 65},
            "status.replicas",
            "less than or equal to 64",
            id="replicas-65",
        ),
        pytest.param(
            {**NODE_STATUS, "pods": -1},
            "status.pods",
            "greater than or equal to 0",
            id="pods-negative",
        ),
        pytest.param(
            {**NODE_STATUS, "gpus": "8"}, "status.gpus", "must be of type integer", id="gpus-string"
        ),
        pytest.param(
            {**NODE_STATUS, "lastTransitionTime": "now"},
            "status.lastTransitionTime",
            "must be of type date-time",
            id="time",
        ),
    ],
)
def test_bad_node_state_status_is_rejected(
    objects: Objects, status_body: Json, field_path: str, fragment: str
) -> None:
    body = node_state()
    assert objects.create(NODE_STATES, body)[0] == 201
    path = f"{NODE_STATES}/{body['metadata']['name']}"

    status, response = objects.patch_status(path, status_body)

    assert_invalid(status, response, field_path=field_path, fragment=fragment)
    assert "status" not in objects.read(path)


@pytest.mark.parametrize(
    "status_body",
    [
        pytest.param(NODE_STATUS, id="full"),
        *(
            pytest.param({"phase": phase.value}, id=f"phase-{phase.value}")
            for phase in models.NodePhase
        ),
    ],
)
def test_good_node_state_status_is_accepted(objects: Objects, status_body: Json) -> None:
    body = node_state()
    assert objects.create(NODE_STATES, body)[0] == 201
    path = f"{NODE_STATES}/{body['metadata']['name']}"

    status, response = objects.patch_status(path, status_body)

    assert status == 200, json.dumps(response)
    stored = objects.read(path)["status"]
    assert stored.items() >= status_body.items()
    parsed = statuses.GPUNodeStateStatus.model_validate(stored)
    assert parsed.phase == status_body["phase"]


# -- kubectl: printer columns, short names, category -------------------------------------------


def _table(output: str) -> tuple[list[str], list[list[str]]]:
    lines = [line.split() for line in output.splitlines() if line.strip()]
    assert lines, f"empty kubectl output: {output!r}"
    return lines[0], lines[1:]


POLICY_HEADERS = [
    "NAME", "STRATEGY", "REPLICAS", "PRIORITY", "MATCHED", "APPLIED", "VERIFIED", "SLOTS",
    "RESOURCES", "ROLLOUT", "READY", "AGE",
]  # fmt: skip
NODE_STATE_HEADERS = ["NAME", "POLICY", "STRATEGY", "PHASE", "GPUS", "SLOTS", "PODS", "AGE"]


@pytest.mark.parametrize("resource", ["gsp", "gpusharingpolicies", "gpusharingpolicy"])
def test_kubectl_get_policy_shows_the_printer_columns(
    objects: Objects, kubectl: Kubectl, resource: str
) -> None:
    body = policy(spec(priority=100))
    name = body["metadata"]["name"]
    assert objects.create(POLICIES, body)[0] == 201
    assert objects.patch_status(f"{POLICIES}/{name}", POLICY_STATUS)[0] == 200

    headers, rows = _table(kubectl("get", resource, name).stdout)

    assert headers == POLICY_HEADERS
    assert len(rows) == 1
    assert rows[0][:-1] == [name, "TimeSlicing", "4", "100", "3", "2", "1", "3/32", "True"]


@pytest.mark.parametrize("resource", ["gns", "gpunodestates", "gpunodestate"])
def test_kubectl_get_node_state_shows_the_printer_columns(
    objects: Objects, kubectl: Kubectl, resource: str
) -> None:
    body = node_state()
    name = body["metadata"]["name"]
    assert objects.create(NODE_STATES, body)[0] == 201
    assert objects.patch_status(f"{NODE_STATES}/{name}", NODE_STATUS)[0] == 200

    headers, rows = _table(kubectl("get", resource, name).stdout)

    assert headers == NODE_STATE_HEADERS
    assert len(rows) == 1
    assert rows[0][:-1] == [name, "batch", "MPS", "Verified", "8", "5/64", "3"]


def test_kubectl_get_gpushare_category_lists_both_kinds(objects: Objects, kubectl: Kubectl) -> None:
    gsp, gns = policy(spec()), node_state()
    assert objects.create(POLICIES, gsp)[0] == 201
    assert objects.create(NODE_STATES, gns)[0] == 201

    listed = kubectl("get", "gpushare", "-o", "name").stdout.split()

    assert f"{models.POLICY_SINGULAR}.{models.GROUP}/{gsp['metadata']['name']}" in listed
    assert f"{models.NODE_STATE_SINGULAR}.{models.GROUP}/{gns['metadata']['name']}" in listed


def test_kubectl_apply_rejects_a_bad_policy_with_the_rule_message(
    kubectl: Kubectl, objects: Objects, tmp_path: Path
) -> None:
    name = unique_name()
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(
        yaml.safe_dump(policy(expression(operator="Exists", values=["a"]), name=name))
    )

    result = kubectl("apply", "-f", str(manifest), check=False)

    assert result.returncode != 0
    assert EMPTY in result.stderr
    assert f"{ME0}: Invalid value" in result.stderr
    assert objects.plane.request("GET", f"{POLICIES}/{name}")[0] == 404


# -- upgrade -----------------------------------------------------------------------------------


def _older_crds(directory: Path) -> None:
    """The CRDs as an older release had them: no `paused` field, fewer descriptions."""
    for source in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(source.read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        schema.pop("description")
        if crd["metadata"]["name"] == POLICY_CRD:
            del schema["properties"]["spec"]["properties"]["paused"]
        (directory / source.name).write_text(yaml.safe_dump(crd))


def _served_crd(plane: ControlPlane, name: str) -> Json:
    status, raw = plane.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    )
    assert status == 200, raw
    return dict(json.loads(raw))


def _admitted_paused(objects: Objects) -> object:
    """What a dry-run create of a paused policy is admitted as (pruned: None).

    While the apiserver swaps the storage of a changed CRD, the answer is the refusal itself.
    """
    status, response = objects.create(POLICIES, policy(spec(paused=True)), dry_run=True)
    if status != 201:
        return f"HTTP {status}: {response.get('message')}"
    return response["spec"].get("paused")


def test_kubectl_apply_upgrades_an_older_copy_of_the_crds(
    control_plane: ControlPlane, kubectl: Kubectl, objects: Objects, tmp_path: Path
) -> None:
    older = tmp_path / "older"
    older.mkdir()
    _older_crds(older)
    try:
        kubectl("apply", "-f", str(older))
        # The older schema is in force: the field it does not know is pruned.
        poll(
            lambda: _admitted_paused(objects),
            until=lambda v: v is None,
            timeout=30,
            what="the older CRD to be served",
        )
        served = _served_crd(control_plane, POLICY_CRD)
        schema = served["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert "paused" not in schema["properties"]["spec"]["properties"]
    finally:
        upgraded = kubectl("apply", "-f", str(CRD_DIR))

    for name in (POLICY_CRD, NODE_STATE_CRD):
        assert f"customresourcedefinition.apiextensions.k8s.io/{name} configured" in (
            upgraded.stdout
        )
    kubectl(
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        f"crd/{POLICY_CRD}",
        f"crd/{NODE_STATE_CRD}",
    )
    poll(
        lambda: _admitted_paused(objects),
        until=lambda v: v is True,
        timeout=30,
        what="the current CRD to be served",
    )
    for path in sorted(CRD_DIR.glob("*.yaml")):
        expected = yaml.safe_load(path.read_text())
        served = _served_crd(control_plane, expected["metadata"]["name"])
        assert served["spec"]["versions"] == expected["spec"]["versions"]
        assert served["spec"]["names"] == expected["spec"]["names"]
    # Applying the same files once more changes nothing.
    again = kubectl("apply", "-f", str(CRD_DIR))
    assert again.stdout.count("unchanged") == 2, again.stdout
    # Leave both kinds served for whatever runs next.
    wait_served(control_plane)

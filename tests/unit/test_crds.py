"""The generated CRDs: committed copies up to date, structural schemas, columns and names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from gpushare_operator.app import crdgen
from gpushare_operator.core.api import crds, models

ROOT = Path(__file__).resolve().parents[2]
CRD_DIRS = [ROOT / "crds", ROOT / "charts" / "gpushare-operator" / "crds"]
FILES = {
    "gpushare.dev_gpusharingpolicies.yaml": models.POLICY_PLURAL,
    "gpushare.dev_gpunodestates.yaml": models.NODE_STATE_PLURAL,
}

# What a structural schema node may carry (apiextensions.k8s.io/v1 JSONSchemaProps we use).
ALLOWED_KEYWORDS = {
    "additionalProperties",
    "minProperties",
    "default",
    "description",
    "enum",
    "format",
    "items",
    "maxItems",
    "maxLength",
    "maxProperties",
    "maximum",
    "minItems",
    "minLength",
    "minimum",
    "pattern",
    "properties",
    "required",
    "type",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return crdgen.render_crd_files()


@pytest.fixture(scope="module")
def by_plural() -> dict[str, dict[str, Any]]:
    return {crd["spec"]["names"]["plural"]: crd for crd in crds.build_crds()}


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    root: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return root


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def all_nodes(by_plural: dict[str, dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for plural, crd in by_plural.items():
        for path, node in walk(schema_of(crd)):
            yield f"{plural}:{path}", node


@pytest.mark.parametrize("directory", CRD_DIRS, ids=["crds", "chart"])
def test_committed_crds_are_up_to_date(directory: Path, rendered: dict[str, str]) -> None:
    assert set(rendered) == set(FILES)
    for name, text in rendered.items():
        path = directory / name
        assert path.is_file(), f"{path} is missing: run make crds"
        committed = path.read_text(encoding="utf-8")
        assert committed == text, f"{path} is stale: run make crds"
    stray = {path.name for path in directory.glob("*.yaml")} - set(rendered)
    assert not stray, f"{directory} has CRD files that the models do not make: {stray}"


def test_rendering_is_deterministic_and_plain(rendered: dict[str, str]) -> None:
    assert crdgen.render_crd_files() == rendered
    for text in rendered.values():
        assert text.startswith(crdgen.HEADER)
        # No YAML anchors or aliases, no Python tags: plain data that any tool reads alike.
        assert "&id" not in text
        assert "*id" not in text
        assert "!!python" not in text
    assert list(rendered) == list(FILES)


def test_files_parse_back_to_the_built_crds(
    rendered: dict[str, str], by_plural: dict[str, dict[str, Any]]
) -> None:
    for name, plural in FILES.items():
        assert yaml.safe_load(rendered[name]) == by_plural[plural]


def test_crdgen_writes_every_directory(tmp_path: Path, rendered: dict[str, str]) -> None:
    first, second = tmp_path / "a", tmp_path / "b" / "nested"
    assert crdgen.main([str(first), str(second)]) == 0
    for directory in (first, second):
        written = {path.name: path.read_text(encoding="utf-8") for path in directory.iterdir()}
        assert written == rendered


@pytest.mark.parametrize(
    ("plural", "kind", "short"),
    [
        (models.POLICY_PLURAL, "GPUSharingPolicy", "gsp"),
        (models.NODE_STATE_PLURAL, "GPUNodeState", "gns"),
    ],
)
def test_names_scope_and_version(
    by_plural: dict[str, dict[str, Any]], plural: str, kind: str, short: str
) -> None:
    crd = by_plural[plural]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{plural}.gpushare.dev"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("gpushare.dev", "Cluster")
    assert spec["names"]["kind"] == kind
    assert spec["names"]["listKind"] == f"{kind}List"
    assert spec["names"]["shortNames"] == [short]
    assert spec["names"]["categories"] == ["gpushare"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def columns(crd: dict[str, Any]) -> list[tuple[str, str, str]]:
    (version,) = crd["spec"]["versions"]
    return [(c["name"], c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]


def test_policy_printer_columns(by_plural: dict[str, dict[str, Any]]) -> None:
    assert columns(by_plural[models.POLICY_PLURAL]) == [
        ("Strategy", "string", ".spec.strategy"),
        ("Replicas", "integer", ".spec.replicas"),
        ("Priority", "integer", ".spec.priority"),
        ("Matched", "integer", ".status.matchedNodes"),
        ("Applied", "integer", ".status.appliedNodes"),
        ("Verified", "integer", ".status.verifiedNodes"),
        ("Slots", "string", ".status.slotsSummary"),
        ("Resources", "string", ".status.resourcesSummary"),
        ("Rollout", "string", ".status.rollout.progress"),
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


def test_node_state_printer_columns(by_plural: dict[str, dict[str, Any]]) -> None:
    assert columns(by_plural[models.NODE_STATE_PLURAL]) == [
        ("Policy", "string", ".status.policy"),
        ("Strategy", "string", ".status.strategy"),
        ("Phase", "string", ".status.phase"),
        ("GPUs", "integer", ".status.gpus"),
        ("Slots", "string", ".status.slotsSummary"),
        ("Pods", "integer", ".status.pods"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


def test_printer_columns_point_at_schema_fields(by_plural: dict[str, dict[str, Any]]) -> None:
    for crd in by_plural.values():
        paths = {path for path, _ in walk(schema_of(crd))}
        for name, _, json_path in columns(crd):
            field = json_path.split("[")[0]
            assert field in paths or field == ".metadata.creationTimestamp", name


def test_every_schema_node_is_structural(by_plural: dict[str, dict[str, Any]]) -> None:
    for path, node in all_nodes(by_plural):
        # An int-or-string is the one node the apiserver wants without a type.
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        assert set(node) <= ALLOWED_KEYWORDS, f"{path}: {set(node) - ALLOWED_KEYWORDS}"
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert isinstance(node["additionalProperties"], dict), path
        for rule in node.get("x-kubernetes-validations", []):
            assert set(rule) == {"rule", "message"}, path
            assert rule["message"], path


def test_collections_are_bounded_for_cel_cost(by_plural: dict[str, dict[str, Any]]) -> None:
    # The apiserver estimates the cost of CEL rules from these bounds and refuses a CRD whose
    # rules could cost too much; bounding every list and map keeps every rule estimable.
    for path, node in all_nodes(by_plural):
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_optional_fields_are_plain_not_nullable(by_plural: dict[str, dict[str, Any]]) -> None:
    status = schema_of(by_plural[models.NODE_STATE_PLURAL])["properties"]["status"]
    assert status["properties"]["policy"] == {
        "description": "The policy that governs the node, if any (while Releasing: the one it"
        " leaves).",
        "type": "string",
    }
    assert status["required"] == ["phase"]  # slotsSummary is derived, never required


def test_spec_schema_carries_the_admission_rules(by_plural: dict[str, dict[str, Any]]) -> None:
    root = schema_of(by_plural[models.POLICY_PLURAL])
    assert root["required"] == ["spec"]
    assert root["x-kubernetes-validations"] == [dict(r) for r in crds.POLICY_NAME_RULES]
    spec = root["properties"]["spec"]
    assert spec["required"] == ["strategy"]  # replicas: required by a CEL rule, not Exclusive
    assert spec["x-kubernetes-validations"] == [dict(r) for r in crds.SPEC_RULES]
    fields = spec["properties"]
    assert fields["strategy"]["enum"] == ["TimeSlicing", "MPS", "Exclusive", "MIG"]
    assert (fields["replicas"]["minimum"], fields["replicas"]["maximum"]) == (1, 64)
    assert (fields["priority"]["minimum"], fields["priority"]["maximum"]) == (0, 1_000_000_000)
    assert fields["priority"]["default"] == 0
    resource = fields["resourceName"]
    assert (resource["default"], resource["maxLength"]) == ("nvidia.com/gpu", 63)
    assert resource["x-kubernetes-validations"] == [dict(r) for r in crds.RESOURCE_NAME_RULES]
    selector = fields["nodeSelector"]
    assert selector["default"] == {}
    assert selector["x-kubernetes-map-type"] == "atomic"
    match_labels = selector["properties"]["matchLabels"]
    assert match_labels["x-kubernetes-validations"] == [
        dict(r) for r in (*crds.MATCH_LABELS_RULES, *crds.STABLE_MATCH_LABELS_RULES)
    ]
    assert match_labels["additionalProperties"]["maxLength"] == 63
    requirement = selector["properties"]["matchExpressions"]["items"]
    assert requirement["x-kubernetes-validations"] == [
        dict(r) for r in (*crds.REQUIREMENT_RULES, *crds.STABLE_REQUIREMENT_RULES)
    ]
    assert requirement["required"] == ["key", "operator"]
    assert requirement["properties"]["operator"]["enum"] == [
        "In",
        "NotIn",
        "Exists",
        "DoesNotExist",
    ]
    key = requirement["properties"]["key"]
    assert key["pattern"] == f"^{models.LABEL_KEY_PATTERN}$"
    assert key["maxLength"] == 317
    assert key["x-kubernetes-validations"] == [dict(r) for r in crds.LABEL_KEY_RULES]


def test_conditions_merge_by_type(by_plural: dict[str, dict[str, Any]]) -> None:
    for crd in by_plural.values():
        conditions = schema_of(crd)["properties"]["status"]["properties"]["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map"
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        assert "type" in conditions["items"]["required"]


def test_defaults_in_the_schema_are_the_model_defaults(
    by_plural: dict[str, dict[str, Any]],
) -> None:
    fields = schema_of(by_plural[models.POLICY_PLURAL])["properties"]["spec"]["properties"]
    defaults = {name: node["default"] for name, node in fields.items() if "default" in node}
    spec = models.GPUSharingPolicySpec(strategy=models.SharingStrategy.MPS, replicas=2)
    expected = spec.model_dump(mode="json", exclude_none=True)
    assert defaults == {name: expected[name] for name in defaults}
    assert set(defaults) == set(expected) - {"strategy", "replicas"}


def test_rules_are_embeddable_cel_literals() -> None:
    assert crds.cel_string("a-z") == "'a-z'"
    with pytest.raises(ValueError, match="CEL literal"):
        crds.cel_string("it's")


class _Union(BaseModel):
    value: int | str


class _Negated(BaseModel):
    model_config = ConfigDict(json_schema_extra={"not": {"type": "null"}})

    value: int = 0


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: int = 0


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (_Union, "union of several types"),
        (_Negated, "no structural equivalent"),
        (_Closed, "additionalProperties must be a schema"),
    ],
    ids=["union", "unknown-keyword", "closed-object"],
)
def test_non_structural_models_stop_the_build(model: type[BaseModel], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        crds.structural_schema(model)

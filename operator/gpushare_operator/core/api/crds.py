"""The two CustomResourceDefinitions, built from the pydantic models of ``core.api.models``.

The models are the source: their JSON schema is turned into the structural schema that the
apiserver requires (every node typed, no ``$ref``, no ``anyOf``, no ``title``), and the Kubernetes
extensions that JSON schema has no words for are added here: the CEL rules that mirror the models'
Python checks, and the list and map types that server-side apply merges by. Generating instead of
hand-writing keeps the admission rules and the operator's own validation from drifting apart.

The output is plain data in a fixed key order, so that the rendered files compare byte for byte.
"""

from __future__ import annotations

from typing import Any, Final, TypedDict

from pydantic import BaseModel

from gpushare_operator.core.api import migspec, models, statuses
from gpushare_operator.core.api.celrules import (
    EVICTION_GRACE_PERIOD_RULES as EVICTION_GRACE_PERIOD_RULES,
)
from gpushare_operator.core.api.celrules import EVICTION_TIMEOUT_RULES as EVICTION_TIMEOUT_RULES
from gpushare_operator.core.api.celrules import LABEL_KEY_RULES as LABEL_KEY_RULES
from gpushare_operator.core.api.celrules import MATCH_LABELS_RULES as MATCH_LABELS_RULES
from gpushare_operator.core.api.celrules import MAX_UNAVAILABLE_RULES as MAX_UNAVAILABLE_RULES
from gpushare_operator.core.api.celrules import MIG_DEVICES_RULES as MIG_DEVICES_RULES
from gpushare_operator.core.api.celrules import MIG_RULES as MIG_RULES
from gpushare_operator.core.api.celrules import POLICY_NAME_RULES as POLICY_NAME_RULES
from gpushare_operator.core.api.celrules import REQUIREMENT_RULES as REQUIREMENT_RULES
from gpushare_operator.core.api.celrules import RESOURCE_NAME_RULES as RESOURCE_NAME_RULES
from gpushare_operator.core.api.celrules import SPEC_RULES as SPEC_RULES
from gpushare_operator.core.api.celrules import (
    STABLE_MATCH_LABELS_RULES as STABLE_MATCH_LABELS_RULES,
)
from gpushare_operator.core.api.celrules import STABLE_REQUIREMENT_RULES as STABLE_REQUIREMENT_RULES
from gpushare_operator.core.api.celrules import ValidationRule as ValidationRule
from gpushare_operator.core.api.celrules import cel_string as cel_string

Schema = dict[str, Any]


class PrinterColumn(TypedDict):
    name: str
    type: str
    jsonPath: str


# JSON schema keywords that a structural schema may carry, and those that are dropped as
# meaningless to the apiserver. Anything else stops the build: a keyword that pydantic starts
# emitting must be looked at, not passed on to an apiserver that would refuse or ignore it.
_KEPT: Final = frozenset(
    {
        "additionalProperties",
        "default",
        "description",
        "enum",
        "format",
        "items",
        "maxItems",
        "maxLength",
        "maxProperties",
        "minProperties",
        "maximum",
        "minItems",
        "minLength",
        "minimum",
        "pattern",
        "properties",
        "required",
        "type",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
    }
)
# Kubernetes has no keywords for map keys (propertyNames, patternProperties): they are checked
# by CEL rules instead, and a patternProperties value schema becomes additionalProperties.
_DROPPED: Final = frozenset({"title", "readOnly", "propertyNames", "patternProperties"})


_CONDITIONS: Final[Schema] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}
# Kubernetes extensions per (model, field); a field of None means the model's own node. The
# selector is atomic, as metav1.LabelSelector is, so that server-side apply replaces it whole.
_EXTENSIONS: Final[dict[tuple[type[BaseModel], str | None], Schema]] = {
    (models.LabelSelector, None): {"x-kubernetes-map-type": "atomic"},
    (models.LabelSelector, "matchLabels"): {
        "x-kubernetes-validations": (*MATCH_LABELS_RULES, *STABLE_MATCH_LABELS_RULES)
    },
    (models.LabelSelector, "matchExpressions"): {"x-kubernetes-list-type": "atomic"},
    (models.LabelSelectorRequirement, None): {
        "x-kubernetes-validations": (*REQUIREMENT_RULES, *STABLE_REQUIREMENT_RULES)
    },
    (models.GPUSharingPolicySpec, None): {"x-kubernetes-validations": SPEC_RULES},
    (migspec.MigSpec, None): {"x-kubernetes-validations": MIG_RULES},
    (migspec.MigSpec, "devices"): {"x-kubernetes-validations": MIG_DEVICES_RULES},
    (models.LabelSelectorRequirement, "key"): {"x-kubernetes-validations": LABEL_KEY_RULES},
    (models.LabelSelectorRequirement, "values"): {"x-kubernetes-list-type": "atomic"},
    (models.GPUSharingPolicySpec, "resourceName"): {
        "x-kubernetes-validations": RESOURCE_NAME_RULES
    },
    (statuses.Condition, "type"): {"x-kubernetes-validations": LABEL_KEY_RULES},
    (models.RolloutSpec, "maxUnavailable"): {"x-kubernetes-validations": MAX_UNAVAILABLE_RULES},
    (models.EvictionSpec, "timeout"): {"x-kubernetes-validations": EVICTION_TIMEOUT_RULES},
    (models.EvictionSpec, "gracePeriodSeconds"): {
        "x-kubernetes-validations": EVICTION_GRACE_PERIOD_RULES
    },
    (statuses.GPUSharingPolicyStatus, "conditions"): _CONDITIONS,
    (statuses.GPUNodeStateStatus, "conditions"): _CONDITIONS,
}
_EXTENSIONS_BY_NAME: Final = {
    (model.__name__, field): extension for (model, field), extension in _EXTENSIONS.items()
}


def _column(name: str, type_: str, json_path: str) -> PrinterColumn:
    return {"name": name, "type": type_, "jsonPath": json_path}


_AGE: Final = _column("Age", "date", ".metadata.creationTimestamp")
POLICY_COLUMNS: Final = (
    _column("Strategy", "string", ".spec.strategy"),
    _column("Replicas", "integer", ".spec.replicas"),
    _column("Priority", "integer", ".spec.priority"),
    _column("Matched", "integer", ".status.matchedNodes"),
    _column("Applied", "integer", ".status.appliedNodes"),
    _column("Verified", "integer", ".status.verifiedNodes"),
    _column("Slots", "string", ".status.slotsSummary"),
    _column("Resources", "string", ".status.resourcesSummary"),
    _column("Rollout", "string", ".status.rollout.progress"),
    _column("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
    _AGE,
)
NODE_STATE_COLUMNS: Final = (
    _column("Policy", "string", ".status.policy"),
    _column("Strategy", "string", ".status.strategy"),
    _column("Phase", "string", ".status.phase"),
    _column("GPUs", "integer", ".status.gpus"),
    _column("Slots", "string", ".status.slotsSummary"),
    _column("Pods", "integer", ".status.pods"),
    _AGE,
)


def _plain(value: Any) -> Any:
    """A fresh copy made of dicts, lists and scalars only.

    The rule tables are shared tuples; a YAML dumper would write tuples as Python objects and
    repeated objects as anchors and aliases, so each CRD gets its own plain data.
    """
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _without_nulls(value: Any) -> Any:
    """A default without its None members: a null field in a default means "absent"."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _flatten(node: Schema, *, defs: Schema) -> tuple[Schema, str]:
    """Resolve `$ref` and the `anyOf: [X, null]` of optional fields into one node.

    Optional fields become plain X rather than `nullable`: the apiserver prunes nulls of
    non-nullable fields, and a merge patch's null deletes the field, which is what None means.
    Keywords beside the reference (a field's description, default) win over the referenced ones.
    Returns the node and the name of the model it is, or "".
    """
    node = dict(node)
    name = ""
    if "anyOf" in node:
        options = [option for option in node.pop("anyOf") if option != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"not structural, a union of several types: {options}")
        inner, name = _flatten(options[0], defs=defs)
        node = {**inner, **node}
    if "$ref" in node:
        name = node.pop("$ref").removeprefix("#/$defs/")
        inner, _ = _flatten(defs[name], defs=defs)
        node = {**inner, **node}
    return node, name


def _keywords(flat: Schema) -> Schema:
    """The node's own keywords, children not yet converted; a null default is no default."""
    unknown = flat.keys() - _KEPT - _DROPPED
    if unknown:
        raise ValueError(f"JSON schema keywords with no structural equivalent: {sorted(unknown)}")
    if not isinstance(flat.get("additionalProperties", {}), dict):
        raise ValueError("additionalProperties must be a schema: unknown fields are pruned")
    out = {key: value for key, value in flat.items() if key in _KEPT}
    if "default" in out:
        out["default"] = _without_nulls(out["default"])
        if out["default"] is None:
            del out["default"]
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise ValueError(f"not structural, a node without a type: {flat}")
    return out


def _convert(node: Schema, *, defs: Schema, model: str = "") -> Schema:
    """One structural node, its children converted, from a pydantic JSON schema node."""
    flat, name = _flatten(node, defs=defs)
    model = name or model
    out = _keywords(flat)
    if "properties" in flat:
        out.pop("required", None)
        out.update(_convert_properties(flat, defs=defs, model=model))
    if "items" in flat:
        out["items"] = _convert(flat["items"], defs=defs)
    # A map: its value schema, whichever way pydantic states it; its keys are CEL's business.
    for values in [flat.get("additionalProperties"), *flat.get("patternProperties", {}).values()]:
        if values is not None:
            out["additionalProperties"] = _convert(values, defs=defs)
    out.update(_EXTENSIONS_BY_NAME.get((model, None), {}))
    return dict(sorted(out.items()))


def _convert_properties(flat: Schema, *, defs: Schema, model: str) -> Schema:
    """An object's properties, in declaration order, and which of them are required.

    Computed fields (pydantic marks them readOnly and required) are derived by the model on
    every write, so they are never required of what a client sends.
    """
    properties: Schema = {}
    for field, child in flat["properties"].items():
        properties[field] = _convert(child, defs=defs)
        properties[field].update(_EXTENSIONS_BY_NAME.get((model, field), {}))
        properties[field] = dict(sorted(properties[field].items()))
    computed = {field for field, child in flat["properties"].items() if child.get("readOnly")}
    required = [field for field in flat.get("required", []) if field not in computed]
    return (
        {"properties": properties, "required": required} if required else {"properties": properties}
    )


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of `model`, with its Kubernetes extensions."""
    raw = model.model_json_schema(mode="serialization")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs=defs, model=model.__name__)


def _check_extensions() -> None:
    """Fail on an extension for a field that no longer exists, rather than drop it silently."""
    for model, field in _EXTENSIONS:
        fields = model.model_fields.keys() | model.model_computed_fields.keys()
        if field is not None and field not in fields:
            raise LookupError(f"extension for a missing field: {model.__name__}.{field}")


def _root_schema(*, description: str, spec: Schema | None, status: Schema) -> Schema:
    properties: Schema = {
        "apiVersion": {"description": "The versioned schema of this object.", "type": "string"},
        "kind": {"description": "The REST resource this object represents.", "type": "string"},
        "metadata": {"type": "object"},
    }
    if spec is not None:
        properties["spec"] = spec
    properties["status"] = status
    root: Schema = {"description": description, "properties": properties, "type": "object"}
    if spec is not None:
        root["required"] = ["spec"]
    return dict(sorted(root.items()))


def _crd(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: tuple[str, ...],
    schema: Schema,
    columns: tuple[PrinterColumn, ...],
) -> Schema:
    names = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": singular,
        "shortNames": list(short_names),
        "categories": list(models.CATEGORIES),
    }
    version = {
        "name": models.VERSION,
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
        "additionalPrinterColumns": [dict(column) for column in columns],
        "schema": {"openAPIV3Schema": schema},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{models.GROUP}"},
        "spec": {"group": models.GROUP, "names": names, "scope": "Cluster", "versions": [version]},
    }


def policy_crd() -> Schema:
    schema = _root_schema(
        description="GPUSharingPolicy shares the GPUs of the nodes it selects: how, and how much.",
        spec=structural_schema(models.GPUSharingPolicySpec),
        status=structural_schema(statuses.GPUSharingPolicyStatus),
    )
    schema["x-kubernetes-validations"] = list(POLICY_NAME_RULES)
    return _crd(
        kind=models.POLICY_KIND,
        plural=models.POLICY_PLURAL,
        singular=models.POLICY_SINGULAR,
        short_names=models.POLICY_SHORT_NAMES,
        schema=schema,
        columns=POLICY_COLUMNS,
    )


def node_state_crd() -> Schema:
    schema = _root_schema(
        description="GPUNodeState reports the GPU-sharing state of the GPU node of the same name.",
        spec=None,
        status=structural_schema(statuses.GPUNodeStateStatus),
    )
    return _crd(
        kind=models.NODE_STATE_KIND,
        plural=models.NODE_STATE_PLURAL,
        singular=models.NODE_STATE_SINGULAR,
        short_names=models.NODE_STATE_SHORT_NAMES,
        schema=schema,
        columns=NODE_STATE_COLUMNS,
    )


def build_crds() -> list[Schema]:
    """The GPUSharingPolicy and GPUNodeState CRDs, as apiextensions.k8s.io/v1 objects."""
    _check_extensions()
    return [_plain(policy_crd()), _plain(node_state_crd())]

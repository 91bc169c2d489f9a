"""The CEL rules (``x-kubernetes-validations``) of the CRDs: the models' Python checks that JSON
schema cannot express, written once so that the apiserver refuses at admission what the operator
would refuse on reading.  ``core.api.crds`` places them in the schema.
"""

from __future__ import annotations

from typing import Final, TypedDict

from gpushare_operator.core.api import migspec, models
from gpushare_operator.core.labelling import rewrittenlabels


class ValidationRule(TypedDict):
    rule: str
    message: str


def cel_string(text: str) -> str:
    """`text` as a CEL single-quoted literal; the model patterns are built to need no escaping."""
    if "'" in text or "\\" in text:
        raise ValueError(f"not embeddable in a CEL literal as is: {text!r}")
    return f"'{text}'"


def _rule(rule: str, message: str) -> ValidationRule:
    return {"rule": rule, "message": message}


_PREFIX_MAX: Final = models.DNS_SUBDOMAIN_MAX_LENGTH
# The key pattern already bounds the name part; the prefix bound needs a rule. `indexOf` is -1
# for a key without a prefix, so the one comparison covers both shapes.
LABEL_KEY_RULES: Final = (
    _rule(
        f"self.indexOf('/') <= {_PREFIX_MAX}",
        f"the prefix of a label key must be at most {_PREFIX_MAX} characters",
    ),
)
# A map's keys have no schema of their own in Kubernetes, so the whole key rule is CEL here.
MATCH_LABELS_RULES: Final = (
    _rule(
        f"self.all(k, k.size() <= {models.LABEL_KEY_MAX_LENGTH}"
        f" && k.indexOf('/') <= {_PREFIX_MAX}"
        f" && k.matches({cel_string('^' + models.LABEL_KEY_PATTERN + '$')}))",
        "matchLabels keys must be valid label keys: an optional DNS subdomain prefix of at most"
        f" {_PREFIX_MAX} characters and '/', then a name of at most"
        f" {models.LABEL_NAME_MAX_LENGTH} alphanumerics, '-', '_' or '.',"
        " starting and ending with an alphanumeric",
    ),
)
REQUIREMENT_RULES: Final = (
    _rule(
        "!(self.operator in ['Exists', 'DoesNotExist'])"
        " || !has(self.values) || size(self.values) == 0",
        "values must be empty when operator is Exists or DoesNotExist",
    ),
    _rule(
        "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
        "values must be non-empty when operator is In or NotIn",
    ),
)
# One rule per label that gpushare's own configuration rewrites, so each refusal names its key.
_PRODUCT: Final = cel_string(rewrittenlabels.GPU_PRODUCT)
_SHARED: Final = cel_string(rewrittenlabels.SHARED_SUFFIX)
_SHARED_PRODUCT_MESSAGE: Final = (
    f"a selector value ending in {rewrittenlabels.SHARED_SUFFIX}"
    f" for {rewrittenlabels.GPU_PRODUCT} is refused: {rewrittenlabels.SHARED_PRODUCT_WHY}"
)
STABLE_MATCH_LABELS_RULES: Final = (
    *(
        _rule(
            f"!({cel_string(key)} in self)",
            f"matchLabels: {rewrittenlabels.rewritten_key_error(key)}",
        )
        for key in rewrittenlabels.REWRITTEN_LABELS
    ),
    _rule(
        f"!({_PRODUCT} in self) || !self[{_PRODUCT}].endsWith({_SHARED})",
        f"matchLabels: {_SHARED_PRODUCT_MESSAGE}",
    ),
)
STABLE_REQUIREMENT_RULES: Final = (
    *(
        _rule(f"self.key != {cel_string(key)}", str(rewrittenlabels.rewritten_key_error(key)))
        for key in rewrittenlabels.REWRITTEN_LABELS
    ),
    _rule(
        f"self.key != {_PRODUCT} || !has(self.values)"
        f" || self.values.all(v, !v.endsWith({_SHARED}))",
        _SHARED_PRODUCT_MESSAGE,
    ),
)
_EXCLUSIVE: Final = cel_string(models.SharingStrategy.EXCLUSIVE)
_MPS: Final = cel_string(models.SharingStrategy.MPS)
_TIME_SLICING: Final = cel_string(models.SharingStrategy.TIME_SLICING)
_MIG: Final = cel_string(models.SharingStrategy.MIG)
_DEFAULT_RESOURCE: Final = cel_string(models.DEFAULT_RESOURCE_NAME)
_PROCEED: Final = cel_string(models.PodPolicy.PROCEED)
_DRA: Final = cel_string(models.Backend.DRA)
_MIXED: Final = cel_string(migspec.MigStrategy.MIXED)
MIG_SPEC_RULES: Final = (
    _rule(
        f"self.strategy != {_MIG} || has(self.mig)",
        "mig is required when strategy is MIG: a profile or devices",
    ),
    _rule(
        f"self.strategy != {_MPS} || !has(self.mig)",
        f"mig is refused with strategy MPS: {models.MPS_ON_MIG}",
    ),
    _rule(
        f"self.strategy == {_MIG} || self.strategy == {_MPS} || !has(self.mig)",
        "mig applies only when strategy is MIG",
    ),
    _rule(
        f"self.strategy != {_MIG} || !has(self.replicas)",
        "replicas must be absent when strategy is MIG: mig.replicas time-slices each MIG device",
    ),
    _rule(
        f"self.strategy != {_MIG} || !has(self.resourceName)"
        f" || self.resourceName == {_DEFAULT_RESOURCE}",
        "resourceName must be left at nvidia.com/gpu when strategy is MIG: the MIG strategy"
        " names the resources (single: nvidia.com/gpu, mixed: nvidia.com/mig-<profile>)",
    ),
    _rule(
        f"self.strategy != {_MIG} || !has(self.rollout) || !has(self.rollout.podPolicy)"
        f" || self.rollout.podPolicy != {_PROCEED}",
        f"rollout.podPolicy Proceed is refused when strategy is MIG: {models.MIG_IDLE}",
    ),
)
SPEC_RULES: Final = (
    _rule(
        f"self.strategy != {_EXCLUSIVE} || !has(self.replicas) || self.replicas == 1",
        "replicas must be absent or 1 when strategy is Exclusive",
    ),
    _rule(
        f"self.strategy == {_EXCLUSIVE} || self.strategy == {_MIG}"
        f" || (has(self.replicas) && self.replicas >= {models.MIN_REPLICAS})",
        f"replicas must be {models.MIN_REPLICAS} to {models.MAX_REPLICAS} when strategy is"
        " TimeSlicing or MPS",
    ),
    _rule(
        f"self.strategy != {_MPS} || !has(self.replicas)"
        f" || self.replicas <= {models.MAX_MPS_REPLICAS}",
        f"replicas must be at most {models.MAX_MPS_REPLICAS} when strategy is MPS: MPS serves"
        f" at most {models.MAX_MPS_REPLICAS} clients per GPU",
    ),
    _rule(
        f"(self.strategy != {_EXCLUSIVE} && self.strategy != {_MIG})"
        " || !has(self.renameByDefault) || !self.renameByDefault",
        "renameByDefault applies only to TimeSlicing and MPS",
    ),
    *MIG_SPEC_RULES,
    _rule(
        f"!has(self.backend) || self.backend != {_DRA} || self.strategy != {_MIG}"
        " || !has(self.mig) || (has(self.mig.migStrategy)"
        f" ? self.mig.migStrategy == {_MIXED} : has(self.mig.devices))",
        models.DRA_MIG_MIXED,
    ),
    _rule(
        f"!has(self.backend) || self.backend != {_DRA} || self.strategy != {_MIG}"
        " || !has(self.mig) || !has(self.mig.replicas)",
        models.DRA_MIG_REPLICAS,
    ),
)
_SINGLE: Final = cel_string(migspec.MigStrategy.SINGLE)
MIG_RULES: Final = (
    _rule(
        "has(self.profile) != has(self.devices)",
        "mig: exactly one of profile and devices must be set",
    ),
    _rule(
        f"!has(self.migStrategy) || self.migStrategy != {_SINGLE} || has(self.profile)",
        migspec.SINGLE_NEEDS_PROFILE,
    ),
)
# A map's keys have no schema of their own: the profile-name pattern is CEL here.
MIG_DEVICES_RULES: Final = (
    _rule(
        f"self.all(k, k.size() <= {migspec.MIG_PROFILE_MAX_LENGTH}"
        f" && k.matches({cel_string('^' + migspec.MIG_PROFILE_PATTERN + '$')}))",
        "mig.devices keys must be MIG profile names such as 1g.10gb, 3g.40gb or 1g.10gb+me",
    ),
)
RESOURCE_NAME_RULES: Final = (
    _rule("!self.contains('kubernetes.io/')", "resourceName must not be in kubernetes.io"),
    _rule("!self.startsWith('requests.')", "resourceName must not start with 'requests.'"),
)
# An int-or-string has no type for OpenAPI to check: both shapes are checked here.
MAX_UNAVAILABLE_RULES: Final = (
    _rule(
        f"type(self) == int ? self >= 1 && self <= {models.MAX_ROLLOUT_NODES}"
        f" : self.matches({cel_string(models.PERCENT_PATTERN)})",
        "maxUnavailable must be a whole number of nodes (at least 1) or a percentage such as 10%",
    ),
)
# The pattern admits the empty text and zero; CEL's duration() reads the same text as Python.
EVICTION_TIMEOUT_RULES: Final = (
    _rule(
        f"self != '' && duration(self) >= duration('{models.MIN_EVICTION_TIMEOUT}s')",
        "eviction.timeout must be a duration of at least 1s, such as 10m, 90s or 1h30m",
    ),
)
# The schema's minimum alone would say "should be greater than or equal to 1": this says why.
EVICTION_GRACE_PERIOD_RULES: Final = (
    _rule(
        f"self >= {models.MIN_GRACE_PERIOD}",
        f"eviction.gracePeriodSeconds must be at least {models.MIN_GRACE_PERIOD}:"
        f" an eviction is never a deletion, and {models.GRACE_PERIOD_WHY}",
    ),
)
# Only a rule at the root of the schema may read metadata.name.
POLICY_NAME_RULES: Final = (
    _rule(
        f"self.metadata.name.size() <= {models.POLICY_NAME_MAX_LENGTH}",
        f"a GPUSharingPolicy name must be at most {models.POLICY_NAME_MAX_LENGTH} characters:"
        " it is part of its device-plugin config key, which is a node label value",
    ),
)

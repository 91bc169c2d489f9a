"""The gpushare.dev/v1alpha1 API: GPUSharingPolicy and GPUNodeState, as pydantic models.

These models are the single source of the API: the CRDs in ``crds/`` are generated from them
(``core.api.crds``), and the operator re-validates what it reads with them. Every admission rule of
the
CRD is therefore checked here too, with a readable message, so that an object which reached the
operator some other way (an older CRD, a status written by hand) fails loudly instead of being
half-understood. What JSON schema can say (bounds, enums, patterns, lengths) is declared here;
``core.api.crds`` adds the Kubernetes extensions: the CEL rules (``x-kubernetes-validations``) that
mirror the checks JSON schema cannot express, and the list and map types.

Attribute names are the Kubernetes camelCase field names (no aliases), so ``model_dump()`` yields
API-shaped dicts; attribute docstrings become the CRD descriptions that ``kubectl explain`` shows.
"""

from __future__ import annotations

import datetime
import enum
import re
from collections.abc import Callable
from typing import Annotated, Final, Literal, Self

from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    model_validator,
)
from pydantic.json_schema import WithJsonSchema

from gpushare_operator.core.api import defaults, durations
from gpushare_operator.core.api.migspec import MigSpec, MigStrategy
from gpushare_operator.core.api.modelbase import ApiModel as ApiModel

# One implementation of the label syntax, shared with the selector compiler.
from gpushare_operator.core.labelling.labels import dns_subdomain_error as dns_subdomain_error
from gpushare_operator.core.labelling.labels import is_valid_label_key as is_valid_label_key
from gpushare_operator.core.labelling.labels import is_valid_label_value as is_valid_label_value
from gpushare_operator.core.labelling.labels import label_key_error as label_key_error
from gpushare_operator.core.labelling.labels import label_value_error as label_value_error
from gpushare_operator.core.labelling.rewrittenlabels import (
    rewritten_key_error,
    shared_product_error,
)

# The one field manager of every write (server-side apply owns fields by it).
FIELD_MANAGER: Final = "gpushare-operator"

GROUP: Final = "gpushare.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CATEGORIES: Final = ("gpushare",)

POLICY_KIND: Final = "GPUSharingPolicy"
POLICY_PLURAL: Final = "gpusharingpolicies"
POLICY_SINGULAR: Final = "gpusharingpolicy"
POLICY_SHORT_NAMES: Final = ("gsp",)

NODE_STATE_KIND: Final = "GPUNodeState"
NODE_STATE_PLURAL: Final = "gpunodestates"
NODE_STATE_SINGULAR: Final = "gpunodestate"
NODE_STATE_SHORT_NAMES: Final = ("gns",)

DEFAULT_RESOURCE_NAME: Final = "nvidia.com/gpu"
MIN_REPLICAS: Final = 2
MAX_REPLICAS: Final = 64
# NVIDIA's MPS documentation: at most 48 client processes per device on Volta and later; the
# device plugin enforces a replica limit for MPS since v0.15.0.
MAX_MPS_REPLICAS: Final = 48
MAX_PRIORITY: Final = 1_000_000_000
# NVIDIA's MPS documentation (and the device plugin's README) on MIG.
MPS_ON_MIG: Final = "Sharing with MPS is currently not supported on devices with MIG enabled"
MIG_IDLE: Final = (
    "the MIG manager can only change the layout of a GPU that runs no process, so a MIG"
    " change waits for the node's GPU pods to go (WaitForPods) or evicts them (Evict)"
)

# A policy's name goes into the `gpushare.dev/policy` node label and into its config key
# (`<name>-ts<replicas>-<6 hex>`, `-mps<replicas>-`, `-excl-`, `-mig[<replicas>]-`), which is
# itself a node label value (63 characters at most); the longest suffix is "-mps48-abcdef" (or
# "-ts64-", "-mig64-": 13 characters), which leaves 50 for the name.
POLICY_NAME_MAX_LENGTH: Final = 50

# Bounds on selector collections: Kubernetes has none, but CEL rules iterate over them, and the
# apiserver refuses a CRD whose rules have an unbounded estimated cost.
MAX_MATCH_LABELS: Final = 64
MAX_MATCH_EXPRESSIONS: Final = 64
MAX_SELECTOR_VALUES: Final = 256
MAX_CONDITIONS: Final = 32
# Nodes a status names (a rollout's waits, a halt's failures): enough to act on, bounded.
MAX_LISTED_NODES: Final = 10

# The patterns below are RE2 and ECMA-262 compatible, written without backslashes (`[.]`, not an
# escaped dot) so that the same text works in Python, in an OpenAPI `pattern` and inside a CEL
# string literal. They are unanchored: anchor them (or use `re.fullmatch`) where they are used.
DNS_SUBDOMAIN_PATTERN: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_SUBDOMAIN_MAX_LENGTH: Final = 253
# The name part of a qualified name (a label key); the repetition bound makes it at most 63 long.
LABEL_NAME_PATTERN: Final = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_NAME_MAX_LENGTH: Final = 63
LABEL_KEY_PATTERN: Final = f"({DNS_SUBDOMAIN_PATTERN}/)?{LABEL_NAME_PATTERN}"
LABEL_KEY_MAX_LENGTH: Final = DNS_SUBDOMAIN_MAX_LENGTH + 1 + LABEL_NAME_MAX_LENGTH
# A label value may be empty; otherwise as a name part, at most 63 long.
LABEL_VALUE_PATTERN: Final = "(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?"
LABEL_VALUE_MAX_LENGTH: Final = 63
RESOURCE_NAME_PATTERN: Final = f"{DNS_SUBDOMAIN_PATTERN}/{DNS_SUBDOMAIN_PATTERN}"
RESOURCE_NAME_MAX_LENGTH: Final = 63

_RFC3339_RE: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")
CONDITION_REASON_PATTERN: Final = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


def resource_name_error(name: str) -> str | None:
    """Why `name` cannot be the shared extended resource, or None.

    The rule is the intersection of what Kubernetes accepts as an extended resource name and what
    the NVIDIA device plugin accepts in its config: `<prefix>/<name>`, at most 63 characters in
    all (the plugin's limit, so the name part and the quota name "requests.<name>" fit too), the
    prefix a DNS subdomain outside the "kubernetes.io/" namespace and not starting "requests.",
    and the name a DNS subdomain as well (the plugin checks it so: lowercase, no '_').
    """
    if len(name) > RESOURCE_NAME_MAX_LENGTH:
        return f"must be at most {RESOURCE_NAME_MAX_LENGTH} characters"
    prefix, slash, rest = name.partition("/")
    if not slash:
        return "must be domain-prefixed: <domain>/<name>"
    if "kubernetes.io/" in name:
        return "must not be in the kubernetes.io namespace"
    if name.startswith("requests."):
        return "must not start with 'requests.'"
    if (error := dns_subdomain_error(prefix)) is not None:
        return f"domain {error}"
    if (error := dns_subdomain_error(rest)) is not None:
        return f"name part {error}"
    return None


def is_valid_resource_name(name: str) -> bool:
    return resource_name_error(name) is None


def is_valid_policy_name(name: str) -> bool:
    """Whether `name` fits everywhere a policy name goes (see POLICY_NAME_MAX_LENGTH)."""
    return len(name) <= POLICY_NAME_MAX_LENGTH and dns_subdomain_error(name) is None


def _checked(check: Callable[[str], str | None], what: str) -> AfterValidator:
    """A pydantic validator raising a readable "<what> 'x' <reason>" from an error function."""

    def validate(value: str) -> str:
        error = check(value)
        if error is not None:
            # The label checks already name what they checked; the others say only why.
            raise ValueError(error if error.startswith(what) else f"{what} {value!r} {error}")
        return value

    return AfterValidator(validate)


def _string_schema(*, pattern: str, max_length: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "maxLength": max_length, "pattern": f"^{pattern}$"})


def _check_rfc3339(value: str) -> str | None:
    if not _RFC3339_RE.fullmatch(value):
        return "must be an RFC 3339 date-time such as 2025-01-31T12:00:00Z"
    try:
        datetime.datetime.fromisoformat(value)
    except ValueError:
        return "is not a real date and time"
    return None


def _int_or_percent(value: int | str) -> int | str:
    if isinstance(value, int):
        if not 1 <= value <= MAX_ROLLOUT_NODES:
            raise ValueError(f"must be 1 to {MAX_ROLLOUT_NODES} nodes, or a percentage")
        return value
    if not re.fullmatch(PERCENT_PATTERN, value):
        raise ValueError(f"{value!r} is neither a whole number of nodes nor a percentage like 10%")
    return value


LabelKey = Annotated[
    str,
    _checked(label_key_error, "label key"),
    _string_schema(pattern=LABEL_KEY_PATTERN, max_length=LABEL_KEY_MAX_LENGTH),
]
LabelValue = Annotated[
    str,
    _checked(label_value_error, "label value"),
    _string_schema(pattern=LABEL_VALUE_PATTERN, max_length=LABEL_VALUE_MAX_LENGTH),
]
ResourceName = Annotated[
    str,
    _checked(resource_name_error, "resourceName"),
    _string_schema(pattern=RESOURCE_NAME_PATTERN, max_length=RESOURCE_NAME_MAX_LENGTH),
]
Rfc3339 = Annotated[
    str,
    _checked(_check_rfc3339, "time"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
# Strict numbers and booleans, as the apiserver has them: "4" is not 4, and true is not 1.
Count = Annotated[StrictInt, Field(ge=0)]
Replicas = Annotated[StrictInt, Field(ge=MIN_REPLICAS, le=MAX_REPLICAS)]
# Exclusive has one slot per GPU; the field allows 1 so that it may say so explicitly.
SpecReplicas = Annotated[StrictInt, Field(ge=1, le=MAX_REPLICAS)]
SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
# A Kubernetes int-or-string: a whole number of nodes, or a percentage such as "10%".
PERCENT_PATTERN: Final = "^(100|[1-9]?[0-9])%$"
MAX_ROLLOUT_NODES: Final = 1_000_000
MAX_PROGRESS_DEADLINE: Final = 2**31 - 1  # a Deployment's progressDeadlineSeconds is an int32
IntOrPercent = Annotated[
    StrictInt | str,
    AfterValidator(lambda value: _int_or_percent(value)),
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]


class SharingStrategy(enum.StrEnum):
    """How a GPU is shared: TimeSlicing (interleaved contexts), MPS, MIG (hardware slices), or
    Exclusive (not at all)."""

    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"
    EXCLUSIVE = "Exclusive"
    # Multi-Instance GPU: hardware slices in the layout of the policy's mig block.
    MIG = "MIG"


class NodePhase(enum.StrEnum):
    """Where a GPU node is on its way to the configuration of the policy that governs it."""

    PENDING = "Pending"
    APPLIED = "Applied"
    VERIFIED = "Verified"
    # Verified for its config once, disagreeing since (a GPU lost, the device plugin down):
    # drift, not a failure of the change.
    DEGRADED = "Degraded"
    MISMATCH = "Mismatch"
    # Our labels are gone; the device plugin is not yet back unshared (the policy it is
    # released from keeps it in its budget meanwhile).
    RELEASING = "Releasing"
    # podPolicy Evict: its pods that must go are being evicted; its config changes once they
    # are gone (it counts against its policy's budget meanwhile).
    EVICTING = "Evicting"
    UNSUPPORTED = "Unsupported"
    UNMANAGED = "Unmanaged"


class LabelSelectorRequirement(ApiModel):
    """A selector requirement: a label key, an operator and values (metav1 shape)."""

    key: LabelKey
    """The label key that the selector applies to."""
    operator: SelectorOperator
    """The key's relationship to the values: In, NotIn, Exists or DoesNotExist."""
    values: Annotated[list[LabelValue], Field(max_length=MAX_SELECTOR_VALUES)] | None = None
    """Label values: non-empty with In and NotIn, empty or absent with Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Self:
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"values must be empty when operator is {self.operator}")
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"values must be non-empty when operator is {self.operator}")
        return self


class LabelSelector(ApiModel):
    """A label selector (metav1.LabelSelector); its requirements are ANDed, and {} matches all."""

    matchLabels: (
        Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_MATCH_LABELS)] | None
    ) = None
    """Labels that must be present with exactly these values."""
    matchExpressions: (
        Annotated[list[LabelSelectorRequirement], Field(max_length=MAX_MATCH_EXPRESSIONS)] | None
    ) = None
    """Label selector requirements, all of which must hold."""


class Backend(enum.StrEnum):
    """What serves a node's GPUs to pods: NVIDIA's device plugin, or its DRA kubelet plugin."""

    DEVICE_PLUGIN = "DevicePlugin"
    DRA = "DRA"


# Why a policy under backend DRA is refused sharing, unless the operator runs with
# --dra-sharing (the CRD cannot see a flag: the chart's ValidatingAdmissionPolicy refuses at
# admission when the flag is off, and the operator refuses what gets past it).
DRA_SHARING_ALPHA: Final = (
    "TimeSlicing and MPS under backend DRA need NVIDIA's DRA driver alpha feature gates"
    " (TimeSlicingSettings, MPSSupport): use backend DevicePlugin for shared GPUs, or run"
    " gpushare with --dra-sharing (chart: draSharing.enabled=true) and the DRA driver with"
    " those gates on"
)
# The validation context key that lifts DRA_SHARING_ALPHA (GPUSharingPolicySpec.model_validate
# with context={DRA_SHARING: True}).
DRA_SHARING: Final = "dra_sharing"
DRA_MIG_MIXED: Final = (
    "MIG under backend DRA takes mig.migStrategy mixed: each profile is served as"
    " nvidia.com/mig-<profile> by a DeviceClass of its own (under single every MIG device would"
    " be nvidia.com/gpu, the name the full-GPU class serves, and an extended resource name lives"
    " on one DeviceClass only)"
)
DRA_MIG_REPLICAS: Final = (
    "mig.replicas under backend DRA is sharing, which needs NVIDIA's DRA driver alpha feature"
    " gates (TimeSlicingSettings): use backend DevicePlugin for time-sliced MIG devices"
)


class PodPolicy(enum.StrEnum):
    """What a change does to a node whose pods hold more slots than the new config has."""

    WAIT_FOR_PODS = "WaitForPods"
    PROCEED = "Proceed"
    EVICT = "Evict"


class RolloutPhase(enum.StrEnum):
    """Where the rollout of a policy's generation stands."""

    PROGRESSING = "Progressing"
    COMPLETE = "Complete"
    HALTED = "Halted"
    WAITING_FOR_PODS = "WaitingForPods"
    PAUSED = "Paused"


MIN_EVICTION_TIMEOUT: Final = 1
MAX_GRACE_PERIOD: Final = 24 * 3600
# An eviction asking for gracePeriodSeconds 0 is a forced deletion: the API server removes the
# pod's record at once, without waiting for the kubelet, while its containers still run; a
# drain would take the record's going for the GPU being free.  So at least 1.
MIN_GRACE_PERIOD: Final = 1
GRACE_PERIOD_WHY: Final = (
    "0 would make the API server drop the pod's record at once while its containers still run"
)


def _eviction_timeout(text: str) -> str:
    if durations.seconds(text) < MIN_EVICTION_TIMEOUT:
        raise ValueError("eviction.timeout must be at least 1s")
    return text


EvictionTimeout = Annotated[
    str,
    AfterValidator(_eviction_timeout),
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": durations.DURATION_MAX_LENGTH,
            "pattern": f"^{durations.DURATION_PATTERN}$",
        }
    ),
]


class EvictionSpec(ApiModel):
    """How podPolicy Evict drains a node's pods before its change."""

    timeout: EvictionTimeout = "10m"
    """How long the pods that must go may take (PodDisruptionBudgets permitting) before the node
    is left on its old config with EvictionBlocked: a duration such as 10m, 90s or 1h30m."""
    # The schema refuses 0 (minimum and a CEL rule saying why); the model reads it, because an
    # older CRD let it in and CRD ratcheting keeps it through later edits: it is read as 1
    # (``grace_period``) and reported (``adjustment``), never made the whole spec invalid.
    gracePeriodSeconds: (
        Annotated[
            StrictInt,
            Field(ge=0, le=MAX_GRACE_PERIOD, json_schema_extra={"minimum": MIN_GRACE_PERIOD}),
        ]
        | None
    ) = None
    """The grace period each eviction asks for, at least 1 (0 would be a forced deletion: the
    API server would drop the pod's record while its containers still run); unset: each pod's
    own terminationGracePeriodSeconds."""

    @property
    def timeout_seconds(self) -> int:
        return durations.seconds(self.timeout)

    @property
    def grace_period(self) -> int | None:
        """What each eviction asks for (``eviction_grace_period``)."""
        return eviction_grace_period(self.gracePeriodSeconds)

    def adjustment(self) -> str | None:
        """Why the evictions ask for another grace period than the spec says; None: they don't."""
        if self.gracePeriodSeconds is None or self.gracePeriodSeconds >= MIN_GRACE_PERIOD:
            return None
        return (
            f"spec.rollout.eviction.gracePeriodSeconds is {self.gracePeriodSeconds}, which an"
            f" older CRD let in: evictions ask for {MIN_GRACE_PERIOD} s instead"
            f" ({GRACE_PERIOD_WHY}). Set it to {MIN_GRACE_PERIOD} or more"
        )


def eviction_grace_period(seconds: int | None) -> int | None:
    """The gracePeriodSeconds an eviction may ask for: ``seconds``, never below
    ``MIN_GRACE_PERIOD`` (an eviction is never a deletion); None: the pod's own."""
    return None if seconds is None else max(MIN_GRACE_PERIOD, seconds)


class RolloutSpec(ApiModel):
    """How a change of the policy reaches its nodes: in budgeted batches, a canary first."""

    maxUnavailable: IntOrPercent = defaults.ROLLOUT_MAX_UNAVAILABLE
    """Nodes that may be between their config label change and Verified at once: a number, or
    a percentage of the nodes the policy governs (rounded down, at least 1)."""
    canary: Annotated[StrictInt, Field(ge=0, le=MAX_ROLLOUT_NODES)] = 1
    """Nodes changed first; the rest waits until they are all Verified. 0: no canary."""
    failureThreshold: Annotated[StrictInt, Field(ge=1, le=MAX_ROLLOUT_NODES)] = 1
    """Nodes of the rollout that may end in Mismatch before it halts."""
    podPolicy: PodPolicy = PodPolicy.WAIT_FOR_PODS
    """WaitForPods: a node whose pods hold more slots than its new config has keeps its config
    until they fit. Proceed: change it anyway. Evict: evict the fewest pods that must go (lowest
    priority, then youngest) through the Eviction API, under their PodDisruptionBudgets, then
    change it."""
    eviction: EvictionSpec = EvictionSpec()
    """With podPolicy Evict: how long the evictions may take, and their grace period."""
    progressDeadlineSeconds: Annotated[StrictInt, Field(ge=1, le=MAX_PROGRESS_DEADLINE)] = (
        defaults.ROLLOUT_PROGRESS_DEADLINE
    )
    """Seconds a rollout with nodes still to change may go without a node moving (one more
    updated, one fewer waiting) before its Progressing condition turns False with
    ProgressDeadlineExceeded, whatever holds it; not counted while paused."""
    cordonDuringChange: StrictBool = False
    """Taint the node NoSchedule (gpushare.dev/reconfiguring) from just before its label
    changes until it is Verified, so no pod is admitted while the device plugin restarts."""


class GPUSharingPolicySpec(ApiModel):
    """How the GPUs of the selected nodes are shared."""

    nodeSelector: LabelSelector = LabelSelector()
    """Which GPU nodes this policy governs; {} selects every GPU node."""
    priority: Annotated[StrictInt, Field(ge=0, le=MAX_PRIORITY)] = 0
    """Where policies overlap, the highest priority wins; ties go to the name that sorts first."""
    strategy: SharingStrategy
    """How a GPU is shared: TimeSlicing, MPS, Exclusive (no sharing), or MIG (hardware slices,
    laid out by spec.mig)."""
    replicas: SpecReplicas | None = None
    """Slots advertised per physical GPU: 2 to 64 (MPS: to 48); absent or 1 for Exclusive;
    absent for MIG (mig.replicas time-slices each MIG device)."""
    mig: MigSpec | None = None
    """With strategy MIG: the layout of every GPU and how its MIG devices are advertised."""
    resourceName: ResourceName = DEFAULT_RESOURCE_NAME
    """The extended resource whose replicas are advertised, e.g. nvidia.com/gpu."""
    renameByDefault: StrictBool = False
    """Advertise the replicas as <resourceName>.shared instead of <resourceName>."""
    failRequestsGreaterThanOne: StrictBool | None = None
    """Refuse pods that request more than one shared slot; unset: the device plugin's default
    for the strategy (true for MPS, false for TimeSlicing)."""
    paused: StrictBool = False
    """Change no node while true; status keeps being reported."""
    rollout: RolloutSpec = RolloutSpec()
    """How a change reaches the nodes: budget, canary, failure threshold, pods, cordon."""
    backend: Backend = Backend.DEVICE_PLUGIN
    """What serves the GPUs: DevicePlugin (NVIDIA's device plugin, configured by a ConfigMap
    key), or DRA (NVIDIA's DRA kubelet plugin publishes ResourceSlices; DeviceClasses with
    extendedResourceName keep nvidia.com/gpu and nvidia.com/mig-<profile> requests working). DRA
    takes Exclusive, and MIG with migStrategy mixed; TimeSlicing and MPS only when gpushare runs
    with --dra-sharing (NVIDIA's driver: alpha).
    Changing it moves the nodes under the rollout, like any other change."""

    @property
    def dra_shared(self) -> bool:
        """TimeSlicing or MPS under backend DRA: NVIDIA's driver shares (an alpha feature)."""
        return self.backend is Backend.DRA and self.strategy in (
            SharingStrategy.TIME_SLICING,
            SharingStrategy.MPS,
        )

    @model_validator(mode="after")
    def _backend_serves_strategy(self, info: ValidationInfo) -> Self:
        if self.backend is Backend.DRA:
            if self.dra_shared and not (info.context or {}).get(DRA_SHARING):
                raise ValueError(DRA_SHARING_ALPHA)
            mig = self.mig
            if self.strategy is SharingStrategy.MIG and mig is not None:
                if mig.strategy is not MigStrategy.MIXED:
                    raise ValueError(DRA_MIG_MIXED)
                if mig.replicas is not None:
                    raise ValueError(DRA_MIG_REPLICAS)
        return self

    @model_validator(mode="after")
    def _replicas_fit_strategy(self) -> Self:
        if self.strategy is SharingStrategy.MIG:
            return self._mig_fits()
        if self.mig is not None:
            if self.strategy is SharingStrategy.MPS:
                raise ValueError(f"mig is refused with strategy MPS: {MPS_ON_MIG}")
            raise ValueError("mig applies only when strategy is MIG")
        if self.strategy is SharingStrategy.EXCLUSIVE:
            if self.replicas not in (None, 1):
                raise ValueError("replicas must be absent or 1 when strategy is Exclusive")
            if self.renameByDefault:
                raise ValueError("renameByDefault applies only to TimeSlicing and MPS")
            return self
        if self.replicas is None or self.replicas < MIN_REPLICAS:
            raise ValueError(
                f"replicas must be {MIN_REPLICAS} to {MAX_REPLICAS} when strategy is"
                f" {self.strategy}"
            )
        if self.strategy is SharingStrategy.MPS and self.replicas > MAX_MPS_REPLICAS:
            raise ValueError(f"replicas must be at most {MAX_MPS_REPLICAS} when strategy is MPS")
        return self

    def _mig_fits(self) -> Self:
        if self.mig is None:
            raise ValueError("mig is required when strategy is MIG: a profile or devices")
        if self.replicas is not None:
            raise ValueError(
                "replicas must be absent when strategy is MIG: mig.replicas time-slices each"
                " MIG device"
            )
        if self.renameByDefault:
            raise ValueError("renameByDefault applies only to TimeSlicing and MPS")
        if self.resourceName != DEFAULT_RESOURCE_NAME:
            raise ValueError(
                "resourceName must be left at nvidia.com/gpu when strategy is MIG: the MIG"
                " strategy names the resources (single: nvidia.com/gpu, mixed:"
                " nvidia.com/mig-<profile>)"
            )
        if self.rollout.podPolicy is PodPolicy.PROCEED:
            raise ValueError(
                f"rollout.podPolicy Proceed is refused when strategy is MIG: {MIG_IDLE}"
            )
        return self

    @model_validator(mode="after")
    def _selector_is_stable(self) -> Self:
        for key in self.nodeSelector.matchLabels or {}:
            if (error := rewritten_key_error(key)) is not None:
                raise ValueError(f"nodeSelector.matchLabels: {error}")
        for key, value in (self.nodeSelector.matchLabels or {}).items():
            if (error := shared_product_error(key, value)) is not None:
                raise ValueError(f"nodeSelector.matchLabels: {error}")
        for expression in self.nodeSelector.matchExpressions or ():
            error = rewritten_key_error(expression.key)
            for value in expression.values or ():
                error = error or shared_product_error(expression.key, value)
            if error is not None:
                raise ValueError(f"nodeSelector.matchExpressions: {error}")
        return self

    @property
    def slots_per_gpu(self) -> int:
        """Replicas per GPU, 1 for Exclusive; for MIG, slots per MIG device (how many MIG
        devices a GPU has depends on its model)."""
        if self.mig is not None:
            return self.mig.slots_per_device
        return self.replicas or 1

    @property
    def fail_requests_greater_than_one(self) -> bool:
        """What is in force: the spec's value, else the device plugin's default."""
        if self.failRequestsGreaterThanOne is not None:
            return self.failRequestsGreaterThanOne
        return self.strategy is SharingStrategy.MPS

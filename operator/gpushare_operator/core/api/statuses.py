"""The status halves of the gpushare.dev/v1alpha1 API, as pydantic models.

Written only by the operator, through the status subresource; like the specs in
``core.api.models``, the CRDs' status schemas are generated from them (``core.api.crds``) and what
the
operator reads back is validated with them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, computed_field
from pydantic.json_schema import WithJsonSchema

from gpushare_operator.core.api.models import (
    CONDITION_REASON_PATTERN,
    MAX_CONDITIONS,
    MAX_LISTED_NODES,
    ApiModel,
    Count,
    LabelKey,
    NodePhase,
    Rfc3339,
    RolloutPhase,
    SharingStrategy,
    SpecReplicas,
)


class Condition(ApiModel):
    """An observation of one aspect of the object's state (metav1.Condition shape)."""

    type: LabelKey
    """The condition type, e.g. Ready."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: True, False or Unknown."""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN)]
    """A CamelCase machine-readable reason for the last transition."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """A human-readable account of the last transition."""
    lastTransitionTime: Rfc3339
    """When the status last changed (RFC 3339)."""
    observedGeneration: Count | None = None
    """The object generation that the condition was set from."""


class ResourceSlots(ApiModel):
    """The slots of one extended resource."""

    capacity: Count = 0
    """Slots of this resource advertised."""
    allocated: Count = 0
    """Slots of this resource requested by running or pending pods."""


class SlotClassSlots(ApiModel):
    """One slot class: the resource a pod requests, what its slot enforces, and how many."""

    resource: Annotated[str, Field(max_length=253)]
    """The extended resource a pod requests one slot of, e.g. nvidia.com/gpu."""
    isolation: Literal["mps", "mig", "exclusive", "none"]
    """What keeps one slot's pod from another's GPU memory: the MPS daemon's per-client limit,
    a MIG slice, a whole GPU, or nothing (time-slicing)."""
    memoryMiB: Count | None = None
    """The GPU memory one slot enforces, in MiB; absent where nothing enforces memory."""
    capacity: Count = 0
    """Slots of this class advertised."""
    allocated: Count = 0
    """Slots of this class requested by running or pending pods."""
    nodes: Count | None = None
    """In a policy's status: the nodes offering this class."""


class Slots(ApiModel):
    """Sharing slots: capacity is GPUs times replicas; allocated is what pods request of them."""

    capacity: Count = 0
    """Slots advertised."""
    allocated: Count = 0
    """Slots requested by running or pending pods; may exceed capacity (overcommitted)."""
    byResource: Annotated[dict[str, ResourceSlots], Field(max_length=16)] | None = None
    """A MIG policy's slots per extended resource (nvidia.com/gpu, or one per profile under
    migStrategy mixed, e.g. nvidia.com/mig-1g.10gb)."""
    classes: Annotated[list[SlotClassSlots], Field(max_length=16)] | None = None
    """Each slot class's size and slots: what a pod asking for GPU memory
    (gpushare.dev/gpu-memory) can get here."""


class _HasSlots(ApiModel):
    slots: Slots = Slots()
    """Sharing slots over the nodes concerned."""

    # A field, not a JSON path expression, because a printer column is a single JSON path.
    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form, unknown to mypy
    @property
    def slotsSummary(self) -> str:
        """Allocated/capacity slots, e.g. 3/16, for display."""
        return f"{self.slots.allocated}/{self.slots.capacity}"


Conditions = Annotated[list[Condition], Field(max_length=MAX_CONDITIONS)]


class RolloutStatus(ApiModel):
    """The rollout of the generation in force: how many of its nodes are where."""

    generation: Count = 0
    """The policy generation being rolled out (the one in force)."""
    state: RolloutPhase = RolloutPhase.PROGRESSING
    """Progressing, Complete, Halted, WaitingForPods or Paused."""
    totalNodes: Count = 0
    """Nodes this rollout concerns: those the policy governs, and those it releases."""
    updatedNodes: Count = 0
    """Nodes on this generation's config and Verified (or released and settled)."""
    unavailableNodes: Count = 0
    """Nodes between their config label change and Verified; Mismatch nodes stay here."""
    waitingNodes: Count = 0
    """Nodes still to be changed: waiting for their turn, or for their pods to fit."""
    failedNodes: Count = 0
    """Nodes on this generation's config that ended in Mismatch."""
    degradedNodes: Count = 0
    """Nodes that were Verified for their config and disagree since (drift, not failure)."""
    waitingOn: Annotated[list[str], Field(max_length=MAX_LISTED_NODES)] = []
    """The nodes the rollout waits on now (at most 10), as the message says."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """What the rollout waits for, in words: never a wait without a reason."""
    startedAt: Rfc3339 | None = None
    """When this generation's rollout started (RFC 3339)."""
    completedAt: Rfc3339 | None = None
    """When it completed (RFC 3339); absent until then."""
    progressedAt: Rfc3339 | None = None
    """When a node of this rollout last moved: one more updated, one fewer waiting (RFC 3339).
    The progress deadline counts from it."""

    @computed_field  # type: ignore[prop-decorator]  # as slotsSummary
    @property
    def progress(self) -> str:
        """Updated/total nodes, e.g. 37/40, for display."""
        return f"{self.updatedNodes}/{self.totalNodes}"


class AppliedSpec(ApiModel):
    """The last valid spec in force, kept so that a new leader facing a broken spec keeps it."""

    generation: Count = 0
    """The policy generation this spec is from."""
    spec: Annotated[
        dict[str, object],
        WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
    ] = {}
    """The spec as the operator understood it."""


class GPUSharingPolicyStatus(_HasSlots):
    """What the policy governs and how far its configuration has got."""

    observedGeneration: Count | None = None
    """The spec generation that this status reflects."""
    matchedNodes: Count = 0
    """GPU nodes that the selector matches."""
    appliedNodes: Count = 0
    """Nodes this policy won that carry its config label."""
    verifiedNodes: Count = 0
    """Applied nodes whose GPU Feature Discovery labels confirm the config."""
    conflictingNodes: Count = 0
    """Matched nodes won by a higher-priority policy."""
    unsupportedNodes: Count = 0
    """Matched nodes this policy would win but cannot work on; the next usable policy governs."""
    gpus: Count = 0
    """Physical GPUs on the nodes this policy governs."""
    configKey: str | None = None
    """The device-plugin config key that this spec renders to."""
    resourcesSummary: str | None = None
    """A MIG policy's allocated/capacity slots per resource, for display."""
    appliedSpec: AppliedSpec | None = None
    """The last valid spec in force, with its generation."""
    rollout: RolloutStatus | None = None
    """How far the rollout of the generation in force has got."""
    conditions: Conditions = []
    """Ready, SelectorValid, Conflicting, Paused and related conditions."""


MAX_LISTED_PODS = 50


class EvictionStatus(ApiModel):
    """podPolicy Evict on this node: whose change, since when, what is left, what blocks it.
    Every leader reads its deadline and its outcome from here."""

    policy: str
    """The policy whose change needs the evictions (for a release: the one the node leaves)."""
    generation: Count = 0
    """That policy's metadata.generation: an edit of its spec arms the evictions again."""
    target: str = ""
    """The config key the node is to take; empty for a release to the default config."""
    startedAt: Rfc3339
    """When the first eviction was asked for; the node is given up at this plus the timeout."""
    pods: Annotated[list[str], Field(max_length=MAX_LISTED_PODS)] = []
    """The pods (namespace/name) still to go, in the order they are evicted."""
    blockedBy: Annotated[list[str], Field(max_length=MAX_LISTED_PODS)] = []
    """PodDisruptionBudgets (namespace/name) that refused an eviction (HTTP 429)."""
    blockedAt: Rfc3339 | None = None
    """When the node was given up (EvictionBlocked): it keeps its old config."""
    reason: Literal["EvictionTimedOut", "NotEvictable"] | None = None
    """Why it was given up: the timeout passed, or pods we never evict are in the way."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """The same, in words."""


class IdleWaitStatus(ApiModel):
    """A MIG change admitted under podPolicy WaitForPods: the node is tainted and waits for its
    GPU pods to end.  The admission lives here, so a new leader keeps it (and the taint)."""

    policy: str = ""
    """The policy whose budget the node is charged to; empty: the cluster-wide budget only."""
    target: str = ""
    """The config key the node is to take; empty for a release to the default config."""
    since: Rfc3339
    """When the node was admitted and began to wait."""


class MigNodeStatus(ApiModel):
    """What a MIG policy wants of the node, and what the MIG manager reports."""

    config: str | None = None
    """The mig-parted config (nvidia.com/mig.config) the node is labelled with, or is to be."""
    layout: str | None = None
    """That layout on every GPU, e.g. 1x 3g.40gb + 1x 2g.20gb."""
    state: str | None = None
    """The MIG manager's nvidia.com/mig.config.state: pending, rebooting, success or failed."""
    slotsPerGPU: Annotated[dict[str, Count], Field(max_length=16)] | None = None
    """Slots one GPU offers, per extended resource (MIG devices times replicas)."""


class GPUNodeStateStatus(_HasSlots):
    """The sharing state of one GPU node."""

    policy: str | None = None
    """The policy that governs the node, if any (while Releasing: the one it leaves)."""
    strategy: SharingStrategy | None = None
    """The governing policy's strategy."""
    configKey: str | None = None
    """The device-plugin config key that the node is labelled with, or is to be."""
    phase: NodePhase
    """Pending, Applied, Verified, Degraded, Mismatch, Releasing, Evicting, Unsupported or
    Unmanaged."""
    gpus: Count = 0
    """Physical GPUs on the node."""
    product: str | None = None
    """The GPU product name from GPU Feature Discovery, without its -SHARED suffix."""
    memoryMiBPerGPU: Count | None = None
    """Memory per GPU in MiB, from GPU Feature Discovery."""
    replicas: SpecReplicas | None = None
    """Replicas per GPU of the governing policy (1 for Exclusive)."""
    configReadyAt: Rfc3339 | None = None
    """When a newly written config key will have reached the node's device plugin, and the
    node may be labelled with it (RFC 3339); set only while the node waits for that."""
    pods: Count = 0
    """Running or pending pods that hold slots on the node."""
    eviction: EvictionStatus | None = None
    """While podPolicy Evict drains the node (phase Evicting), or after it gave up."""
    idleWait: IdleWaitStatus | None = None
    """While a MIG change waits, tainted, for the node's GPU pods to end (WaitForPods)."""
    mig: MigNodeStatus | None = None
    """Strategy MIG: the node's layout and the MIG manager's state."""
    conditions: Conditions = []
    """Conditions of the node's sharing state."""
    lastTransitionTime: Rfc3339 | None = None
    """When the phase last changed (RFC 3339)."""

"""What a GPU node should look like: the labels we own on it, and its GPUNodeState status.

``decide`` is the whole phase machine of a node, as a pure function of the node's record, the
policy that governs it (``choose``: the first usable one by rank), what is known of its config
key, and the clock.  ``render_status`` turns the decision into the status dict that is compared
with what the API server holds.  Nothing rendered changes with the clock alone: a wait is
published once, as the absolute time it ends (``configReadyAt``), so re-plans during it write
nothing.  A node no policy governs any more is released by ``core.phases.releases``; the values
passed between them are in ``core.decisions``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpushare_operator.core import backends, conditions, migphases
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.decisions import NOTHING_PUBLISHED as NOTHING_PUBLISHED
from gpushare_operator.core.decisions import KeyReadiness as KeyReadiness
from gpushare_operator.core.decisions import Labels as Labels
from gpushare_operator.core.decisions import NodeDecision as NodeDecision
from gpushare_operator.core.decisions import Published as Published
from gpushare_operator.core.dra import draclasses
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.phases.releases import disable_mig_first
from gpushare_operator.core.phases.releases import release as released
from gpushare_operator.core.phases.releases import release_blocked as release_blocked
from gpushare_operator.core.phases.releases import release_settled as release_settled
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    POLICY_LABEL,
    NodeRecord,
)
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.slots import slotstatus

# A policy without MIG needs no layout name: nothing to wait for.
MIG_NOT_NEEDED = KeyReadiness(present=True)


def unsupported(record: NodeRecord, policy: CompiledPolicy) -> tuple[str, str] | None:
    """(reason, message) when ``policy`` cannot work on this node; None when it can."""
    return _unsupported(record, policy)


def choose(record: NodeRecord, ranked: Sequence[CompiledPolicy]) -> CompiledPolicy | None:
    """The policy that governs the node: the first of ``ranked`` (winner first) that can work
    there.  When none can, the first, so that the node reports why it is Unsupported."""
    for policy in ranked:
        if _unsupported(record, policy) is None:
            return policy
    return ranked[0] if ranked else None


def _unsupported(record: NodeRecord, policy: CompiledPolicy) -> tuple[str, str] | None:
    count_error = record.gpu_count_error
    if count_error is not None:
        return "InvalidNodeLabel", count_error
    if policy.mig is not None:
        return migphases.unsupported(record, policy)
    # A mixed strategy our own MIG layout brought is no obstacle: MIG is disabled first
    # (``migphases.disable_first``), and MPS's config follows.
    if (
        policy.strategy == "MPS"
        and record.mig_strategy == "mixed"
        and not migphases.carries_ours(record)
    ):
        return (
            "MPSWithMixedMIG",
            "MPS cannot share GPUs on a node with nvidia.com/mig.strategy=mixed",
        )
    return None


def _applied(
    record: NodeRecord,
    policy: CompiledPolicy,
    *,
    applied_since: float | None,
    published: Published,
    now: float,
    mismatch_timeout: float,
    devices: tuple[dra.Device, ...] = (),
) -> NodeDecision:
    """A node that carries its target: confirmed by what its backend's agents publish, or
    waiting for them until ``mismatch_timeout``."""
    backend = backends.of(policy)
    waiting = backend.waiting(
        record, policy, published=published, applied_since=applied_since, now=now
    )
    if waiting is not None:
        return waiting
    check = backend.check(record, policy, devices=devices)
    if not check.problems:
        return NodeDecision(policy, NodePhase.VERIFIED, "Verified", check.verified, None)
    seen = "; ".join(check.problems)
    named = migphases.layout_name(record, policy) if policy.mig is not None else None
    if published.verified(policy, layout=named):
        # Confirmed once for this very config: whatever changed since is drift on the node,
        # not a failure of the change (a lost GPU, the device plugin restarting or down).
        message = f"was Verified for {policy.config_key}; now {seen}"
        return NodeDecision(policy, NodePhase.DEGRADED, "Degraded", message, None)
    since = now if applied_since is None else applied_since
    deadline = since + mismatch_timeout
    if now >= deadline:
        message = f"not confirmed within {mismatch_timeout:.0f} s: {seen}"
        return NodeDecision(policy, NodePhase.MISMATCH, "NotConfirmed", message, None)
    # What is seen is left out until the timeout: it changes as the plugin restarts and GFD
    # relabels, and every change would be one more status write per node of a rollout.
    return NodeDecision(
        policy, NodePhase.APPLIED, "Applied", backend.applied, None, recheck_at=deadline
    )


def shows_target(record: NodeRecord, policy: CompiledPolicy) -> bool:
    """Whether the node carries ``policy``'s labels: its key, its name, and what its backend
    adds (the DRA switch, a MIG layout; for any other, no MIG layout of ours left enabled)."""
    if record.config_label != policy.config_key or record.policy_label != policy.name:
        return False
    return backends.of(policy).shows(record, policy)


def decide(
    *,
    record: NodeRecord,
    policy: CompiledPolicy | None,
    key: KeyReadiness,
    applied_since: float | None,
    now: float,
    mismatch_timeout: float,
    published: Published = NOTHING_PUBLISHED,
    mig_key: KeyReadiness = MIG_NOT_NEEDED,
    backend: dra.Readiness = dra.NOT_DRA,
) -> NodeDecision:
    """The node's phase and the labels we want on it, from current state alone (level-based):
    the node's record, and what its GPUNodeState says (which any leader reads the same).
    ``mig_key``: what is known of the node's MIG layout name in the mig-parted ConfigMap;
    ``backend``: for a DRA policy, its DeviceClass and the node's slice devices."""
    if policy is None or policy.config_key is None:
        return released(record, published=published, now=now, timeout=mismatch_timeout)
    problem = _unsupported(record, policy)
    if problem is not None:
        return NodeDecision(policy, NodePhase.UNSUPPORTED, problem[0], problem[1], None)
    if policy.mig is None and migphases.leaving_mig(record) and not policy.paused:
        return migphases.disable_first(record, policy, published=published, now=now)
    if shows_target(record, policy):
        return _applied(
            record,
            policy,
            applied_since=applied_since,
            published=published,
            now=now,
            mismatch_timeout=mismatch_timeout,
            devices=backend.devices,
        )
    if policy.paused:
        message = "policy is paused: the node is left as it is"
        return NodeDecision(policy, NodePhase.PENDING, "Paused", message, None)
    if not key.present:
        message = f"config key {policy.config_key} is not in the device-plugin ConfigMap yet"
        return NodeDecision(policy, NodePhase.PENDING, "ConfigNotWritten", message, None)
    if policy.dra and backend.conflict is not None:
        return NodeDecision(
            policy, NodePhase.PENDING, "DeviceClassConflict", backend.conflict, None
        )
    if policy.dra and not backend.class_ready:
        message = (
            f"DeviceClass(es) {draclasses.classes_named(policy.resources)} not written yet: without"
            " them no such request would be served on a DRA node"
        )
        return NodeDecision(policy, NodePhase.PENDING, "DeviceClassNotWritten", message, None)
    layout = migphases.layout_name(record, policy)
    if not mig_key.present:
        message = f"MIG layout {layout} is not in the mig-parted ConfigMap yet"
        return NodeDecision(policy, NodePhase.PENDING, "ConfigNotWritten", message, None)
    if mig_key.ready_at is not None and (key.ready_at is None or mig_key.ready_at > key.ready_at):
        key = mig_key  # the later of the two names to propagate
    if key.ready_at is not None and now < key.ready_at:
        message = (
            f"config key {policy.config_key} is new: the kubelet refreshes the device plugin's"
            f" view of the ConfigMap periodically, so the node is labelled from {key.ready_at_wall}"
        )
        return NodeDecision(
            policy,
            NodePhase.PENDING,
            "WaitingForConfigPropagation",
            message,
            None,
            recheck_at=key.ready_at,
            config_ready_at=key.ready_at_wall,
        )
    changer = backends.of(policy)
    labels: Labels = {CONFIG_LABEL: policy.config_key, POLICY_LABEL: policy.name}
    labels.update(changer.target(record, policy))
    message = f"labelling the node with config key {policy.config_key}"
    message += changer.describe(record, policy)
    return NodeDecision(policy, NodePhase.PENDING, "LabelPending", message, labels)


def orphan_released(
    decision: NodeDecision,
    *,
    record: NodeRecord,
    claimants: Collection[str],
    published: Published = NOTHING_PUBLISHED,
    now: float = 0.0,
) -> NodeDecision:
    """An Unsupported node that still carries the labels of a policy no longer claiming it
    (deleted, or its selector moved on) loses them, as a node no policy selects would.

    The policies that do select it cannot work there, so none of them will ever relabel it:
    left alone, it would keep a gone policy's config for good (and that policy's finalizer,
    which waits for its label to go, would never let it be deleted).  Only our own labels
    are removed; nothing about the node's broken GPU stack is written.  A MIG layout of ours
    is disabled first, as on any release: left enabled, it would outlive the labels.
    """
    owner = record.policy_label
    if decision.phase is not NodePhase.UNSUPPORTED or owner is None or owner in claimants:
        return decision
    if migphases.leaving_mig(record):
        return disable_mig_first(record, published=published, now=now)
    return replace(decision, labels={CONFIG_LABEL: None, POLICY_LABEL: None})


def releases(decision: NodeDecision) -> bool:
    """Whether the decision removes our labels from the node."""
    return decision.labels is not None and decision.labels.get(CONFIG_LABEL) is None


def held_back(
    decision: NodeDecision, *, reason: str, message: str, quiet_until: float | None = None
) -> NodeDecision:
    """The same decision without its label change: the rollout holds the node where it is.
    Pending either way: a node to be released is not Unmanaged until our labels are gone.
    ``quiet_until``: the wait is not published before then (it is looked at again then)."""
    return NodeDecision(
        decision.policy,
        NodePhase.PENDING,
        reason,
        message,
        None,
        recheck_at=quiet_until,
        released_from=decision.released_from,
        eviction=decision.eviction,
    )


def shows(record: NodeRecord, policy: CompiledPolicy | None) -> bool:
    """Whether the node carries ``policy``'s labels (for None: none of ours)."""
    if policy is None:
        return record.policy_label is None
    return shows_target(record, policy)


def labels_satisfied(record: NodeRecord, labels: Labels) -> bool:
    """Whether the node already shows what we want (removal = absent)."""
    return all(record.labels.get(key) == value for key, value in labels.items())


def _eviction_blocked(decision: NodeDecision) -> list[conditions.Cond]:
    """Shown only once podPolicy Evict gave the node up: absent otherwise."""
    eviction = decision.eviction or {}
    if not eviction.get("blockedAt"):
        return []
    return [conditions.Cond("EvictionBlocked", "True", decision.reason, decision.message)]


def _degraded(decision: NodeDecision) -> list[conditions.Cond]:
    """Shown only while the node drifts from a config it was confirmed for: absent otherwise."""
    if decision.phase is not NodePhase.DEGRADED:
        return []
    return [conditions.Cond("Degraded", "True", "NoLongerConfirmed", decision.message)]


def _write_failed(problem: str | None) -> list[conditions.Cond]:
    """Shown only while our labels cannot be written (say, RBAC revoked): absent otherwise."""
    if problem is None:
        return []
    return [conditions.Cond("WriteFailed", "True", "LabelWriteRefused", problem)]


def render_status(
    *,
    record: NodeRecord,
    decision: NodeDecision,
    previous: Mapping[str, Any] | None,
    now: str,
    allocated: int = 0,
    allocated_by: Mapping[str, int] | None = None,
    pods: int = 0,
    devices: int | None = None,
    write_problem: str | None = None,
) -> dict[str, Any]:
    """The GPUNodeState status, with transition times kept while nothing changes.
    ``allocated_by``: the slots held per resource (a MIG node shows them per resource).
    ``devices``: the GPUs capacity is counted from, where not GFD's count (a DRA node's
    ResourceSlice)."""
    policy = decision.policy
    gpus = record.gpus or 0
    governed = policy is not None and decision.phase is not NodePhase.UNSUPPORTED
    capacity = 0
    slots: dict[str, Any] = {}
    if governed and policy is not None:
        capacity = (gpus if devices is None else devices) * (policy.replicas or 0)
        if policy.mig is not None:
            per_gpu = policy.mig.slots_per_gpu(record.product)
            capacity = gpus * sum(per_gpu.values())
            held = allocated_by or {}
            names = sorted({*per_gpu, *(r for r, n in held.items() if n)})
            slots["byResource"] = {
                r: {"capacity": gpus * per_gpu.get(r, 0), "allocated": held.get(r, 0)}
                for r in names
            }
        classes = slotstatus.node_classes(record, policy, allocated_by=allocated_by or {})
        if classes is not None:
            slots["classes"] = classes
    previous = previous or {}
    since = previous.get("lastTransitionTime")
    if previous.get("phase") != decision.phase or not since:
        since = now
    ready = "True" if decision.phase is NodePhase.VERIFIED else "False"
    status: dict[str, Any] = {
        "policy": policy.name if policy else decision.released_from,
        "strategy": str(policy.strategy) if policy and policy.strategy else None,
        "configKey": policy.config_key if policy else None,
        "phase": str(decision.phase),
        "gpus": gpus,
        "product": record.product,
        "memoryMiBPerGPU": record.memory_mib,
        "replicas": policy.replicas if policy else None,
        "slots": {"capacity": capacity, "allocated": allocated, **slots},
        "slotsSummary": f"{allocated}/{capacity}",
        "pods": pods,
        "configReadyAt": decision.config_ready_at,
        "eviction": dict(decision.eviction) if decision.eviction else None,
        "idleWait": dict(decision.idle_wait) if decision.idle_wait else None,
        "mig": migphases.status(record, policy) if governed and policy is not None else None,
        "conditions": conditions.render_conditions(
            [
                conditions.Cond("Ready", ready, decision.reason, decision.message),
                conditions.overcommitted(allocated=allocated, capacity=capacity),
                *_degraded(decision),
                *_eviction_blocked(decision),
                *_write_failed(write_problem),
            ],
            previous=previous.get("conditions"),
            now=now,
        ),
        "lastTransitionTime": since,
    }
    return {k: v for k, v in status.items() if v is not None}

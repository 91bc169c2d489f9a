"""What a MIG policy needs of a node, and what the node must show before it counts as Verified.

A MIG layout is applied by the GPU Operator's MIG manager (NVIDIA/mig-parted
``cmd/nvidia-mig-manager``), which reads the mig-parted config that the node's
``nvidia.com/mig.config`` label names and reports in ``nvidia.com/mig.config.state``: ``pending``
while it works (it pauses the device plugin and GPU Feature Discovery meanwhile, setting their
``nvidia.com/gpu.deploy.*`` labels to ``paused-for-mig-change``), ``rebooting`` when the GPUs
need a reset by reboot, then ``success`` or ``failed``.  Only after ``success`` do GFD and the
device plugin (restarted on the new layout) say what is there: under ``single``
``nvidia.com/mig.strategy=single`` and every MIG device as ``nvidia.com/gpu``; under ``mixed``
a ``nvidia.com/mig-<profile>.count`` label and a ``nvidia.com/mig-<profile>`` resource per
profile (k8s-device-plugin ``internal/lm/mig-strategy.go``, ``internal/rm``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.decisions import Labels, NodeDecision, Published
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.labelling.rewrittenlabels import mig_profile_of
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    GPU_PRODUCT,
    MIG_CAPABLE,
    MIG_CONFIG_LABEL,
    MIG_STRATEGY,
    POLICY_LABEL,
    NodeRecord,
)
from gpushare_operator.core.records.policies import CompiledPolicy

MIG_CHANGING: Final = "MIGChanging"  # the reason of a node whose MIG manager is at work
DISABLING: Final = "DisablingMIG"  # the reason of a node whose MIG goes off first
DISABLE_FAILED: Final = "MIGDisableFailed"  # the MIG manager could not disable MIG
# How long after our label a `failed` may still be the last layout's: the MIG manager takes a
# new label up (state pending) within a second of seeing it.
STALE_STATE: Final = 5.0
SUCCESS: Final = "success"
FAILED: Final = "failed"
PENDING: Final = "pending"
REBOOTING: Final = "rebooting"
PAUSED: Final = "paused-for-mig-change"
DEPLOY_PREFIX: Final = "nvidia.com/gpu.deploy."
MIG_DEVICE_PREFIX: Final = "nvidia.com/mig-"


def unsupported(record: NodeRecord, policy: CompiledPolicy) -> tuple[str, str] | None:
    """(reason, message) when the MIG policy cannot work on this node; None when it can."""
    mig = policy.mig
    if mig is None:
        return None
    if record.mig_config_owners:
        owners = ", ".join(record.mig_config_owners)
        return (
            "MIGConfigOwnedByOther",
            f"nvidia.com/mig.config is set by field manager {owners}: gpushare never takes over"
            " a MIG layout it did not write (remove the label with that manager to hand it over)",
        )
    if record.labels.get(MIG_CAPABLE) == "false":
        return "MIGNotCapable", "GPU Feature Discovery reports nvidia.com/mig.capable=false"
    product = record.product
    if product is None:
        return "MIGModelUnknown", f"the node has no {GPU_PRODUCT} label to look its GPU up by"
    refusal = mig.refusals.get(product)
    if refusal is not None:
        return "MIGLayoutDoesNotFit", refusal
    if product not in mig.layouts:
        return (
            "MIGModelUnknown",
            f"GPU model {product} is not in NVIDIA's MIG tables (MIG-capable models: "
            f"{', '.join(sorted({*mig.layouts, *mig.refusals}))})",
        )
    return None


def layout_name(record: NodeRecord, policy: CompiledPolicy) -> str | None:
    """The mig-parted config the node's label must name under ``policy``; None for a policy
    that is not MIG (or a model it cannot fit)."""
    if policy.mig is None:
        return None
    return policy.mig.names.get(record.product or "")


def changes_mig(
    record: NodeRecord,
    policy: CompiledPolicy | None,
    *,
    layouts: Mapping[str, migconfigs.MigLayout | None] | None,
) -> bool:
    """Whether moving the node to ``policy`` (None: releasing it) changes its MIG layout:
    enabling, re-laying out or disabling MIG, which the MIG manager can do only on idle GPUs.

    Layouts are compared, not names: a name carries its policy's name (``migconfigs``), and
    the same layout under another policy is only a new label, which the MIG manager takes as
    already applied (``mig-parted assert`` compares the GPUs with the named config's content,
    and an applied config is ``success`` at once: NVIDIA/mig-parted
    ``pkg/mig/reconfigure/reconfigure.go`` ``isConfigAlreadyApplied``).  ``layouts``: the
    mig-parted ConfigMap's names (``cache.mig_config.layouts``); a name not in it is taken to
    name another layout."""
    current = record.mig_config_label
    if record.mig_config_owners:
        current = None  # not ours: we never change it
    wanted = layout_name(record, policy) if policy is not None else None
    if current == migconfigs.ALL_DISABLED:
        current = None
    if wanted == current:
        return False
    if policy is None or policy.mig is None or current is None or wanted is None:
        return True
    known = (layouts or {}).get(current)
    return known is None or known != policy.mig.layouts.get(record.product or "")


def in_force(
    record: NodeRecord, *, layouts: Mapping[str, migconfigs.MigLayout | None] | None
) -> bool:
    """Whether the MIG layout of ours the node's label names (not ``all-disabled``) is what
    its GPUs show: the MIG manager reports ``success`` and is not at work, and GPU Feature
    Discovery shows that layout's devices (under ``single`` its one profile, the only layout
    single has; under ``mixed`` each profile's count).  Such a node has nothing for the MIG
    manager to do, whatever name its label carries."""
    layout = (layouts or {}).get(record.mig_config_label or "")
    gpus = record.gpus or 0
    if layout is None or not carries_ours(record) or not gpus:
        return False
    if record.mig_state != SUCCESS or in_progress(record):
        return False
    if record.mig_strategy == "single":
        shown = mig_profile_of(record.labels.get(GPU_PRODUCT))
        return layout.profiles == (shown,)
    if record.mig_strategy != "mixed":
        return False
    wanted = {f"{MIG_DEVICE_PREFIX}{p}.count": str(n * gpus) for p, n in layout.devices}
    shown_counts = {
        key: value
        for key, value in record.labels.items()
        if key.startswith(MIG_DEVICE_PREFIX) and key.endswith(".count") and value not in ("", "0")
    }
    return shown_counts == wanted


def carries_ours(record: NodeRecord) -> bool:
    """Whether the node's MIG layout label is ours (any value, all-disabled too)."""
    return record.mig_config_label is not None and not record.mig_config_owners


def mig_enabled_by_us(record: NodeRecord) -> bool:
    """Whether the node's label names a MIG layout of ours other than ``all-disabled``: a
    policy that takes the node without MIG must first have MIG disabled."""
    label = record.mig_config_label
    return label is not None and label != migconfigs.ALL_DISABLED and not record.mig_config_owners


def leaving_mig(record: NodeRecord) -> bool:
    """Whether a policy without MIG must wait for MIG to be disabled first: a layout of ours
    is enabled, or ``all-disabled`` (ours) is not applied yet."""
    if record.mig_config_owners or record.mig_config_label is None:
        return False
    return mig_enabled_by_us(record) or not disabled(record)


def disabled(record: NodeRecord) -> bool:
    """Whether the MIG manager has applied ``all-disabled``: it says ``success`` and GPU Feature
    Discovery shows no MIG device any more.  The state alone may be the last layout's
    ``success``, read before the manager even saw our label."""
    if record.mig_config_label != migconfigs.ALL_DISABLED or record.mig_state != SUCCESS:
        return False
    return not shows_mig_devices(record)


def shows_mig_devices(record: NodeRecord) -> bool:
    """Whether GFD reports MIG devices: a single-strategy device product, or a mixed-strategy
    ``nvidia.com/mig-<profile>.count`` above 0."""
    if mig_profile_of(record.labels.get(GPU_PRODUCT)) is not None:
        return True
    return any(
        key.startswith(MIG_DEVICE_PREFIX) and key.endswith(".count") and value not in ("", "0")
        for key, value in record.labels.items()
    )


def in_progress(record: NodeRecord) -> bool:
    """The MIG manager is at work (or the node reboots for it): neither a failure nor drift."""
    if record.mig_state in (PENDING, REBOOTING):
        return True
    return any(
        value == PAUSED for key, value in record.labels.items() if key.startswith(DEPLOY_PREFIX)
    )


def failed(record: NodeRecord) -> bool:
    return record.mig_state == FAILED


def disagreements(
    record: NodeRecord, *, policy: CompiledPolicy | None = None, layout_slots: Mapping[str, int]
) -> list[str]:
    """What the node shows that the MIG layout in force would not.

    ``layout_slots``: resource -> slots per GPU of the layout (``CompiledMig.slots_per_gpu``).
    """
    mig = policy.mig if policy is not None else None
    problems = []
    if record.mig_state != SUCCESS:
        problems.append(f"nvidia.com/mig.config.state is {record.mig_state}, expected success")
    if mig is None:
        return problems or ["not a MIG policy"]
    strategy = str(mig.strategy)
    if record.mig_strategy != strategy:
        problems.append(f"{MIG_STRATEGY} is {record.mig_strategy}, expected {strategy}")
    gpus = record.gpus or 0
    if strategy == "single" and mig_profile_of(record.labels.get(GPU_PRODUCT)) != mig.profiles[0]:
        problems.append(
            f"{GPU_PRODUCT} is {record.labels.get(GPU_PRODUCT)}, expected a"
            f" {mig.profiles[0]} MIG device"
        )
    for resource, per_gpu in sorted(layout_slots.items()):
        allocatable = record.allocatable_of(resource)
        if allocatable != per_gpu * gpus or not gpus:
            problems.append(f"allocatable {resource} is {allocatable}, expected {per_gpu * gpus}")
    if strategy == "mixed":
        for profile in mig.profiles:
            resource = mig.resources[profile]
            label = f"{resource}.count"
            devices = layout_slots.get(resource, 0) // max(mig.replicas, 1)
            shown = record.labels.get(label)
            if shown != str(devices * gpus):
                problems.append(f"{label} is {shown}, expected {devices * gpus}")
    return problems


def runs_layout(
    record: NodeRecord, layout: migconfigs.MigLayout, *, policy: CompiledPolicy
) -> bool:
    """Whether the node shows ``layout`` (one its label names, maybe not ``policy``'s target
    any more) in force under ``policy``'s key: the MIG manager's success, GFD's strategy and
    devices, and allocatable.  A node on its last layout, confirmed, is available."""
    mig = policy.mig
    gpus = record.gpus or 0
    if mig is None or not gpus or record.mig_state != SUCCESS or in_progress(record):
        return False
    strategy = str(mig.strategy)
    if record.mig_strategy != strategy:
        return False
    devices = dict(layout.devices)
    per_device = max(mig.replicas, 1)
    if strategy == "single":
        [profile] = devices if len(devices) == 1 else [None]
        if profile is None or mig_profile_of(record.labels.get(GPU_PRODUCT)) != profile:
            return False
        return record.allocatable_of("nvidia.com/gpu") == devices[profile] * per_device * gpus
    for profile, count in devices.items():
        resource = f"{MIG_DEVICE_PREFIX}{profile}"
        if record.labels.get(f"{resource}.count") != str(count * gpus):
            return False
        if record.allocatable_of(resource) != count * per_device * gpus:
            return False
    return True


def waiting(
    record: NodeRecord,
    policy: CompiledPolicy,
    *,
    published: Published,
    applied_since: float | None,
    now: float,
) -> NodeDecision | None:
    """The MIG manager's own states: ``failed`` fails the change (once it can be this
    layout's: the label may still show the last layout's ``failed`` for a moment after ours);
    while it works (or the node reboots for it) the node is Applied with no deadline, and
    says nothing new."""
    name = layout_name(record, policy)
    since = now if applied_since is None else applied_since
    confirmed = published.verified(policy, layout=name)
    if failed(record) and not confirmed and now < since + STALE_STATE:
        message = f"labelled with {name}; waiting for the MIG manager to take it up"
        return NodeDecision(
            policy, NodePhase.APPLIED, "Applied", message, None, recheck_at=since + STALE_STATE
        )
    if failed(record) and not confirmed:
        message = (
            f"the MIG manager could not apply {name} (nvidia.com/mig.config.state=failed):"
            " see its log on the node; the layout stays as it was"
        )
        return NodeDecision(policy, NodePhase.MISMATCH, "MIGConfigFailed", message, None)
    if in_progress(record):
        message = f"the MIG manager is applying {name}"
        return NodeDecision(policy, NodePhase.APPLIED, MIG_CHANGING, message, None)
    return None


def key_disagreements(record: NodeRecord, sharing: devconfigs.SharingConfig) -> list[str]:
    """A MIG key judged by itself (the node's layout is the MIG manager's to confirm): the
    manager's success, GFD's MIG strategy, and every resource the key advertises there."""
    problems = []
    if record.mig_state != SUCCESS:
        problems.append(f"nvidia.com/mig.config.state is {record.mig_state}, expected success")
    if record.mig_strategy != sharing.mig_strategy:
        problems.append(f"nvidia.com/mig.strategy is {record.mig_strategy}")
    for resource in sharing.mig_resources:
        if not record.allocatable_of(resource):
            problems.append(f"allocatable {resource} is {record.allocatable_of(resource)}")
    return problems


def disable_first(
    record: NodeRecord, policy: CompiledPolicy, *, published: Published, now: float
) -> NodeDecision:
    """A node leaving a MIG layout of ours for a policy without MIG: the MIG manager disables
    MIG first (``all-disabled``), under the config the node runs; the new config follows once
    it reports success."""
    if record.mig_config_label == migconfigs.ALL_DISABLED:
        state = record.mig_state
        message = (
            "waiting for the MIG manager to disable MIG before the new config"
            f" (nvidia.com/mig.config.state={state})"
        )
        return disabling(record, policy, published=published, now=now, message=message)
    labels: Labels = {
        CONFIG_LABEL: record.config_label,
        POLICY_LABEL: record.policy_label,
        MIG_CONFIG_LABEL: migconfigs.ALL_DISABLED,
    }
    message = f"disabling MIG ({migconfigs.ALL_DISABLED}) before config key {policy.config_key}"
    return NodeDecision(policy, NodePhase.PENDING, DISABLING, message, labels)


def disabling(
    record: NodeRecord,
    policy: CompiledPolicy | None,
    *,
    published: Published,
    now: float,
    message: str,
    released_from: str | None = None,
) -> NodeDecision:
    """Our ``all-disabled`` is on the node: Pending until the MIG manager's ``success``, or a
    failure (``Mismatch``, counted against the rollout) once its ``failed`` can be about
    ``all-disabled`` rather than the layout before (``STALE_STATE`` after we began to wait)."""
    if failed(record):
        waited = published.reason == DISABLING and published.since is not None
        stale_until = (published.since or now) + STALE_STATE
        if published.reason == DISABLE_FAILED or (waited and now >= stale_until):
            failure = (
                "the MIG manager could not disable MIG (nvidia.com/mig.config.state=failed for"
                f" {migconfigs.ALL_DISABLED}): see its log on the node; the node keeps its"
                " layout and its config until it succeeds"
            )
            return NodeDecision(
                policy,
                NodePhase.MISMATCH,
                DISABLE_FAILED,
                failure,
                None,
                released_from=released_from,
            )
        return NodeDecision(
            policy,
            NodePhase.PENDING,
            DISABLING,
            message,
            None,
            recheck_at=stale_until if waited else now + STALE_STATE,
            released_from=released_from,
        )
    return NodeDecision(
        policy, NodePhase.PENDING, DISABLING, message, None, released_from=released_from
    )


def status(record: NodeRecord, policy: CompiledPolicy) -> dict[str, Any] | None:
    mig = policy.mig
    layout = mig.layouts.get(record.product or "") if mig is not None else None
    if mig is None or layout is None:
        return None
    status = {
        "config": layout_name(record, policy),
        "layout": miggeometry.describe(layout.as_dict()),
        "state": record.mig_state,
        "slotsPerGPU": mig.slots_per_gpu(record.product),
    }
    return {k: v for k, v in status.items() if v is not None}

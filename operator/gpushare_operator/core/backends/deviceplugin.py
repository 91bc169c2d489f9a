"""The device plugin: a node runs the config its ``nvidia.com/device-plugin.config`` label
names, confirmed by GPU Feature Discovery's sharing labels and kubelet's allocatable."""

from __future__ import annotations

from typing import Final

from gpushare_operator.core import migphases
from gpushare_operator.core.api.models import MIG_IDLE
from gpushare_operator.core.backends.base import Check, Layouts, Rendered
from gpushare_operator.core.decisions import Labels, NodeDecision, Published
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.dra.driver import Device
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy

# Until the device plugin restarts with the node's config and GFD relabels (MIG layouts too).
APPLIED: Final = "label applied; waiting for the device plugin and GPU Feature Discovery to confirm"


class DevicePlugin:
    """Whole GPUs (Exclusive, TimeSlicing, MPS) served by NVIDIA's device plugin."""

    name: Final = "device plugin"
    applied: Final = APPLIED

    def target(self, record: NodeRecord, policy: CompiledPolicy) -> Labels:
        # Off DRA, if the node was on it; a MIG layout of ours (all-disabled by now) is left
        # out of the apply, which drops it; one another manager owns stays, as SSA has it.
        return dra.switch(record, dra=False)

    def describe(self, record: NodeRecord, policy: CompiledPolicy) -> str:
        return ""

    def shows(self, record: NodeRecord, policy: CompiledPolicy) -> bool:
        return dra.shows(record, dra=False) and not migphases.mig_enabled_by_us(record)

    def waiting(
        self,
        record: NodeRecord,
        policy: CompiledPolicy,
        *,
        published: Published,
        applied_since: float | None,
        now: float,
    ) -> NodeDecision | None:
        return None

    def check(
        self, record: NodeRecord, policy: CompiledPolicy, *, devices: tuple[Device, ...]
    ) -> Check:
        assert policy.sharing is not None
        strategy = devconfigs.sharing_strategy_label(policy.sharing)
        resource = devconfigs.advertised_resource(policy.sharing)
        verified = (
            f"GPU Feature Discovery reports {policy.replicas} replicas, {strategy}; kubelet shows"
            f" {record.allocatable_of(resource)} {resource} allocatable"
        )
        return Check(tuple(disagreements(record, policy.sharing)), verified)

    def disrupts(
        self, record: NodeRecord, policy: CompiledPolicy | None, *, layouts: Layouts | None
    ) -> str | None:
        return leaving(record, policy, layouts=layouts)

    def renders(self, policy: CompiledPolicy) -> Rendered:
        return Rendered(config=config_of(policy))


def leaving(
    record: NodeRecord, policy: CompiledPolicy | None, *, layouts: Layouts | None
) -> str | None:
    """What a move to a device-plugin target disrupts: leaving DRA, or a MIG layout."""
    if dra.changes_backend(record, dra=False):
        return dra.BACKEND_IDLE
    if migphases.changes_mig(record, policy, layouts=layouts):
        return MIG_IDLE
    return None


def config_of(policy: CompiledPolicy) -> dict[str, str]:
    """The policy's device-plugin config key and text (every backend has one: on a DRA node
    GPU Feature Discovery still reads it)."""
    if policy.config_key and policy.config_text:
        return {policy.config_key: policy.config_text}
    return {}


def disagreements(record: NodeRecord, sharing: devconfigs.SharingConfig) -> list[str]:
    """What the node shows that ``sharing`` in force would not: GFD's replicas and
    sharing-strategy labels, and kubelet's allocatable of the advertised resource.

    An Exclusive config is confirmed by the absence of sharing labels as well as by GFD's
    explicit ``1`` / ``none``: GFD releases before sharing support wrote neither; the
    allocatable check still proves the GPUs are there, one slot each.
    """
    if sharing.strategy == devconfigs.MIG:
        return migphases.key_disagreements(record, sharing)
    replicas = sharing.replicas if sharing.shared else 1
    strategy = devconfigs.sharing_strategy_label(sharing)
    shared = sharing.shared
    resource = devconfigs.advertised_resource(sharing)
    problems = []
    reported = record.reported_replicas
    if reported != replicas and (shared or reported is not None):
        problems.append(f"nvidia.com/gpu.replicas is {reported}, expected {replicas}")
    reported_strategy = record.sharing_strategy
    if reported_strategy != strategy and (shared or reported_strategy is not None):
        problems.append(
            f"nvidia.com/gpu.sharing-strategy is {reported_strategy}, expected {strategy}"
        )
    allocatable = record.allocatable_of(resource)
    expected = (record.gpus or 0) * replicas
    if allocatable != expected:
        problems.append(f"allocatable {resource} is {allocatable}, expected {expected}")
    return problems


DEVICE_PLUGIN: Final = DevicePlugin()

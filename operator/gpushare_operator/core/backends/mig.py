"""MIG: a node runs the layout its ``nvidia.com/mig.config`` label names (the MIG manager
applies it; ``nvidia.com/mig.config.state`` says how far), and the device plugin serves its MIG
devices, confirmed by GPU Feature Discovery's MIG labels and kubelet's allocatable."""

from __future__ import annotations

from typing import Final

from gpushare_operator.core import migphases
from gpushare_operator.core.api.models import MIG_IDLE
from gpushare_operator.core.backends.base import Check, Layouts, Rendered
from gpushare_operator.core.backends.deviceplugin import APPLIED, config_of, leaving
from gpushare_operator.core.decisions import Labels, NodeDecision, Published
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.dra.driver import Device
from gpushare_operator.core.mig.migconfigs import MigLayout
from gpushare_operator.core.records.nodes import MIG_CONFIG_LABEL, NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy


class Mig:
    """MIG slices laid out by the MIG manager, served by NVIDIA's device plugin."""

    name: Final = "MIG"
    applied: Final = APPLIED

    def target(self, record: NodeRecord, policy: CompiledPolicy) -> Labels:
        return {**dra.switch(record, dra=False), **layout_label(record, policy)}

    def describe(self, record: NodeRecord, policy: CompiledPolicy) -> str:
        name = migphases.layout_name(record, policy)
        return "" if name is None else f" and MIG layout {name}"

    def shows(self, record: NodeRecord, policy: CompiledPolicy) -> bool:
        return dra.shows(record, dra=False) and shows_layout(record, policy)

    def waiting(
        self,
        record: NodeRecord,
        policy: CompiledPolicy,
        *,
        published: Published,
        applied_since: float | None,
        now: float,
    ) -> NodeDecision | None:
        return migphases.waiting(
            record, policy, published=published, applied_since=applied_since, now=now
        )

    def check(
        self, record: NodeRecord, policy: CompiledPolicy, *, devices: tuple[Device, ...]
    ) -> Check:
        assert policy.mig is not None
        slots = policy.mig.slots_per_gpu(record.product)
        problems = migphases.disagreements(record, policy=policy, layout_slots=slots)
        layout = ", ".join(f"{n} x {r}" for r, n in sorted(slots.items()))
        verified = (
            f"the MIG manager applied {migphases.layout_name(record, policy)}; the device plugin"
            f" advertises {layout} per GPU on {record.gpus} GPUs"
        )
        return Check(tuple(problems), verified)

    def disrupts(
        self, record: NodeRecord, policy: CompiledPolicy | None, *, layouts: Layouts | None
    ) -> str | None:
        return leaving(record, policy, layouts=layouts)  # what any device-plugin target says

    def renders(self, policy: CompiledPolicy) -> Rendered:
        return Rendered(config=config_of(policy), layouts=layouts_of(policy))


def layout_label(record: NodeRecord, policy: CompiledPolicy) -> Labels:
    """The MIG layout label the node's GPU model takes under ``policy`` (none if no layout
    fits it: such a node is Unsupported before it is labelled)."""
    name = migphases.layout_name(record, policy)
    return {} if name is None else {MIG_CONFIG_LABEL: name}


def shows_layout(record: NodeRecord, policy: CompiledPolicy) -> bool:
    return record.mig_config_label == migphases.layout_name(record, policy)


def relayout(
    record: NodeRecord, policy: CompiledPolicy | None, *, layouts: Layouts | None
) -> str | None:
    """Why a change of the node's MIG layout needs idle GPUs; None when the layout stays."""
    return MIG_IDLE if migphases.changes_mig(record, policy, layouts=layouts) else None


def layouts_of(policy: CompiledPolicy) -> dict[str, MigLayout]:
    """The mig-parted layouts of a usable MIG policy, by name."""
    if policy.mig is None or not policy.usable:
        return {}
    return dict(policy.mig.entries)


MIG: Final = Mig()

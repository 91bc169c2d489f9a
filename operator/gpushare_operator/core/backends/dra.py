"""DRA: the node's device plugin is switched off and NVIDIA's DRA kubelet plugin on (two
labels, ``core.dra.driver``); confirmed by a ResourceSlice listing the devices GPU Feature
Discovery's
labels promise (full GPUs, or the MIG layout's devices) and no allocatable left from the
device plugin.  Its MIG layout, if any, is the MIG manager's as on the device plugin."""

from __future__ import annotations

from typing import Final

from gpushare_operator.core import migphases
from gpushare_operator.core.backends import mig as mig_backend
from gpushare_operator.core.backends.base import Check, Layouts, Rendered
from gpushare_operator.core.backends.deviceplugin import config_of
from gpushare_operator.core.decisions import Labels, NodeDecision, Published
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.dra.driver import Device
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy


class Dra:
    """Whole GPUs, or a MIG layout's devices, served by NVIDIA's DRA kubelet plugin."""

    name: Final = "DRA"
    applied: Final = f"labels applied; waiting for the {dra.DRIVER} kubelet plugin's ResourceSlice"

    def target(self, record: NodeRecord, policy: CompiledPolicy) -> Labels:
        labels: Labels = dict(dra.ON)
        if policy.mig is not None:
            labels.update(mig_backend.layout_label(record, policy))
        return labels

    def describe(self, record: NodeRecord, policy: CompiledPolicy) -> str:
        text = f" and {dra.DRA_DRIVER_LABEL}=true (backend DRA)"
        if policy.mig is not None:
            text += mig_backend.MIG.describe(record, policy)
        return text

    def shows(self, record: NodeRecord, policy: CompiledPolicy) -> bool:
        if not dra.shows(record, dra=True):
            return False
        if policy.mig is None:
            return not migphases.mig_enabled_by_us(record)
        return mig_backend.shows_layout(record, policy)

    def waiting(
        self,
        record: NodeRecord,
        policy: CompiledPolicy,
        *,
        published: Published,
        applied_since: float | None,
        now: float,
    ) -> NodeDecision | None:
        if policy.mig is None:
            return None
        return mig_backend.MIG.waiting(
            record, policy, published=published, applied_since=applied_since, now=now
        )

    def check(
        self, record: NodeRecord, policy: CompiledPolicy, *, devices: tuple[Device, ...]
    ) -> Check:
        assert policy.sharing is not None
        if policy.mig is not None:
            per_gpu = policy.mig.slots_per_gpu(record.product)
            listed = ", ".join(f"{n} x {r}" for r, n in sorted(per_gpu.items()))
            verified = (
                f"the MIG manager applied {migphases.layout_name(record, policy)}; the"
                f" {dra.DRIVER} ResourceSlice lists {listed} per GPU on {record.gpus} GPUs,"
                " and kubelet none of them from the device plugin"
            )
            problems = dra.mig_disagreements(record, devices, per_gpu=per_gpu)
            return Check(tuple(problems), verified)
        resource = devconfigs.advertised_resource(policy.sharing)
        verified = (
            f"the {dra.DRIVER} ResourceSlice lists {dra.gpu_count(devices)} GPUs; kubelet shows"
            f" no {resource} from the device plugin"
        )
        return Check(tuple(dra.disagreements(record, devices, resource=resource)), verified)

    def disrupts(
        self, record: NodeRecord, policy: CompiledPolicy | None, *, layouts: Layouts | None
    ) -> str | None:
        if dra.changes_backend(record, dra=True):
            return dra.BACKEND_IDLE
        return mig_backend.relayout(record, policy, layouts=layouts)

    def renders(self, policy: CompiledPolicy) -> Rendered:
        return Rendered(
            config=config_of(policy),
            layouts=mig_backend.layouts_of(policy),
            device_classes=policy.resources,
        )


DRA: Final = Dra()

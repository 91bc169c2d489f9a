"""MIG in the plan's terms: a node's layout and its slots by resource, and a MIG node settled.

Pure pieces of ``kubectl gpushare plan`` and ``explain node`` for strategy MIG:

- ``advertised``: the slots a node offers per extended resource under a standing, since a MIG
  layout offers several (``nvidia.com/mig-3g.40gb`` and ``nvidia.com/mig-2g.20gb``), and a
  change to or from MIG swaps one resource for others, which one total would hide;
- ``layout_of``: the layout the status would publish (``status.mig``: the mig-parted config
  name, the layout as people write it), read off the rendered status like the rest;
- ``settle``: the labels and allocatable NVIDIA's agents leave once a MIG layout is in force
  (the MIG manager's ``success``, then GPU Feature Discovery and the device plugin under the
  policy's MIG strategy: ``core.migphases`` says what the operator checks), or once MIG is off
  (``all-disabled``) for a node leaving a layout of ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushare_operator.core import migphases
from gpushare_operator.core.labelling.rewrittenlabels import MIG_INFIX
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.records.nodes import (
    GPU_COUNT,
    GPU_PRODUCT,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    MIG_STRATEGY,
    NVIDIA_RESOURCES,
    NodeRecord,
)
from gpushare_operator.core.records.policies import CompiledPolicy

Slots = tuple[tuple[str, int], ...]  # (resource, slots), by resource name


def advertised(
    record: NodeRecord,
    status: Mapping[str, Any],
    *,
    resource: str,
    governed: bool,
    unsupported: bool,
) -> Slots:
    """The node's slots by resource under the status the operator would render: a governed
    node's from its policy (per resource of a MIG layout), a node no policy governs the
    default config's (one ``nvidia.com/gpu`` per GPU), an Unsupported one what it offers now
    (nothing is changed there)."""
    gpus = int(status.get("gpus") or 0)
    if unsupported:
        return tuple(
            sorted(
                (name, int(quantity))
                for name, quantity in record.allocatable
                if name.startswith(NVIDIA_RESOURCES) and quantity.isdigit() and int(quantity)
            )
        )
    if not governed:
        return ((GPU_RESOURCE, gpus),)
    per_gpu = (status.get("mig") or {}).get("slotsPerGPU")
    if isinstance(per_gpu, Mapping):
        return tuple(sorted((name, gpus * int(n)) for name, n in per_gpu.items()))
    return ((resource, int((status.get("slots") or {}).get("capacity") or 0)),)


def layout_of(status: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(mig-parted config name, layout text) the status publishes; (None, None) for no MIG."""
    mig = status.get("mig") or {}
    return mig.get("config"), mig.get("layout")


def settle(
    labels: dict[str, str],
    resources: dict[str, str],
    *,
    record: NodeRecord,
    policy: CompiledPolicy | None,
) -> bool:
    """Leave ``labels`` and ``resources`` as NVIDIA's agents do once ``policy``'s MIG layout
    is in force, or MIG is off for a node that carried a layout of ours; True if the node is a
    MIG node after it (the caller leaves its resources alone then)."""
    mig = policy.mig if policy is not None else None
    name = migphases.layout_name(record, policy) if policy is not None else None
    if mig is None or name is None:
        if migphases.carries_ours(record):
            _mig_off(labels, resources, record)
        return False
    _mig_off(labels, resources, record)
    gpus = record.gpus or 0
    labels[MIG_CONFIG_LABEL] = name
    labels[MIG_STATE_LABEL] = migphases.SUCCESS
    labels[MIG_STRATEGY] = str(mig.strategy)
    per_gpu = mig.slots_per_gpu(record.product)
    for resource, slots in per_gpu.items():
        resources[resource] = str(gpus * slots)
    layout = mig.layouts[record.product or ""]
    if str(mig.strategy) == "single":
        [(profile, devices)] = layout.devices
        labels[GPU_PRODUCT] = f"{record.product}{MIG_INFIX}{profile}"
        labels[GPU_COUNT] = str(gpus * devices)
    else:
        for profile, devices in layout.devices:
            labels[f"{mig.resources[profile]}.count"] = str(gpus * devices)
    return True


def _mig_off(labels: dict[str, str], resources: dict[str, str], record: NodeRecord) -> None:
    """No MIG device left: whole GPUs under the base product, no MIG resource or count."""
    gpus = record.gpus or 0
    if record.product is not None:
        labels[GPU_PRODUCT] = record.product
    labels[GPU_COUNT] = str(gpus)
    for key in [k for k in labels if k.startswith(migphases.MIG_DEVICE_PREFIX)]:
        del labels[key]
    for key in [k for k in resources if k.startswith(migphases.MIG_DEVICE_PREFIX)]:
        del resources[key]
    if migphases.carries_ours(record):
        labels[MIG_CONFIG_LABEL] = migconfigs.ALL_DISABLED
        labels[MIG_STATE_LABEL] = migphases.SUCCESS
    labels.pop(MIG_STRATEGY, None)

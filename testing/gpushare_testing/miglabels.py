"""GFD and the device plugin on MIG GPUs, as pure functions, under both MIG strategies.

Written from NVIDIA/k8s-device-plugin: ``internal/rm/device_map.go`` (which resources the plugin
registers and when it refuses to start), ``internal/lm/mig-strategy.go`` and
``internal/lm/resource.go`` (GFD's labels).  ``agents`` keeps the rules for GPUs without MIG;
these take over as soon as one GPU of the node has MIG enabled, and add the
``nvidia.com/mig.strategy`` label and the removal of GFD's stale MIG labels in every case.

The plugin (``device_map.go``):

- ``none``: every GPU is a full GPU, MIG or not.
- ``single`` and ``mixed``: a MIG-enabled GPU without MIG devices is an invalid configuration
  and the plugin exits (kubelet crash-loops it).  ``single`` also refuses MIG devices of more
  than one kind, and a node with both MIG-enabled and MIG-disabled GPUs.
- ``single`` serves each MIG device as ``nvidia.com/gpu``; ``mixed`` as
  ``nvidia.com/mig-<profile>``, MIG-disabled GPUs staying ``nvidia.com/gpu``.  A resource named
  in the time-slicing section is served ``replicas`` times (``<name>.shared`` when renamed).
- MPS on MIG devices is refused (the plugin's README: "not supported on devices with MIG
  enabled").

GFD (``mig-strategy.go``, ``resource.go``): ``nvidia.com/mig.strategy`` is the strategy unless
it is ``none``.  MIG-enabled GPUs get full-GPU labels *without* sharing (``gpu.replicas=0``,
``gpu.sharing-strategy=none``, no ``-SHARED``), with the physical count and memory.  Then
``single`` overwrites ``nvidia.com/gpu.product`` with ``<model>-MIG-<profile>``, ``gpu.count``
with the MIG devices, ``gpu.memory`` with the slice's, and adds the slice attributes; an
invalid node gets ``<model>-MIG-INVALID`` with count, replicas and memory ``0``.  ``mixed``
labels each profile as a resource ``nvidia.com/mig-<profile>.{product,count,replicas,
sharing-strategy,memory,slices.gi,slices.ci,...}``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from gpushare_testing.agents import (
    MPS_LABEL,
    PRODUCT_LABEL,
    REPLICAS_LABEL,
    SHARED_SUFFIX,
    STRATEGY_LABEL,
    Sharing,
    gfd_labels,
    plugin_resources,
)
from gpushare_testing.bodyparts import GPU_RESOURCE
from gpushare_testing.migmanager import Layout
from gpushare_testing.migtables import GpuModel

__all__ = [
    "MIG_STRATEGY_LABEL",
    "MigNode",
    "mig_gfd_labels",
    "mig_plugin_resources",
    "plugin_refusal",
    "stale_gfd_labels",
    "strategy_of",
]

MIG_STRATEGY_LABEL: Final = "nvidia.com/mig.strategy"
COUNT_LABEL: Final = "nvidia.com/gpu.count"
MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
_MIG_RESOURCE = "nvidia.com/mig-"
# GFD's labels that only MIG devices have (nvml-mig-device.go GetAttributes), besides memory.
_ATTRIBUTE_SUFFIXES = ("slices.gi", "slices.ci", "multiprocessors", "engines.")
# Further NVML attributes an export may carry, under go-nvml's field names.
_EXTRA_ATTRIBUTES = {
    "multiprocessorCount": "multiprocessors",
    "copyEngineCount": "engines.copy",
    "decoderCount": "engines.decoder",
    "encoderCount": "engines.encoder",
    "jpegCount": "engines.jpeg",
    "ofaCount": "engines.ofa",
}
_MIG_KEY = re.compile(r"nvidia\.com/mig-[^/]+\.[a-z.-]+")


@dataclass(frozen=True, slots=True)
class MigNode:
    """What GFD and the plugin see of a node's GPUs: the model, and each GPU's MIG state."""

    product: str  # GFD's name for the model, as NVML reports it (never a rewritten label)
    memory_mib: int
    layout: Layout
    model: GpuModel | None = None  # NVIDIA's tables for it; None: not a MIG model
    default_strategy: str = "single"  # the GPU Operator's ClusterPolicy mig.strategy

    @property
    def mig_enabled(self) -> bool:
        return any(gpu.enabled for gpu in self.layout)


def strategy_of(sharing: Sharing, node: MigNode) -> str:
    return sharing.mig_strategy or node.default_strategy


def _replicas(sharing: Sharing, resource: str) -> int:
    return dict(sharing.replicated).get(resource, 1)


def _served_name(sharing: Sharing, resource: str) -> str:
    shared = _replicas(sharing, resource) > 1 and sharing.rename_by_default
    return resource + ".shared" if shared else resource


def _single_invalid(node: MigNode) -> str:
    enabled = [gpu for gpu in node.layout if gpu.enabled]
    if not enabled:
        return ""
    if any(not gpu.devices for gpu in enabled):
        return "at least one MIG device is enabled but empty"
    if len(enabled) != len(node.layout):
        return "devices with MIG enabled and disable detected"
    if len({p for gpu in enabled for p in gpu.devices}) > 1:
        return "more than one MIG device type present on node"
    return ""


def plugin_refusal(sharing: Sharing, node: MigNode) -> str:
    """Why the plugin exits with this config on these GPUs (empty: it starts)."""
    strategy = strategy_of(sharing, node)
    if not node.mig_enabled or strategy == "none":
        return ""
    if sharing.replication == "mps" or sharing.strategy == "mps":
        return "sharing with MPS is not supported on devices with MIG enabled"
    if any(gpu.enabled and not gpu.devices for gpu in node.layout):
        return "at least one device with migEnabled=true was not configured correctly"
    return _single_invalid(node) if strategy == "single" else ""


def mig_plugin_resources(
    *, sharing: Sharing, node: MigNode, registered: Collection[str], lost: int = 0
) -> dict[str, str | None] | None:
    """The extended resources kubelet shows once the plugin runs; ``None``: it refuses.

    ``lost`` GPUs (the first ones) have failed their health check: their devices are counted in
    capacity only when ``lost`` is 0, which is how ``NodeAgents`` asks for allocatable.
    """
    if not node.mig_enabled or strategy_of(sharing, node) == "none":
        result = plugin_resources(gpus=len(node.layout), sharing=sharing, registered=registered)
        return _zero_missing(result, registered)
    if plugin_refusal(sharing, node):
        return None
    counts: dict[str, int] = {}
    for index, gpu in enumerate(node.layout):
        if index < lost:
            continue
        if not gpu.enabled:
            counts[GPU_RESOURCE] = counts.get(GPU_RESOURCE, 0) + 1
            continue
        for profile in gpu.devices:
            resource = GPU_RESOURCE if strategy_of(sharing, node) == "single" else _MIG_RESOURCE
            name = resource if resource == GPU_RESOURCE else resource + profile
            counts[name] = counts.get(name, 0) + 1
    served: dict[str, str | None] = {GPU_RESOURCE: None}
    for resource, count in counts.items():
        served[_served_name(sharing, resource)] = str(count * _replicas(sharing, resource))
    return _zero_missing(served, registered)


def _zero_missing(
    result: dict[str, str | None], registered: Collection[str]
) -> dict[str, str | None]:
    """kubelet keeps a registered resource its plugin no longer serves, at ``0``."""
    for resource in registered:
        if result.get(resource) is None:
            result[resource] = "0"
    return result


def _profile_labels(
    key: str, profile: str, count: int, sharing: Sharing | None, node: MigNode
) -> dict[str, str]:
    """resource.go ``NewMIGResourceLabeler``: the labels of one MIG resource ``key``."""
    replicas = 1 if sharing is None else _replicas(sharing, key)
    shared = replicas > 1 and sharing is not None
    renamed = shared and sharing is not None and sharing.rename_by_default
    product = f"{node.product}-MIG-{profile}" + (SHARED_SUFFIX if shared and not renamed else "")
    strategy = sharing.replication if shared and sharing is not None else "none"
    labels = {
        f"{key}.product": product,
        f"{key}.count": str(count),
        f"{key}.replicas": str(replicas),
        f"{key}.sharing-strategy": strategy,
    }
    info = node.model.profiles.get(profile) if node.model is not None else None
    if info is not None:
        labels[f"{key}.memory"] = str(info.memory_mib)
        labels[f"{key}.slices.gi"] = str(info.compute_slices)
        labels[f"{key}.slices.ci"] = str(info.compute_slices)
        for field, suffix in _EXTRA_ATTRIBUTES.items():
            if field in info.extra:
                labels[f"{key}.{suffix}"] = str(info.extra[field])
    return labels


def mig_gfd_labels(labels: Mapping[str, str], *, sharing: Sharing, node: MigNode) -> dict[str, str]:
    """The node's whole label set after one GFD pass (the timestamp left to the caller).

    Keys GFD wrote before and does not write now are absent from the result; the caller removes
    them (``stale_gfd_labels``), as NFD drops the labels GFD stops reporting.
    """
    base = dict(labels)
    if node.product and PRODUCT_LABEL in base:
        base[PRODUCT_LABEL] = node.product  # NVML's name, whatever GFD wrote last
    for key in stale_gfd_labels(base, {}):
        base.pop(key)
    strategy = strategy_of(sharing, node)
    full_gpus_shared = not node.mig_enabled or any(not g.enabled for g in node.layout)
    result = gfd_labels(base, sharing if full_gpus_shared else _unshared(sharing))
    if strategy != "none":
        result[MIG_STRATEGY_LABEL] = strategy
    elif MIG_STRATEGY_LABEL in labels:
        # Real GFD writes no strategy label under `none` (and NFD would drop it); the simulated
        # nodes are registered with the GPU Operator's default (`single`), so the label is left
        # as it was rather than dropped on every node whose key says `none`.
        result[MIG_STRATEGY_LABEL] = labels[MIG_STRATEGY_LABEL]
    if "-MIG-" in labels.get(PRODUCT_LABEL, "") and node.memory_mib:
        # Back from single: the full-GPU labeler writes the physical count and memory again.
        # (It always writes them; the simulator leaves them alone otherwise, so that a test's
        # hand-made count label stays.)
        result[COUNT_LABEL] = str(len(node.layout))
        result[MEMORY_LABEL] = str(node.memory_mib)
    if not node.mig_enabled:
        return result
    result[MPS_LABEL] = "false"
    if not full_gpus_shared:  # NewGPUResourceLabelerWithoutSharing: a nil sharing config
        result[REPLICAS_LABEL] = "0"
        result[STRATEGY_LABEL] = "none"
    result[COUNT_LABEL] = str(len(node.layout))
    result[MEMORY_LABEL] = str(node.memory_mib)
    if strategy == "single":
        result |= _single_labels(sharing, node)
    elif strategy == "mixed":
        counts: dict[str, int] = {}
        for gpu in node.layout:
            for profile in gpu.devices if gpu.enabled else ():
                counts[profile] = counts.get(profile, 0) + 1
        for profile, count in counts.items():
            key = _MIG_RESOURCE + profile
            result |= _profile_labels(key, profile, count, sharing, node)
    return result


def _unshared(sharing: Sharing) -> Sharing:
    """resource.go: MIG-enabled GPUs' full-GPU labels ignore the sharing config."""
    return Sharing(strategy="none", replicas=1, mig_strategy=sharing.mig_strategy)


def _single_labels(sharing: Sharing, node: MigNode) -> dict[str, str]:
    if _single_invalid(node):  # GFD logs the reason; the labels say INVALID
        return {
            PRODUCT_LABEL: f"{node.product}-MIG-INVALID",
            COUNT_LABEL: "0",
            REPLICAS_LABEL: "0",
            MEMORY_LABEL: "0",
        }
    devices = [p for gpu in node.layout for p in gpu.devices]
    return _profile_labels(GPU_RESOURCE, devices[0], len(devices), sharing, node)


def stale_gfd_labels(labels: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """GFD's MIG labels on the node that ``wanted`` no longer has: NFD removes those."""
    stale = []
    for key in labels:
        if key in wanted:
            continue
        mig_resource = _MIG_KEY.fullmatch(key) is not None
        gpu_attribute = key.startswith("nvidia.com/gpu.") and key.removeprefix(
            "nvidia.com/gpu."
        ).startswith(_ATTRIBUTE_SUFFIXES)
        if mig_resource or gpu_attribute:
            stale.append(key)
    return stale

"""Slim Node records: what the operator needs of a Node, and nothing else.

A realistic GPU Node is ~15 KB of JSON and ~54 KiB decoded (managedFields, 40 images,
conditions, nodeInfo).  We keep name, uid, the resourceVersion of the last change that
mattered, labels, two capacities and the allocatable ``nvidia.com/*`` resources (what the
device plugin really advertises, which ``Verified`` checks); every GPU fact is derived from
those on demand.  Label
keys and common values are interned, so 5,000 nodes share one copy of ``nvidia.com/gpu.product``
and of ``NVIDIA-H100-80GB-HBM3``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_operator.core.labelsets import LabelSet
from gpushare_operator.core.rewrittenlabels import base_product

CONFIG_LABEL = "nvidia.com/device-plugin.config"
POLICY_LABEL = "gpushare.dev/policy"
OWNED_LABELS = (CONFIG_LABEL, POLICY_LABEL)

GPU_PRESENT = "nvidia.com/gpu.present"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_MEMORY = "nvidia.com/gpu.memory"
GPU_REPLICAS = "nvidia.com/gpu.replicas"
GPU_SHARING = "nvidia.com/gpu.sharing-strategy"
GFD_TIMESTAMP = "nvidia.com/gfd.timestamp"  # GFD's every labelling pass, in epoch seconds
MIG_STRATEGY = "nvidia.com/mig.strategy"
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
NVIDIA_RESOURCES = "nvidia.com/"

_intern = sys.intern


_MAX_INT32 = 2**31 - 1


def _int_or_none(text: object) -> int | None:
    """A non-negative int32 from a label or quantity; anything else is unusable (None).

    GFD writes small whole numbers; a negative or huge one is a broken label, and passing it on
    would make a status the CRD (and int64 JSON) rejects.
    """
    if not isinstance(text, str):
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 <= value <= _MAX_INT32 else None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """An immutable projection of a Node; shared by every index and snapshot, never copied."""

    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    gpu_capacity: int | None
    shared_capacity: int | None
    # (resource, quantity) of allocatable nvidia.com/* resources, as the API server wrote them.
    allocatable: tuple[tuple[str, str], ...] = ()
    # spec.taints exactly as the API server has them (usually none): a taint patch tests the
    # list it changes, so that another manager's taints are never replaced or reordered.
    taints: tuple[Mapping[str, Any], ...] = ()

    def allocatable_of(self, resource: str) -> int | None:
        """What kubelet says pods may request of ``resource`` now; None when it is absent."""
        for name, quantity in self.allocatable:
            if name == resource:
                return _int_or_none(quantity)
        return None

    @property
    def is_gpu_node(self) -> bool:
        labels = self.labels
        return (
            labels.get(GPU_PRESENT) == "true"
            or GPU_COUNT in labels
            or self.gpu_capacity is not None
            or self.shared_capacity is not None
        )

    @property
    def gpu_count_error(self) -> str | None:
        """Why the GFD count label cannot be used, for a condition; None when it is fine."""
        raw = self.labels.get(GPU_COUNT)
        if raw is None:
            return None
        count = _int_or_none(raw)
        if count is None or count < 0:
            return f"label {GPU_COUNT}={raw!r} is not a non-negative integer"
        return None

    @property
    def reported_replicas(self) -> int | None:
        return _int_or_none(self.labels.get(GPU_REPLICAS))

    @property
    def gpus(self) -> int | None:
        """Physical GPUs: the GFD count label, else advertised capacity ÷ reported replicas."""
        raw = self.labels.get(GPU_COUNT)
        if raw is not None:
            count = _int_or_none(raw)
            return count if count is not None and count >= 0 else None
        advertised = self.gpu_capacity or self.shared_capacity
        if advertised is None:
            return None
        replicas = self.reported_replicas or 1
        return advertised // replicas if replicas > 0 else None

    @property
    def product(self) -> str | None:
        """The GPU product without the ``-SHARED`` suffix GFD adds while sharing is on."""
        return base_product(self.labels.get(GPU_PRODUCT))

    @property
    def memory_mib(self) -> int | None:
        return _int_or_none(self.labels.get(GPU_MEMORY))

    @property
    def sharing_strategy(self) -> str | None:
        return self.labels.get(GPU_SHARING)

    @property
    def mig_strategy(self) -> str | None:
        return self.labels.get(MIG_STRATEGY)

    @property
    def config_label(self) -> str | None:
        return self.labels.get(CONFIG_LABEL)

    @property
    def policy_label(self) -> str | None:
        return self.labels.get(POLICY_LABEL)


def _capacity(status: Mapping[str, Any], resource: str) -> int | None:
    capacity = status.get("capacity")
    if not isinstance(capacity, Mapping):
        return None
    return _int_or_none(capacity.get(resource))


def _nvidia_allocatable(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    allocatable = status.get("allocatable")
    if not isinstance(allocatable, Mapping):
        return ()
    return tuple(
        (_intern(name), _intern(str(quantity)))
        for name, quantity in allocatable.items()
        if name.startswith(NVIDIA_RESOURCES)
    )


def _allocatable_unchanged(kept: tuple[tuple[str, str], ...], status: Mapping[str, Any]) -> bool:
    """``kept == _nvidia_allocatable(status)`` without building anything: heartbeats pass here."""
    allocatable = status.get("allocatable")
    if not isinstance(allocatable, Mapping):
        return not kept
    seen = 0
    for name, quantity in allocatable.items():
        if name.startswith(NVIDIA_RESOURCES):
            if seen >= len(kept):
                return False
            kept_name, kept_quantity = kept[seen]  # compared in place: no tuple per heartbeat
            if kept_name != name or kept_quantity != quantity:
                return False
            seen += 1
    return seen == len(kept)


def _taints(spec: object) -> tuple[Mapping[str, Any], ...]:
    raw = spec.get("taints") if isinstance(spec, Mapping) else None
    if not isinstance(raw, list) or not raw:
        return ()
    return tuple(dict(taint) for taint in raw if isinstance(taint, Mapping))


def _taints_unchanged(kept: tuple[Mapping[str, Any], ...], spec: object) -> bool:
    raw = spec.get("taints") if isinstance(spec, Mapping) else None
    if not raw:
        return not kept  # the common case: no taints at all, nothing built
    return (
        isinstance(raw, list)
        and len(raw) == len(kept)
        and all(a == b for a, b in zip(kept, raw, strict=True))
    )


def slim_labels(raw: object) -> LabelSet:
    """Labels with interned values and a key layout shared across nodes (see ``labelsets``)."""
    return LabelSet(raw if isinstance(raw, Mapping) else None)


def labels_equal(record: NodeRecord, raw: object) -> bool:
    """Compare without building anything: the heartbeat fast path."""
    if not isinstance(raw, Mapping):
        return not record.labels
    return record.labels == raw


def project_node(obj: Mapping[str, Any]) -> NodeRecord:
    """The one copy: decoded Node → slim record (managedFields and the rest are left behind)."""
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return NodeRecord(
        name=_intern(str(metadata.get("name", ""))),
        uid=str(metadata.get("uid", "")),
        resource_version=str(metadata.get("resourceVersion", "")),
        labels=slim_labels(metadata.get("labels")),
        gpu_capacity=_capacity(status, GPU_RESOURCE),
        shared_capacity=_capacity(status, SHARED_RESOURCE),
        allocatable=_nvidia_allocatable(status),
        taints=_taints(obj.get("spec")),
    )


def content_unchanged(record: NodeRecord, obj: Mapping[str, Any]) -> bool:
    """True when a Node event changes nothing the operator reads (e.g. a heartbeat)."""
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return (
        labels_equal(record, metadata.get("labels"))
        and record.gpu_capacity == _capacity(status, GPU_RESOURCE)
        and record.shared_capacity == _capacity(status, SHARED_RESOURCE)
        and _allocatable_unchanged(record.allocatable, status)
        and _taints_unchanged(record.taints, obj.get("spec"))
        and record.uid == metadata.get("uid")
    )


def older_than(obj: Mapping[str, Any], record: NodeRecord) -> bool:
    """Whether ``obj`` predates ``record`` (same object; etcd revisions only grow).

    resourceVersions are opaque to clients in general; for one object on one etcd they are its
    modification revisions, and this is only used to drop a stale watch event after a write's
    response was ingested first.  Anything unparseable counts as not older.
    """
    metadata = obj.get("metadata") or {}
    if metadata.get("uid") != record.uid:
        return False
    try:
        return int(metadata.get("resourceVersion", "")) < int(record.resource_version)
    except ValueError:
        return False


def is_gpu_node_body(obj: Mapping[str, Any]) -> bool:
    """Cheap pre-filter on a decoded body, so non-GPU nodes are never projected at all."""
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if labels.get(GPU_PRESENT) == "true" or GPU_COUNT in labels or POLICY_LABEL in labels:
        return True
    status = obj.get("status") or {}
    capacity = status.get("capacity") or {}
    return GPU_RESOURCE in capacity or SHARED_RESOURCE in capacity

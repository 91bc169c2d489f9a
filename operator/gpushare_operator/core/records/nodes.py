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

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.labelling.labelsets import LabelSet
from gpushare_operator.core.labelling.rewrittenlabels import base_product, mig_profile_of

FIELD_MANAGER = "gpushare-operator"  # models.FIELD_MANAGER, without importing the API here

CONFIG_LABEL = "nvidia.com/device-plugin.config"
POLICY_LABEL = "gpushare.dev/policy"
# The MIG manager applies the mig-parted config this label names (NVIDIA/mig-parted
# cmd/nvidia-mig-manager); gpushare writes it only on nodes a MIG policy governs or governed.
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
OWNED_LABELS = (CONFIG_LABEL, POLICY_LABEL, MIG_CONFIG_LABEL)
# The MIG manager's progress: pending, rebooting, success or failed.
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_CAPABLE = "nvidia.com/mig.capable"

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
    # The field managers besides ours that own the nvidia.com/mig.config label (from
    # managedFields, read only while the label is there): a layout someone else set.
    mig_config_owners: tuple[str, ...] = ()

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
        """Physical GPUs: the GFD count label, else advertised capacity ÷ reported replicas.

        Under the single MIG strategy GFD counts MIG devices instead; the physical count is
        that divided by the devices one GPU of the model holds in the one-profile layout
        (NVIDIA's tables), which is the only layout gpushare applies under single.  Derived
        from the node's labels alone, it reads the same after a restart of the operator.
        """
        raw = self.labels.get(GPU_COUNT)
        if raw is not None:
            count = _int_or_none(raw)
            if count is None or count < 0:
                return None
            per_gpu = self._mig_devices_per_gpu()
            if per_gpu is None:
                return count
            return count // per_gpu if per_gpu and count % per_gpu == 0 else None
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
        """The memory of one GPU; under the single MIG strategy GFD shows the slice's, so the
        whole GPU's comes from NVIDIA's tables for the base product."""
        if mig_profile_of(self.labels.get(GPU_PRODUCT)) is not None:
            model = miggeometry.model(self.product)
            return model.memory_mib if model is not None else None
        return _int_or_none(self.labels.get(GPU_MEMORY))

    def _mig_devices_per_gpu(self) -> int | None:
        """MIG devices per GPU when GFD shows single-strategy MIG devices (0: unknown model or
        profile); None when it shows whole GPUs."""
        profile = mig_profile_of(self.labels.get(GPU_PRODUCT))
        if profile is None:
            return None
        model = miggeometry.model(self.product)
        layout = miggeometry.uniform(model, profile) if model is not None else None
        return sum(layout.values()) if layout else 0

    @property
    def mig_config_label(self) -> str | None:
        return self.labels.get(MIG_CONFIG_LABEL)

    @property
    def mig_state(self) -> str | None:
        return self.labels.get(MIG_STATE_LABEL)

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


# Allocatable pairs seen, each kept once: a pool's nodes advertise the same few (bounded, so a
# fleet of odd figures cannot grow it without end; past the bound a node keeps its own).
_SHARED_ALLOCATABLE: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
_SHARED_MAX = 4096


def _nvidia_allocatable(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    allocatable = status.get("allocatable")
    if not isinstance(allocatable, Mapping):
        return ()
    pairs = tuple(
        (_intern(name), _intern(str(quantity)))
        for name, quantity in allocatable.items()
        if name.startswith(NVIDIA_RESOURCES)
    )
    known = _SHARED_ALLOCATABLE.get(pairs)
    if known is not None:
        return known
    if len(_SHARED_ALLOCATABLE) < _SHARED_MAX:
        _SHARED_ALLOCATABLE[pairs] = pairs
    return pairs


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


def _mig_config_owners(metadata: Mapping[str, Any]) -> tuple[str, ...]:
    """Who besides us owns the MIG layout label; () when the label is absent (the common
    case: nothing is read)."""
    labels = metadata.get("labels")
    if not isinstance(labels, Mapping) or MIG_CONFIG_LABEL not in labels:
        return ()
    owners = set()
    for entry in metadata.get("managedFields") or ():
        if not isinstance(entry, Mapping) or entry.get("manager") == FIELD_MANAGER:
            continue
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        if isinstance(fields, Mapping) and f"f:{MIG_CONFIG_LABEL}" in fields:
            owners.add(str(entry.get("manager")))
    return tuple(sorted(owners))


def carries_mig_config(obj: Mapping[str, Any]) -> bool:
    """Whether a decoded Node carries the MIG layout label (its managedFields are then read)."""
    labels = (obj.get("metadata") or {}).get("labels")
    return isinstance(labels, Mapping) and MIG_CONFIG_LABEL in labels


def has_managed_fields(obj: Mapping[str, Any]) -> bool:
    return "managedFields" in (obj.get("metadata") or {})


def keep_mig_owners(new: NodeRecord, old: NodeRecord) -> NodeRecord:
    """``new`` with ``old``'s MIG label owners while the label is the same: an object without
    managedFields (our write's slimmed answer) says nothing about them."""
    if new.mig_config_label != old.mig_config_label:
        return new
    return dataclasses.replace(new, mig_config_owners=old.mig_config_owners)


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
        mig_config_owners=_mig_config_owners(metadata),
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
        and (MIG_CONFIG_LABEL not in record.labels or _owners_unchanged(record, metadata))
    )


def _owners_unchanged(record: NodeRecord, metadata: Mapping[str, Any]) -> bool:
    # managedFields are only delivered with a full object; a watch event without them
    # (never, from the API server) keeps what is known.
    if "managedFields" not in metadata:
        return True
    return record.mig_config_owners == _mig_config_owners(metadata)


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

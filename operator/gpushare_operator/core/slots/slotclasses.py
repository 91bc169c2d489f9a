"""What one slot of a node enforces: its resource, its isolation, and the GPU memory it caps.

A *slot class* is what a pod gets when it requests one of a node's slots: the extended resource
it requests, the isolation behind it, and the GPU memory the slot enforces, if any.  Only three
of NVIDIA's sharing modes enforce memory, and each in its own way:

- **MPS**: the device plugin's MPS control daemon sets every client's default pinned device
  memory limit to the GPU's total memory divided by its replicas, in MiB, rounded down
  (``set_default_device_pinned_mem_limit``, k8s-device-plugin
  ``cmd/mps-control-daemon/mps/daemon.go``).  GPU Feature Discovery's ``nvidia.com/gpu.memory``
  is that total in MiB, rounded down, so ``floor(memory / replicas)`` is the daemon's figure.
- **MIG** without replicas: a MIG device is a hardware slice; its memory is the profile's, from
  NVIDIA's tables (``core.hardware.miggeometry``) for the node's GPU model.
- **Exclusive**: the whole GPU, one pod per GPU.

Time-slicing enforces nothing (every replica sees the whole GPU), and nor do time-sliced MIG
devices (their replicas share the slice's memory): such slots have isolation ``none`` and no
memory.  ``classes`` is pure: the same node and policy give the same answer on any replica.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.labelling.labels import label_value_error
from gpushare_operator.core.mig.migconfigs import MigLayout
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy

# The labels a Verified node carries about its slots (written with our other labels).
MEMORY_LABEL: Final = "gpushare.dev/slot-memory-mib"
ISOLATION_LABEL: Final = "gpushare.dev/slot-isolation"
RESOURCE_LABEL: Final = "gpushare.dev/slot-resource"
LABELS: Final = (MEMORY_LABEL, ISOLATION_LABEL, RESOURCE_LABEL)
NO_SLOT_LABELS: Final[Mapping[str, None]] = dict.fromkeys(LABELS)

# A label value may not hold '/': the resource's domain and name are joined by '_' instead.
# A resource's domain is a DNS subdomain, which has no '_', so the first '_' is the slash.
RESOURCE_SEPARATOR: Final = "_"


class Isolation(enum.StrEnum):
    """What keeps one slot's pod from another's GPU memory."""

    MPS = "mps"  # the MPS control daemon's per-client pinned memory limit
    MIG = "mig"  # a hardware MIG slice
    EXCLUSIVE = "exclusive"  # the whole GPU
    NONE = "none"  # nothing: time-slicing, or time-sliced MIG devices


@dataclass(frozen=True, slots=True, order=True)
class SlotClass:
    """One kind of slot: the resource a pod requests, and what the slot enforces."""

    resource: str
    isolation: Isolation
    memory_mib: int | None  # None: no memory is enforced (or the node's memory is unknown)

    @property
    def enforced(self) -> bool:
        return self.memory_mib is not None and self.isolation is not Isolation.NONE

    def describe(self) -> str:
        if not self.enforced:
            return f"{self.resource} ({self.isolation}: no memory enforced)"
        return f"{self.memory_mib} MiB of {self.resource} ({self.isolation})"


def classes(record: NodeRecord, policy: CompiledPolicy) -> tuple[SlotClass, ...]:
    """The slot classes the node offers under ``policy``, one per advertised resource; () for
    a policy that never compiled or a MIG layout that does not fit the node's GPU."""
    sharing = policy.sharing
    if sharing is None:
        return ()
    layout = None
    if policy.mig is not None:
        layout = policy.mig.layouts.get(record.product or "")
        if layout is None:
            return ()
    return classes_of(record, sharing, layout=layout)


def classes_of(
    record: NodeRecord, sharing: devconfigs.SharingConfig, *, layout: MigLayout | None
) -> tuple[SlotClass, ...]:
    """The slot classes of a device-plugin config (and, for MIG, the layout on every GPU):
    what ``classes`` gives for a policy, and what a node runs under the key and the layout
    its labels name, whatever the policy says now (``core.slots.memoryfits``)."""
    if sharing.strategy == devconfigs.MIG:
        return () if layout is None else _mig_classes(record, sharing, layout)
    resource = devconfigs.advertised_resource(sharing)
    memory = record.memory_mib
    if sharing.strategy == devconfigs.MPS:
        per_client = None if memory is None else memory // max(1, sharing.replicas)
        return (SlotClass(resource, Isolation.MPS, per_client),)
    if sharing.strategy == devconfigs.EXCLUSIVE:
        return (SlotClass(resource, Isolation.EXCLUSIVE, memory),)
    return (SlotClass(resource, Isolation.NONE, None),)


def _mig_classes(
    record: NodeRecord, sharing: devconfigs.SharingConfig, layout: MigLayout
) -> tuple[SlotClass, ...]:
    model = miggeometry.model(record.product)
    if model is None:
        return ()
    found: dict[str, SlotClass] = {}
    for profile, _count in layout.devices:
        try:
            [resource] = devconfigs.mig_resource_names(
                mig_strategy=sharing.mig_strategy, profiles=[profile]
            )
        except devconfigs.ConfigError:
            return ()  # a layout no config of ours advertises: no class to speak of
        if sharing.replicas > 1:
            found[resource] = SlotClass(resource, Isolation.NONE, None)
            continue
        known = model.profiles.get(profile)
        memory = known.memory_mib if known is not None else None
        found[resource] = SlotClass(resource, Isolation.MIG, _lowest(memory, record, resource))
    return tuple(found[r] for r in sorted(found))


def _lowest(table: int | None, record: NodeRecord, resource: str) -> int | None:
    """The slice's memory: NVIDIA's tables, or GPU Feature Discovery's label for the slice
    (``<resource>.memory``: ``nvidia.com/gpu.memory`` under single, ``nvidia.com/mig-<profile>
    .memory`` under mixed, NVML's figure) where that is lower.  go-nvml's mock tables round a
    1g.10gb up to 10240 MiB; a real driver reports a little less, and a promise must hold."""
    text = record.labels.get(f"{resource}.memory")
    seen = int(text) if text is not None and text.isdigit() and int(text) > 0 else None
    if table is None or seen is None:
        return table if seen is None else seen
    return min(table, seen)


def promise(record: NodeRecord, policy: CompiledPolicy) -> SlotClass | None:
    """The one slot class the node's labels can speak for; None when it has none, or several
    (a MIG layout of several profiles: one label cannot say which slot is which)."""
    found = classes(record, policy)
    return found[0] if len(found) == 1 else None


def encode_resource(resource: str) -> str | None:
    """``resource`` as a label value (``nvidia.com/gpu`` → ``nvidia.com_gpu``); None when it
    cannot be one (longer than 63 characters)."""
    value = resource.replace("/", RESOURCE_SEPARATOR, 1)
    return value if label_value_error(value) is None else None


def decode_resource(value: str) -> str:
    """The resource a ``slot-resource`` label value names."""
    domain, separator, name = value.partition(RESOURCE_SEPARATOR)
    return f"{domain}/{name}" if separator else value


def labels(slot: SlotClass | None) -> dict[str, str | None]:
    """The three slot labels as wanted for ``slot`` (None values: absent).  A slot whose
    resource cannot be a label value gets none: a partial promise would mislead."""
    if slot is None:
        return dict(NO_SLOT_LABELS)
    resource = encode_resource(slot.resource)
    if resource is None:
        return dict(NO_SLOT_LABELS)
    memory = str(slot.memory_mib) if slot.enforced else None
    return {MEMORY_LABEL: memory, ISOLATION_LABEL: str(slot.isolation), RESOURCE_LABEL: resource}


def carries_any(node_labels: Mapping[str, str]) -> bool:
    return any(key in node_labels for key in LABELS)


@dataclass(frozen=True, slots=True, order=True)
class Offer:
    """An enforced slot class as the nodes' labels show it, with the policy that set it: what
    the memory-request webhook chooses from (the same on every replica: labels are state)."""

    memory_mib: int
    resource: str
    isolation: Isolation
    policy: str

    @property
    def slot(self) -> SlotClass:
        return SlotClass(self.resource, self.isolation, self.memory_mib)


def offer_of(node_labels: Mapping[str, str], *, policy_label: str) -> Offer | None:
    """The enforced slot class a node's labels promise; None when they promise none (no
    labels, isolation ``none``, or a value that does not parse: never trusted halfway)."""
    policy = node_labels.get(policy_label)
    memory = node_labels.get(MEMORY_LABEL)
    isolation = node_labels.get(ISOLATION_LABEL)
    resource = node_labels.get(RESOURCE_LABEL)
    if policy is None or memory is None or isolation is None or resource is None:
        return None
    if not memory.isdigit() or isolation not in Isolation.__members__.values():
        return None
    kind = Isolation(isolation)
    if kind is Isolation.NONE or int(memory) <= 0:
        return None
    return Offer(int(memory), decode_resource(resource), kind, policy)

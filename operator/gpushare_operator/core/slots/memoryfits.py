"""Whether a pod that asked for GPU memory still fits a change of its node: the one rule that
the operator's rollout and ``kubectl gpushare plan`` both apply.

A pod created with ``gpushare.dev/gpu-memory`` was given a slot of an enforced class (the
webhook, ``core.slots.memoryrequests``); its record keeps the request (``PodRecord.memory_mib``).  A
change of the node's config fits it only if the slot class of the resource it holds still
enforces its request afterwards: a slot of fewer MiB (more MPS clients, a smaller MIG slice),
a slot that enforces nothing (time-slicing, time-sliced MIG devices), another resource, or no
slot at all (the default config of a released node) breaks the promise it was placed by, and
the pod would run on under a smaller cap or none.  ``core.slots.slotchanges.judge`` says what the
pod loses, from the node's slot classes (``core.slots.slotclasses``) before and after.

*Before* is what the node offers now.  The operator reads it from what the node runs: the
device-plugin config its key names and the MIG layout its label names (``running``), since the
policy may already have moved on (an edited spec is the policy's only spec).  The plan reads it
from the policies as they are before the planned edit; on a settled node both are the same.

*After* is the classes of the new policy on the node as GFD will label it (``classes_after``):
a new single-strategy MIG layout makes GFD relabel ``nvidia.com/gpu.memory`` with the new
slice's memory, so the old figure is left out and NVIDIA's tables speak for the slice; an
identical layout under another name changes nothing on the GPU, and the label stays.

What the rollout does with a misfit is ``podPolicy``'s: ``WaitForPods`` holds the node
(``REASON``), ``Evict`` evicts the pod whatever the slot count says (``core.rollout.victims``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpushare_operator.core import quantities
from gpushare_operator.core.api.migspec import MigStrategy
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.mig.migconfigs import MigLayout
from gpushare_operator.core.records.nodes import GPU_MEMORY, NodeRecord
from gpushare_operator.core.records.pods import MEMORY_REQUEST_LABEL, PodRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.slots import slotchanges, slotclasses
from gpushare_operator.core.slots.slotchanges import SlotChange
from gpushare_operator.core.slots.slotclasses import SlotClass

# The reason of a node held back (podPolicy WaitForPods) because a change would break the
# memory promise of a pod on it.
REASON: Final = "MemoryNoLongerEnforced"
# How many pods a message names; the rest are counted.
NAMED: Final = 5


@dataclass(frozen=True, slots=True)
class MemoryMisfit:
    """A pod whose slot would no longer hold its memory request, and what it would lose."""

    pod: PodRecord
    change: SlotChange

    def describe(self) -> str:
        pod = self.pod
        asked = quantities.describe_mib(self.change.request_mib)
        return f"pod {pod.namespace}/{pod.name} asked for {asked}: {self.change.describe()}"


def running(
    record: NodeRecord, *, sharing: devconfigs.SharingConfig | None, layout: MigLayout | None
) -> tuple[SlotClass, ...]:
    """The slot classes of what the node runs: ``sharing``, the config its key names (None:
    none of ours, or a key whose text we would not render), and for MIG ``layout``, the one
    its label names."""
    if sharing is None:
        return ()
    return slotclasses.classes_of(record, sharing, layout=layout)


def classes_after(
    record: NodeRecord, policy: CompiledPolicy | None, *, layout_before: MigLayout | None
) -> tuple[SlotClass, ...]:
    """The node's classes under ``policy`` (None: released, the default config: none);
    ``layout_before``: the MIG layout on its GPUs now (None: none, or unknown)."""
    if policy is None:
        return ()
    return slotclasses.classes(after_view(record, policy, layout_before=layout_before), policy)


def after_view(
    record: NodeRecord, policy: CompiledPolicy, *, layout_before: MigLayout | None
) -> NodeRecord:
    """The node as its memory will read under ``policy``: a new single-strategy MIG layout
    makes GFD relabel ``nvidia.com/gpu.memory`` with the new slice's memory, so the old value
    (the whole GPU's, or another slice's) is left out and NVIDIA's tables speak for the slice."""
    mig = policy.mig
    if mig is None or mig.strategy is not MigStrategy.SINGLE or GPU_MEMORY not in record.labels:
        return record
    if layout_before is not None and layout_before == mig.layouts.get(record.product or ""):
        return record
    labels = {k: v for k, v in record.labels.items() if k != GPU_MEMORY}
    return dataclasses.replace(record, labels=labels)


def on_node(
    record: NodeRecord,
    pods: Iterable[PodRecord],
    policy: CompiledPolicy | None,
    *,
    configs: Mapping[str, devconfigs.SharingConfig | None],
    layouts: Mapping[str, MigLayout | None] | None,
) -> tuple[MemoryMisfit, ...]:
    """The operator's judgement of a change of the node to ``policy`` (None: released): its
    classes before are those of what it runs, the config its key names (``configs``: our
    ConfigMap's keys, parsed) and the MIG layout of ours its label names (``layouts``: our
    mig-parted ConfigMap's names); an edited policy has no spec before the edit to ask."""
    layout = (layouts or {}).get(record.mig_config_label or "")
    if record.mig_config_owners:
        layout = None  # another manager's label: not a layout of ours
    sharing = configs.get(record.config_label or "")
    before = running(record, sharing=sharing, layout=layout)
    after = classes_after(record, policy, layout_before=layout)
    return misfits(pods, before=before, after=after)


def misfits(
    pods: Iterable[PodRecord], *, before: Sequence[SlotClass], after: Sequence[SlotClass]
) -> tuple[MemoryMisfit, ...]:
    """The pods (on one node) that asked for memory and whose slot the change from ``before``
    to ``after`` (the node's classes) takes away or shrinks under their request."""
    found = []
    for pod in pods:
        request = pod.memory_mib
        if request is None or not pod.holds_slots:
            continue
        held = [resource for resource, _ in pod.requests]
        change = slotchanges.judge(request, held, before, after)
        if change is not None:
            found.append(MemoryMisfit(pod, change))
    return tuple(sorted(found, key=lambda m: (m.pod.namespace, m.pod.name)))


def describe(found: Sequence[MemoryMisfit]) -> str:
    """Why a node's change would break memory promises, naming the pods (a few)."""
    named = "; ".join(m.describe() for m in found[:NAMED])
    more = f"; and {len(found) - NAMED} more" if len(found) > NAMED else ""
    return (
        f"{len(found)} pod(s) that asked for GPU memory ({MEMORY_REQUEST_LABEL}) would lose"
        f" the slot that enforces it: {named}{more}"
    )

"""What a change of config does to a pod that asked for GPU memory: its slot class, before
and after.

A pod created with ``gpushare.dev/gpu-memory`` holds a slot of one resource; the node's slot
class of that resource (``core.slots.slotclasses``) is what keeps its promise.  A change of the
node's
policy (its strategy, replicas or MIG layout, or another policy winning the node) can take that
promise away, and ``judge`` says how:

- ``removed``: no slot class at all after the change (no policy governs the node, or it cannot
  work there);
- ``resource``: the node's slots become another resource, so the pod's is advertised no more;
- ``unenforced``: the same resource, but its slot enforces no memory any more (time-slicing);
- ``shrinks``: the slot enforces less than the pod asked for, and less than before (a slot that
  enforced nothing before, or a node no policy governed, counts as the whole GPU: an MPS limit
  that appears below the request shrinks what the pod could use).

A slot that already enforced less than the request and enforces more (but still not enough)
after is not made worse by the change: it is not listed.  A pod whose slot enforced nothing
before is listed only for ``shrinks``: nothing enforced was taken from it.  Pure: the plugin's
plan calls it on the classes ``core.slots.slotclasses`` gives before and after.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpushare_operator.core import quantities
from gpushare_operator.core.slots.slotclasses import SlotClass


class Loss(enum.StrEnum):
    REMOVED = "removed"
    RESOURCE = "resource"
    UNENFORCED = "unenforced"
    SHRINKS = "shrinks"


@dataclass(frozen=True, slots=True)
class SlotChange:
    """The slot class a pod's resource has before and after a change, and what it loses."""

    resource: str
    request_mib: int
    before: SlotClass | None  # None: the node offered no class of the resource (unmanaged)
    after: SlotClass | None  # None: it offers none after the change
    loss: Loss
    others: tuple[SlotClass, ...] = ()  # the classes the node offers after, when not this one

    def describe(self) -> str:
        """Why the pod loses its promise, in a sentence's second half."""
        asked = quantities.describe_mib(self.request_mib)
        was = _shown(self.before)
        if self.loss is Loss.REMOVED:
            return f"its slot ({was}) goes: the node offers no slot class after the change"
        if self.loss is Loss.RESOURCE:
            offered = ", ".join(_shown(s) for s in self.others) or "nothing"
            return f"the node's slots become {offered}: no slot of {self.resource} any more"
        if self.loss is Loss.UNENFORCED:
            return f"its slot ({was}) enforces no memory any more ({_shown(self.after)})"
        if self.before is None or not self.before.enforced:
            was = "the whole GPU (nothing enforced)"
        now = _shown(self.after)
        return f"its slot shrinks from {was} to {now}, under the {asked} it asked for"


def _shown(slot: SlotClass | None) -> str:
    if slot is None:
        return "no slot class"
    if not slot.enforced:
        return f"{slot.resource}, {slot.isolation}: no memory enforced"
    return f"{slot.memory_mib} MiB {slot.isolation}"


def class_of(resource: str, classes: Iterable[SlotClass]) -> SlotClass | None:
    """The class of ``resource`` among a node's classes (one per resource)."""
    return next((slot for slot in classes if slot.resource == resource), None)


def judge(
    request_mib: int,
    held: Iterable[str],
    before: Sequence[SlotClass],
    after: Sequence[SlotClass],
) -> SlotChange | None:
    """What the change from ``before`` to ``after`` (the node's classes) takes from a pod that
    asked for ``request_mib`` and holds slots of the resources ``held``; None if nothing."""
    for resource in held:
        change = _judge_one(request_mib, resource, before, after)
        if change is not None:
            return change
    return None


def _judge_one(
    request_mib: int, resource: str, before: Sequence[SlotClass], after: Sequence[SlotClass]
) -> SlotChange | None:
    was, now = class_of(resource, before), class_of(resource, after)
    if was == now:
        return None
    enforced_before = was is not None and was.enforced
    if now is None:
        if not enforced_before:
            return None
        loss = Loss.RESOURCE if after else Loss.REMOVED
        return SlotChange(resource, request_mib, was, None, loss, others=tuple(after))
    if not now.enforced:
        if not enforced_before:
            return None
        return SlotChange(resource, request_mib, was, now, Loss.UNENFORCED)
    memory = now.memory_mib or 0
    if memory >= request_mib:
        return None
    if enforced_before and was is not None and (was.memory_mib or 0) <= memory:
        return None  # no smaller than before: the change takes nothing from it
    return SlotChange(resource, request_mib, was, now, Loss.SHRINKS)

"""Which status changes deserve a Kubernetes Event: pure rules over (before, after) statuses.

Events are edge-triggered: one when a condition turns bad (or changes reason), none while it
stays so, and none for routine progress such as nodes being Pending for a moment.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Announcement:
    type: str  # Normal | Warning
    reason: str
    message: str


# Policy conditions: (type, status, reason or None for any) → event reason (all Warnings).
_POLICY_RULES = {
    ("SelectorValid", "False", None): "InvalidPolicy",
    ("Conflicting", "True", None): "Conflict",
    ("Ready", "False", "DevicePluginConfigUnavailable"): "DevicePluginConfigUnavailable",
    ("Ready", "False", "NodesMismatched"): "NodesMismatched",
    ("Ready", "False", "InvalidSpec"): "InvalidPolicy",
    ("Ready", "False", "InvalidConfig"): "InvalidPolicy",
    ("Ready", "False", "DRASharingDisabled"): "InvalidPolicy",
    ("Overcommitted", "True", None): "Overcommitted",
    ("Unsupported", "True", None): "NodesUnsupported",
    ("SchemaOutdated", "True", None): "SchemaOutdated",
    ("SpecAdjusted", "True", None): "SpecAdjusted",
    ("Progressing", "False", "ProgressDeadlineExceeded"): "ProgressDeadlineExceeded",
}

# Node conditions: type → reasons that deserve a Warning on the Node when they appear.
_NODE_RULES = {
    "Ready": (
        "InvalidNodeLabel",
        "MPSWithMixedMIG",
        "NotConfirmed",
        "Degraded",
        "ReleaseNotConfirmed",
        "ReleaseBlocked",
    ),
    "Overcommitted": ("AllocationExceedsCapacity",),
    "EvictionBlocked": ("EvictionTimedOut", "NotEvictable"),
}
# Node Ready reasons that deserve a Normal Event when they appear (progress worth a trace).
_NODE_NORMAL = ("Evicting",)
# Events about a podPolicy Evict drain: posted on the node's GPUNodeState, where the drain
# is described (status.eviction), rather than on the Node.
NODE_STATE_REASONS = frozenset({"Evicting", "EvictionBlocked"})


def condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def _changed(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> bool:
    if before is None:
        return True
    return (before.get("status"), before.get("reason")) != (
        after.get("status"),
        after.get("reason"),
    )


def rollout_announcements(
    previous: Mapping[str, Any] | None, rollout: Mapping[str, Any] | None
) -> Iterator[Announcement]:
    """RolloutStarted for a new generation, RolloutHalted and RolloutComplete as the state
    turns so; nothing while a rollout just makes progress."""
    if not rollout:
        return
    before = previous or {}
    generation = rollout.get("generation")
    new = before.get("generation") != generation
    state = rollout.get("state")
    if new:
        yield Announcement(
            "Normal",
            "RolloutStarted",
            f"rolling out generation {generation} to {rollout.get('totalNodes', 0)} node(s)",
        )
    if state != before.get("state") or new:
        if state == "Halted":
            # The rollout's message says which halt: failures past the threshold, or failed
            # and degraded nodes holding the whole budget; and names the nodes.
            why = rollout.get("message") or (
                f"{rollout.get('failedNodes', 0)} node(s) ended in Mismatch; no further node is"
                " changed until they recover or the spec changes"
            )
            yield Announcement("Warning", "RolloutHalted", f"generation {generation}: {why}")
        elif state == "Complete":
            message = f"generation {generation} is on all {rollout.get('updatedNodes', 0)} node(s)"
            yield Announcement("Normal", "RolloutComplete", message)


def policy_announcements(
    previous: Mapping[str, Any], status: Mapping[str, Any]
) -> Iterator[Announcement]:
    yield from rollout_announcements(previous.get("rollout"), status.get("rollout"))
    for cond in status.get("conditions") or ():
        kind, state, reason = str(cond["type"]), str(cond["status"]), str(cond["reason"])
        if not _changed(condition(previous, kind), cond):
            continue
        event = _POLICY_RULES.get((kind, state, reason)) or _POLICY_RULES.get((kind, state, None))
        if event is not None:
            yield Announcement("Warning", event, str(cond.get("message") or reason))


def node_announcements(
    previous: Mapping[str, Any], status: Mapping[str, Any]
) -> Iterator[Announcement]:
    for kind, reasons in _NODE_RULES.items():
        now = condition(status, kind)
        before = condition(previous, kind) or {}
        if now is None or now.get("reason") == before.get("reason"):
            continue
        if now.get("reason") in reasons:
            reason = str(now["reason"]) if kind == "Ready" else kind
            yield Announcement("Warning", reason, str(now.get("message", "")))
        elif kind == "Ready" and now.get("reason") in _NODE_NORMAL:
            yield Announcement("Normal", str(now["reason"]), str(now.get("message", "")))

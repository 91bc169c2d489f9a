"""Rollout arithmetic: budgets, order, whether pods fit, the taint, and a rollout's state.

Pure functions of numbers and records; the bookkeeping that feeds them (which node is where)
lives in ``reconcile.rollouts``.  A node is *unavailable* from the moment its config label
changes until it is Verified (a released node: until the device plugin is back unshared); a
Mismatch node stays unavailable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpushare_operator.core import listpatches
from gpushare_operator.core.api.models import RolloutPhase, RolloutSpec
from gpushare_operator.core.listpatches import JsonPatch
from gpushare_operator.core.stamps import epoch_of

TAINT_KEY: Final = "gpushare.dev/reconfiguring"
TAINT: Final[Mapping[str, str]] = {"key": TAINT_KEY, "effect": "NoSchedule"}
DEFAULT_ROLLOUT: Final = RolloutSpec()


# On every policy before any node is labelled for it: deleting the policy then releases its
# nodes under its budget instead of all at once, and the policy goes only once they are.
FINALIZER: Final = "gpushare.dev/release-nodes"


def max_unavailable(value: int | str, *, total: int) -> int:
    """The budget: a number of nodes, or a percentage of ``total`` rounded down; at least 1."""
    if isinstance(value, int):
        return max(1, value)
    percent = int(value.rstrip("%"))
    return max(1, total * percent // 100)


def misfit(held: Mapping[str, int], *, room: Mapping[str, int]) -> str | None:
    """Why the node's pods would not fit a config advertising ``room`` (resource -> slots on
    the node, and nothing else); None when they fit.  ``held``: slots held per resource.
    Each resource is judged by itself: a MIG layout of several profiles has a count each."""
    for resource, slots in sorted(held.items()):
        if slots > 0 and resource not in room:
            return f"pods hold {slots} {resource}, which the new config does not advertise"
    for resource, slots in sorted(held.items()):
        if slots > room.get(resource, 0):
            return f"pods hold {slots} {resource}; the new config has {room[resource]}"
    return None


def order_key(*, allocated: int, name: str) -> tuple[int, str]:
    """Fewest allocated slots first, then by name: the same order after every restart."""
    return (allocated, name)


@dataclass(frozen=True, slots=True)
class Counts:
    """Where the nodes of one rollout are."""

    total: int = 0  # nodes the rollout concerns (governed, or released by this policy)
    updated: int = 0  # on the target and Verified
    changing: int = 0  # on the target (label written), not yet Verified, not Mismatch
    failed: int = 0  # on the target, Mismatch: never confirmed after our change
    degraded: int = 0  # confirmed once, disagreeing since (drift: unavailable, no failure)
    admitted: int = 0  # cleared to change, label not written yet
    waiting: int = 0  # to change, waiting for their turn
    blocked: int = 0  # to change, waiting for their pods to fit
    unavailable: int = 0  # between label change and Verified, whatever their target


# Why a rollout is halted (the RolloutHalted condition's reason).
FAILURE_THRESHOLD: Final = "FailureThresholdReached"
BUDGET_HELD: Final = "BudgetHeldByFailedNodes"
# Why a rollout is not Progressing: no node moved for progressDeadlineSeconds.
DEADLINE_EXCEEDED: Final = "ProgressDeadlineExceeded"


def halted(counts: Counts, spec: RolloutSpec) -> bool:
    """Halted by failures: no node is admitted until they recover or the spec changes."""
    return counts.failed >= spec.failureThreshold


def budget_held(counts: Counts, spec: RolloutSpec) -> bool:
    """Nodes wait for their turn, none is changing, and failed or degraded nodes (unavailable
    for good until they recover) fill the whole budget: nothing can move, though too few
    failed to reach failureThreshold.  Such a rollout is no more Progressing than a halted
    one, and says so."""
    if counts.waiting == 0 or counts.changing or counts.admitted:
        return False
    held = counts.failed + counts.degraded
    return held > 0 and held >= max_unavailable(spec.maxUnavailable, total=counts.total)


def halt_reason(counts: Counts, spec: RolloutSpec) -> str | None:
    """Why the rollout is halted, or None while it is not."""
    if halted(counts, spec):
        return FAILURE_THRESHOLD
    if budget_held(counts, spec):
        return BUDGET_HELD
    return None


def canary_room(counts: Counts, spec: RolloutSpec) -> int | None:
    """How many more nodes may take the new config while the canary is not yet proven;
    None once it is (or there is no canary)."""
    if spec.canary <= 0:
        return None
    # A failed canary is no longer one: the next node takes its place, within the budget (the
    # failed node stays unavailable), until failureThreshold failures halt the rollout.
    in_rollout = counts.updated + counts.changing + counts.admitted
    target = min(spec.canary, in_rollout + counts.waiting + counts.blocked)
    if counts.updated >= target:
        return None
    return max(0, target - in_rollout)


def room(
    counts: Counts,
    spec: RolloutSpec,
    *,
    cluster_room: int,
    paused: bool = False,
    deleting: bool = False,
) -> int:
    """How many more nodes may start changing now under the policy's and the cluster's budget
    (a deleted policy's releases go on even when it was paused or halted)."""
    if not deleting and (paused or halted(counts, spec)):
        return 0
    budget = max_unavailable(spec.maxUnavailable, total=counts.total)
    return max(0, min(budget - counts.unavailable, cluster_room))


def phase(counts: Counts, spec: RolloutSpec, *, paused: bool) -> RolloutPhase:
    if paused:
        return RolloutPhase.PAUSED
    if halt_reason(counts, spec) is not None:
        return RolloutPhase.HALTED
    if counts.waiting + counts.admitted + counts.unavailable == 0:
        return RolloutPhase.WAITING_FOR_PODS if counts.blocked else RolloutPhase.COMPLETE
    return RolloutPhase.PROGRESSING


# -- the progress deadline ---------------------------------------------------------------------


def progressed(
    before: Mapping[str, Any], *, state: RolloutPhase, updated: int, waiting: int, now: str
) -> str:
    """When a node of the rollout last moved (``status.rollout.progressedAt``): now for a new
    generation, a resume, one more node updated or one fewer waiting; otherwise the time the
    status recorded, so that a new leader measures the same stillness from the cluster."""
    last = before.get("progressedAt")
    if not before or not isinstance(last, str):
        return now
    if before.get("state") == RolloutPhase.PAUSED and state is not RolloutPhase.PAUSED:
        return now
    if updated > _count(before, "updatedNodes") or waiting < _count(before, "waitingNodes"):
        return now
    return last


def _count(block: Mapping[str, Any], field: str) -> int:
    value = block.get(field)
    return value if isinstance(value, int) else 0


def deadline_left(rollout: Mapping[str, Any], *, deadline: int, now: str) -> float | None:
    """Seconds until a rollout that has not moved passes its progress deadline (0 or less:
    passed); None while it is not judged (complete, paused, or no readable time)."""
    if rollout.get("state") in (RolloutPhase.COMPLETE, RolloutPhase.PAUSED):
        return None
    since, at = epoch_of(rollout.get("progressedAt")), epoch_of(now)
    if since is None or at is None:
        return None
    return since + deadline - at


# -- the taint ----------------------------------------------------------------------------------


def taint_added(taints: Sequence[Mapping[str, Any]]) -> JsonPatch:
    """Append our taint, never replacing or reordering another manager's (see listpatches)."""
    return listpatches.appended("/spec/taints", taints, TAINT)


def is_ours(taint: Mapping[str, Any]) -> bool:
    """Our taint is our key with our effect: one with our key and another effect is someone
    else's (a human's NoExecute, say), and never removed."""
    return taint.get("key") == TAINT_KEY and taint.get("effect") == TAINT["effect"]


def taint_removed(taints: Sequence[Mapping[str, Any]]) -> JsonPatch | None:
    """Remove our taint only; None when it is not there."""
    return listpatches.removed("/spec/taints", taints, is_ours)

"""Where a node stands in a rollout: the steps, and the placement ``RolloutBook.judge``
gives it (everything ``RolloutBook.record`` enters about it)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.phases import nodephases

RELEASE = ""  # the target of a node to be released (config keys are never empty)
CLUSTER = ""  # charged to no policy, only to the cluster-wide budget (names are never empty)


class Step(enum.Enum):
    UPDATED = "updated"  # on the target, Verified
    CHANGING = "changing"  # on the target, not Verified yet (or releasing, not yet settled)
    FAILED = "failed"  # on the target, Mismatch: never confirmed after our change
    DEGRADED = "degraded"  # on the target, confirmed once and disagreeing since
    ADMITTED = "admitted"  # cleared to change; label not written yet
    WAITING = "waiting"  # wants to change; waits for its turn
    BLOCKED = "blocked"  # wants to change; waits for its pods to fit
    PREPARING = "preparing"  # to change once its config key has propagated (or unpaused)


HELD_STEPS = frozenset({Step.WAITING, Step.BLOCKED})
# A rollout with a node at any of these is under way (or unhealthy): no node joins it at once.
UNDER_WAY = (*HELD_STEPS, Step.PREPARING, Step.ADMITTED, Step.CHANGING, Step.FAILED)
SETTLED_STEP = {
    NodePhase.VERIFIED: Step.UPDATED,
    NodePhase.APPLIED: Step.CHANGING,
    NodePhase.RELEASING: Step.CHANGING,
    NodePhase.MISMATCH: Step.FAILED,
    NodePhase.DEGRADED: Step.DEGRADED,
    NodePhase.PENDING: Step.PREPARING,
}


@dataclass(frozen=True, slots=True)
class Place:
    policy: str  # charged to; CLUSTER: to the cluster-wide budget only
    step: Step


@dataclass(frozen=True, slots=True)
class Placement:
    """Where ``judge`` puts a node: everything ``record`` enters about it."""

    node: str
    charged: str  # the policy whose budget the node is charged to (CLUSTER: none)
    step: Step | None  # None: the node leaves the book
    down: str | None  # unavailable, charged to this policy; None: available
    grant: tuple[str, str] | None  # its admission (target, charged) from now on
    wanted: str | None = None  # the target it waits for, while held back
    held_since: float | None = None  # when it began to be held back


@dataclass(frozen=True, slots=True)
class Judgement:
    decision: nodephases.NodeDecision  # to act on: the planned one, or a wait
    placement: Placement

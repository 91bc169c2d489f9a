"""metav1.Condition lists whose lastTransitionTime only moves when the status does.

Rendering a condition with a fresh timestamp on every reconcile would make every status differ
from the last one written, and so cost a write per reconcile; keeping the previous time for an
unchanged status is what lets "no change, no write" hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Cond:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str = ""


def _previous_by_type(previous: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in previous or () if isinstance(c, Mapping)}


def render_conditions(
    wanted: Iterable[Cond],
    *,
    previous: Sequence[Mapping[str, Any]] | None,
    now: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Conditions as API dicts, keeping each one's transition time while its status holds."""
    before = _previous_by_type(previous)
    rendered = []
    for cond in wanted:
        old = before.get(cond.type)
        since = now
        if old is not None and old.get("status") == cond.status and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
        item: dict[str, Any] = {
            "type": cond.type,
            "status": cond.status,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": since,
        }
        if generation is not None:
            item["observedGeneration"] = generation
        rendered.append(item)
    return rendered


def overcommitted(*, allocated: int, capacity: int) -> Cond:
    """Allocation above capacity (say, after replicas were lowered) is shown, never hidden."""
    if allocated > capacity:
        message = (
            f"pods hold {allocated} slots but only {capacity} exist; new pods asking for them "
            "will not schedule until enough of these finish"
        )
        return Cond("Overcommitted", "True", "AllocationExceedsCapacity", message)
    return Cond(
        "Overcommitted", "False", "WithinCapacity", f"{allocated} of {capacity} slots in use"
    )


def find(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    return _previous_by_type(conditions).get(kind)

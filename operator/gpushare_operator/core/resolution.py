"""Which policy governs a node when several select it.

The highest ``priority`` wins; among equal priorities the name that sorts first wins. Policy names
are unique (they are cluster-scoped objects), so the order is total and the outcome depends only
on the set of candidates, never on the order in which caches or events delivered them: every
replica of the operator, before and after a restart, picks the same winner.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class Ranked(Protocol):
    """Anything with a name and a priority: a policy spec, a cache record, a test double."""

    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> int: ...


RankedT = TypeVar("RankedT", bound=Ranked)


def rank_key(candidate: Ranked) -> tuple[int, str]:
    """Sort key putting the winner first: higher priority first, then the smaller name."""
    return (-candidate.priority, candidate.name)


def ranked(candidates: Iterable[RankedT]) -> list[RankedT]:
    """All candidates, the winner first and the weakest last."""
    return sorted(candidates, key=rank_key)


def winner(candidates: Iterable[RankedT]) -> RankedT | None:
    """The governing candidate, or ``None`` if there are none (one pass, no sorting)."""
    return min(candidates, key=rank_key, default=None)


def losers(candidates: Iterable[RankedT]) -> list[RankedT]:
    """The candidates that matched but lost to the winner, strongest first.

    These are the policies that report the node under ``conflictingNodes``.
    """
    return ranked(candidates)[1:]

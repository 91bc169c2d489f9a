"""The leader gate: every write waits on it, so that only the leader writes.

The Lease elector (HA issue) implements the same protocol; until then ``AlwaysLeader`` is the
stand-in elector for a single replica, and the writer's gating code path is the real one.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class LeaderGate(Protocol):
    def is_leader(self) -> bool: ...
    async def wait_leader(self) -> None: ...
    def time_left(self) -> float:
        """Seconds until leadership ends unless renewed (0 when not leading)."""
        ...


class AlwaysLeader:
    """A single replica leads from the start (no election)."""

    def is_leader(self) -> bool:
        return True

    async def wait_leader(self) -> None:
        return None

    def time_left(self) -> float:
        return float("inf")


class ManualGate:
    """A gate opened and closed by hand: for tests of the writer's gating."""

    def __init__(self, *, open_: bool = False) -> None:
        self._open = asyncio.Event()
        if open_:
            self._open.set()

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.clear()

    def is_leader(self) -> bool:
        return self._open.is_set()

    def time_left(self) -> float:
        return float("inf") if self._open.is_set() else 0.0

    async def wait_leader(self) -> None:
        await self._open.wait()

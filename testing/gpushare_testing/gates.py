"""Leader gates for code that writes from a single process (unit tests, benchmarks)."""

from __future__ import annotations


class AlwaysLeader:
    """Leads from the start and never stops (no election)."""

    def is_leader(self) -> bool:
        return True

    async def wait_leader(self) -> None:
        return None

    def time_left(self) -> float:
        return float("inf")


class ManualGate:
    """Leads while the test says so."""

    def __init__(self, *, leading: bool = True) -> None:
        self.leading = leading

    def is_leader(self) -> bool:
        return self.leading

    async def wait_leader(self) -> None:
        return None

    def time_left(self) -> float:
        return float("inf") if self.leading else 0.0

"""The leader gate: every write waits on it, so that only the leader writes.

``kube.election.LeaseElector`` is the one the operator runs; tests and benchmarks that write
from a single process pass a gate that always leads.
"""

from __future__ import annotations

from typing import Protocol


class LeaderGate(Protocol):
    def is_leader(self) -> bool: ...
    async def wait_leader(self) -> None: ...
    def time_left(self) -> float:
        """Seconds until leadership ends unless renewed (0 when not leading)."""
        ...

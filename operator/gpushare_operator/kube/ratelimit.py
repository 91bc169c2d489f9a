"""A token bucket bounding API writes to ``--write-qps`` with bursts of ``--write-burst``, and
the /metrics access reviews (kube/access.py), which refuse rather than wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self, *, qps: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if qps <= 0 or burst <= 0:
            raise ValueError("qps and burst must be positive")
        self._qps = qps
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._stamp = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._qps)
        self._stamp = now

    async def take(self) -> None:
        """Wait for one token; callers queue fairly behind the lock."""
        async with self._lock:
            self._refill()
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self._qps)
                self._refill()
            self._tokens -= 1

    def try_take(self) -> float:
        """Take a token if one is there now and return 0; else take nothing and return the
        seconds until one will be.  For callers that refuse at once instead of queueing."""
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self._qps

"""Jittered exponential back-off, and the server's own word on when to come back.

Jitter, because every replica (and every informer in one) fails at the same moment when the
API server restarts: without it they would all come back in lock-step and hit it together.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping


class Backoff:
    """Delays that double from ``initial`` up to ``cap``, each stretched by up to ``jitter``.

    The sequence starts over once no failure has been seen for ``reset_after`` seconds, rather
    than on the first success: an object that fails every time it is delivered would otherwise
    succeed at listing, fail at once, and retry at the initial delay forever.
    """

    def __init__(
        self,
        *,
        initial: float = 0.2,
        cap: float = 30.0,
        jitter: float = 0.5,
        reset_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._initial = initial
        self._cap = cap
        self._jitter = jitter
        self._reset_after = reset_after if reset_after is not None else 2 * cap
        self._clock = clock
        self._rng = rng
        self._next = initial
        self._last_failure: float | None = None

    def next(self, *, retry_after: float | None = None) -> float:
        """The delay before the next attempt; a server's Retry-After is a floor, not a hint."""
        now = self._clock()
        if self._last_failure is not None and now - self._last_failure > self._reset_after:
            self._next = self._initial
        self._last_failure = now
        base = self._next
        self._next = min(self._next * 2, self._cap)
        delay = min(base * (1 + self._jitter * self._rng()), self._cap)
        if retry_after is not None:
            # Spread the herd after the server's pause too, but never come back before it.
            delay = max(delay, retry_after * (1 + 0.1 * self._rng()))
        return delay


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """``Retry-After`` in seconds (the API server sends delta-seconds, never a date)."""
    if not headers:
        return None
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None

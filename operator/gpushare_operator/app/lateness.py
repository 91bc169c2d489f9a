"""How late the running event loop fires a timer: the measure behind the loop-lag gauges
(``app.looplag``), kept apart from them so that the webhook's own process, which reports its
lateness instead of serving gauges, measures it without the metrics library."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

WINDOW = 10.0  # seconds over which the recent worst lag is kept


class Lateness:
    """A timer's lateness on the running loop: the worst over the last ``WINDOW`` seconds
    (``recent``) and since start (``worst``), each told after every tick."""

    def __init__(self, *, interval: float = 0.1) -> None:
        self.interval = interval
        self.recent = 0.0
        self.worst = 0.0

    async def run(self, *, tell: Callable[[float, float], None] = lambda *_: None) -> None:
        window_start = time.monotonic()
        self.recent = 0.0
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            lag = max(0.0, now - before - self.interval)
            if now - window_start > WINDOW:
                window_start, self.recent = now, 0.0
            self.recent = max(self.recent, lag)
            self.worst = max(self.worst, lag)
            tell(self.recent, self.worst)

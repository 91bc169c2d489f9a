"""How late the event loop runs a timer: the longest step that ran in between.

Everything but the Lease elector shares one event loop: a step that keeps it busy (decoding a
re-list page, planning a big rollout) delays every watch, write and health check behind it.
A timer every ``interval`` seconds that notes how late it fires measures exactly that, for the
cost of ten wake-ups a second.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Gauge

WINDOW = 10.0  # seconds over which the recent worst lag is kept


class LoopLagMonitor:
    def __init__(self, *, registry: CollectorRegistry, interval: float = 0.1) -> None:
        self._interval = interval
        self.recent = Gauge(
            "gpushare_event_loop_lag_seconds",
            f"Worst lateness of a {interval:g}-s event-loop timer over the last {WINDOW:g} s",
            registry=registry,
        )
        self.worst = Gauge(
            "gpushare_event_loop_lag_max_seconds",
            f"Worst lateness of a {interval:g}-s event-loop timer since start",
            registry=registry,
        )
        self.worst_seen = 0.0

    async def run(self) -> None:
        window_start, window_worst = time.monotonic(), 0.0
        while True:
            before = time.monotonic()
            await asyncio.sleep(self._interval)
            now = time.monotonic()
            lag = max(0.0, now - before - self._interval)
            if now - window_start > WINDOW:
                window_start, window_worst = now, 0.0
            window_worst = max(window_worst, lag)
            self.worst_seen = max(self.worst_seen, lag)
            self.recent.set(window_worst)
            self.worst.set(self.worst_seen)

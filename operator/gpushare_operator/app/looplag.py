"""How late the event loop runs a timer: the longest step that ran in between.

Everything but the Lease elector and the webhook's server shares one event loop: a step that
keeps it busy (decoding a re-list page, planning a big rollout) delays every watch, write and
health check behind it.  A timer every ``interval`` seconds that notes how late it fires
measures exactly that, for the cost of ten wake-ups a second.  The webhook's server, on a
thread and loop of its own, has a monitor of its own (``gpushare_webhook_loop_lag_*``): its
lateness is its own work plus any wait for the GIL while the main loop holds it.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Gauge

WINDOW = 10.0  # seconds over which the recent worst lag is kept


class LoopLagMonitor:
    def __init__(
        self, *, registry: CollectorRegistry, interval: float = 0.1, webhook: bool = False
    ) -> None:
        """The main loop's monitor, or (``webhook``) the webhook server's."""
        self._interval = interval
        recent = f"Worst lateness of a {interval:g}-s timer over the last {WINDOW:g} s"
        worst = f"Worst lateness of a {interval:g}-s timer since start"
        if webhook:
            where = ", on the webhook server's own loop (its work and any wait for the GIL)"
            self.recent = Gauge(
                "gpushare_webhook_loop_lag_seconds", recent + where, registry=registry
            )
            self.worst = Gauge(
                "gpushare_webhook_loop_lag_max_seconds", worst + where, registry=registry
            )
        else:
            where = ", on the main event loop"
            self.recent = Gauge(
                "gpushare_event_loop_lag_seconds", recent + where, registry=registry
            )
            self.worst = Gauge(
                "gpushare_event_loop_lag_max_seconds", worst + where, registry=registry
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

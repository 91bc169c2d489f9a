"""How late an event loop runs a timer: the longest step that ran in between.

Everything but the Lease elector shares the main event loop: a step that keeps it busy
(decoding a re-list page, planning a big rollout) delays every watch, write and health check
behind it.  A timer every ``interval`` seconds that notes how late it fires measures exactly
that, for the cost of ten wake-ups a second.  The webhook's process measures its own loop the
same way (``Lateness``) and reports it (``gpushare_webhook_loop_lag_*``): its lateness is its
own work, and the machine's, since it shares nothing else with the operator.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

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


class LoopLagMonitor:
    def __init__(
        self, *, registry: CollectorRegistry, interval: float = 0.1, webhook: bool = False
    ) -> None:
        """The main loop's monitor, or (``webhook``) the gauges the webhook's process reports
        its own loop's lateness to (``tell``)."""
        self._lateness = Lateness(interval=interval)
        recent = f"Worst lateness of a {interval:g}-s timer over the last {WINDOW:g} s"
        worst = f"Worst lateness of a {interval:g}-s timer since start"
        if webhook:
            where = ", on the webhook's own process (its work and the machine's)"
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

    @property
    def worst_seen(self) -> float:
        return self._lateness.worst

    def tell(self, recent: float, worst: float) -> None:
        self.recent.set(recent)
        self.worst.set(worst)

    async def run(self) -> None:
        await self._lateness.run(tell=self.tell)

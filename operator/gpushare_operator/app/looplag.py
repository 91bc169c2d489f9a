"""How late an event loop runs a timer: the longest step that ran in between.

Everything but the Lease elector shares the main event loop: a step that keeps it busy
(decoding a re-list page, planning a big rollout) delays every watch, write and health check
behind it.  A timer every ``interval`` seconds that notes how late it fires measures exactly
that, for the cost of ten wake-ups a second.  The webhook's process measures its own loop the
same way (``app.lateness``) and reports it (``gpushare_webhook_loop_lag_*``): its lateness is its
own work, and the machine's, since it shares nothing else with the operator.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from gpushare_operator.app.lateness import WINDOW, Lateness


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

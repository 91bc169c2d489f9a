"""The event-loop lag monitor sees a step that holds the loop."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from gpushare_operator.app.looplag import LoopLagMonitor


async def test_a_blocking_step_shows_as_lag() -> None:
    registry = CollectorRegistry()
    monitor = LoopLagMonitor(registry=registry, interval=0.05)
    task = asyncio.create_task(monitor.run())
    try:
        await asyncio.sleep(0.2)
        assert monitor.worst_seen < 0.2
        time.sleep(0.4)  # noqa: ASYNC251 - a step that keeps the loop busy is the point
        await asyncio.sleep(0.2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert monitor.worst_seen >= 0.3
    assert registry.get_sample_value("gpushare_event_loop_lag_max_seconds") == monitor.worst_seen
    assert (registry.get_sample_value("gpushare_event_loop_lag_seconds") or 0) >= 0.3

"""/healthz and /readyz, for the kubelet: plain HTTP, no credentials (the kubelet has none).

Liveness fails on what a restart mends (a task that died, an informer stalled); readiness waits
until every cache is synced, so that a rolling update does not count a blind replica as up.
"""

from __future__ import annotations

import time
from typing import Protocol

from aiohttp import web


class Health(Protocol):
    """What the probes read; app.assembly's Assembly is one."""

    @property
    def synced(self) -> bool:
        """Whether the policies are primed, every informer has listed once, and the webhook
        (when served) has a serving certificate."""
        ...

    def health_problem(self, *, now: float) -> str | None:
        """Why /healthz should fail at monotonic time ``now``; None while healthy."""
        ...


def build_probe_app(health: Health) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        problem = health.health_problem(now=time.monotonic())
        if problem is not None:
            return web.Response(status=503, text=problem + "\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if not health.synced:
            text = "caches not synced, or the webhook has no serving certificate yet\n"
            return web.Response(status=503, text=text)
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app

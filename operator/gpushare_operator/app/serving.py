"""The operator's two HTTP servers: the probes, and /metrics for Prometheus.

The probes answer plain HTTP on ``--http-port`` (the kubelet probes without credentials);
/metrics is served on ``--metrics-port`` over HTTPS to callers the API server authenticates
(TokenReview) and authorizes for ``get`` on the non-resource URL ``/metrics``
(SubjectAccessReview), as kubebuilder's operators do.  ``--metrics-insecure`` serves it over
plain HTTP to anyone instead, for a laptop or a network that is private anyway.
"""

from __future__ import annotations

import ssl

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from gpushare_operator.app import servingcerts
from gpushare_operator.app.probes import Health, build_probe_app
from gpushare_operator.app.settings import Settings
from gpushare_operator.kube.access import AccessReviewer, Decision
from gpushare_operator.kube.connection import ApiHandle

log = structlog.get_logger(__name__)


def build_metrics_app(
    registry: CollectorRegistry, *, reviewer: AccessReviewer | None
) -> web.Application:
    """/metrics; guarded by ``reviewer`` unless it is None (``--metrics-insecure``)."""

    async def metrics(request: web.Request) -> web.Response:
        if reviewer is not None:
            refusal = await _refusal(reviewer, request)
            if refusal is not None:
                return refusal
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def _refusal(reviewer: AccessReviewer, request: web.Request) -> web.Response | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    bearer = token.strip() if scheme.lower() == "bearer" else None
    try:
        verdict = await reviewer.review(bearer, path=request.path, verb="get")
    except Exception as exc:  # the API server is unreachable or refuses us: not the caller's fault
        log.warning("cannot review /metrics access", error=str(exc))
        return web.Response(status=503, text="cannot review access with the API server\n")
    if verdict.decision is Decision.UNAUTHENTICATED:
        return web.Response(
            status=401, text="Unauthorized\n", headers={"WWW-Authenticate": "Bearer"}
        )
    if verdict.decision is Decision.FORBIDDEN:
        log.info("refused /metrics", user=verdict.user, remote=request.remote)
        return web.Response(status=403, text=f"Forbidden: {verdict.user} may not get /metrics\n")
    return None


class Servers:
    """The running probe and metrics servers, stopped together."""

    def __init__(self) -> None:
        self._runners: list[web.AppRunner] = []

    async def add(
        self, app: web.Application, *, port: int, tls: ssl.SSLContext | None = None
    ) -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        # All interfaces: the kubelet probes the pod IP, and Prometheus scrapes it.
        await web.TCPSite(runner, host="0.0.0.0", port=port, ssl_context=tls).start()

    async def cleanup(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()


async def serve(
    *, settings: Settings, health: Health, registry: CollectorRegistry, handle: ApiHandle
) -> Servers:
    """Start both servers; ``handle``'s client asks the API server who may read /metrics."""
    s = settings
    servers = Servers()
    try:
        await servers.add(build_probe_app(health), port=s.http_port)
        if s.metrics_insecure:
            await servers.add(build_metrics_app(registry, reviewer=None), port=s.metrics_port)
        else:
            tls = servingcerts.server_context(
                cert_file=s.metrics_cert_file, key_file=s.metrics_key_file
            )
            reviewer = AccessReviewer(handle.api)
            await servers.add(
                build_metrics_app(registry, reviewer=reviewer), port=s.metrics_port, tls=tls
            )
    except BaseException:
        await servers.cleanup()
        raise
    return servers

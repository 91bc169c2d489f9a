"""The operator's two HTTP servers: the probes, and /metrics for Prometheus.

The probes answer plain HTTP on ``--http-port`` (the kubelet probes without credentials);
/metrics is served on ``--metrics-port`` over HTTPS to callers the API server authenticates
(TokenReview) and authorizes for ``get`` on the non-resource URL ``/metrics``
(SubjectAccessReview), as kubebuilder's operators do, within the limits of kube/access.py: a
token that cannot be reviewed now is refused with 429 at once.  ``--metrics-insecure`` serves it
over plain HTTP to anyone instead, for a laptop or a network that is private anyway.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Awaitable, Callable, Iterator

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare_operator.app import servingcerts
from gpushare_operator.app.probes import Health, build_probe_app
from gpushare_operator.app.settings import Settings
from gpushare_operator.kube.access import AccessReviewer, ApiReviews, Decision, Throttled

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
    except Throttled as exc:  # too many unknown tokens: refused without asking (kube/access.py)
        return web.Response(
            status=429,
            text="Too many requests: try again later\n",
            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))},
        )
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


class AccessCounts(Collector):
    """What became of each /metrics request's review, and what the cache holds, at scrape time."""

    def __init__(self, reviewer: AccessReviewer) -> None:
        self._reviewer = reviewer

    def collect(self) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            "gpushare_metrics_access",
            "/metrics requests by how their access was decided: cached, reviewed (asked the "
            "API server), shared (another request's review), throttled (429), failed (503), "
            "anonymous (no token)",
            labels=["outcome"],
        )
        for outcome, count in sorted(self._reviewer.outcomes.items()):
            outcomes.add_metric([outcome], count)
        yield outcomes
        cached = GaugeMetricFamily(
            "gpushare_metrics_access_cache_entries",
            "Access answers cached for /metrics, allowed and denied",
            labels=["answer"],
        )
        cached.add_metric(["allowed"], len(self._reviewer.allowed))
        cached.add_metric(["denied"], len(self._reviewer.denied))
        yield cached


class Servers:
    """The running probe and metrics servers, stopped together, then what they used."""

    def __init__(self) -> None:
        self._runners: list[web.AppRunner] = []
        self._closers: list[Callable[[], Awaitable[None]]] = []

    def close_after(self, close: Callable[[], Awaitable[None]]) -> None:
        """Call ``close`` at cleanup, once the servers are stopped (the last added first)."""
        self._closers.append(close)

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
        while self._closers:
            await self._closers.pop()()


async def serve(
    *,
    settings: Settings,
    health: Health,
    registry: CollectorRegistry,
    reviews: Callable[[], ApiReviews],
) -> Servers:
    """Start both servers; ``reviews()`` builds what asks the API server who may read /metrics
    (on a client of its own), unless ``--metrics-insecure``."""
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
            api_reviews = reviews()
            servers.close_after(api_reviews.close)
            reviewer = AccessReviewer(api_reviews)
            servers.close_after(reviewer.close)
            registry.register(AccessCounts(reviewer))
            await servers.add(
                build_metrics_app(registry, reviewer=reviewer), port=s.metrics_port, tls=tls
            )
    except BaseException:
        await servers.cleanup()
        raise
    return servers

"""/healthz and /readyz for the kubelet, /metrics for Prometheus, and the Prometheus side of
telemetry.

Two servers: the probes answer plain HTTP on ``--http-port`` (the kubelet probes without
credentials); /metrics is served on ``--metrics-port`` over HTTPS to callers the API server
authenticates (TokenReview) and authorizes for ``get`` on the non-resource URL ``/metrics``
(SubjectAccessReview), as kubebuilder's operators do.  ``--metrics-insecure`` serves it over
plain HTTP to anyone instead, for a laptop or a network that is private anyway.

The registry is per operator instance (not prometheus_client's global one), so that tests can
run several and so that nothing registers at import time.
"""

from __future__ import annotations

import bisect
import ssl
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpushare_operator.app import servingcerts
from gpushare_operator.kube.access import AccessReviewer, Decision

if TYPE_CHECKING:
    from gpushare_operator.app.assembly import Assembly

log = structlog.get_logger(__name__)

_LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
_POLICY_NODE_FIELDS = {
    "matched": "matchedNodes",
    "applied": "appliedNodes",
    "verified": "verifiedNodes",
    "conflicting": "conflictingNodes",
}


class IngestCounts(Collector):
    """Events ingested and their latencies, counted in plain lists and exposed at scrape time.

    Once per watch event, prometheus_client's ``labels()``, locks and per-bucket counters cost
    a tenth of what handling the event does; a bisect and two additions here cost next to
    nothing, and the scrape (every few seconds at most) turns them into the same two families.
    """

    def __init__(self) -> None:
        self._buckets: dict[str, list[int]] = {}  # per kind: events per latency bucket, +Inf last
        self._sums: dict[str, float] = {}

    def add(self, kind: str, seconds: float) -> None:
        buckets = self._buckets.get(kind)
        if buckets is None:
            buckets = self._buckets[kind] = [0] * (len(_LATENCY_BUCKETS) + 1)
            self._sums[kind] = 0.0
        buckets[bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        self._sums[kind] += seconds

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "gpushare_events_ingested", "Watch events ingested", labels=["kind"]
        )
        latency = HistogramMetricFamily(
            "gpushare_ingest_seconds", "Time to ingest one watch event", labels=["kind"]
        )
        for kind, buckets in sorted(self._buckets.items()):
            events.add_metric([kind], sum(buckets))
            bounds = [*(str(bound) for bound in _LATENCY_BUCKETS), "+Inf"]
            cumulative = [sum(buckets[: i + 1]) for i in range(len(buckets))]
            latency.add_metric([kind], list(zip(bounds, cumulative, strict=True)), self._sums[kind])
        yield events
        yield latency


class PrometheusTelemetry:
    """kube.telemetry.Telemetry, counted in a registry of our own."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ingested = IngestCounts()
        registry.register(self.ingested)
        self.informer_failures = Counter(
            "gpushare_informer_failures",
            "List or watch failures that made an informer back off and re-list, by reason "
            "(api, connection, event: one object could not be decoded or applied, unexpected)",
            ["kind", "reason"],
            registry=registry,
        )
        self.reconcile = Histogram(
            "gpushare_reconcile_seconds",
            "Time to plan one object",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.writes = Counter(
            "gpushare_writes",
            "API writes by kind and outcome",
            ["kind", "outcome"],
            registry=registry,
        )
        self.write_latency = Histogram(
            "gpushare_write_seconds",
            "API write latency",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )

    def event_ingested(self, kind: str, seconds: float) -> None:
        self.ingested.add(kind, seconds)

    def informer_failed(self, kind: str, reason: str) -> None:
        self.informer_failures.labels(kind, reason).inc()

    def reconciled(self, kind: str, seconds: float) -> None:
        self.reconcile.labels(kind).observe(seconds)

    def wrote(self, kind: str, outcome: str, seconds: float) -> None:
        self.writes.labels(kind, outcome).inc()
        self.write_latency.labels(kind).observe(seconds)


class StateCollector(Collector):
    """Gauges read from the operator's state at scrape time: nothing to keep in step."""

    def __init__(self, assembly: Assembly) -> None:
        self._assembly = assembly

    def collect(self) -> Iterator[Metric]:
        a = self._assembly
        state = a.state
        caches = GaugeMetricFamily("gpushare_cache_objects", "Objects cached", labels=["kind"])
        for kind, size in (
            ("Node", len(state.nodes)),
            ("Pod", len(state.usage.pods)),
            ("GPUSharingPolicy", len(state.policies)),
            ("GPUNodeState", len(state.node_states)),
        ):
            caches.add_metric([kind], size)
        yield caches
        yield GaugeMetricFamily(
            "gpushare_write_queue_depth",
            "Objects still to write: queued, being written, held back, or waiting to retry",
            value=a.writer.backlog,
        )
        yield GaugeMetricFamily(
            "gpushare_leader", "1 while this replica leads", value=int(a.gate.is_leader())
        )
        yield from self._policy_metrics()

    def _policy_metrics(self) -> Iterator[Metric]:
        nodes = GaugeMetricFamily(
            "gpushare_policy_nodes", "Nodes per policy and state", labels=["policy", "state"]
        )
        slots = GaugeMetricFamily(
            "gpushare_policy_slots", "Shared GPU slots per policy", labels=["policy", "kind"]
        )
        for name, status in sorted(self._assembly.reconciler.memory.rendered_policies.items()):
            if name not in self._assembly.state.policies:
                continue
            for label, field in _POLICY_NODE_FIELDS.items():
                nodes.add_metric([name, label], status.get(field, 0))
            for kind in ("capacity", "allocated"):
                slots.add_metric([name, kind], status.get("slots", {}).get(kind, 0))
        yield nodes
        yield slots
        yield from self._rollout_metrics()

    def _rollout_metrics(self) -> Iterator[Metric]:
        """Live from the rollout book, not from the last status written (which waits for nodes
        to settle): what a dashboard of a rollout in progress wants."""
        book = self._assembly.reconciler.book
        nodes = GaugeMetricFamily(
            "gpushare_rollout_nodes",
            "Nodes per policy at each step of its rollout",
            labels=["policy", "state"],
        )
        for name in sorted(self._assembly.state.policies):
            counts = book.counts(name)
            for state in _ROLLOUT_STATES:
                nodes.add_metric([name, state], getattr(counts, state))
        yield nodes
        yield GaugeMetricFamily(
            "gpushare_unavailable_nodes",
            "GPU nodes between a config label change and Verified, over all policies",
            value=book.unavailable(),
        )
        yield GaugeMetricFamily(
            "gpushare_max_unavailable_nodes",
            "The cluster-wide budget of unavailable GPU nodes (--max-unavailable)",
            value=book.cluster_budget(),
        )


_ROLLOUT_STATES = ("updated", "changing", "failed", "admitted", "waiting", "blocked", "unavailable")


def build_probe_app(assembly: Assembly) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        problem = assembly.health_problem(now=time.monotonic())
        if problem is not None:
            return web.Response(status=503, text=problem + "\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if not assembly.synced:
            return web.Response(status=503, text="caches not synced\n")
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


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


async def serve(assembly: Assembly, registry: CollectorRegistry) -> Servers:
    s = assembly.settings
    servers = Servers()
    try:
        await servers.add(build_probe_app(assembly), port=s.http_port)
        if s.metrics_insecure:
            await servers.add(build_metrics_app(registry, reviewer=None), port=s.metrics_port)
        else:
            tls = servingcerts.server_context(
                cert_file=s.metrics_cert_file, key_file=s.metrics_key_file
            )
            reviewer = AccessReviewer(assembly.handle.api)
            await servers.add(
                build_metrics_app(registry, reviewer=reviewer), port=s.metrics_port, tls=tls
            )
    except BaseException:
        await servers.cleanup()
        raise
    return servers

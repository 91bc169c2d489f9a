"""What the operator measures, for Prometheus: the telemetry of its reads and writes, and the
gauges of its state, read at scrape time.

The registry is per operator instance (not prometheus_client's global one), so that tests can
run several and so that nothing registers at import time.  Serving it is app.serving's job.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpushare_operator.core.rollout import rollouts
from gpushare_operator.core.rollout.rollouts import Counts
from gpushare_operator.core.slots import memoryrequests
from gpushare_operator.core.slots.slotclasses import Offer

_LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
# Fine below 5 ms, where the budgets are (2 ms, 3 ms while nodes storm); the API server's own
# histogram starts at 5 ms.
_ADMISSION_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.5,
)
_POLICY_NODE_FIELDS = {
    "matched": "matchedNodes",
    "applied": "appliedNodes",
    "verified": "verifiedNodes",
    "conflicting": "conflictingNodes",
}
_ROLLOUT_STATES = (
    "updated",
    "changing",
    "failed",
    "degraded",
    "admitted",
    "waiting",
    "blocked",
    "unavailable",
)

# The policy conditions that say a rollout cannot move, and every reason they give.
_STALLING = frozenset({("RolloutHalted", "True"), ("Progressing", "False")})
_STALL_REASONS = (
    rollouts.FAILURE_THRESHOLD,
    rollouts.BUDGET_HELD,
    rollouts.DEADLINE_EXCEEDED,
)


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
        self.evictions = Counter(
            "gpushare_evictions",
            "Pod evictions for podPolicy Evict: started (the API server accepted one), done (the"
            " pod is gone), blocked (pods left when a node was given up: EvictionBlocked)",
            ["result"],
            registry=registry,
        )
        for result in ("started", "done", "blocked"):
            self.evictions.labels(result)
        self.write_latency = Histogram(
            "gpushare_write_seconds",
            "API write latency",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )

        self.admissions = Counter(
            "gpushare_webhook_admissions",
            "Pods the memory-request webhook answered, by outcome: mutated (given a slot),"
            " refused (the message says why), unavailable (caches not synced yet)",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("mutated", "refused", "unavailable"):
            self.admissions.labels(outcome)
        self.refusals = Counter(
            "gpushare_webhook_refusals",
            "Pods the memory-request webhook refused, by reason: no slot enforces GPU memory,"
            " the request is larger than any slot, a broken request label, a pod that already"
            " asks for a GPU, a container that cannot hold the slot, an MPS limit outside it",
            ["reason"],
            registry=registry,
        )
        for reason in memoryrequests.REASONS:
            self.refusals.labels(reason)
        self.admission_latency = Histogram(
            "gpushare_webhook_admission_seconds",
            "Time from having an admission review whole to handing its answer to the kernel, on"
            " the webhook server's own thread (the wall time to the write, plus the write's own"
            " CPU time): the operator's own share (the API server's"
            " apiserver_admission_webhook_admission_duration_seconds adds its side, the network"
            " and TLS)",
            buckets=_ADMISSION_BUCKETS,
            registry=registry,
        )
        self.write_wait = Histogram(
            "gpushare_webhook_write_wait_seconds",
            "How long an answer's write kept the webhook server's thread off its core beyond the"
            " write's own CPU time: on loopback the send wakes the API server's reader, which"
            " the kernel may run on this core first; the answer is the API server's by then",
            buckets=_ADMISSION_BUCKETS,
            registry=registry,
        )
        self.review_receive = Histogram(
            "gpushare_webhook_review_receive_seconds",
            "Time from an admission review's first byte to its last, as the webhook server"
            " reads them: how long the API server and the network took to deliver it",
            buckets=_ADMISSION_BUCKETS,
            registry=registry,
        )

    def admitted(self, outcome: str, reason: str | None = None) -> None:
        self.admissions.labels(outcome).inc()
        if reason is not None:
            self.refusals.labels(reason).inc()

    def admission_took(self, receiving: float, answering: float, waiting: float) -> None:
        self.review_receive.observe(receiving)
        self.admission_latency.observe(answering)
        self.write_wait.observe(waiting)

    def event_ingested(self, kind: str, seconds: float) -> None:
        self.ingested.add(kind, seconds)

    def informer_failed(self, kind: str, reason: str) -> None:
        self.informer_failures.labels(kind, reason).inc()

    def reconciled(self, kind: str, seconds: float) -> None:
        self.reconcile.labels(kind).observe(seconds)

    def wrote(self, kind: str, outcome: str, seconds: float) -> None:
        self.writes.labels(kind, outcome).inc()
        self.write_latency.labels(kind).observe(seconds)

    def evicted(self, result: str, count: int) -> None:
        self.evictions.labels(result).inc(count)


class WebhookCertificate(Collector):
    """The memory-request webhook's serving certificate, as this replica serves it: whether one
    is loaded (without one the webhook does not answer and the API server refuses labelled
    pods), and its validity, read at scrape time."""

    def __init__(self, validity: Callable[[], tuple[float, float] | None]) -> None:
        self._validity = validity  # (notBefore, notAfter) in Unix seconds; None: none loaded

    def collect(self) -> Iterator[Metric]:
        validity = self._validity()
        yield GaugeMetricFamily(
            "gpushare_webhook_certificate_loaded",
            "1 while this replica has a webhook serving certificate loaded, else 0",
            value=int(validity is not None),
        )
        not_before = GaugeMetricFamily(
            "gpushare_webhook_certificate_not_before_timestamp_seconds",
            "When the webhook serving certificate this replica serves became valid",
        )
        not_after = GaugeMetricFamily(
            "gpushare_webhook_certificate_expiry_timestamp_seconds",
            "When the webhook serving certificate this replica serves expires",
        )
        if validity is not None:
            not_before.add_metric([], validity[0])
            not_after.add_metric([], validity[1])
        yield not_before
        yield not_after


class Readings(Protocol):
    """What the gauges read at scrape time; app.assembly adapts the operator's parts to it, so
    that this module knows nothing of where the caches, the writer or the rollout book live."""

    def cache_sizes(self) -> Iterable[tuple[str, int]]:
        """(kind, objects cached) for each informer's kind and the policies."""
        ...

    def write_backlog(self) -> int:
        """Objects still to write: queued, being written, held back, or waiting to retry."""
        ...

    def is_leader(self) -> bool: ...

    def policies(self) -> Iterable[str]:
        """The names of the policies that exist now."""
        ...

    def rendered_status(self, policy: str) -> Mapping[str, Any] | None:
        """The policy status last rendered for ``policy``; None before the first."""
        ...

    def rollout_counts(self, policy: str) -> Counts:
        """Where the nodes of the policy's rollout are, live (not the last status written)."""
        ...

    def unavailable_nodes(self) -> int:
        """GPU nodes between a config label change and Verified, over all policies."""
        ...

    def max_unavailable_nodes(self) -> int:
        """The cluster-wide budget of unavailable GPU nodes (``--max-unavailable``)."""
        ...

    def node_phases(self) -> Iterable[tuple[str, str, int]]:
        """(policy, phase, GPU nodes) as the GPUNodeStates' statuses say (policy "" for none)."""
        ...

    def slot_offers(self) -> Iterable[tuple[Offer, int]]:
        """(class, nodes offering it) in this replica's node cache: what its webhook places."""
        ...


class StateCollector(Collector):
    """Gauges read from the operator's state at scrape time: nothing to keep in step."""

    def __init__(self, readings: Readings) -> None:
        self._readings = readings

    def collect(self) -> Iterator[Metric]:
        r = self._readings
        caches = GaugeMetricFamily("gpushare_cache_objects", "Objects cached", labels=["kind"])
        for kind, size in r.cache_sizes():
            caches.add_metric([kind], size)
        yield caches
        yield GaugeMetricFamily(
            "gpushare_write_queue_depth",
            "Objects still to write: queued, being written, held back, or waiting to retry",
            value=r.write_backlog(),
        )
        yield GaugeMetricFamily(
            "gpushare_leader", "1 while this replica leads", value=int(r.is_leader())
        )
        offers = GaugeMetricFamily(
            "gpushare_webhook_offer_nodes",
            "Nodes whose slot labels offer a memory class, as this replica's cache holds them:"
            " what its webhook can place (a follower shows a leader's label a moment later)",
            labels=["policy", "resource", "isolation", "memory_mib"],
        )
        for offer, count in r.slot_offers():
            offers.add_metric(
                [offer.policy, offer.resource, offer.isolation, str(offer.memory_mib)], count
            )
        yield offers
        phases = GaugeMetricFamily(
            "gpushare_node_phases",
            "GPU nodes per policy and phase, as their GPUNodeStates say (policy empty: none)",
            labels=["policy", "phase"],
        )
        for policy, phase, count in r.node_phases():
            phases.add_metric([policy, phase], count)
        yield phases
        policies = sorted(r.policies())
        yield from self._policy_metrics(policies)
        yield from self._rollout_metrics(policies)

    def _policy_metrics(self, policies: list[str]) -> Iterator[Metric]:
        nodes = GaugeMetricFamily(
            "gpushare_policy_nodes", "Nodes per policy and state", labels=["policy", "state"]
        )
        slots = GaugeMetricFamily(
            "gpushare_policy_slots", "Shared GPU slots per policy", labels=["policy", "kind"]
        )
        per_resource = GaugeMetricFamily(
            "gpushare_policy_resource_slots",
            "A MIG policy's slots per extended resource",
            labels=["policy", "resource", "kind"],
        )
        for name in policies:
            status = self._readings.rendered_status(name)
            if status is None:
                continue
            for label, field in _POLICY_NODE_FIELDS.items():
                nodes.add_metric([name, label], status.get(field, 0))
            for kind in ("capacity", "allocated"):
                slots.add_metric([name, kind], status.get("slots", {}).get(kind, 0))
            for resource, counts in (status.get("slots", {}).get("byResource") or {}).items():
                for kind in ("capacity", "allocated"):
                    per_resource.add_metric([name, resource, kind], counts.get(kind, 0))
        yield nodes
        yield slots
        yield per_resource
        yield self._stalled(policies)

    def _stalled(self, policies: list[str]) -> Metric:
        """1 for each reason a policy's rollout cannot move (the one to page on), else 0."""
        stalled = GaugeMetricFamily(
            "gpushare_rollout_stalled",
            "1 while a policy's rollout cannot move for this reason (RolloutHalted's, or"
            " ProgressDeadlineExceeded), else 0",
            labels=["policy", "reason"],
        )
        for name in policies:
            status = self._readings.rendered_status(name)
            if status is None:
                continue
            holding = {
                str(c.get("reason"))
                for c in status.get("conditions") or ()
                if (c.get("type"), c.get("status")) in _STALLING
            }
            for reason in _STALL_REASONS:
                stalled.add_metric([name, reason], int(reason in holding))
        return stalled

    def _rollout_metrics(self, policies: list[str]) -> Iterator[Metric]:
        """Live from the rollout book, not from the last status written (which waits for nodes
        to settle): what a dashboard of a rollout in progress wants."""
        nodes = GaugeMetricFamily(
            "gpushare_rollout_nodes",
            "Nodes per policy at each step of its rollout",
            labels=["policy", "state"],
        )
        for name in policies:
            counts = self._readings.rollout_counts(name)
            for state in _ROLLOUT_STATES:
                nodes.add_metric([name, state], getattr(counts, state))
        yield nodes
        yield GaugeMetricFamily(
            "gpushare_unavailable_nodes",
            "GPU nodes between a config label change and Verified, over all policies",
            value=self._readings.unavailable_nodes(),
        )
        yield GaugeMetricFamily(
            "gpushare_max_unavailable_nodes",
            "The cluster-wide budget of unavailable GPU nodes (--max-unavailable)",
            value=self._readings.max_unavailable_nodes(),
        )

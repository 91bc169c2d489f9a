"""Ingest telemetry counted in plain lists shows the same families prometheus_client's own would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_operator.app.metrics import _LATENCY_BUCKETS, PrometheusTelemetry

EVENTS = [("Node", 0.00005), ("Node", 0.0001), ("Node", 0.003), ("Node", 9.0), ("Pod", 0.0002)]


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
        and family.name in ("gpushare_events_ingested", "gpushare_ingest_seconds")
    }


def test_the_same_samples_as_a_counter_and_a_histogram() -> None:
    ours = CollectorRegistry()
    telemetry = PrometheusTelemetry(ours)
    reference = CollectorRegistry()
    counter = Counter("gpushare_events_ingested", "x", ["kind"], registry=reference)
    histogram = Histogram(
        "gpushare_ingest_seconds", "x", ["kind"], buckets=_LATENCY_BUCKETS, registry=reference
    )
    for kind, seconds in EVENTS:
        telemetry.event_ingested(kind, seconds)
        counter.labels(kind).inc()
        histogram.labels(kind).observe(seconds)
    assert samples(ours) == samples(reference)
    assert samples(ours)[("gpushare_events_ingested_total", (("kind", "Node"),))] == 4

"""The state gauges read what metrics.Readings gives them, at scrape time, and the operator's
adapter gives them its caches, leadership, rendered statuses and rollout book."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_operator.app.assembly import Assembly, MetricsReadings
from gpushare_operator.app.metrics import StateCollector
from gpushare_operator.app.settings import parse_settings
from gpushare_operator.core.records.nodes import POLICY_LABEL
from gpushare_operator.core.rollout.rollouts import Counts
from gpushare_operator.core.slots import slotclasses
from gpushare_operator.core.slots.slotclasses import Isolation, Offer
from gpushare_operator.kube.connection import ApiHandle


class ScriptedReadings:
    """metrics.Readings with figures set by the test."""

    def __init__(self) -> None:
        self.leader = False
        self.statuses: dict[str, Mapping[str, Any]] = {}
        self.counts: dict[str, Counts] = {}
        self.offers: list[tuple[Offer, int]] = []
        self.phases: list[tuple[str, str, int]] = []

    def cache_sizes(self) -> Iterable[tuple[str, int]]:
        return (("Node", 3), ("Pod", 5))

    def write_backlog(self) -> int:
        return 7

    def is_leader(self) -> bool:
        return self.leader

    def policies(self) -> Iterable[str]:
        return self.counts.keys()

    def rendered_status(self, policy: str) -> Mapping[str, Any] | None:
        return self.statuses.get(policy)

    def rollout_counts(self, policy: str) -> Counts:
        return self.counts[policy]

    def unavailable_nodes(self) -> int:
        return 2

    def max_unavailable_nodes(self) -> int:
        return 4

    def slot_offers(self) -> Iterable[tuple[Offer, int]]:
        return self.offers

    def node_phases(self) -> Iterable[tuple[str, str, int]]:
        return self.phases


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_gauges_show_the_readings_of_each_scrape() -> None:
    readings = ScriptedReadings()
    registry = CollectorRegistry()
    registry.register(StateCollector(readings))
    readings.counts = {"b": Counts(changing=1), "a": Counts(updated=2, unavailable=1)}
    readings.statuses = {"a": {"matchedNodes": 3, "slots": {"capacity": 8}}}
    first = scrape(registry)
    assert first[("gpushare_cache_objects", (("kind", "Pod"),))] == 5
    assert first[("gpushare_write_queue_depth", ())] == 7
    assert first[("gpushare_leader", ())] == 0
    assert first[("gpushare_policy_nodes", (("policy", "a"), ("state", "matched")))] == 3
    assert first[("gpushare_policy_nodes", (("policy", "a"), ("state", "verified")))] == 0
    assert first[("gpushare_policy_slots", (("kind", "capacity"), ("policy", "a")))] == 8
    # No status rendered yet for b: no policy figures for it, but its rollout is live.
    assert not any(
        name == "gpushare_policy_nodes" and ("policy", "b") in labels for name, labels in first
    )
    assert first[("gpushare_rollout_nodes", (("policy", "b"), ("state", "changing")))] == 1
    assert first[("gpushare_rollout_nodes", (("policy", "a"), ("state", "unavailable")))] == 1
    assert (
        first[("gpushare_unavailable_nodes", ())],
        first[("gpushare_max_unavailable_nodes", ())],
    ) == (2, 4)
    mixed = {"nvidia.com/mig-1g.10gb": {"capacity": 14, "allocated": 3}}
    readings.statuses["a"] = {"slots": {"capacity": 14, "allocated": 3, "byResource": mixed}}
    per_resource = scrape(registry)
    key = (("kind", "allocated"), ("policy", "a"), ("resource", "nvidia.com/mig-1g.10gb"))
    assert per_resource[("gpushare_policy_resource_slots", key)] == 3
    readings.leader = True
    del readings.counts["b"]
    second = scrape(registry)
    assert second[("gpushare_leader", ())] == 1
    assert not any(("policy", "b") in labels for _, labels in second)


def test_the_operator_reads_its_own_parts() -> None:
    handle = ApiHandle(configuration=None, api=None)  # type: ignore[arg-type]  # never used here
    operator = Assembly(settings=parse_settings([], env={}), handle=handle)
    operator.cache.upsert_policy(
        {
            "metadata": {"name": "p", "uid": "u", "generation": 1},
            "spec": {"strategy": "TimeSlicing", "replicas": 2},
        }
    )
    operator.reconciler.memory.rendered_policies["p"] = {"matchedNodes": 0}
    readings = MetricsReadings(operator)
    assert dict(readings.cache_sizes()) == {
        "Node": 0,
        "Pod": 0,
        "GPUSharingPolicy": 1,
        "GPUNodeState": 0,
        "PodDisruptionBudget": 0,
    }
    assert readings.write_backlog() == operator.writer.backlog > 0  # the policy's status
    assert readings.is_leader() is False
    assert list(readings.policies()) == ["p"]
    assert readings.rendered_status("p") == {"matchedNodes": 0}
    assert readings.rendered_status("q") is None
    assert readings.rollout_counts("p") == operator.reconciler.book.counts("p")
    book = operator.reconciler.book
    assert readings.unavailable_nodes() == book.unavailable() == 0
    assert readings.max_unavailable_nodes() == book.cluster_budget() == 1  # at least one
    for name, policy, phase in (
        ("n1", "p", "Verified"),
        ("n2", "p", "Verified"),
        ("n3", None, "Unmanaged"),
    ):
        operator.cache.upsert_node_state(
            {"metadata": {"name": name, "uid": name}, "status": {"policy": policy, "phase": phase}}
        )
    assert list(readings.node_phases()) == [("", "Unmanaged", 1), ("p", "Verified", 2)]


def test_the_phase_gauge_counts_nodes_per_policy_and_phase() -> None:
    readings = ScriptedReadings()
    registry = CollectorRegistry()
    registry.register(StateCollector(readings))
    readings.phases = [("p", "Verified", 3), ("p", "Mismatch", 1)]
    seen = scrape(registry)
    assert seen[("gpushare_node_phases", (("phase", "Verified"), ("policy", "p")))] == 3
    assert seen[("gpushare_node_phases", (("phase", "Mismatch"), ("policy", "p")))] == 1
    readings.phases = []
    assert not any(name == "gpushare_node_phases" for name, _ in scrape(registry))


def test_the_offer_gauge_shows_each_class_this_replica_can_place() -> None:
    readings = ScriptedReadings()
    registry = CollectorRegistry()
    registry.register(StateCollector(readings))
    assert not any(name == "gpushare_webhook_offer_nodes" for name, _ in scrape(registry))
    readings.offers = [(Offer(20389, "nvidia.com/gpu", Isolation.MPS, "mps4"), 2)]
    key = (
        ("isolation", "mps"),
        ("memory_mib", "20389"),
        ("policy", "mps4"),
        ("resource", "nvidia.com/gpu"),
    )
    assert scrape(registry)[("gpushare_webhook_offer_nodes", key)] == 2


def test_the_operator_counts_the_offers_its_node_cache_holds() -> None:
    handle = ApiHandle(configuration=None, api=None)  # type: ignore[arg-type]  # never used here
    operator = Assembly(settings=parse_settings([], env={}), handle=handle)
    labels = {
        POLICY_LABEL: "mps4",
        slotclasses.MEMORY_LABEL: "20389",
        slotclasses.ISOLATION_LABEL: "mps",
        slotclasses.RESOURCE_LABEL: "nvidia.com_gpu",
    }
    offers = operator.cache.slot_offers
    offers.update("n1", labels)
    offers.update("n2", labels)
    offers.update("n3", {**labels, slotclasses.ISOLATION_LABEL: "none"})  # promises nothing
    [(offer, count)] = MetricsReadings(operator).slot_offers()
    assert (offer.memory_mib, offer.resource, offer.policy, count) == (
        20389,
        "nvidia.com/gpu",
        "mps4",
        2,
    )

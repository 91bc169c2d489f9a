"""/metrics, /healthz and /readyz of a running operator, scraped as Prometheus and kubelet would:
/metrics over HTTPS with the token of a ServiceAccount the chart's metrics-reader role is bound
to, the probes over plain HTTP.

The operator runs as a child process against the real API server with the GPU node simulator;
its figures are compared with what it published on the API (policy status), and readiness is
shown to wait for every cache by an identity that may not list pods until it is granted that.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_testing import apiobjects as h
from gpushare_testing import podbodies
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory, RunningOperator
from gpushare_testing.replicas import LEASE_PATH
from gpushare_testing.scraping import Scraper, fetch
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

logger = logging.getLogger(__name__)

# Every family the issue lists (counters by their family name, without ``_total``).
FAMILIES = {
    "gpushare_events_ingested": "counter",
    "gpushare_ingest_seconds": "histogram",
    "gpushare_reconcile_seconds": "histogram",
    "gpushare_writes": "counter",
    "gpushare_write_seconds": "histogram",
    "gpushare_cache_objects": "gauge",
    "gpushare_write_queue_depth": "gauge",
    "gpushare_leader": "gauge",
    "gpushare_policy_nodes": "gauge",
    "gpushare_policy_slots": "gauge",
}
NODE_STATES = {
    "matched": "matchedNodes",
    "applied": "appliedNodes",
    "verified": "verifiedNodes",
    "conflicting": "conflictingNodes",
}


def report(message: str) -> None:
    """A measured figure: in the test's output (-s or on failure) and in the INFO log."""
    print(message)
    logger.info(message)


# -- scraping ------------------------------------------------------------------------------------


async def get(operator: RunningOperator, path: str) -> tuple[int, str]:
    """A probe, as the kubelet asks: plain HTTP, no credentials."""
    return await fetch(operator.http_port, path, scheme="http")


async def probe(operator: RunningOperator, path: str) -> int | None:
    """The status of a probe; None while the server is not listening yet."""
    try:
        status, _ = await get(operator, path)
    except aiohttp.ClientConnectionError:
        return None
    return status


@dataclass
class Scrape:
    """One /metrics scrape: families by name, and sample lookup by name and labels."""

    families: dict[str, Any]

    def samples(self, name: str) -> Iterator[Any]:
        for family in self.families.values():
            for sample in family.samples:
                if sample.name == name:
                    yield sample

    def value(self, name: str, **labels: str) -> float | None:
        for sample in self.samples(name):
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
        return None


async def scrape(operator: RunningOperator, reader: Scraper) -> Scrape:
    status, text = await fetch(operator.metrics_port, "/metrics", token=reader.token)
    assert status == 200, text
    return Scrape({f.name: f for f in text_string_to_metric_families(text)})


def delete_lease(plane: ControlPlane) -> None:
    """Lease objects outlive tests (one control plane per session): start from none."""
    status, raw = plane.request("DELETE", LEASE_PATH)
    assert status in (200, 404), raw


# -- fixtures ------------------------------------------------------------------------------------


async def start_leader(
    control_plane: ControlPlane, start_operator: OperatorFactory, namespace: str
) -> RunningOperator:
    delete_lease(control_plane)
    identity = f"obs-{uuid.uuid4().hex[:6]}"
    return await start_operator(
        "--device-plugin-namespace", namespace, "--identity", identity, "--no-metrics-insecure"
    )


def policy_figures(scrape: Scrape, name: str) -> dict[str, float | None]:
    figures = {
        state: scrape.value("gpushare_policy_nodes", policy=name, state=state)
        for state in NODE_STATES
    }
    for kind in ("capacity", "allocated"):
        figures[kind] = scrape.value("gpushare_policy_slots", policy=name, kind=kind)
    return figures


def published_figures(body: dict[str, Any]) -> dict[str, float | None]:
    status = body.get("status") or {}
    figures: dict[str, float | None] = {
        state: float(status.get(field, 0)) for state, field in NODE_STATES.items()
    }
    for kind in ("capacity", "allocated"):
        figures[kind] = float((status.get("slots") or {}).get(kind, 0))
    return figures


async def wait_verified(sim: GpuClusterSimulator, node: str) -> None:
    await eventually(
        lambda: h.node_state(sim.client, node),
        until=lambda s: (s or {}).get("status", {}).get("phase") == "Verified",
        what=f"{node} Verified",
    )


# -- the tests -----------------------------------------------------------------------------------


async def test_metrics_match_the_published_policy_status(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    metrics_reader: Scraper,
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    nodes = await sim.create_gpu_nodes(pool=pool, count=2, gpus=4)
    high, low = h.unique("high"), h.unique("low")
    await h.add_policy(sim, policies, h.policy(high, pool=pool, priority=5, replicas=4))
    await h.add_policy(sim, policies, h.policy(low, pool=pool, priority=1, replicas=2))
    operator = await start_leader(control_plane, start_operator, namespace)
    for name in nodes:
        await wait_verified(sim, name)
    # Three slots in use on the first node: bound by hand, as the scheduler would.
    pod = podbodies.shared_gpu_pod(
        name=h.unique("vllm"),
        node=nodes[0],
        namespace=namespace,
        resource="nvidia.com/gpu",
        count=3,
    )
    status, created = await sim.client.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    assert status == 201, created

    async def pair() -> tuple[Scrape, dict[str, dict[str, Any]]]:
        return await scrape(operator, metrics_reader), {
            name: await h.get_policy(sim.client, name) for name in (high, low)
        }

    def agree(result: tuple[Scrape, dict[str, dict[str, Any]]]) -> bool:
        metrics, bodies_ = result
        expected = {"verified": 2.0, "allocated": 3.0}
        published = published_figures(bodies_[high])
        return all(published[k] == v for k, v in expected.items()) and all(
            policy_figures(metrics, name) == published_figures(body)
            for name, body in bodies_.items()
        )

    started = time.monotonic()
    metrics, published = await eventually(
        pair, until=agree, timeout=30, what="/metrics to agree with the published policy status"
    )
    report(
        f"/metrics agreed with the published status {time.monotonic() - started:.2f} s after "
        f"the pod was bound: {high} {policy_figures(metrics, high)}, "
        f"{low} {policy_figures(metrics, low)}"
    )
    # The figures compared are the interesting ones, not zeros on both sides.
    assert policy_figures(metrics, high) == {
        "matched": 2,
        "applied": 2,
        "verified": 2,
        "conflicting": 0,
        "capacity": 32,
        "allocated": 3,
    }
    assert policy_figures(metrics, low)["matched"] == 2
    assert policy_figures(metrics, low)["conflicting"] == 2
    assert published[low]["status"]["conflictingNodes"] == 2

    # Every family the issue lists, of its type.
    assert {name: metrics.families[name].type for name in FAMILIES if name in metrics.families} == (
        FAMILIES
    )
    assert metrics.value("gpushare_leader") == 1
    for kind in ("Node", "GPUNodeState", "Pod"):
        events = metrics.value("gpushare_events_ingested_total", kind=kind)
        assert events is not None and events > 0, kind
        ingested = metrics.value("gpushare_ingest_seconds_count", kind=kind)
        assert ingested is not None and ingested > 0, kind
    assert (metrics.value("gpushare_cache_objects", kind="Node") or 0) >= 2
    assert (metrics.value("gpushare_cache_objects", kind="GPUSharingPolicy") or 0) >= 2
    assert (metrics.value("gpushare_cache_objects", kind="Pod") or 0) >= 1
    assert metrics.value("gpushare_write_queue_depth") is not None
    for kind in ("configmap", "node-labels", "nodestate-status", "policy-status"):
        writes = metrics.value("gpushare_writes_total", kind=kind, outcome="ok")
        assert writes is not None and writes > 0, kind
        assert (metrics.value("gpushare_write_seconds_count", kind=kind) or 0) >= writes
    for kind in ("node", "policy"):
        assert (metrics.value("gpushare_reconcile_seconds_count", kind=kind) or 0) > 0, kind

    assert await get(operator, "/healthz") == (200, "ok\n")
    assert await get(operator, "/readyz") == (200, "ok\n")


async def test_node_events_ingested_grow_after_a_relabel(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    metrics_reader: Scraper,
    start_operator: OperatorFactory,
) -> None:
    [name] = await sim.create_gpu_nodes(pool=h.unique("pool"), count=1)
    operator = await start_leader(control_plane, start_operator, namespace)
    await sim.wait_idle()
    before = await scrape(operator, metrics_reader)
    events = before.value("gpushare_events_ingested_total", kind="Node") or 0.0
    timed = before.value("gpushare_ingest_seconds_count", kind="Node") or 0.0

    relabelled = time.monotonic()
    await sim.relabel(name, {"team": "vision"})
    after = await eventually(
        lambda: scrape(operator, metrics_reader),
        until=lambda s: (s.value("gpushare_events_ingested_total", kind="Node") or 0) > events,
        interval=0.05,
        what="the Node event count to grow",
    )
    report(
        f"Node events ingested {events:.0f} -> "
        f"{after.value('gpushare_events_ingested_total', kind='Node'):.0f}, "
        f"seen on /metrics {time.monotonic() - relabelled:.3f} s after the relabel"
    )
    assert (after.value("gpushare_ingest_seconds_count", kind="Node") or 0) > timed


@pytest.fixture
def pod_blind_user(control_plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """A user allowed everything the operator needs except pods: (user, its ClusterRole)."""
    name = f"gpushare-nopods-{uuid.uuid4().hex[:6]}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["nodes", "configmaps", "events", "namespaces"],
                "verbs": ["*"],
            },
            {"apiGroups": ["gpushare.dev"], "resources": ["*"], "verbs": ["*"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["*"]},
            {
                "apiGroups": ["apiextensions.k8s.io"],
                "resources": ["customresourcedefinitions"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}],
    }
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    for kind, body in (("clusterroles", role), ("clusterrolebindings", binding)):
        status, raw = control_plane.request("POST", f"{rbac}/{kind}", body=body)
        assert status == 201, raw
    try:
        yield name, f"{rbac}/clusterroles/{name}"
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            control_plane.request("DELETE", f"{rbac}/{kind}/{name}")


async def test_readyz_waits_for_every_cache_and_healthz_does_not(
    control_plane: ControlPlane,
    namespace: str,
    pod_blind_user: tuple[str, str],  # before start_operator: torn down after the operator stops
    start_operator: OperatorFactory,
) -> None:
    user, role_path = pod_blind_user
    operator = await start_operator(
        "--device-plugin-namespace",
        namespace,
        "--identity",
        user,
        user=user,
        groups=(),
        wait=False,
    )
    await eventually(
        lambda: probe(operator, "/healthz"), until=lambda s: s == 200, what="/healthz to answer"
    )

    # It cannot list pods: every other cache syncs, the Pod cache never does.
    async def refusals() -> list[dict[str, Any]]:
        return [
            line
            for line in operator.log_lines()
            if line.get("kind") == "Pod" and line.get("event") == "list failed; retrying"
        ]

    [refused, *_] = await eventually(refusals, what="the Pod list to be refused")
    assert "403" in str(refused.get("error")), refused
    # By design a span, not a condition: "never ready" is watched for 3 s of its list retries.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert await get(operator, "/readyz") == (
            503,
            "caches not synced, or the webhook has no serving certificate yet\n",
        )
        assert await probe(operator, "/healthz") == 200  # alive, merely not ready
        await asyncio.sleep(0.2)
    assert "caches synced" not in operator.logs()

    # Granted pods, the same process syncs its last cache and becomes ready.
    patch = [
        {
            "op": "add",
            "path": "/rules/-",
            "value": {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        }
    ]
    status, raw = control_plane.request(
        "PATCH", role_path, body=patch, content_type="application/json-patch+json"
    )
    assert status == 200, raw
    granted = time.monotonic()
    await eventually(
        lambda: probe(operator, "/readyz"),
        until=lambda s: s == 200,
        timeout=45,
        interval=0.1,
        what="/readyz once pods can be listed",
    )
    report(f"/readyz 200 {time.monotonic() - granted:.2f} s after pods were granted")
    assert "caches synced" in operator.logs()
    assert await probe(operator, "/healthz") == 200

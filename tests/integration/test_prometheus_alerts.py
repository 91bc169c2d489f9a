"""The shipped alerts and dashboard against a real Prometheus scraping a real operator on the
local control plane.

A rollout halts (its canary's agents never follow the new config: ``Mismatch``, then
``FailureThresholdReached``), a node that was ``Verified`` loses a GPU (``Degraded``), and a pod
asking for more GPU memory than any slot enforces is refused by the webhook.  Prometheus, with
the chart's rules time-scaled by ``SCALE`` (``gpushare_testing.prometheus.time_scaled``: each
``for:`` and range window divided by it, nothing else changed), must show through its HTTP API
the matching alerts firing, and no other; every dashboard panel's queries must return series;
then, the node healed, the GPU restored and a memory pod placed, every alert must resolve.
The operator's scrape passes ``promtool check metrics``.

Prometheus scrapes the operator's plain port (``--metrics-insecure``, as the operator tests run
it): what is under test here is the rules and the panels, which read the same series over either
port; the chart's HTTPS port behind TokenReview and SubjectAccessReview is scraped with a
ServiceAccount token in ``test_metrics_auth.py``.

``GPUSHARE_DASHBOARD_PREVIEW=<png>`` (``make dashboard-preview``) also draws the dashboard's
panels over the scenario into that file.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import prometheus as prom
from gpushare_testing import webhooks as wh
from gpushare_testing.controlplane import free_port
from gpushare_testing.operators import OperatorFactory, RunningOperator
from gpushare_testing.rolloutstate import all_verified, rollout_state
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

SCALE = 60  # the rules' minutes become seconds: for: 10m fires after 10 s
POD = "gpushare-operator-0"  # the target's pod label: the dashboard reads the leader by it
JOB = "gpushare"


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


@pytest.fixture
async def prometheus(tmp_path: Path) -> AsyncIterator[Callable[[RunningOperator], Any]]:
    """Start a Prometheus scraping one operator's /metrics every second, with the shipped
    rules time-scaled; stopped at the end."""
    started: list[prom.PrometheusServer] = []

    async def start(operator: RunningOperator) -> prom.PrometheusServer:
        rules = prom.time_scaled(prom.load_rules(), SCALE)
        target = prom.Target(f"127.0.0.1:{operator.metrics_port}", {"pod": POD})
        server = prom.PrometheusServer(tmp_path / "prometheus", [target], rules=rules, job=JOB)
        started.append(server)
        await in_thread(server.wait_ready)
        return server

    yield start
    for server in started:
        server.stop()
        print(f"--- prometheus log ---\n{server.logs()[-5000:]}")


def scrape(operator: RunningOperator) -> str:
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"  # --metrics-insecure: see conftest
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


EXPECTED = ("GpushareRolloutHalted", "GpushareNodesMismatch", "GpushareNodesDegraded")


async def test_alerts_fire_for_real_faults_and_resolve_once_fixed(
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
    prometheus: Callable[[RunningOperator], Any],
) -> None:
    halting, drifting = h.unique("halt"), h.unique("drift")
    canary, steady = sorted(await sim.create_gpu_nodes(pool=halting, count=2, gpus=1))
    [degrading] = await sim.create_gpu_nodes(pool=drifting, count=1, gpus=2)
    # MPS: its Verified nodes offer a memory class, which the webhook places pods in.
    rollout = {"maxUnavailable": 1, "canary": 1, "failureThreshold": 1}
    await h.add_policy(
        sim, policies, h.policy(halting, pool=halting, strategy="MPS", rollout=rollout)
    )
    await h.add_policy(sim, policies, h.policy(drifting, pool=drifting))
    port = free_port()
    await wh.install(sim, webhook_flags.configuration, port=port)
    operator = await start_operator(
        "--device-plugin-namespace",
        namespace,
        "--mismatch-timeout",
        "3",
        *webhook_flags.args(port=port),
    )
    await wh.wait_published(sim, webhook_flags.configuration)
    await all_verified(sim, [canary, steady], halting)
    await all_verified(sim, [degrading], drifting)

    # The operator's exposition is what promtool's linter wants (names, units, _total, help).
    status, said = await in_thread(lambda: prom.check_metrics(scrape(operator)))
    assert (status, said) == (0, ""), said

    server: prom.PrometheusServer = await prometheus(operator)
    started = time.time()

    async def leading() -> list[dict[str, Any]]:
        return list(await in_thread(lambda: server.query(f'gpushare_leader{{job="{JOB}"}} == 1')))

    await eventually(leading, timeout=30, what="Prometheus to scrape the leading operator")
    assert await in_thread(server.alerts) == []  # a healthy operator pages no one

    # -- the faults, for real ------------------------------------------------------------------
    sim.lose_gpu(degrading)  # Verified once, allocatable short of its config since: Degraded
    sim.set_healthy(canary, False)  # its agents never follow the next config: Mismatch
    await h.patch_policy(sim.client, halting, {"replicas": 8})
    status, body = await sim.client.post(
        f"/api/v1/namespaces/{namespace}/pods", wh.memory_pod("huge", memory="100Gi")
    )
    assert status == 403 and "no GPU slot enforces 100Gi" in body["message"], body

    seen: set[str] = set()
    extra: set[str] = set()

    async def alerts() -> list[dict[str, Any]]:
        now = list(await in_thread(server.alerts))
        firing = {a["labels"]["alertname"] for a in now if a["state"] == "firing"}
        seen.update(firing)
        extra.update(firing - {*EXPECTED, "GpushareMemoryRequestsAllRefused"})
        return now

    def all_fired(now: list[dict[str, Any]]) -> bool:
        return (
            prom.firing(
                now, "GpushareRolloutHalted", policy=halting, reason="FailureThresholdReached"
            )
            and prom.firing(now, "GpushareNodesMismatch", policy=halting)
            and prom.firing(now, "GpushareNodesDegraded", policy=drifting)
            and "GpushareMemoryRequestsAllRefused" in seen  # it resolves by itself, soon
        )

    firing_now = await eventually(alerts, until=all_fired, timeout=120, what="the alerts to fire")
    assert extra == set(), f"alerts fired that the faults do not explain: {extra}"
    refused = [a for a in firing_now if a["labels"]["alertname"] in EXPECTED]
    for alert in refused:
        assert alert["labels"]["severity"] == "warning"
        assert alert["annotations"]["runbook_url"].endswith(alert["labels"]["alertname"].lower())
        assert alert["labels"]["policy"] in alert["annotations"]["description"]
    assert (await rollout_state(sim, halting, "Halted"))["failedNodes"] == 1

    # -- every panel charts something --------------------------------------------------------
    board = json.loads(prom.DASHBOARD.read_text())
    queries = prom.panel_queries(board)
    assert len({q.panel for q in queries}) >= 20
    empty = []
    for query in queries:
        expr = prom.grafana_expanded(
            query.expr, rate_interval="10s", variables={"job": JOB, "policy": ".*"}
        )
        if not await in_thread(server.query, expr):
            empty.append(f"{query.panel} [{query.ref}]: {expr}")
    assert empty == [], "panels whose queries return no series:\n" + "\n".join(empty)

    # -- fixed: every alert resolves -------------------------------------------------------
    sim.set_healthy(canary, True)
    sim.restore_gpus(degrading)
    status, body = await sim.client.post(
        f"/api/v1/namespaces/{namespace}/pods", wh.memory_pod("fits", memory="4Gi")
    )
    assert status == 201, body  # placed in an MPS slot: not every memory request is refused
    await all_verified(sim, [canary, steady], halting, timeout=120)
    await all_verified(sim, [degrading], drifting)
    await eventually(
        alerts,
        until=lambda now: (
            not any(
                prom.active(now, name) for name in (*EXPECTED, "GpushareMemoryRequestsAllRefused")
            )
        ),
        timeout=60,
        what="every alert to resolve",
    )
    assert extra == set(), f"alerts fired that the faults do not explain: {extra}"
    assert seen >= {*EXPECTED, "GpushareMemoryRequestsAllRefused"}

    out = os.environ.get("GPUSHARE_DASHBOARD_PREVIEW")
    if out:
        from gpushare_testing import dashboardpreview

        end = time.time()
        blank = await in_thread(
            lambda: dashboardpreview.render(server, board, start=started, end=end, out=Path(out))
        )
        assert blank == [], f"panels drawn without data: {blank}"

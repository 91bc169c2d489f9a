"""Operator processes for the integration tests: ``python -m gpushare_operator run``, as users run
it, against a local control plane, with its log in a file and its /metrics over plain HTTP.

The ``start_operator`` fixture starts them on the session's control plane; the tests with a
control plane of their own (chaos, lease load) call ``spawn`` themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gpushare_testing.apiobjects import OPERATOR_USER
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.waiting import eventually

OPERATOR_NAMESPACE = "gpushare-system"  # the operator's Lease lives here


@dataclass
class RunningOperator:
    """One operator process: its log, its client identity and its ports."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    user: str
    http_port: int
    metrics_port: int = 0  # plain HTTP (--metrics-insecure) unless the test asked otherwise

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.logs().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines

    async def wait_synced(self, *, timeout: float = 60.0) -> None:
        async def synced() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.logs()}")
            return "caches synced" in self.logs()

        await eventually(synced, timeout=timeout, what="operator caches to sync")

    async def metrics(self) -> dict[str, float]:
        """Every sample of its /metrics, keyed ``name{label=value,...}`` (``name`` alone when
        it has no labels)."""
        samples: dict[str, float] = {}
        for name, labels, value in await self._samples():
            pairs = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            samples[f"{name}{{{pairs}}}" if pairs else name] = value
        return samples

    async def labelled(self, name: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of each sample called ``name`` in its /metrics."""
        return [(labels, value) for found, labels, value in await self._samples() if found == name]

    async def _samples(self) -> list[tuple[str, dict[str, str], float]]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        timeout = aiohttp.ClientTimeout(total=10)  # a frozen (SIGSTOPped) one never answers
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url) as response,
        ):
            assert response.status == 200, response.status
            text = await response.text()
        return [
            (sample.name, dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    async def leader_gauge(self) -> float:
        """``gpushare_leader``: 1 while it leads."""
        return (await self.metrics())["gpushare_leader"]

    async def write_queue_depth(self) -> float:
        """``gpushare_write_queue_depth``: objects queued, being written or waiting to retry."""
        return (await self.metrics())["gpushare_write_queue_depth"]

    async def cached(self) -> dict[str, float]:
        """``gpushare_cache_objects`` by kind: what its caches hold right now."""
        return {
            labels["kind"]: value for labels, value in await self.labelled("gpushare_cache_objects")
        }

    async def events_ingested(self, kind: str) -> float:
        """How many watch events of ``kind`` its informers have ingested so far."""
        return (await self.metrics()).get(f"gpushare_events_ingested_total{{kind={kind}}}", 0.0)

    def stop(self, *, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"operator ignored {sig} for {timeout} s") from None
        return int(self.proc.returncode)

    def resume(self) -> None:
        """SIGCONT a possibly frozen operator, so that nothing is left stopped behind a test."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)

    async def exited(self, *, timeout: float = 30) -> int:
        """The exit code, waiting without blocking the event loop (the simulator runs on it)."""

        async def returncode() -> int | None:
            return self.proc.poll()

        result = await eventually(
            returncode, until=lambda rc: rc is not None, timeout=timeout, what="its exit"
        )
        assert result is not None
        return result


OperatorFactory = Callable[..., Awaitable[RunningOperator]]


def ensure_namespace(plane: ControlPlane, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    status, raw = plane.request("POST", "/api/v1/namespaces", body=body)
    assert status in (201, 409), raw


def spawn(
    plane: ControlPlane,
    log_path: Path,
    *args: str,
    user: str = OPERATOR_USER,
    groups: tuple[str, ...] = ("system:masters",),
    kubeconfig: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> RunningOperator:
    """Start an operator process (not waiting for it to sync) in ``OPERATOR_NAMESPACE``.

    Its propagation delay is 1 s, so that tests need not wait out the default, and its
    cluster-wide budget is every GPU node (a new policy's nodes count against it: tests of
    other things should not wait on pacing; test_rollouts sets its own); ``env`` adds or
    overrides ``GPUSHARE_*`` settings, and flags override both.
    """
    ensure_namespace(plane, OPERATOR_NAMESPACE)
    config = kubeconfig or plane.kubeconfig_for_user(user, groups=groups)
    port, metrics_port = free_port(), free_port()
    environment = {
        **os.environ,
        "KUBECONFIG": str(config),
        "GPUSHARE_NAMESPACE": OPERATOR_NAMESPACE,
        "GPUSHARE_CONFIG_PROPAGATION_DELAY": "1",
        "GPUSHARE_MAX_UNAVAILABLE": "100%",
        "GPUSHARE_HTTP_PORT": str(port),
        # Tests scrape over plain HTTP; test_observability passes --no-metrics-insecure.
        "GPUSHARE_METRICS_PORT": str(metrics_port),
        "GPUSHARE_METRICS_INSECURE": "true",
        # The memory-request webhook writes a Secret and a webhook configuration: only the
        # tests of it turn it on (webhooks.py), so that the others count only their own writes.
        "GPUSHARE_WEBHOOK_PORT": "0",
        **(env or {}),
    }
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpushare_operator", "run", "--log-format", "json", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
        )
    return RunningOperator(
        proc=proc, log_path=log_path, user=user, http_port=port, metrics_port=metrics_port
    )

"""Integration tests: every one of them talks to the real local control plane."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpushare_operator.kube import connection
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.simulator import GpuClusterSimulator
from tests.waiting import eventually


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
async def kube_api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """An admin (system:masters) client for the test's own set-up and assertions."""
    configuration = await connection.load_configuration(
        kubeconfig=str(control_plane.admin_kubeconfig)
    )
    async with connection.api_client(configuration) as api:
        yield api


@pytest.fixture
async def namespace(kube_api: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube_api)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    await core.delete_namespace(name)


@dataclass
class RunningOperator:
    """``python -m gpushare_operator run`` in a child process, as users run it."""

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


OperatorFactory = Callable[..., Awaitable[RunningOperator]]
OPERATOR_NAMESPACE = "gpushare-system"  # the operator's Lease lives here


def _ensure_namespace(plane: ControlPlane, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    status, raw = plane.request("POST", "/api/v1/namespaces", body=body)
    assert status in (201, 409), raw


@pytest.fixture
async def start_operator(
    control_plane: ControlPlane, tmp_path: Path
) -> AsyncIterator[OperatorFactory]:
    """Start operator processes (identity ``gpushare-operator`` unless told otherwise)."""
    started: list[RunningOperator] = []

    async def start(
        *args: str,
        user: str = "gpushare-operator",
        groups: tuple[str, ...] = ("system:masters",),
        kubeconfig: Path | None = None,
        wait: bool = True,
    ) -> RunningOperator:
        config = kubeconfig or control_plane.kubeconfig_for_user(user, groups=groups)
        _ensure_namespace(control_plane, OPERATOR_NAMESPACE)
        port, metrics_port = free_port(), free_port()
        log_path = tmp_path / f"operator-{len(started)}.log"
        env = {
            **os.environ,
            "KUBECONFIG": str(config),
            "GPUSHARE_CONFIG_PROPAGATION_DELAY": "1",
            # No cluster-wide pacing unless a test asks (test_rollouts does).
            "GPUSHARE_MAX_UNAVAILABLE": "100%",
            "GPUSHARE_HTTP_PORT": str(port),
            "GPUSHARE_NAMESPACE": OPERATOR_NAMESPACE,
            # Tests scrape over plain HTTP; test_observability passes --no-metrics-insecure.
            "GPUSHARE_METRICS_PORT": str(metrics_port),
            "GPUSHARE_METRICS_INSECURE": "true",
        }
        with log_path.open("wb") as log:
            proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once; we never wait here
                [sys.executable, "-m", "gpushare_operator", "run", "--log-format", "json", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        running = RunningOperator(
            proc=proc, log_path=log_path, user=user, http_port=port, metrics_port=metrics_port
        )
        started.append(running)
        if wait:
            await running.wait_synced()
        return running

    yield start
    for running in started:
        running.stop()
        print(f"--- operator log {running.log_path} ---\n{running.logs()[-20000:]}")


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def crds_installed(control_plane: ControlPlane) -> None:
    """Install crds/ with the real kubectl, as users do, and wait for them to be served."""
    kubectl = [
        str(control_plane.bin_dir / "kubectl"),
        "--kubeconfig",
        str(control_plane.admin_kubeconfig),
    ]
    subprocess.run([*kubectl, "apply", "-f", str(ROOT / "crds")], check=True, capture_output=True)
    subprocess.run(
        [
            *kubectl,
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/gpusharingpolicies.gpushare.dev",
            "crd/gpunodestates.gpushare.dev",
        ],
        check=True,
        capture_output=True,
    )


@pytest.fixture
async def sim(
    request: pytest.FixtureRequest, control_plane: ControlPlane, namespace: str
) -> AsyncIterator[GpuClusterSimulator]:
    """GPU nodes and the NVIDIA agents on them; the device-plugin namespace is ``namespace``.

    A test marked ``@pytest.mark.simulator(**knobs)`` gets those constructor knobs.
    """
    marker = request.node.get_closest_marker("simulator")
    knobs = marker.kwargs if marker is not None else {}
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=namespace, **knobs
    ) as simulator:
        yield simulator


@pytest.fixture
async def policies(sim: GpuClusterSimulator) -> AsyncIterator[list[str]]:
    """Names of policies a test created; deleted afterwards so no other test sees them."""
    created: list[str] = []
    try:
        yield created
    finally:
        for name in created:
            path = f"/apis/gpushare.dev/v1alpha1/gpusharingpolicies/{name}"
            status, body = await sim.client.delete(path)
            assert status in (200, 404), body
            # The operator has stopped by now, so nothing releases the nodes and lifts its
            # finalizer: lift it as the documented uninstall does, or the policy stays.
            status, body = await sim.client.patch(
                path,
                {"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )
            assert status in (200, 404), body


@pytest.fixture
async def pods_ns(sim: GpuClusterSimulator, namespace: str) -> AsyncIterator[str]:
    """The namespace for the test's pods (the device-plugin one); its pods are force-deleted
    afterwards, since the simulated kubelet does not finish graceful deletions."""
    try:
        yield namespace
    finally:
        status, body = await sim.client.delete(
            f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": "0"}
        )
        assert status == 200, body

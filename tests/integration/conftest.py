"""Integration tests: every one of them talks to the real local control plane.

Fixtures only: what tests share beyond them lives in ``gpushare_testing``, which tests import.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from gpushare_operator.kube import connection
from gpushare_testing import nodeguard, webhooks
from gpushare_testing.apiobjects import OPERATOR_USER, create_namespace, unique
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import install_crds, kubectl, relaxed_policy_crd
from gpushare_testing.helm import Helm
from gpushare_testing.operators import (
    OPERATOR_NAMESPACE,
    OperatorFactory,
    RunningOperator,
    spawn,
)
from gpushare_testing.paths import CHART, CRDS
from gpushare_testing.replicas import TIMING_FLAGS, USERS, Replicas, delete_lease
from gpushare_testing.scraping import Scraper, bind_metrics_reader, unbind_metrics_reader
from gpushare_testing.simulator import GpuClusterSimulator


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


@pytest.fixture
async def start_operator(
    control_plane: ControlPlane, tmp_path: Path
) -> AsyncIterator[OperatorFactory]:
    """Start operator processes (identity ``gpushare-operator`` unless told otherwise)."""
    started: list[RunningOperator] = []

    async def start(
        *args: str,
        user: str = OPERATOR_USER,
        groups: tuple[str, ...] = ("system:masters",),
        kubeconfig: Path | None = None,
        wait: bool = True,
    ) -> RunningOperator:
        running = spawn(
            control_plane,
            tmp_path / f"operator-{len(started)}.log",
            *args,
            user=user,
            groups=groups,
            kubeconfig=kubeconfig,
        )
        started.append(running)
        if wait:
            await running.wait_synced()
        return running

    yield start
    for running in started:
        running.resume()
        running.stop()
        print(f"--- operator log {running.log_path} ---\n{running.logs()[-20000:]}")


@pytest.fixture
def start_replicas(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    start_operator: OperatorFactory,
) -> Callable[..., Awaitable[Replicas]]:
    """Start two replicas, ``a`` and ``b`` (``gpushare_testing.replicas``), with short Lease
    timings and ``args``, once the last test's Lease is gone; returns them synced."""

    async def start(*args: str) -> Replicas:
        since = datetime.now(UTC)
        delete_lease(control_plane)
        running: dict[str, RunningOperator] = {}
        for identity, user in USERS.items():
            running[identity] = await start_operator(
                "--device-plugin-namespace",
                namespace,
                "--identity",
                identity,
                *TIMING_FLAGS,
                *args,
                user=user,
                wait=False,
            )
        for operator in running.values():
            await operator.wait_synced()
        return Replicas(
            plane=control_plane, sim=sim, namespace=namespace, since=since, running=running
        )

    return start


@pytest.fixture(scope="session")
def crds_installed(control_plane: ControlPlane) -> None:
    """Install crds/ with the real kubectl, as users do, and wait for them to be served."""
    install_crds(control_plane)


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
    afterwards, so that no test waits for another's grace periods."""
    try:
        yield namespace
    finally:
        status, body = await sim.client.delete(
            f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": "0"}
        )
        assert status == 200, body


@pytest.fixture
def relaxed_crd(control_plane: ControlPlane, tmp_path: Path) -> Iterator[None]:
    """The policy CRD of an older release (``crdinstall.relaxed_policy_crd``), until the test
    ends and the current CRDs are put back."""
    path = tmp_path / "relaxed.yaml"
    path.write_text(yaml.safe_dump(relaxed_policy_crd()))
    kubectl(control_plane, "apply", "-f", str(path))
    try:
        yield
    finally:
        kubectl(control_plane, "apply", "-f", str(CRDS))


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm.for_plane(control_plane, tmp_path / "helm")


@pytest.fixture(scope="module")
def node_guard(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The chart's node guard, bound to the users test operators run as, for a whole module
    (``gpushare_testing.nodeguard``): their node writes pass the same admission as in a cluster."""
    helm = Helm.for_plane(control_plane, tmp_path_factory.mktemp("node-guard"))
    with nodeguard.installed(control_plane, helm, nodeguard.operator_identities(control_plane)):
        yield


@pytest.fixture
def namespaces(control_plane: ControlPlane) -> Iterator[list[str]]:
    """Namespaces a test creates (``apiobjects.create_namespace``); deleted afterwards."""
    created: list[str] = []
    yield created
    for name in created:
        control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def plugin_namespace(control_plane: ControlPlane, namespaces: list[str]) -> str:
    """The device plugin's namespace (``gpu-operator`` in a real cluster)."""
    return create_namespace(control_plane, namespaces, "plugin")


@pytest.fixture
def release(helm: Helm, namespace: str, plugin_namespace: str) -> Iterator[str]:
    """The chart installed (no kubelet here: its pods never run, its RBAC is what counts)."""
    name = unique("rbac")
    helm.run(
        "install",
        name,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        f"devicePlugin.namespace={plugin_namespace}",
    )
    yield name
    helm.run("uninstall", name, "--namespace", namespace, "--wait", "--timeout", "60s")


@pytest.fixture
def metrics_reader(control_plane: ControlPlane, namespace: str) -> Iterator[Scraper]:
    """A ServiceAccount bound to the chart's metrics-reader ClusterRole."""
    scraper, role = bind_metrics_reader(control_plane, namespace, f"mr-{uuid.uuid4().hex[:6]}")
    try:
        yield scraper
    finally:
        unbind_metrics_reader(control_plane, role)


@pytest.fixture
async def webhook_flags(sim: GpuClusterSimulator) -> AsyncIterator[webhooks.WebhookFlags]:
    """Names for one test's memory-request webhook (its configuration and Secret), deleted
    afterwards, so that no later test's labelled pod meets a webhook whose operator is gone."""
    flags = webhooks.WebhookFlags(configuration=unique("gpu-memory"), secret=unique("webhook-tls"))
    try:
        yield flags
    finally:
        await webhooks.remove(
            sim, flags.configuration, secret=flags.secret, namespace=OPERATOR_NAMESPACE
        )

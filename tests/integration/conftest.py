"""Integration tests: every one of them talks to the real local control plane."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from gpushare_operator.kube import connection
from gpushare_operator.testing.controlplane import ControlPlane


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

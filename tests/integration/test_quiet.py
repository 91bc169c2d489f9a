"""``quiet``, the wait that "nothing happened" claims rest on, can fail: a write made after it
returned is seen by the next one, and writes that never stop keep it from ever returning.

The stray writes are made with the operator's own client identity, so that the audit log
cannot tell them from the operator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

import pytest

from gpushare_testing.auditlog import changes_by
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory, RunningOperator
from gpushare_testing.quiet import quiet
from gpushare_testing.rawclient import RawClient

pytestmark = pytest.mark.usefixtures("crds_installed")


@pytest.fixture
async def as_operator(
    control_plane: ControlPlane, start_operator: OperatorFactory, namespace: str
) -> AsyncIterator[tuple[RunningOperator, RawClient]]:
    """An operator with nothing to do, and a client that writes as its user."""
    running = await start_operator("--device-plugin-namespace", namespace)
    kubeconfig = control_plane.kubeconfig_for_user(running.user, groups=("system:masters",))
    async with RawClient(kubeconfig=kubeconfig) as client:
        yield running, client


async def stray_write(client: RawClient, namespace: str, index: int) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"stray-{index}"}}
    status, answer = await client.post(f"/api/v1/namespaces/{namespace}/configmaps", body)
    assert status == 201, answer


async def test_a_write_after_quiet_is_seen_and_endless_writes_are_never_quiet(
    control_plane: ControlPlane,
    namespace: str,
    as_operator: tuple[RunningOperator, RawClient],
) -> None:
    running, client = as_operator
    first = await quiet(control_plane, [running], namespace=namespace)
    await stray_write(client, namespace, 0)
    second = await quiet(control_plane, [running], namespace=namespace)
    [stray] = changes_by(second[len(first) :], [running.user])
    assert stray["objectRef"]["name"] == "stray-0"

    async def keep_writing() -> None:
        for index in itertools.count(1):
            await stray_write(client, namespace, index)
            await asyncio.sleep(0.02)

    writer = asyncio.create_task(keep_writing(), name="stray-writer")
    try:
        with pytest.raises(AssertionError, match="never quiet"):
            await quiet(control_plane, [running], namespace=namespace, timeout=3)
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer

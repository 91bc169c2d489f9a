"""The write path never loops: waits, older CRDs and foreign keys, counted in the audit log."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import rolloutaudit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.paths import CRDS
from gpushare_testing.quiet import quiet
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

PREVIOUS_CRDS = Path(__file__).parent / "data" / "crds-0.1.0"
CONFIGMAP = "gpushare-device-plugin-configs"


def _when(event: dict[str, Any]) -> datetime.datetime:
    return datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


def _status_writes(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    writes = h.writes_to(h.operator_writes(plane), resource="gpunodestates", name=node)
    return [e for e in writes if e["objectRef"].get("subresource") == "status"]


def _label_writes(plane: ControlPlane, node: str) -> list[Mapping[str, Any]]:
    """The config changes applied to ``node`` (a Verified node's slot labels come apart)."""
    return rolloutaudit.config_applies(h.operator_writes(plane), [node])


def _configmap_writes(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """This test's ConfigMap only: the audit log spans the session, the name is every test's."""
    writes = h.writes_to(h.operator_writes(plane), resource="configmaps", name=CONFIGMAP)
    return [e for e in writes if e["objectRef"].get("namespace") == namespace]


async def _verified(sim: GpuClusterSimulator, node: str, timeout: float = 90) -> None:
    await h.wait_phase(sim, node, "Verified", timeout)


async def test_a_propagation_wait_is_published_once(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool, other_pool = h.unique("wait"), h.unique("other")
    nodes = await sim.create_gpu_nodes(pool=pool, count=3)
    await sim.create_gpu_nodes(pool=other_pool, count=1)
    await start_operator("--device-plugin-namespace", namespace, "--config-propagation-delay", "30")
    waiting = h.unique("waiting")
    await h.add_policy(sim, policies, h.policy(waiting, pool=pool))
    state = await eventually(
        lambda: h.node_state(sim.client, nodes[0]),
        until=lambda s: (s or {}).get("status", {}).get("configReadyAt") is not None,
        what="the propagation wait published",
    )
    ready_at = state["status"]["configReadyAt"]
    assert ready_at in h.condition(state["status"], "Ready")["message"]

    # Another policy being edited: three ConfigMap changes while the nodes wait.
    edited = h.unique("edited")
    writes = len(_configmap_writes(control_plane, namespace))
    await h.add_policy(sim, policies, h.policy(edited, pool=other_pool, replicas=2))
    for replicas in (3, 5):
        await eventually(
            lambda: asyncio.sleep(0, len(_configmap_writes(control_plane, namespace))),
            until=lambda count, writes=writes: count > writes,
            what="the edited policy's key written",
        )
        writes = len(_configmap_writes(control_plane, namespace))
        await h.patch_policy(sim.client, edited, {"replicas": replicas})
    for node in nodes:
        await _verified(sim, node)

    for node in nodes:
        [label] = _label_writes(control_plane, node)
        assert _when(label) >= datetime.datetime.fromisoformat(ready_at.replace("Z", "+00:00"))
        statuses = _status_writes(control_plane, node)
        until_applied = [e for e in statuses if _when(e) <= _when(label)]
        applied_after = [e for e in statuses if _when(e) > _when(label)][:1]
        # Pending (once, with its absolute time), then Applied: the re-plans wrote nothing.
        assert len(until_applied) + len(applied_after) <= 2, [e["stageTimestamp"] for e in statuses]
    assert (
        len(_configmap_writes(control_plane, namespace)) >= 4
    )  # the three changes really happened


@pytest.fixture
def previous_crds(control_plane: ControlPlane) -> Any:
    """The CRDs of the previous release installed over the current ones (as Helm leaves them),
    and the current ones put back afterwards for the other tests."""
    kubectl = [
        str(control_plane.bin_dir / "kubectl"),
        "--kubeconfig",
        str(control_plane.admin_kubeconfig),
    ]
    subprocess.run([*kubectl, "apply", "-f", str(PREVIOUS_CRDS)], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*kubectl, "apply", "-f", str(CRDS)], check=True, capture_output=True)


async def test_previous_crds_are_reported_not_fought(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    previous_crds: None,
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("old")
    nodes = await sim.create_gpu_nodes(pool=pool, count=2)
    name = h.unique("old")
    await h.add_policy(sim, policies, h.policy(name, pool=pool))
    operator = await start_operator(
        "--device-plugin-namespace", namespace, "--config-propagation-delay", "5"
    )
    body = await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: h.condition(b.get("status"), "SchemaOutdated").get("status") == "True",
        timeout=60,
        what="SchemaOutdated on the policy",
    )
    message = h.condition(body["status"], "SchemaOutdated")["message"]
    assert "kubectl apply --server-side -f crds/" in message
    assert "status.configReadyAt" in message or "status.unsupportedNodes" in message
    for node in nodes:
        await _verified(sim, node)
    await eventually(
        lambda: h.events_about(sim.client, name),
        until=lambda es: any(e["reason"] == "SchemaOutdated" for e in es),
        what="the SchemaOutdated Event",
    )
    await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: (b.get("status") or {}).get("verifiedNodes") == len(nodes),
        what="the policy's status to count its verified nodes",
    )
    before = {node: len(_status_writes(control_plane, node)) for node in nodes}
    policy_before = len(
        h.writes_to(h.operator_writes(control_plane), resource="gpusharingpolicies", name=name)
    )
    # A rewrite loop (each echo looking like drift) would never let the operator fall quiet.
    await quiet(control_plane, [operator], namespace=namespace)
    assert {node: len(_status_writes(control_plane, node)) for node in nodes} == before
    # ConfigNotWritten, WaitingForConfigPropagation, once more before the drop was sure,
    # Applied, Verified: then nothing.
    assert max(before.values()) <= 5
    policy_after = len(
        h.writes_to(h.operator_writes(control_plane), resource="gpusharingpolicies", name=name)
    )
    assert policy_after == policy_before


async def test_a_foreign_key_is_never_fought_over(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    foreign = "stale-ts2-abcdef"  # shaped like ours, written by someone else
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": namespace},
        "data": {foreign: "version: v1\n"},
    }
    status, answer = await sim.client.post(
        f"/api/v1/namespaces/{namespace}/configmaps", body, params={"fieldManager": "hand-edit"}
    )
    assert status == 201, answer
    pool_a, pool_b = h.unique("a"), h.unique("b")
    nodes = await sim.create_gpu_nodes(pool=pool_a, count=4)
    first, second = h.unique("first"), h.unique("second")
    await h.add_policy(sim, policies, h.policy(first, pool=pool_a, replicas=2))
    await h.add_policy(sim, policies, h.policy(second, pool=pool_b, replicas=3))
    await start_operator("--device-plugin-namespace", namespace)
    for node in nodes:
        await _verified(sim, node)
    events = await eventually(
        lambda: h.events_about(sim.client, first),
        until=lambda es: any(e["reason"] == "ForeignConfigKey" for e in es),
        what="the ForeignConfigKey Event",
    )
    warning = next(e for e in events if e["reason"] == "ForeignConfigKey")
    assert foreign in warning["message"] and "hand-edit" in warning["message"]
    settled = len(_configmap_writes(control_plane, namespace))

    # 100 changes of the nodes' config labels: pools swap, so each node changes policy.
    for round_ in range(25):
        target = pool_b if round_ % 2 == 0 else pool_a
        await asyncio.gather(*(sim.relabel(node, {"pool": target}) for node in nodes))
        await asyncio.sleep(0.3)  # paces the swaps: the operator sees each, not only the last
    for node in nodes:
        await _verified(sim, node)
    data = await h.config_data(sim.client, namespace)
    assert data is not None and foreign in data  # left alone
    # Both policies' keys were in place before the swaps: no change needed a ConfigMap write.
    assert len(_configmap_writes(control_plane, namespace)) - settled <= 1
    assert settled <= 3  # the first write, and the one attempt that found the foreign key

"""The cluster's objects as the integration tests read and write them: raw JSON through the
simulator's client, policy bodies, conditions, and the operator's writes in the audit log."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from gpushare_testing import auditlog
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.simulator import GpuClusterSimulator, RawClient
from gpushare_testing.waiting import eventually

API = "/apis/gpushare.dev/v1alpha1"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
POLICY_LABEL = "gpushare.dev/policy"
OPERATOR_USER = "gpushare-operator"
UNPACED = {"maxUnavailable": "100%", "canary": 0}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def policy(
    name: str, *, pool: str, strategy: str = "TimeSlicing", replicas: int = 4, **spec: Any
) -> dict[str, Any]:
    body_spec: dict[str, Any] = {
        "nodeSelector": {"matchLabels": {"pool": pool}},
        "strategy": strategy,
        "replicas": replicas,
        # Every node at once: these tests are about other things; test_rollouts paces its own.
        "rollout": UNPACED,
    }
    body_spec.update(spec)
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": name},
        "spec": body_spec,
    }


async def ok(
    client: RawClient,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/merge-patch+json",
) -> Any:
    if method == "GET":
        status, result = await client.get(path)
    elif method == "POST":
        status, result = await client.post(path, body)
    elif method == "PATCH":
        status, result = await client.patch(path, body, content_type=content_type)
    else:
        status, result = await client.delete(path)
    assert 200 <= status < 300, f"{method} {path}: {status} {result}"
    return result


async def create_policy(client: RawClient, body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(await ok(client, "POST", f"{API}/gpusharingpolicies", body))


async def patch_policy(client: RawClient, name: str, spec: Mapping[str, Any]) -> None:
    await ok(client, "PATCH", f"{API}/gpusharingpolicies/{name}", {"spec": dict(spec)})


async def delete_policy(client: RawClient, name: str) -> None:
    status, body = await client.delete(f"{API}/gpusharingpolicies/{name}")
    assert status in (200, 404), body


async def get_policy(client: RawClient, name: str) -> dict[str, Any]:
    return dict(await ok(client, "GET", f"{API}/gpusharingpolicies/{name}"))


async def node_state(client: RawClient, name: str) -> dict[str, Any] | None:
    status, body = await client.get(f"{API}/gpunodestates/{name}")
    return dict(body) if status == 200 else None


async def node(client: RawClient, name: str) -> dict[str, Any]:
    return dict(await ok(client, "GET", f"/api/v1/nodes/{name}"))


async def config_data(client: RawClient, namespace: str) -> dict[str, str] | None:
    status, body = await client.get(
        f"/api/v1/namespaces/{namespace}/configmaps/gpushare-device-plugin-configs"
    )
    return dict(body.get("data") or {}) if status == 200 else None


async def events_about(client: RawClient, name: str) -> list[dict[str, Any]]:
    body = await ok(client, "GET", "/api/v1/events")
    return [e for e in body["items"] if e["involvedObject"].get("name") == name]


def condition(status: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    for cond in (status or {}).get("conditions") or ():
        if cond["type"] == kind:
            return dict(cond)
    return {}


def operator_writes(plane: ControlPlane, *, user: str = OPERATOR_USER) -> list[dict[str, Any]]:
    """Every write ``user`` made (the audit log holds some reads too: not those)."""
    return [
        e for e in plane.audit_events() if e["user"]["username"] == user and not auditlog.is_read(e)
    ]


def writes_to(events: list[dict[str, Any]], *, resource: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if e["objectRef"].get("resource") == resource and e["objectRef"].get("name") == name
    ]


async def add_policy(sim: GpuClusterSimulator, created: list[str], body: dict[str, Any]) -> None:
    """Create a policy and remember it for the ``policies`` fixture to delete."""
    await create_policy(sim.client, body)
    created.append(body["metadata"]["name"])


def phase_of(state: Mapping[str, Any] | None) -> str | None:
    phase = (state or {}).get("status", {}).get("phase")
    return None if phase is None else str(phase)


async def wait_phase(
    sim: GpuClusterSimulator,
    node: str,
    phase: str,
    timeout: float = 30,
    *,
    replicas: int | None = None,
) -> Any:
    """Until the node's GPUNodeState shows ``phase`` (and ``replicas``, if given); returns that
    GPUNodeState."""

    def reached(state: Mapping[str, Any] | None) -> bool:
        if phase_of(state) != phase:
            return False
        return replicas is None or (state or {})["status"].get("replicas") == replicas

    return await eventually(
        lambda: node_state(sim.client, node),
        until=reached,
        timeout=timeout,
        what=f"{node} to be {phase}" + ("" if replicas is None else f" with {replicas} replicas"),
    )


def create_namespace(plane: ControlPlane, created: list[str], prefix: str) -> str:
    """A new namespace ``<prefix>-<random>``, remembered in ``created`` (the ``namespaces``
    fixture deletes them)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    status, raw = plane.request("POST", "/api/v1/namespaces", body=body)
    assert status == 201, raw
    created.append(name)
    return name

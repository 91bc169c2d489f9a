"""GPU pods through the API: as a user submits them, as the scheduler binds them and kubelet
reports them, and what the operator publishes of them on GPUNodeStates."""

from __future__ import annotations

from typing import Any

from gpushare_testing import apiobjects as h
from gpushare_testing import podbodies
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

GPU = "nvidia.com/gpu"
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe", "lifecycle")


def pod_manifest(
    name: str,
    *,
    namespace: str,
    node: str | None,
    resource: str = GPU,
    count: int = 1,
    init_count: int = 0,
    sidecar_count: int = 0,
) -> dict[str, Any]:
    """A realistic inference pod (``podbodies.shared_gpu_pod``) as a user would submit it.

    Server-set fields go (uid, timestamps, status, managedFields), and so does the owner
    reference: its ReplicaSet does not exist and the garbage collector would delete the pod.
    Regular init containers may not have probes; sidecars (restartable ones) may.
    """
    body = podbodies.shared_gpu_pod(
        name=name,
        node=node,
        namespace=namespace,
        resource=resource,
        count=count,
        init_count=init_count,
        sidecar_count=sidecar_count,
        managed_fields=False,
    )
    metadata = {k: body["metadata"][k] for k in ("name", "namespace", "labels", "annotations")}
    spec = body["spec"]
    for container in spec.get("initContainers") or ():
        if container.get("restartPolicy") != "Always":
            for field in _PROBES:
                container.pop(field, None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


async def create_pod(
    sim: GpuClusterSimulator, namespace: str, name: str, node: str | None, **options: Any
) -> dict[str, Any]:
    manifest = pod_manifest(name, namespace=namespace, node=node, **options)
    created = dict(await h.ok(sim.client, "POST", f"/api/v1/namespaces/{namespace}/pods", manifest))
    assert created["spec"].get("nodeName") == node
    return created


async def read_pod(sim: GpuClusterSimulator, namespace: str, name: str) -> dict[str, Any]:
    return dict(await h.ok(sim.client, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"))


async def set_phase(sim: GpuClusterSimulator, namespace: str, name: str, phase: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
    await h.ok(sim.client, "PATCH", path, {"status": {"phase": phase}})


async def bind(sim: GpuClusterSimulator, namespace: str, name: str, node: str) -> None:
    """Bind a pending pod as the scheduler does: through the binding subresource."""
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await h.ok(sim.client, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)


async def delete_pod(sim: GpuClusterSimulator, namespace: str, name: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    status, body = await sim.client.delete(path, params={"gracePeriodSeconds": "0"})
    assert status == 200, body


def small_pod(
    name: str,
    *,
    gpus: int,
    node: str | None = None,
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A small pod asking for ``gpus`` nvidia.com/gpu (as a limit, the usual way to ask)."""
    container = {
        "name": "cuda",
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "resources": {"limits": {GPU: str(gpus)}, "requests": {"cpu": "100m"}},
    }
    spec: dict[str, Any] = {"containers": [container]}
    if node is not None:
        spec["nodeName"] = node
    if selector is not None:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def create(sim: GpuClusterSimulator, namespace: str, body: dict[str, Any]) -> None:
    await h.ok(sim.client, "POST", f"/api/v1/namespaces/{namespace}/pods", body)


async def read(sim: GpuClusterSimulator, namespace: str, name: str) -> dict[str, Any]:
    return dict(await h.ok(sim.client, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"))


async def node_state(sim: GpuClusterSimulator, node: str) -> dict[str, Any]:
    """The node's GPUNodeState, or {} while there is none."""
    return await h.node_state(sim.client, node) or {}


def node_usage(state: dict[str, Any]) -> tuple[int, int] | None:
    status = state.get("status") or {}
    if "slots" not in status:
        return None
    return int(status["slots"]["allocated"]), int(status["pods"])


async def wait_node_usage(
    sim: GpuClusterSimulator, node: str, allocated: int, pods: int, *, timeout: float = 30
) -> dict[str, Any]:
    """Wait until the GPUNodeState shows ``allocated`` slots held by ``pods`` pods."""
    return await eventually(
        lambda: node_state(sim, node),
        until=lambda s: node_usage(s) == (allocated, pods),
        timeout=timeout,
        what=f"{node} to show {allocated} slots in {pods} pods",
    )

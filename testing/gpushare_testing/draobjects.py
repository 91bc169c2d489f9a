"""Backend DRA in integration tests: the objects a test reads and the waits it needs."""

from __future__ import annotations

from typing import Any

from gpushare_testing import apiobjects as h
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

DRA_LABEL = "gpushare.dev/dra-driver"
DEPLOY_LABEL = "nvidia.com/gpu.deploy.device-plugin"
CLASS = "gpu.gpushare.dev"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
RESOURCE_API = "/apis/resource.k8s.io/v1"


def exclusive(name: str, pool: str, **spec: Any) -> dict[str, Any]:
    body = h.policy(name, pool=pool, strategy="Exclusive", **spec)
    body["spec"].pop("replicas")
    return body


async def device_class(sim: GpuClusterSimulator) -> dict[str, Any] | None:
    status, body = await sim.client.get(f"{CLASSES}/{CLASS}")
    return dict(body) if status == 200 else None


async def labels_of(sim: GpuClusterSimulator, node: str) -> dict[str, str]:
    return dict((await h.node(sim.client, node))["metadata"].get("labels") or {})


async def pods_of(sim: GpuClusterSimulator, namespace: str) -> list[dict[str, Any]]:
    body = await h.ok(sim.client, "GET", f"/api/v1/namespaces/{namespace}/pods")
    return list(body["items"])


async def claim_of(sim: GpuClusterSimulator, pod: dict[str, Any]) -> dict[str, Any]:
    """The extended-resource claim kube-scheduler made and allocated for ``pod``."""
    name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    namespace = pod["metadata"]["namespace"]
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    return dict(await h.ok(sim.client, "GET", path))


async def running(sim: GpuClusterSimulator, namespace: str, count: int) -> list[dict[str, Any]]:
    """Wait for ``count`` pods Running; for 0, also until the simulated kubelet has stopped
    the deleted ones' containers (it holds their GPUs until then)."""

    async def stopping() -> frozenset[str]:
        return sim.pods.stopping if sim.pods is not None else frozenset()

    if count == 0:
        await eventually(stopping, until=lambda s: not s, timeout=60, what="containers stopped")
    return await eventually(
        lambda: pods_of(sim, namespace),
        until=lambda pods: (
            len([p for p in pods if p.get("status", {}).get("phase") == "Running"]) == count
        ),
        timeout=60,
        what=f"{count} pods Running in {namespace}",
    )

"""A rollout as the API server shows it: keys, Verified nodes, ``status.rollout``, the operator's
rollout gauge, and which replicas each config key of the device-plugin ConfigMap stands for."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gpushare_testing import apiobjects as h
from gpushare_testing.agents import parse_device_plugin_config
from gpushare_testing.operators import RunningOperator
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually


def paced(name: str, *, pool: str, replicas: int = 4, **rollout: Any) -> dict[str, Any]:
    """A TimeSlicing policy over ``pool`` with the rollout fields given."""
    return h.policy(name, pool=pool, replicas=replicas, rollout=rollout)


async def settled_key(sim: GpuClusterSimulator, name: str) -> str:
    """The config key of the policy's current generation, once its status has seen it."""
    body = await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: (
            (b.get("status") or {}).get("observedGeneration") == b["metadata"]["generation"]
        ),
        what=f"{name}'s status for its current generation",
    )
    return str(body["status"]["configKey"])


async def verified_on(sim: GpuClusterSimulator, key: str) -> set[str]:
    """The nodes whose GPUNodeState says Verified on ``key``."""
    body = await h.ok(sim.client, "GET", f"{h.API}/gpunodestates")
    return {
        item["metadata"]["name"]
        for item in body["items"]
        if (item.get("status") or {}).get("phase") == "Verified"
        and item["status"].get("configKey") == key
    }


async def all_verified(
    sim: GpuClusterSimulator, nodes: Collection[str], name: str, *, timeout: float = 120
) -> str:
    """Wait until every node is Verified on the policy's current key; return the key."""
    key = await settled_key(sim, name)
    await eventually(
        lambda: verified_on(sim, key),
        until=lambda done: set(nodes) <= done,
        timeout=timeout,
        interval=0.5,
        what=f"{sorted(nodes)} Verified on {key}",
    )
    return key


async def rollout_of(sim: GpuClusterSimulator, name: str) -> dict[str, Any]:
    return dict(((await h.get_policy(sim.client, name)).get("status") or {}).get("rollout") or {})


async def rollout_state(
    sim: GpuClusterSimulator, name: str, state: str, timeout: float = 60
) -> dict[str, Any]:
    return await eventually(
        lambda: rollout_of(sim, name),
        until=lambda r: r.get("state") == state,
        timeout=timeout,
        what=f"{name}'s rollout {state}",
    )


async def rollout_metrics(operator: RunningOperator, policy: str) -> dict[str, float]:
    """``gpushare_rollout_nodes`` of one policy from the operator's /metrics, by state."""
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        text = await response.text()
    return {
        sample.labels["state"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gpushare_rollout_nodes"
        for sample in family.samples
        if sample.labels.get("policy") == policy
    }


async def key_replicas(sim: GpuClusterSimulator, namespace: str) -> dict[str, int]:
    """The replicas each key of the device-plugin ConfigMap in ``namespace`` advertises (as
    the device plugin reads it); keys it would refuse are left out."""
    data = await h.config_data(sim.client, namespace) or {}
    found = {}
    for key, text in data.items():
        sharing = parse_device_plugin_config(text)
        if sharing is not None:
            found[key] = sharing.replicas
    return found


async def gone(sim: GpuClusterSimulator, name: str, *, timeout: float = 90) -> None:
    """Until the policy is deleted for good (``kubectl delete --wait``: its finalizer went)."""
    await eventually(
        lambda: sim.client.get(f"{h.API}/gpusharingpolicies/{name}"),
        until=lambda answer: answer[0] == 404,
        timeout=timeout,
        what=f"{name} gone",
    )

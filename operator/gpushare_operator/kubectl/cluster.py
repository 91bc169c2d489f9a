"""Reading the cluster into the operator's own ``ClusterCache``, through the operator's sinks.

Policies come first, as in the operator: they say which resources pods are kept for.  Nodes,
GPUNodeStates and pods are then read at once, each through the operator's own read path
(kube/reading.py: a streaming list where the server has it), and every object goes through the
same sink the operator's informers feed, so it is kept as the same slim record (non-GPU nodes
and pods asking for no shared GPU resource are dropped as they arrive).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import ConfigMapSink, NodeSink, NodeStateSink, PodSink
from gpushare_operator.core import models
from gpushare_operator.kube import connection, reading

API = f"/apis/{models.GROUP}/{models.VERSION}"
POLICIES = f"{API}/{models.POLICY_PLURAL}"
NODE_STATES = f"{API}/{models.NODE_STATE_PLURAL}"
NODES = "/api/v1/nodes"
# As the operator's pod informer: finished pods hold no slots and are never read.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
POLICY_LIST = reading.Collection(path=POLICIES, kind=models.POLICY_KIND, page_size=250)
NODE_LIST = reading.Collection(path=NODES, kind="Node", page_size=100)
NODE_STATE_LIST = reading.Collection(path=NODE_STATES, kind=models.NODE_STATE_KIND, page_size=250)
POD_LIST = reading.Collection(
    path="/api/v1/pods", kind="Pod", field_selector=LIVE_PODS, page_size=250
)


@dataclass(frozen=True, slots=True)
class ClusterRef:
    """Where the cluster is, and the operator's device-plugin ConfigMap in it."""

    kubeconfig: str | None = None
    context: str | None = None
    device_plugin_namespace: str = "gpu-operator"
    device_plugin_configmap: str = "gpushare-device-plugin-configs"

    @property
    def configmap_path(self) -> str:
        namespace, name = self.device_plugin_namespace, self.device_plugin_configmap
        return f"/api/v1/namespaces/{namespace}/configmaps/{name}"


@contextlib.asynccontextmanager
async def connected(cluster_ref: ClusterRef) -> AsyncIterator[reading.Api]:
    configuration = await connection.load_kubectl_configuration(
        kubeconfig=cluster_ref.kubeconfig, context=cluster_ref.context
    )
    async with connection.api_client(configuration) as api:
        yield api


async def load_policies(api: reading.Api, cache: ClusterCache) -> list[dict[str, Any]]:
    items = await reading.list_all(api, POLICY_LIST)
    for item in items:
        cache.upsert_policy(item)
    return items


async def load_configmap(api: reading.Api, cache: ClusterCache, cluster_ref: ClusterRef) -> None:
    """The device-plugin ConfigMap as the operator's informer would deliver its first list
    (keys present then count as propagated); absent, or not readable, is no keys at all."""
    sink = ConfigMapSink(cache)
    try:
        found = await reading.get(api, cluster_ref.configmap_path, keep_managed_fields=True)
    except reading.ApiError as exc:
        if exc.status != 403:
            raise
        found = None
    sink.begin_relist()
    if found is not None:
        sink.relist_item(found)
    sink.end_relist()


async def load_fleet(
    api: reading.Api, cache: ClusterCache, *, pods: bool = True, node_states: bool = True
) -> None:
    """Every GPU node, and (by default) every GPUNodeState and every live pod, in parallel."""
    reads = [reading.list_into(api, NODE_LIST, NodeSink(cache))]
    if node_states:
        reads.append(reading.list_into(api, NODE_STATE_LIST, NodeStateSink(cache)))
    if pods:
        pod_list = replace(POD_LIST, worth_decoding=_asks_for(cache))
        reads.append(reading.list_into(api, pod_list, PodSink(cache)))
    await asyncio.gather(*reads)


def _asks_for(cache: ClusterCache) -> Callable[[bytes], bool]:
    """Whether a pod's JSON names a resource the state keeps pods for: one that does not
    cannot request it, and the pod sink would drop it after decoding it whole."""
    names = tuple(name.encode() for name in sorted(cache.tracked_resources))
    return lambda raw: any(name in raw for name in names)


async def load_node(api: reading.Api, cache: ClusterCache, name: str) -> dict[str, Any] | None:
    """One node, its GPUNodeState and its live pods: what ``explain node`` needs."""
    body = await reading.get(api, f"{NODES}/{name}")
    if body is None:
        return None
    cache.upsert_node(body)
    node_state = await reading.get(api, f"{NODE_STATES}/{name}")
    if node_state is not None:
        cache.upsert_node_state(node_state)
    pod_list = replace(POD_LIST, field_selector=f"spec.nodeName={name},{LIVE_PODS}")
    await reading.list_into(api, pod_list, PodSink(cache))
    return body

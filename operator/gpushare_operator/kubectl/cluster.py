"""Reading the cluster into the operator's own ``ClusterCache``, through the operator's sinks.

Policies come first, as in the operator: they say which resources pods are kept for.  Nodes,
GPUNodeStates and pods are then read at once, and every object goes through the same sink the
operator's informers feed, so it is kept as the same slim record (non-GPU nodes and pods asking
for no shared GPU resource are dropped as they arrive).  What is read, and how:

* Nodes and GPUNodeStates: whole (a node's labels, capacity, taints and the owners of its MIG
  label; what the operator published for it), through the operator's own read path, in the
  very request its informers make (kube/reading.py: a streaming list from the watch cache
  where the server has it, one object alive at a time; a paged list otherwise).
* Live pods (``status.phase`` neither Succeeded nor Failed, cut by the server): a consistent
  paged list (``read_pages_into``), served from the watch cache from Kubernetes 1.31 on, the
  next page asked for as soon as this one's continue token is in.  Not a streaming list: the
  API server spends 1.5 to 2 times the CPU on the same pods sent as watch events, and pods are
  most of what a plan reads (docs/performance.md).  A page is cut into its pods undecoded, and
  only the pods that have a tracked resource as a key (their requests) are decoded: most pods
  ask for no GPU.  No metadata-only or table form would do: what a pod asks for is in its spec.

No cyclic garbage collection while these are read (``_collector_paused``).

Every read says what it needs: a 403 is ``MissingPermission`` naming the verb, the resource and
the namespace (kubectl/permissions.py), never an empty answer, so that a plan or a status is
never made from what the user could not see.  Only a 404 is absence, where absence means
something (no device-plugin or mig-parted ConfigMap yet: no policy has written one).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import (
    ClaimSink,
    ConfigMapSink,
    DeviceClassSink,
    NodeSink,
    NodeStateSink,
    PodSink,
    SliceSink,
)
from gpushare_operator.core.api import defaults, models
from gpushare_operator.core.deviceplugin.devconfigs import MIG_RESOURCE_PREFIX
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.records.nodes import carries_mig_config
from gpushare_operator.kube import connection, http, objectpaths, reading
from gpushare_operator.kube.objectpaths import Resource
from gpushare_operator.kubectl.permissions import Permission, needing

API = f"/apis/{models.GROUP}/{models.VERSION}"
POLICIES = Resource(api=API, plural=models.POLICY_PLURAL, kind=models.POLICY_KIND)
NODE_STATES = Resource(api=API, plural=models.NODE_STATE_PLURAL, kind=models.NODE_STATE_KIND)
NODES = Resource(api="/api/v1", plural="nodes", kind="Node")
PODS = Resource(api="/api/v1", plural="pods", kind="Pod", namespaced=True)
EVENTS = Resource(api="/api/v1", plural="events", kind="Event", namespaced=True)
CONFIGMAPS = Resource(api="/api/v1", plural="configmaps", kind="ConfigMap", namespaced=True)
BUDGETS = Resource(
    api="/apis/policy/v1",
    plural="poddisruptionbudgets",
    kind="PodDisruptionBudget",
    namespaced=True,
)
# Backend DRA: a node's devices (NVIDIA's kubelet plugin's slices), the claims holding them,
# and the DeviceClasses that serve nvidia.com/gpu there.
RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICES = Resource(api=RESOURCE_API, plural="resourceslices", kind="ResourceSlice")
CLAIMS = Resource(api=RESOURCE_API, plural="resourceclaims", kind="ResourceClaim", namespaced=True)
DEVICE_CLASSES = Resource(api=RESOURCE_API, plural="deviceclasses", kind="DeviceClass")
_RESOURCES = {
    r.kind: r
    for r in (
        POLICIES,
        NODE_STATES,
        NODES,
        PODS,
        EVENTS,
        CONFIGMAPS,
        BUDGETS,
        SLICES,
        CLAIMS,
        DEVICE_CLASSES,
    )
}
# As the operator's pod informer: finished pods hold no slots and are never read.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
POLICY_LIST = reading.Collection(path=objectpaths.path(POLICIES), kind=POLICIES.kind, page_size=250)
NODE_LIST = reading.Collection(
    path=objectpaths.path(NODES),
    kind=NODES.kind,
    page_size=100,
    keep_managed_fields_of=carries_mig_config,  # who set a MIG layout: ours to change or not
)
NODE_STATE_LIST = reading.Collection(
    path=objectpaths.path(NODE_STATES), kind=NODE_STATES.kind, page_size=250
)
# Pods per page: 500 pods are ~3 MB of JSON; two pages at most are held at once (the one being
# handled, the next one arriving).  Measured (500 nodes, 5,000 pods): 250 to 2,500 cost the
# same, within noise.
POD_PAGE_SIZE = 500
POD_LIST = reading.Collection(
    path=objectpaths.path(PODS), kind=PODS.kind, field_selector=LIVE_PODS, page_size=POD_PAGE_SIZE
)
BUDGET_LIST = reading.Collection(path=objectpaths.path(BUDGETS), kind=BUDGETS.kind, page_size=250)
SLICE_LIST = reading.Collection(path=objectpaths.path(SLICES), kind=SLICES.kind, page_size=250)
CLAIM_LIST = reading.Collection(path=objectpaths.path(CLAIMS), kind=CLAIMS.kind, page_size=500)
CLASS_LIST = reading.Collection(
    path=objectpaths.path(DEVICE_CLASSES), kind=DEVICE_CLASSES.kind, page_size=250
)


@dataclass(frozen=True, slots=True)
class ClusterRef:
    """Where the cluster is, and the operator's two ConfigMaps in it (the device plugin's and
    the mig-parted one beside it, as the operator's flags name them)."""

    kubeconfig: str | None = None
    context: str | None = None
    device_plugin_namespace: str = defaults.DEVICE_PLUGIN_NAMESPACE
    device_plugin_configmap: str = defaults.DEVICE_PLUGIN_CONFIGMAP
    mig_parted_configmap: str = defaults.MIG_PARTED_CONFIGMAP

    def __post_init__(self) -> None:
        # All go into a path: refused here, before the kubeconfig is even read.
        objectpaths.checked(self.device_plugin_namespace, kind="Namespace")
        objectpaths.checked(self.device_plugin_configmap, kind=CONFIGMAPS.kind)
        objectpaths.checked(self.mig_parted_configmap, kind=CONFIGMAPS.kind)


@contextlib.asynccontextmanager
async def connected(cluster_ref: ClusterRef) -> AsyncIterator[reading.Api]:
    configuration = await connection.load_kubectl_configuration(
        kubeconfig=cluster_ref.kubeconfig, context=cluster_ref.context
    )
    async with connection.api_client(configuration) as api:
        yield api


# -- reads that say what they need ---------------------------------------------------------------


async def read_one(
    api: reading.Api,
    resource: objectpaths.Resource,
    name: str,
    *,
    purpose: str,
    namespace: str | None = None,
    keep_managed_fields: bool = False,
) -> dict[str, Any] | None:
    """One object, None if there is none (404); MissingPermission on a 403."""
    need = Permission(
        verb="get", resource=resource, name=name, namespace=namespace, purpose=purpose
    )
    with needing(need):
        return await reading.get(
            api, resource, name, namespace=namespace, keep_managed_fields=keep_managed_fields
        )


def _listing(collection: reading.Collection, purpose: str) -> Permission:
    # A list that falls back from streaming to pages (no watch) only fails on its paged list.
    return Permission(verb="list", resource=_RESOURCES[collection.kind], purpose=purpose)


async def read_into(
    api: reading.Api, collection: reading.Collection, sink: reading.Sink, *, purpose: str
) -> None:
    """A whole collection into ``sink``; MissingPermission on a 403."""
    with needing(_listing(collection, purpose)):
        await reading.list_into(api, collection, sink)


async def read_pages_into(
    api: reading.Api, collection: reading.Collection, sink: reading.Sink, *, purpose: str
) -> None:
    """A whole collection into ``sink`` as a paged list (a consistent one: every page at the
    first one's resourceVersion), each page split so that only the objects
    ``collection.worth_decoding`` says yes to are decoded (``paged_items``).  The next page is
    asked for as soon as this one's continue token is in (its first bytes), so that the API
    server writes it while this one is read and handled: two pages in flight at most.  An
    expired continue token (410) starts the list over, as kube/reading.py's paged list does.
    MissingPermission on a 403."""
    with needing(_listing(collection, purpose)):
        sink.begin_relist()
        asked = ""
        opening = asyncio.ensure_future(_open_page(api, collection, asked))
        try:
            while True:
                try:
                    response, head = await opening
                except http.ApiError as exc:
                    if exc.status != 410 or not asked:
                        raise
                    # etcd was compacted past the list's revision: start over (replace
                    # semantics again, so what the first pages had and is gone now leaves).
                    sink.begin_relist()
                    asked = ""
                    opening = asyncio.ensure_future(_open_page(api, collection, asked))
                    continue
                early = _continue_token(head)
                if early:
                    asked, opening = (
                        early,
                        asyncio.ensure_future(_open_page(api, collection, early)),
                    )
                async with response:
                    raw = head + await response.read()
                metadata, items = paged_items(raw, collection.worth_decoding)
                for item in items:
                    sink.relist_item(collection.delivered(item))
                token = str(metadata.get("continue") or "")
                if not token:
                    sink.end_relist()
                    return
                if early is None:  # not in the first bytes: asked for now
                    asked, opening = (
                        token,
                        asyncio.ensure_future(_open_page(api, collection, token)),
                    )
        finally:
            _discard(opening)


_PAGE_TIMEOUT = aiohttp.ClientTimeout(total=120)
# Where a page's continue token is looked for: its first bytes, up to where its items begin.
_HEAD_BYTES = 64 * 1024

_Opened = tuple[aiohttp.ClientResponse, bytes]


async def _open_page(api: reading.Api, collection: reading.Collection, token: str) -> _Opened:
    """Ask for one page and read its first bytes, up to where its items begin (a built-in
    type's list has its metadata, and so its continue token, before them); the response, to
    read the rest from.  ApiError on any other status than 200."""
    extra = {"limit": str(collection.page_size)} | ({"continue": token} if token else {})
    query = collection.query(**extra)
    response = await http.open_request(
        api, method="GET", path=collection.path, query=query, timeout=_PAGE_TIMEOUT
    )
    try:
        if response.status != 200:
            raise http.error_from(response, http.decode(await response.read()))
        head = b""
        while _ITEMS not in head and len(head) < _HEAD_BYTES:
            chunk = await response.content.readany()
            if not chunk:
                break
            head += chunk
    except BaseException:
        response.close()
        raise
    return response, head


def _continue_token(head: bytes) -> str | None:
    """The continue token in a page's first bytes ("" on the last page); None where they do
    not hold the list's metadata (then the next page is asked for once this one is read)."""
    before, found, _ = head.partition(_ITEMS)
    if not found:
        return None
    try:
        page = orjson.loads(before + b"}")
    except orjson.JSONDecodeError:
        return None
    metadata = page.get("metadata") if isinstance(page, dict) else None
    return str(metadata.get("continue") or "") if isinstance(metadata, dict) else None


def _discard(opening: asyncio.Future[_Opened]) -> None:
    """A page asked for and not handled (the list failed, or it was the last one, handled):
    its request cancelled, or its response closed."""
    if not opening.done():
        opening.cancel()
    elif not opening.cancelled() and opening.exception() is None:
        opening.result()[0].close()


# How the API server writes a built-in type's list: ``{"kind":..,"apiVersion":..,"metadata":
# {..},"items":[{"metadata":{..},..},{"metadata":{..},..}]}``, compact, one object after another.
_ITEMS = b',"items":['
_ITEM = b'{"metadata":{'
_BETWEEN = b'},{"metadata":{'
_END = b"]}"


def paged_items(
    raw: bytes, worth_decoding: Callable[[bytes], bool] | None
) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """A list page's metadata, and its objects that ``worth_decoding`` (None: all) says yes to,
    decoded one at a time as they are iterated.

    The page is cut, undecoded, where one object ends and the next begins (``_BETWEEN``), and
    only the pieces ``worth_decoding`` says yes to are decoded.  Those quotes cannot be inside
    a JSON string (they would be escaped there); a cut between two elements of an array inside
    an object would leave one half with a ``[`` open and the other with a ``]`` too many, so
    neither decodes.  So a piece that does not decode has the page decoded whole, and all its
    objects follow (those already given are given again: a sink keeps one of each); so does a
    page not laid out as above (a custom resource's keys come sorted), and the sink drops what
    it keeps nothing of.  A tracked name is in one piece whole, so an object that names one is
    either decoded or makes the page decoded whole.
    """
    if worth_decoding is not None:
        cut = _cut(raw)
        if cut is not None:
            metadata, pieces = cut
            return metadata, _decoded(raw, pieces, worth_decoding)
    page = orjson.loads(raw)
    return page.get("metadata") or {}, iter(page.get("items") or ())


def _cut(raw: bytes) -> tuple[dict[str, Any], list[bytes]] | None:
    """The page's metadata and its objects' pieces (see ``paged_items``); None where the page
    is not laid out as the API server writes a built-in type's list."""
    start, stop = raw.find(_ITEMS), raw.rfind(_END)
    if start < 0 or stop < start or raw[stop + len(_END) :].strip():
        return None
    try:
        page = orjson.loads(raw[:start] + b"}")
    except orjson.JSONDecodeError:
        return None
    # The list's metadata (its continue token) must be there, before the items.
    metadata = page.get("metadata") if isinstance(page, dict) else None
    if not isinstance(metadata, dict):
        return None
    start += len(_ITEMS)
    return metadata, raw[start:stop].split(_BETWEEN) if stop > start else []


def _decoded(
    raw: bytes, pieces: list[bytes], worth_decoding: Callable[[bytes], bool]
) -> Iterator[dict[str, Any]]:
    last = len(pieces) - 1
    for index, piece in enumerate(pieces):
        if not worth_decoding(piece):
            continue
        try:
            item = orjson.loads((_ITEM if index else b"") + piece + (b"}" if index < last else b""))
        except orjson.JSONDecodeError:
            item = None
        if not isinstance(item, dict):  # cut inside an object: the page, whole
            yield from orjson.loads(raw).get("items") or ()
            return
        yield item


async def read_all(
    api: reading.Api, collection: reading.Collection, *, purpose: str
) -> list[dict[str, Any]]:
    """A small collection, whole; MissingPermission on a 403."""
    with needing(_listing(collection, purpose)):
        return await reading.list_all(api, collection)


# -- what the commands read ---------------------------------------------------------------------


async def load_policies(api: reading.Api, cache: ClusterCache) -> list[dict[str, Any]]:
    items = await read_all(api, POLICY_LIST, purpose="every policy, as the operator ranks them")
    for item in items:
        cache.upsert_policy(item)
    return items


async def load_configmap(api: reading.Api, cache: ClusterCache, cluster_ref: ClusterRef) -> None:
    """The device-plugin and mig-parted ConfigMaps as the operator's informers would deliver
    their first list (keys and layout names present then count as propagated).  Absent (404)
    is no keys at all: no policy has written one yet.  Not readable (403) is
    MissingPermission: taken for absent, it would promise keys to write and a propagation wait
    that are not real (and, for the mig-parted one, nodes waiting for a layout for ever)."""
    cache.mig_config_name = cluster_ref.mig_parted_configmap
    # One after the other: a user who may read neither is told of the first, always the same.
    await _load_one_configmap(
        api,
        ConfigMapSink(cache),
        cluster_ref.device_plugin_configmap,
        namespace=cluster_ref.device_plugin_namespace,
        purpose="the device-plugin ConfigMap: which config keys exist and have propagated",
    )
    await _load_one_configmap(
        api,
        ConfigMapSink(cache, mig=True),
        cluster_ref.mig_parted_configmap,
        namespace=cluster_ref.device_plugin_namespace,
        purpose="the mig-parted ConfigMap: which MIG layouts exist and have propagated",
    )


async def _load_one_configmap(
    api: reading.Api, sink: ConfigMapSink, name: str, *, namespace: str, purpose: str
) -> None:
    # With its managedFields: a file another manager owns is one the operator never writes.
    found = await read_one(
        api, CONFIGMAPS, name, namespace=namespace, purpose=purpose, keep_managed_fields=True
    )
    sink.begin_relist()
    if found is not None:
        sink.relist_item(found)
    sink.end_relist()


async def load_fleet(
    api: reading.Api,
    cache: ClusterCache,
    *,
    pods: bool = True,
    node_states: bool = True,
    pod_sink: Callable[[reading.Sink], reading.Sink] | None = None,
) -> None:
    """Every GPU node, and (by default) every GPUNodeState and every live pod, in parallel.
    ``pod_sink`` wraps the pods' sink (``plan`` keeps more of the pods it may evict)."""
    reads = [read_into(api, NODE_LIST, NodeSink(cache), purpose="every GPU node")]
    dra_read = _uses_dra(cache)
    if dra_read:
        reads.append(load_dra(api, cache))
    if node_states:
        sink = NodeStateSink(cache)
        purpose = "what the operator published for each node"
        reads.append(read_into(api, NODE_STATE_LIST, sink, purpose=purpose))
    if pods:
        pod_list = replace(POD_LIST, worth_decoding=asks_for(cache))
        purpose = "the pods that hold GPU slots"
        into: reading.Sink = PodSink(cache)
        if pod_sink is not None:
            into = pod_sink(into)
        reads.append(read_pages_into(api, pod_list, into, purpose=purpose))
    with _collector_paused():
        await asyncio.gather(*reads)
    if not dra_read and any(dra.is_on(record) for record in cache.nodes.values()):
        await load_dra(api, cache)  # nodes still on DRA under a policy that left it


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while the fleet is read: what the reads allocate (decoded
    JSON, slim records) holds no cycle, reference counting frees it, and the collector would
    only walk the growing cache again and again (a page of 500 pods decoded in 28 ms without
    it, 35-156 ms with it).  It runs again afterwards, as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _uses_dra(cache: ClusterCache) -> bool:
    return any(policy.dra for policy in cache.policies.values())


async def load_dra(api: reading.Api, cache: ClusterCache, *, node: str | None = None) -> None:
    """What the operator's DRA informers hold: the ``gpu.nvidia.com`` slices (of ``node``
    alone, when named), the claims holding their devices, and the DeviceClasses.  Without them
    a DRA node could not be shown Verified, nor its claims counted."""
    slices = SLICE_LIST
    if node is not None:  # a checked name (objectpaths): it cannot add a term
        slices = replace(SLICE_LIST, field_selector=f"spec.nodeName={node}")
    await asyncio.gather(
        read_into(api, slices, SliceSink(cache), purpose="the devices NVIDIA's DRA plugin lists"),
        read_into(api, CLAIM_LIST, ClaimSink(cache), purpose="the claims holding DRA devices"),
        read_into(
            api,
            CLASS_LIST,
            DeviceClassSink(cache),
            purpose="the DeviceClasses serving nvidia.com/gpu on DRA nodes",
        ),
    )


async def load_budgets(api: reading.Api) -> list[dict[str, Any]]:
    """Every PodDisruptionBudget (policy/v1): read only when the plan foresees evictions."""
    purpose = "the PodDisruptionBudgets that would refuse the evictions the plan foresees"
    return await read_all(api, BUDGET_LIST, purpose=purpose)


def asks_for(cache: ClusterCache) -> Callable[[bytes], bool]:
    """Whether a pod's JSON has a resource the state keeps pods for as a key (``"name":``, as
    in its requests and limits): one that has none cannot request one, and the pod sink would
    drop it after decoding it whole.  A key, not any mention: the device plugin's, GFD's and
    other daemons' pods name ``nvidia.com/gpu`` in their tolerations on every GPU node."""
    keys = tuple(f'"{name}":'.encode() for name in sorted(cache.tracked_resources))
    mig = f'"{MIG_RESOURCE_PREFIX}'.encode()  # every MIG device resource is kept
    return lambda raw: mig in raw or any(key in raw for key in keys)


async def load_node(api: reading.Api, cache: ClusterCache, name: str) -> dict[str, Any] | None:
    """One node, its GPUNodeState and its live pods: what ``explain node`` needs."""
    body = await read_one(api, NODES, name, purpose="the node explained")
    if body is None:
        return None
    cache.upsert_node(body)
    purpose = "what the operator published for the node"
    node_state = await read_one(api, NODE_STATES, name, purpose=purpose)
    if node_state is not None:
        cache.upsert_node_state(node_state)
    # The name is a checked one (the reads above): it cannot add a term to the selector.
    pod_list = replace(POD_LIST, field_selector=f"spec.nodeName={name},{LIVE_PODS}")
    await read_into(api, pod_list, PodSink(cache), purpose="the pods on the node")
    record = cache.nodes.get(name)
    if _uses_dra(cache) or (record is not None and dra.is_on(record)):
        await load_dra(api, cache, node=name)
    return body

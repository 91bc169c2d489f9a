"""A GPU cluster without GPUs: Nodes on a real API server, and the NVIDIA agents that tend them.

The operator's loop only closes through agents it does not control: it labels a node with a
device-plugin config key, the GPU Operator's config manager restarts the device plugin with that
key's config, kubelet advertises the new capacity, and GPU Feature Discovery relabels the node
with the sharing it now sees.  ``GpuClusterSimulator`` plays those agents for the nodes it
created, with their real failure mode (a label naming a key the ConfigMap lacks changes
nothing: the real config manager crash-loops), their lag (``reaction_delay``) and their field
managers, so that audit logs and managedFields look as they would in a cluster.

It talks to the API server through ``RawClient``, a few lines of aiohttp: this layer must not
depend on the operator's own client stack (kubernetes_asyncio lives in ``kube`` only), and a
simulator built on the code under test would share its bugs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml

from gpushare_operator.testing import bodies
from gpushare_operator.testing.rawclient import (
    MERGE_PATCH,
    ApiError,
    JsonObject,
    RawClient,
    WatchLines,
)

__all__ = ["MERGE_PATCH", "ApiError", "GpuClusterSimulator", "RawClient", "WatchLines"]

logger = logging.getLogger(__name__)

CONFIG_LABEL = "nvidia.com/device-plugin.config"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
MPS_LABEL = "nvidia.com/mps.capable"
TIMESTAMP_LABEL = "nvidia.com/gfd.timestamp"
DEFAULT_CONFIG_KEY = "default"


@dataclass(frozen=True, slots=True)
class Sharing:
    """What the device plugin advertises for one config: GFD's sharing labels and capacity."""

    strategy: str  # "none" | "time-slicing" | "mps", as in nvidia.com/gpu.sharing-strategy
    replicas: int
    rename_by_default: bool = False

    def capacity(self, *, gpus: int) -> dict[str, str | None]:
        """The extended resources kubelet shows; ``None`` means absent (a merge-patch delete)."""
        slots = str(gpus * self.replicas)
        if self.strategy != "none" and self.rename_by_default:
            return {bodies.GPU_RESOURCE: "0", bodies.SHARED_GPU_RESOURCE: slots}
        return {bodies.GPU_RESOURCE: slots, bodies.SHARED_GPU_RESOURCE: None}

    @property
    def labels(self) -> dict[str, str]:
        """GFD's sharing labels (``mps.capable`` says whether MPS sharing is configured)."""
        return {
            REPLICAS_LABEL: str(self.replicas),
            STRATEGY_LABEL: self.strategy,
            MPS_LABEL: str(self.strategy == "mps").lower(),
        }


NO_SHARING = Sharing(strategy="none", replicas=1)


def parse_device_plugin_config(text: str) -> Sharing | None:
    """The sharing a device-plugin config v1 asks for; ``None`` when the plugin would refuse it.

    Refusals mirror the plugin's own checks: not YAML, no ``version: v1``, both strategies at
    once, or a shared ``nvidia.com/gpu`` with fewer than 2 replicas.  Other resources are left
    alone (MIG devices are not simulated).
    """
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(config, dict) or config.get("version") != "v1":
        return None
    sharing = config.get("sharing") or {}
    chosen = [(key, sharing[key]) for key in ("timeSlicing", "mps") if sharing.get(key)]
    if len(chosen) > 1:
        return None
    if not chosen:
        return NO_SHARING
    key, spec = chosen[0]
    replicas = [
        r.get("replicas")
        for r in spec.get("resources") or []
        if isinstance(r, dict) and r.get("name") == bodies.GPU_RESOURCE
    ]
    if not replicas:
        return NO_SHARING
    if not isinstance(replicas[0], int) or replicas[0] < 2:
        return None
    strategy = "time-slicing" if key == "timeSlicing" else "mps"
    return Sharing(strategy, replicas[0], bool(spec.get("renameByDefault", False)))


def _rv(obj: JsonObject | None) -> int:
    """A resourceVersion as a number: opaque by contract, an etcd revision in every real server."""
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


# -- the simulator ---------------------------------------------------------------------------


class GpuClusterSimulator:
    """Creates GPU Nodes, and plays config manager + device plugin + GFD on them.

    ``reaction_delay`` is the lag between a change (config label, ConfigMap) and the agents'
    reaction, as kubelet's ConfigMap refresh and the plugin restart make it.  ``verify=False``
    breaks GFD: capacity still follows the config but the sharing labels never do, which is how
    a test drives the operator into its ``Mismatch`` phase.  Nodes it did not create are never
    touched; those it created are deleted on exit unless ``cleanup=False``.
    """

    def __init__(
        self,
        *,
        kubeconfig: str | Path,
        namespace: str = "gpu-operator",
        configmap: str = "gpushare-device-plugin-configs",
        reaction_delay: float = 0.0,
        verify: bool = True,
        poll_interval: float = 0.2,
        cleanup: bool = True,
    ) -> None:
        self.client = RawClient(kubeconfig=kubeconfig)
        self._configmap_path = f"/api/v1/namespaces/{namespace}/configmaps/{configmap}"
        self._reaction_delay = reaction_delay
        self._verify = verify
        self._poll_interval = poll_interval
        self._cleanup = cleanup
        self._gpus: dict[str, int] = {}  # the nodes we created -> their physical GPU count
        self._nodes: dict[str, JsonObject] = {}  # their latest bodies, by resourceVersion
        self._configs: dict[str, str] | None = None
        self._dirty: set[str] = set()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._background: list[asyncio.Task[None]] = []
        self._listed = asyncio.Event()
        self._writes = asyncio.Semaphore(16)
        self._reconfigurations: collections.Counter[str] = collections.Counter()

    async def __aenter__(self) -> GpuClusterSimulator:
        await self.client.__aenter__()
        self._background = [
            asyncio.create_task(self._watch_nodes(), name="gpu-simulator-watch"),
            asyncio.create_task(self._poll_configs(), name="gpu-simulator-configs"),
        ]
        try:
            await self._until(self._started, timeout=30.0, what="the simulator to start")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tasks = [*self._background, *self._workers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._background.clear()
        self._workers.clear()
        try:
            if self._cleanup:
                await asyncio.gather(*(self.delete_node(name) for name in list(self._gpus)))
        finally:
            await self.client.__aexit__()

    # -- what tests call -------------------------------------------------------------------

    @property
    def reconfigurations(self) -> Mapping[str, int]:
        """How many times the agents changed each node (labels and/or capacity), by name."""
        return dict(self._reconfigurations)

    @property
    def node_names(self) -> list[str]:
        return sorted(self._gpus)

    async def create_node(self, body: Mapping[str, Any]) -> JsonObject:
        """Register a node as kubelet does (``bodies.gpu_node`` makes one) and return it.

        managedFields are dropped: the server records its own, starting with kubelet's.
        """
        metadata = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
        metadata.pop("resourceVersion", None)
        name = metadata["name"]
        capacity = body.get("status", {}).get("capacity", {})
        self._gpus[name] = int(capacity.get(bodies.GPU_RESOURCE, "0"))
        status, created = await self.client.post(
            "/api/v1/nodes", {**body, "metadata": metadata}, params={"fieldManager": "kubelet"}
        )
        if status != 201:
            del self._gpus[name]
            raise ApiError(method="POST", path="/api/v1/nodes", status=status, body=created)
        if created["status"].get("capacity", {}).get(bodies.GPU_RESOURCE) != capacity.get(
            bodies.GPU_RESOURCE
        ):
            created = await self._patch(
                name, {"status": body["status"]}, status=True, as_="kubelet"
            )
        self._observe(created)
        return dict(created)

    async def create_gpu_nodes(
        self, *, pool: str, count: int, prefix: str | None = None, **options: Any
    ) -> list[str]:
        """``count`` nodes named ``<prefix>-<i>`` in ``pool``; ``options`` go to ``gpu_node``."""
        names = [f"{prefix or pool}-{index:04d}" for index in range(count)]
        await asyncio.gather(
            *(self.create_node(bodies.gpu_node(name=n, pool=pool, **options)) for n in names)
        )
        return names

    async def relabel(self, name: str, labels: Mapping[str, str | None]) -> JsonObject:
        """Set (or with ``None`` remove) node labels, as an admin with ``kubectl label`` would."""
        return await self._patch(name, {"metadata": {"labels": dict(labels)}}, as_="kubectl-label")

    async def delete_node(self, name: str) -> None:
        self._gpus.pop(name, None)
        self._nodes.pop(name, None)
        status, body = await self.client.delete(f"/api/v1/nodes/{name}")
        if status not in (200, 202, 404):
            raise ApiError(method="DELETE", path=f"/api/v1/nodes/{name}", status=status, body=body)

    async def wait_idle(self, *, timeout: float = 30.0) -> None:
        """Return once every change made so far has been seen and acted on.

        Idle means: the ConfigMap we hold is the one on the server, every node we created is at
        the resourceVersion the server has (so our watch has caught up, including with our own
        writes), and no node is waiting for a reaction.
        """
        await self._until(self._is_idle, timeout=timeout, what="the simulator to go idle")

    # -- watching ----------------------------------------------------------------------------

    async def _watch_nodes(self) -> None:
        version = await self._list_nodes()
        while True:
            try:
                version = await self._follow(version)
            except (aiohttp.ClientError, TimeoutError, ValueError, ApiError) as exc:
                logger.warning("node watch failed: %s; retrying", exc)
                await asyncio.sleep(0.5)

    async def _follow(self, version: str) -> str:
        """One watch request from ``version``; returns where the next one should start."""
        params = {"resourceVersion": version, "allowWatchBookmarks": "true"}
        # aclosing: leaving early must close the response now, not when the generator is GC'd.
        async with contextlib.aclosing(self.client.watch("/api/v1/nodes", params=params)) as events:
            async for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":  # 410 Gone: our resourceVersion was compacted away
                    logger.info("node watch expired (%s); listing again", obj.get("message"))
                    return await self._list_nodes()
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind == "DELETED":
                    self._forget(obj)
                elif kind in ("ADDED", "MODIFIED"):
                    self._observe(obj)
        return version

    async def _list_nodes(self) -> str:
        """List every node (in pages) to start or restart the watch; refresh ours on the way."""
        params, seen = {"limit": "500"}, set()
        while True:
            status, page = await self.client.get("/api/v1/nodes", params=params)
            if status != 200:
                raise ApiError(method="LIST", path="/api/v1/nodes", status=status, body=page)
            for node in page["items"]:
                seen.add(node["metadata"]["name"])
                self._observe(node)
            if not page["metadata"].get("continue"):
                break
            params = {"limit": "500", "continue": page["metadata"]["continue"]}
        for name in set(self._nodes) - seen:  # deleted while we were not watching
            self._forget(self._nodes[name])
        self._listed.set()
        return str(page["metadata"]["resourceVersion"])

    async def _poll_configs(self) -> None:
        while True:
            try:
                configs = await self._read_configs()
            except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
                logger.warning("reading the device-plugin ConfigMap failed: %s", exc)
            else:
                if configs != self._configs:
                    self._configs = configs
                    for name in self._nodes:
                        self._mark(name)
            await asyncio.sleep(self._poll_interval)

    async def _read_configs(self) -> dict[str, str]:
        status, body = await self.client.get(self._configmap_path)
        if status == 404:
            return {}
        if status != 200:
            raise ApiError(method="GET", path=self._configmap_path, status=status, body=body)
        return dict(body.get("data") or {})

    def _observe(self, node: JsonObject) -> None:
        name = node.get("metadata", {}).get("name")
        if name in self._gpus and _rv(node) > _rv(self._nodes.get(name)):
            self._nodes[name] = node
            self._mark(name)

    def _forget(self, node: JsonObject) -> None:
        name = node.get("metadata", {}).get("name")
        if name in self._nodes and _rv(node) >= _rv(self._nodes[name]):
            del self._nodes[name]
            self._gpus.pop(name, None)

    # -- reacting ----------------------------------------------------------------------------

    def _mark(self, name: str) -> None:
        self._dirty.add(name)
        if name not in self._workers:
            self._workers[name] = asyncio.create_task(self._settle(name), name=f"gpu-sim-{name}")

    async def _settle(self, name: str) -> None:
        """React to one node's changes, after the agents' lag, until nothing is left to do."""
        try:
            if self._reaction_delay:
                await asyncio.sleep(self._reaction_delay)
            while name in self._dirty:
                self._dirty.discard(name)
                node, gpus = self._nodes.get(name), self._gpus.get(name)
                target = None if node is None or gpus is None else self._target(node)
                if node is None or gpus is None or target is None:
                    continue
                try:
                    await self._apply(name, node, target, gpus=gpus)
                except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
                    logger.warning("simulated GPU agents failed on %s: %s; retrying", name, exc)
                    self._dirty.add(name)
                    await asyncio.sleep(0.5)
        finally:
            self._workers.pop(name, None)

    def _target(self, node: JsonObject) -> Sharing | None:
        """What the plugin would run with for this node's config label; None: it would not run."""
        key = (node["metadata"].get("labels") or {}).get(CONFIG_LABEL)
        configs = self._configs or {}
        if key is None or (key == DEFAULT_CONFIG_KEY and key not in configs):
            return NO_SHARING
        if key not in configs:
            return None  # the real config manager exits and crash-loops with back-off
        return parse_device_plugin_config(configs[key])

    async def _apply(self, name: str, node: JsonObject, target: Sharing, *, gpus: int) -> None:
        labels = node["metadata"].get("labels") or {}
        label_patch = {k: v for k, v in target.labels.items() if labels.get(k) != v}
        if not self._verify:
            label_patch = {}
        status_patch: JsonObject = {}
        for section in ("capacity", "allocatable"):
            current = node.get("status", {}).get(section) or {}
            wanted = target.capacity(gpus=gpus)
            if changed := {k: v for k, v in wanted.items() if current.get(k) != v}:
                status_patch[section] = changed
        if not label_patch and not status_patch:
            return
        # Capacity first: the plugin re-registers before GFD's next pass relabels the node, and
        # a test that waits for the labels can then rely on the capacity too.
        async with self._writes:
            if status_patch:
                body = {"status": status_patch}
                self._observe(
                    await self._patch(name, body, status=True, as_="nvidia-device-plugin")
                )
            if label_patch:
                label_patch[TIMESTAMP_LABEL] = str(int(time.time()))
                body = {"metadata": {"labels": label_patch}}
                self._observe(await self._patch(name, body, as_="gpu-feature-discovery"))
        self._reconfigurations[name] += 1
        logger.info("simulated GPU agents reconfigured %s: %s", name, target)

    async def _patch(
        self, name: str, body: JsonObject, *, as_: str, status: bool = False
    ) -> JsonObject:
        path = f"/api/v1/nodes/{name}" + ("/status" if status else "")
        code, patched = await self.client.patch(path, body, params={"fieldManager": as_})
        if code != 200:
            raise ApiError(method="PATCH", path=path, status=code, body=patched)
        return dict(patched)

    # -- waiting -----------------------------------------------------------------------------

    async def _is_idle(self) -> bool:
        if self._dirty or self._workers or await self._read_configs() != self._configs:
            return False
        status, listed = await self.client.get("/api/v1/nodes")
        if status != 200:
            raise ApiError(method="LIST", path="/api/v1/nodes", status=status, body=listed)
        server = {
            n["metadata"]["name"]: _rv(n)
            for n in listed["items"]
            if n["metadata"]["name"] in self._gpus
        }
        ours = {name: _rv(node) for name, node in self._nodes.items()}
        return server == ours and not self._dirty and not self._workers

    async def _started(self) -> bool:
        return self._listed.is_set() and self._configs is not None

    async def _until(
        self, probe: Callable[[], Awaitable[bool]], *, timeout: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout
        while not await probe():
            for task in self._background:
                if task.done():
                    task.result()  # re-raise whatever killed it
                    raise RuntimeError(f"{task.get_name()} stopped")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            await asyncio.sleep(0.05)

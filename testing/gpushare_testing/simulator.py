"""A GPU cluster without GPUs: Nodes on a real API server, and the NVIDIA agents that tend them.

The operator's loop only closes through agents it does not control: it labels a node with a
device-plugin config key, the GPU Operator's config manager restarts the device plugin with that
key's config, kubelet advertises the new capacity, and GPU Feature Discovery relabels the node
with the sharing it now sees.  ``GpuClusterSimulator`` plays those agents for the nodes it
created, with their real failure modes and lags (see ``nodeagents`` for the per-node state
machine, ``agents`` for the pure rules, and ``docs/simulator.md`` for the sources), and with
their field managers, so that audit logs and managedFields look as they would in a cluster.
It also plays kubelet's part in running the pods bound to those nodes (``podagent``): each is
admitted against what the node offers at that moment, then Running or rejected (Failed).

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
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from gpushare_testing import bodies, draplugin
from gpushare_testing.agents import (
    CONFIG_LABEL,
    NO_SHARING,
    PRODUCT_LABEL,
    SHARED_SUFFIX,
    TIMESTAMP_LABEL,
    Sharing,
    parse_device_plugin_config,
)
from gpushare_testing.configview import ConfigView
from gpushare_testing.migagent import MigAgent
from gpushare_testing.miglabels import MigNode
from gpushare_testing.migmanager import CONFIG_LABEL as MIG_CONFIG_LABEL
from gpushare_testing.migmanager import disabled
from gpushare_testing.migtables import GpuModel, load_tables
from gpushare_testing.nodeagents import NodeAgents, Timing
from gpushare_testing.nodelifecycle import no_schedule_taints
from gpushare_testing.nodewatch import NodeWatcher, rv
from gpushare_testing.podagent import PodAgent, kubelet_view
from gpushare_testing.rawclient import (
    MERGE_PATCH,
    ApiError,
    JsonObject,
    RawClient,
    WatchLines,
)

__all__ = [
    "MERGE_PATCH",
    "NO_SHARING",
    "ApiError",
    "GpuClusterSimulator",
    "RawClient",
    "Sharing",
    "WatchLines",
    "parse_device_plugin_config",
]

logger = logging.getLogger(__name__)


def _config_label(node: JsonObject) -> str | None:
    value = (node.get("metadata", {}).get("labels") or {}).get(CONFIG_LABEL)
    return value if isinstance(value, str) else None


# -- the simulator ---------------------------------------------------------------------------


class GpuClusterSimulator(NodeWatcher):
    """Creates GPU Nodes, and plays config manager + device plugin + GFD on them.

    The timings are ON by default; a test sets one to 0 to isolate a point:

    - ``config_sync_delay``: how far the config manager's view of the ConfigMap lags the API
      server (kubelet refreshes a mounted ConfigMap volume periodically; about a minute by
      default in a real cluster).
    - ``restart_window``: how long the device plugin is away after each config change; kubelet
      shows its resources with allocatable 0 meanwhile.
    - ``backoff_initial`` / ``backoff_cap``: kubelet's crash-loop back-off for a config manager
      that found no key for its label, and for a plugin that refused its config (10 s and 5 min
      in a real cluster).
    - ``reaction_delay``: extra lag before the config manager sees a label change.

    ``verify=False`` breaks GFD everywhere: capacity still follows the config but the sharing
    labels never do, which is how a test drives the operator into its ``Mismatch`` phase;
    ``set_healthy(name, False)`` breaks one node's agents (they write nothing) until healed.
    Drift on a node that was fine: ``lose_gpu`` (a GPU fails its health check: allocatable
    drops by the devices made of it, GFD's labels stay) until ``restore_gpus``, and
    ``stop_device_plugin`` (allocatable 0, labels kept) until ``start_device_plugin``.
    ``recreate_node`` deletes a node and registers it again under the same name, as a replaced
    machine does.
    ``run_pods=False`` leaves pods alone (no kubelet: bound pods stay Pending).
    Nodes it did not create are never touched; those it created are deleted on exit unless
    ``cleanup=False``.
    """

    def __init__(
        self,
        *,
        kubeconfig: str | Path,
        namespace: str = "gpu-operator",
        configmap: str = "gpushare-device-plugin-configs",
        config_sync_delay: float = 1.0,
        restart_window: float = 2.0,
        backoff_initial: float = 0.5,
        backoff_cap: float = 8.0,
        reaction_delay: float = 0.0,
        verify: bool = True,
        poll_interval: float = 0.2,
        cleanup: bool = True,
        run_pods: bool = True,
        mig_configmap: str = "gpushare-mig-parted-config",
        mig_apply_seconds: float = 1.0,
        mig_reboot_seconds: float = 0.0,
        mig_strategy_default: str = "single",
        mig_tables: Mapping[str, GpuModel] | None = None,
    ) -> None:
        super().__init__(RawClient(kubeconfig=kubeconfig))
        view = lambda name: kubelet_view(self._agents.get(name), self._nodes.get(name))  # noqa: E731
        self.pods = PodAgent(self.client, view=view) if run_pods else None
        self._configs = ConfigView(
            self.client,
            path=f"/api/v1/namespaces/{namespace}/configmaps/{configmap}",
            sync_delay=config_sync_delay,
            poll_interval=poll_interval,
        )
        self._timing = Timing(
            restart_window=restart_window, backoff_initial=backoff_initial, backoff_cap=backoff_cap
        )
        self._reaction_delay = reaction_delay
        self._verify = verify
        self._cleanup = cleanup
        self._gpus: dict[str, int] = {}  # the nodes we created -> their physical GPU count
        self._agents: dict[str, NodeAgents] = {}
        self._labels: dict[str, str | None] = {}  # the config label last queued per node
        # Label changes not yet seen by the config manager: (when it sees them, value).
        self._label_queue: dict[str, collections.deque[tuple[float, str | None]]] = {}
        self._gfd_written: collections.Counter[str] = collections.Counter()
        self._unhealthy: set[str] = set()
        # Nodes whose device plugin is off because their deploy label is not ``true``
        # (draplugin): it comes back when the label does.
        self._undeployed: set[str] = set()
        self._slices: dict[str, str] = {}  # node -> the name of the ResourceSlice we published
        self._bodies: dict[str, Mapping[str, Any]] = {}  # as registered, to register again
        self._gone: set[str] = set()  # uids of nodes deleted: their late events are ignored
        self._wake: dict[str, asyncio.Event] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._writes = asyncio.Semaphore(16)
        self._mig_configs = ConfigView(
            self.client,
            path=f"/api/v1/namespaces/{namespace}/configmaps/{mig_configmap}",
            sync_delay=config_sync_delay,
            poll_interval=poll_interval,
        )
        self._mig_tables = mig_tables
        self._mig_default = mig_strategy_default
        self.mig = MigAgent(
            self, apply_seconds=mig_apply_seconds, reboot_seconds=mig_reboot_seconds
        )

    async def __aenter__(self) -> GpuClusterSimulator:
        await self.client.__aenter__()
        self._background = [
            asyncio.create_task(self._watch_nodes(), name="gpu-simulator-watch"),
            asyncio.create_task(self._configs.run(), name="gpu-simulator-configs"),
            asyncio.create_task(self._mig_configs.run(), name="gpu-simulator-mig-configs"),
        ]
        self._background += self.pods.start() if self.pods is not None else []
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
        tasks = [*self._background, *self._workers.values(), *self.mig.tasks()]
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
        """How many times each node's plugin came back up with a config after a change."""
        return {name: a.restarts for name, a in self._agents.items() if a.restarts}

    @property
    def config_manager_failures(self) -> Mapping[str, tuple[float, ...]]:
        """Per crash-looping config manager, the monotonic times of its failed runs so far."""
        return {name: tuple(a.cm_failures) for name, a in self._agents.items() if a.cm_failures}

    @property
    def plugin_failures(self) -> Mapping[str, int]:
        """Per crash-looping device plugin, how many starts refused its config so far."""
        return {n: a.plugin_failures for n, a in self._agents.items() if a.plugin_failures}

    @property
    def node_names(self) -> list[str]:
        return sorted(self._gpus)

    @property
    def gpu_counts(self) -> Mapping[str, int]:
        """The physical GPUs of each node we created (lost ones included)."""
        return dict(self._gpus)

    def set_healthy(self, name: str, healthy: bool) -> None:
        """Break (or heal) one node's agents: while broken, nothing of theirs reaches the node.

        The agents keep running (the config manager links, the plugin restarts) but neither
        kubelet's view of the plugin nor GFD's labels are written; healing writes what they
        would show by then.  This is how a test makes one node fail verification.
        """
        if healthy:
            self._unhealthy.discard(name)
            self._mark(name)
        else:
            self._unhealthy.add(name)

    def lose_gpu(self, name: str, count: int = 1) -> None:
        """``count`` GPUs of the node fail their health check (an XID error): the device plugin
        marks their devices unhealthy, so kubelet keeps them in capacity and takes them out of
        allocatable; GFD still counts and labels them.  They stay lost until ``restore_gpus``,
        whatever the plugin does meanwhile."""
        self._agents[name].lose_gpus(count)
        self._mark(name)

    def restore_gpus(self, name: str) -> None:
        self._agents[name].restore_gpus()
        self._mark(name)

    def stop_device_plugin(self, name: str) -> None:
        """The node's device-plugin pod goes away: allocatable 0, capacity and labels kept."""
        self._agents[name].stop_plugin()
        self._mark(name)

    def start_device_plugin(self, name: str) -> None:
        """The pod is back: it links what the node's label names now and starts with it."""
        self._agents[name].start_plugin(now=time.monotonic(), view=self._configs.view or {})
        self._mark(name)

    async def recreate_node(self, name: str) -> JsonObject:
        """Delete the node and register it again under the same name, as kubelet registers a
        replaced machine: a new uid, the labels it was first created with (none of the
        operator's), its GPUs unshared and healthy."""
        body = self._bodies[name]
        await self.delete_node(name)
        await self._until(lambda: self._absent(name), timeout=30.0, what=f"{name} deleted")
        return await self.create_node(body)

    async def _absent(self, name: str) -> bool:
        status, _ = await self.client.get(f"/api/v1/nodes/{name}")
        return status == 404

    async def create_node(self, body: Mapping[str, Any]) -> JsonObject:
        """Register a node as kubelet does (``bodies.gpu_node`` makes one) and return it.

        managedFields are dropped: the server records its own, starting with kubelet's.
        """
        metadata = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
        metadata.pop("resourceVersion", None)
        name = metadata["name"]
        capacity = body.get("status", {}).get("capacity", {})
        gpus = int(capacity.get(bodies.GPU_RESOURCE, "0"))
        labels = metadata.get("labels") or {}
        label = labels.get(CONFIG_LABEL)
        self._agents[name] = NodeAgents.start(
            gpus=gpus,
            capacity=capacity,
            label=label,
            view=self._configs.view or {},
            timing=self._timing,
            now=time.monotonic(),
            mig=self._mig_node(labels, gpus),
        )
        self.mig.add(name, labels.get(MIG_CONFIG_LABEL))
        self._labels[name] = label
        self._gpus[name] = gpus
        self._bodies[name] = body
        status, created = await self.client.post(
            "/api/v1/nodes", {**body, "metadata": metadata}, params={"fieldManager": "kubelet"}
        )
        if status != 201:
            self._drop(name)
            raise ApiError(method="POST", path="/api/v1/nodes", status=status, body=created)
        if created["status"].get("capacity", {}).get(bodies.GPU_RESOURCE) != capacity.get(
            bodies.GPU_RESOURCE
        ):
            created = await self._patch(
                name, {"status": body["status"]}, status=True, as_="kubelet"
            )
        if (taints := no_schedule_taints(created)) is not None:  # not-ready goes: it is Ready
            created = await self._patch(
                name, {"spec": {"taints": taints}}, as_="kube-controller-manager"
            )
        self._observe(created)
        if self.pods is not None:
            self.pods.node_added(name)
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
        uid = (self._nodes.get(name) or {}).get("metadata", {}).get("uid")
        if uid:
            self._gone.add(str(uid))
        self._drop(name)
        status, body = await self.client.delete(f"/api/v1/nodes/{name}")
        if status not in (200, 202, 404):
            raise ApiError(method="DELETE", path=f"/api/v1/nodes/{name}", status=status, body=body)

    async def wait_idle(self, *, timeout: float = 30.0) -> None:
        """Return once every change made so far has been seen and acted on.

        Idle means: the ConfigMap we read is the one on the server and the config managers'
        view has caught up with it; every node we created is at the resourceVersion the server
        has (our watch has caught up, our own writes included); no label change is waiting to
        be seen; no timer is pending whose outcome could change a node (a restart window, a
        back-off restart that would now succeed); and each healthy node shows what its agents
        would show.  A crash loop that would only fail again does not keep it from being idle.
        """
        await self._until(self._is_idle, timeout=timeout, what="the simulator to go idle")

    # -- the MIG manager's host (migagent.MigHost) -------------------------------------------

    def mig_node(self, name: str) -> tuple[JsonObject, NodeAgents] | None:
        node, agents = self._nodes.get(name), self._agents.get(name)
        return None if node is None or agents is None else (node, agents)

    def mig_config_text(self) -> str | None:
        """config.yaml of the MIG ConfigMap as the manager's mounted volume shows it."""
        return (self._mig_configs.view or {}).get("config.yaml")

    def mig_model(self, product: str) -> GpuModel | None:
        if self._mig_tables is not None:
            return self._mig_tables.get(product)
        try:
            return load_tables().get(product)
        except (FileNotFoundError, ModuleNotFoundError):
            return None

    def plugin_view(self) -> Mapping[str, str]:
        return self._configs.view or {}

    def mark(self, name: str) -> None:
        self._mark(name)

    async def patch_node(
        self,
        name: str,
        body: JsonObject,
        *,
        as_: str,
        status: bool = False,
        content_type: str = MERGE_PATCH,
    ) -> JsonObject:
        async with self._writes:
            node = await self._patch(name, body, as_=as_, status=status, content_type=content_type)
        self._observe(node)
        return node

    def _mig_node(self, labels: Mapping[str, str], gpus: int) -> MigNode:
        """What NVML would report of the node's GPUs: the model GFD named when it registered."""
        product = str(labels.get(PRODUCT_LABEL, "")).removesuffix(SHARED_SUFFIX)
        memory = str(labels.get("nvidia.com/gpu.memory", "0"))
        return MigNode(
            product=product,
            memory_mib=int(memory) if memory.isdigit() else 0,
            layout=disabled(gpus),
            model=self.mig_model(product),
            default_strategy=self._mig_default,
        )

    # -- the agents' inputs ----------------------------------------------------------------

    def _observe(self, node: JsonObject) -> None:
        name = node.get("metadata", {}).get("name")
        if node.get("metadata", {}).get("uid") in self._gone:
            return  # a late event of a node deleted since (its name may be registered again)
        if name in self._gpus and rv(node) > rv(self._nodes.get(name)):
            self._nodes[name] = node
            self.mig.see(name, node.get("metadata", {}).get("labels") or {})
            label = _config_label(node)
            if label != self._labels.get(name):
                self._labels[name] = label
                queue = self._label_queue.setdefault(name, collections.deque())
                queue.append((time.monotonic() + self._reaction_delay, label))
            self._mark(name)

    def _forget(self, node: JsonObject) -> None:
        name = node.get("metadata", {}).get("name")
        if node.get("metadata", {}).get("uid") in self._gone:
            return
        if name in self._nodes and rv(node) >= rv(self._nodes[name]):
            self._drop(name)

    def _drop(self, name: str) -> None:
        for table in (self._gpus, self._nodes, self._agents, self._labels, self._label_queue):
            table.pop(name, None)
        self._gfd_written.pop(name, None)
        self.mig.drop(name)
        self._unhealthy.discard(name)
        self._undeployed.discard(name)
        self._slices.pop(name, None)  # the garbage collector deletes it with its Node

    # -- reacting ----------------------------------------------------------------------------

    def _mark(self, name: str) -> None:
        self._wake.setdefault(name, asyncio.Event()).set()
        if name not in self._workers:
            self._workers[name] = asyncio.create_task(self._tend(name), name=f"gpu-sim-{name}")

    async def _tend(self, name: str) -> None:
        """Run one node's agents: feed them what they see, write what they show, sleep till due."""
        wake = self._wake.setdefault(name, asyncio.Event())
        try:
            while True:
                wake.clear()
                node, agents = self._nodes.get(name), self._agents.get(name)
                if node is None or agents is None:
                    return
                now, view = time.monotonic(), self._configs.view or {}
                queue = self._label_queue.get(name) or collections.deque()
                while queue and queue[0][0] <= now:
                    agents.see_label(queue.popleft()[1], now=now, view=view)
                self._follow_deploy_label(name, node, agents, now=now, view=view)
                agents.advance(now=now, view=view)
                if name not in self._unhealthy:
                    try:
                        await self._write(name, node, agents)
                        await self._gpu_operator(name)
                        await self._dra_plugin(name)
                    except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
                        logger.warning("simulated GPU agents failed on %s: %s; retrying", name, exc)
                        await asyncio.sleep(0.5)
                        continue
                due = [t for t in (agents.next_deadline(), queue[0][0] if queue else None) if t]
                if not due and not wake.is_set():
                    return
                if due:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), max(0.0, min(due) - time.monotonic()))
        finally:
            self._workers.pop(name, None)

    def _follow_deploy_label(
        self,
        name: str,
        node: JsonObject,
        agents: NodeAgents,
        *,
        now: float,
        view: Mapping[str, str],
    ) -> None:
        """The device-plugin DaemonSet's pod leaves a node whose deploy label is not ``true``,
        and comes back with it (``draplugin``)."""
        labels = node.get("metadata", {}).get("labels") or {}
        deployed = draplugin.device_plugin_deployed(labels)
        if not deployed and name not in self._undeployed and not agents.outage:
            self._undeployed.add(name)
            agents.stop_plugin()
        elif deployed and name in self._undeployed:
            self._undeployed.discard(name)
            agents.start_plugin(now=now, view=view)

    async def _gpu_operator(self, name: str) -> None:
        """The GPU Operator sets an absent deploy label to ``true`` (never another value)."""
        labels = (self._nodes.get(name) or {}).get("metadata", {}).get("labels") or {}
        if draplugin.deploy_label_missing(labels):
            body = {"metadata": {"labels": {draplugin.DEPLOY_LABEL: "true"}}}
            self._observe(await self._patch(name, body, as_=draplugin.GPU_OPERATOR))

    async def _dra_plugin(self, name: str) -> None:
        """Publish or withdraw the node's ResourceSlice as NVIDIA's DRA kubelet plugin would."""
        node = self._nodes.get(name)
        if node is None:
            return
        labels = node.get("metadata", {}).get("labels") or {}
        allocatable = node.get("status", {}).get("allocatable") or {}
        wanted = draplugin.wants_slice(labels, allocatable)
        published = self._slices.get(name)
        if wanted and published is None:
            # What the plugin enumerates as it starts: each GPU whole, or its MIG devices.
            agents = self._agents.get(name)
            layout = agents.mig.layout if agents is not None else ()
            body = draplugin.slice_body(
                node=name,
                node_uid=str(node.get("metadata", {}).get("uid")),
                gpus=self._gpus.get(name, 0),
                labels=labels,
                mig=[gpu.devices if gpu.enabled else None for gpu in layout],
                model=self.mig_model(agents.mig.product) if agents is not None else None,
            )
            params = {"fieldManager": draplugin.FIELD_MANAGER}
            code, created = await self.client.post(draplugin.SLICES_PATH, body, params=params)
            if code != 201:
                raise ApiError(method="POST", path=draplugin.SLICES_PATH, status=code, body=created)
            self._slices[name] = created["metadata"]["name"]
            logger.info("simulated DRA kubelet plugin published %s", self._slices[name])
        elif not wanted and published is not None:
            path = f"{draplugin.SLICES_PATH}/{published}"
            code, answer = await self.client.delete(path)
            if code not in (200, 202, 404):
                raise ApiError(method="DELETE", path=path, status=code, body=answer)
            del self._slices[name]
            logger.info("simulated DRA kubelet plugin withdrew %s", published)

    def slice_of(self, name: str) -> str | None:
        """The ResourceSlice the simulated DRA kubelet plugin published for ``name``."""
        return self._slices.get(name)

    def _dra_settled(self, name: str, node: JsonObject) -> bool:
        labels = node.get("metadata", {}).get("labels") or {}
        allocatable = node.get("status", {}).get("allocatable") or {}
        if draplugin.deploy_label_missing(labels):
            return False
        if draplugin.device_plugin_deployed(labels) == (name in self._undeployed):
            return False
        return draplugin.wants_slice(labels, allocatable) == (name in self._slices)

    def _status_patch(self, node: JsonObject, agents: NodeAgents) -> JsonObject:
        patch: JsonObject = {}
        for section, wanted in agents.status().items():
            current = node.get("status", {}).get(section) or {}
            if changed := {k: v for k, v in wanted.items() if current.get(k) != v}:
                patch[section] = changed
        return patch

    def _gfd_pending(self, name: str, agents: NodeAgents) -> bool:
        return self._verify and agents.gfd_passes > self._gfd_written[name]

    async def _write(self, name: str, node: JsonObject, agents: NodeAgents) -> None:
        """Write what kubelet (for the plugin) and GFD would show now, if it differs."""
        status_patch = self._status_patch(node, agents)
        passes = agents.gfd_passes
        if not status_patch and not self._gfd_pending(name, agents):
            return
        # Capacity first: GFD relabels after the plugin is back, and a test that waits for the
        # labels can then rely on the capacity too.
        async with self._writes:
            if status_patch:
                body = {"status": status_patch}
                node = await self._patch(name, body, status=True, as_="nvidia-device-plugin")
                self._observe(node)
            if self._gfd_pending(name, agents):
                labels = node["metadata"].get("labels") or {}
                patch = agents.gfd_labels(labels)
                patch[TIMESTAMP_LABEL] = str(int(time.time()))  # every pass stamps the node
                body = {"metadata": {"labels": patch}}
                self._observe(await self._patch(name, body, as_="gpu-feature-discovery"))
                self._gfd_written[name] = passes
                logger.info("simulated GPU agents reconfigured %s: %s", name, agents.gfd_sharing)

    async def _patch(
        self,
        name: str,
        body: JsonObject,
        *,
        as_: str,
        status: bool = False,
        content_type: str = MERGE_PATCH,
    ) -> JsonObject:
        path = f"/api/v1/nodes/{name}" + ("/status" if status else "")
        params = {"fieldManager": as_}
        code, patched = await self.client.patch(
            path, body, params=params, content_type=content_type
        )
        if code != 200:
            raise ApiError(method="PATCH", path=path, status=code, body=patched)
        return dict(patched)

    # -- waiting -----------------------------------------------------------------------------

    async def _is_idle(self) -> bool:
        configs = await self._configs.read()
        mig_configs = await self._mig_configs.read()
        status, listed = await self.client.get("/api/v1/nodes")
        if status != 200:
            raise ApiError(method="LIST", path="/api/v1/nodes", status=status, body=listed)
        # No await from here on: the checks below must all see the same moment, or an event
        # that arrives in between could pass the resourceVersion check unacted on.
        server = {
            n["metadata"]["name"]: rv(n)
            for n in listed["items"]
            if n["metadata"]["name"] in self._gpus
        }
        if server != {name: rv(node) for name, node in self._nodes.items()}:
            return False
        if self._configs.pending or configs != self._configs.seen:
            return False
        if self._mig_configs.pending or mig_configs != self._mig_configs.seen:
            return False
        if not self.mig.idle:
            return False
        if self.pods is not None and not self.pods.idle:
            return False
        view = self._configs.view or {}
        for name, agents in self._agents.items():
            node = self._nodes.get(name)
            if self._label_queue.get(name) or not agents.settled(view):
                return False
            if node is None or name in self._unhealthy:
                continue  # a broken node's agents show nothing: nothing to wait for
            if self._status_patch(node, agents) or self._gfd_pending(name, agents):
                return False
            if not self._dra_settled(name, node):
                return False
        return True

    async def _started(self) -> bool:
        pods = self.pods is None or self.pods.listed.is_set()
        configs = self._configs.view is not None and self._mig_configs.view is not None
        return pods and self._listed.is_set() and configs

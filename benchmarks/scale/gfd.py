"""A GFD responder: NVIDIA's agents, as cheaply as 5,000 nodes on 2 cores allow.

The bench cluster has no GPUs, so nothing would ever confirm a config: a node would stay
``Applied`` and a paced rollout would stop after its first batch.  This plays the GPU Operator's
config manager, the device plugin and GPU Feature Discovery (GFD) on the real Node objects,
with the simulator's pure rules (``testing.agents``: ``parse_device_plugin_config``,
``gfd_labels``, ``plugin_resources``, ``resolve_config_key``), and none of its per-node tasks.

One node watch feeds two things:

- the *responder*: when a node's ``nvidia.com/device-plugin.config`` label names a config the
  node does not show yet, it does what the agents do, ``delay`` seconds after it saw the label
  (uniformly 2-4 s by default, the time from the label change to GFD's relabel; see
  ``REALISTIC``): the plugin restarts (kubelet shows 0 of every GPU resource the node
  advertised), registers again 0.5 s later (the advertised resource at GPUs x replicas, a
  resource no longer advertised stays at 0), and GFD relabels (``nvidia.com/gpu.replicas``,
  ``nvidia.com/gpu.sharing-strategy``, ``nvidia.com/mps.capable``, and the product's
  ``-SHARED`` suffix when the resource is shared and not renamed).  The operator's propagation
  delay stands for the kubelet's ConfigMap refresh, which the real config manager waits for, so
  it is not waited for again here.  Writes are bounded (``concurrency`` in flight), and a node
  costs three small patches, not a task of its own between them;
- the *meter*: which nodes are unavailable, seen from the API side.  A node is unavailable
  while the config its label names is not confirmed on it (GFD's replicas and sharing-strategy
  labels, and kubelet's allocatable of the advertised resource at GPUs x replicas: the
  operator's ``Verified``), from the first watch event that shows the label change to the first
  that shows the confirmation.  Both are read from the same watch stream, so the count follows
  the API server's own order of changes, never the operator's logs.

Until ``realistic()`` is called the responder catches up (no delay, no restart step): it confirms
what the nodes already run, before the measured rollout, since a primed bench cluster has every
node labelled and none confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from gpushare_testing import agents
from gpushare_testing.bodyparts import GPU_RESOURCE, SHARED_GPU_RESOURCE
from gpushare_testing.rawclient import ApiError, RawClient

logger = logging.getLogger(__name__)

NODES_PATH: Final = "/api/v1/nodes"
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"
RESOURCES: Final = (GPU_RESOURCE, SHARED_GPU_RESOURCE)
# The labels GFD derives from the sharing in force (gfd_labels changes these and no other).
SHARING_LABELS: Final = (
    agents.PRODUCT_LABEL,
    agents.REPLICAS_LABEL,
    agents.STRATEGY_LABEL,
    agents.MPS_LABEL,
)
STRATEGIC_MERGE: Final = "application/strategic-merge-patch+json"
# From the label change seen to GFD's relabel: the config manager's label watch and the plugin's
# restart take about a second each, GFD's restart (its own config-manager sidecar) a little
# more.  Uniform, so that a batch of nodes does not answer in lockstep.
REALISTIC: Final = (2.0, 4.0)
REGISTER_AFTER: Final = 0.5  # the plugin's restart to its registration with kubelet


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the agents read and write on a node: a few labels and two resources, not 15 KB."""

    config: str | None  # nvidia.com/device-plugin.config
    gpus: int
    labels: Mapping[str, str]  # the SHARING_LABELS present on the node
    resources: Mapping[str, str | None]  # allocatable of RESOURCES (None: absent)


def view(node: Mapping[str, Any]) -> NodeView:
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        gpus = int(labels.get(GPU_COUNT_LABEL, "0"))
    except ValueError:
        gpus = 0
    return NodeView(
        config=labels.get(agents.CONFIG_LABEL),
        gpus=gpus,
        labels={k: labels[k] for k in SHARING_LABELS if k in labels},
        resources={r: allocatable.get(r) for r in RESOURCES},
    )


# The YAML of a config is parsed once, not on every node event.
_parse = functools.lru_cache(maxsize=256)(agents.parse_device_plugin_config)


def sharing_of(label: str | None, configs: Mapping[str, str]) -> agents.Sharing | None:
    """The sharing the plugin runs for this label; None when it would not run (a missing key,
    a config it refuses): the node is then never confirmed, as on a real cluster."""
    key = agents.resolve_config_key(label, configs.keys())
    if isinstance(key, agents.Missing):
        return None
    if key is None:
        return agents.NO_SHARING
    return _parse(configs[key])


def confirmed(node: NodeView, sharing: agents.Sharing | None) -> bool:
    """Whether the node shows ``sharing`` in force: the operator's Verified, from the labels
    GFD writes for it and kubelet's allocatable of the resource the plugin advertises."""
    if sharing is None:
        return False
    wanted = agents.gfd_labels({}, sharing)
    for label in (agents.REPLICAS_LABEL, agents.STRATEGY_LABEL):
        if node.labels.get(label) != wanted[label]:
            return False
    return node.resources.get(sharing.advertised) == str(node.gpus * sharing.replicas)


def restarted(node: NodeView) -> dict[str, str | None]:
    """The plugin stopped: kubelet shows 0 of every GPU resource it had (and keeps them)."""
    return {r: "0" for r, value in node.resources.items() if value is not None}


def registered(node: NodeView, sharing: agents.Sharing) -> dict[str, str | None]:
    """The plugin registered again with ``sharing``: what kubelet shows then."""
    known = [r for r, value in node.resources.items() if value is not None]
    return agents.plugin_resources(gpus=node.gpus, sharing=sharing, registered=known)


def relabelled(node: NodeView, sharing: agents.Sharing, *, stamp: str) -> dict[str, str | None]:
    """GFD's pass: the sharing labels it changes, and its timestamp."""
    after = agents.gfd_labels(node.labels, sharing)
    changed: dict[str, str | None] = {k: v for k, v in after.items() if node.labels.get(k) != v}
    changed[agents.TIMESTAMP_LABEL] = stamp
    return changed


@dataclass
class Meter:
    """Unavailable nodes over time, from the node watch (see the module docstring)."""

    down: dict[str, float] = field(default_factory=dict)  # node -> monotonic time it went down
    peak: int = 0
    peak_at: float = 0.0
    started: float = field(default_factory=time.monotonic)
    series: list[tuple[float, int]] = field(default_factory=list)  # (s since reset, count)
    # node -> (config label, monotonic time) of its last confirmation seen
    confirmed_at: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)  # each down spell, in seconds

    def reset(self) -> None:
        """From now on: the peak restarts at the present count."""
        self.started = time.monotonic()
        self.peak, self.peak_at = len(self.down), 0.0
        self.series = [(0.0, len(self.down))]
        self.durations = []

    def observe(self, name: str, label: str | None, ok: bool) -> None:
        now = time.monotonic()
        if ok:
            since = self.down.pop(name, None)
            if since is None:
                return
            self.durations.append(now - since)
            self.confirmed_at[name] = (label, now)
        elif name not in self.down:
            self.down[name] = now
        else:
            return
        count = len(self.down)
        self.series.append((round(now - self.started, 2), count))
        if count > self.peak:
            self.peak, self.peak_at = count, now - self.started

    def forget(self, name: str) -> None:
        self.down.pop(name, None)


class Responder:
    """The agents on every node, and the meter, from one node watch; see the module docstring."""

    def __init__(
        self,
        client: RawClient,
        *,
        configmap_path: str,
        concurrency: int = 16,
        seed: int = 20261201,
        log: Callable[[str], None] = logger.info,
    ) -> None:
        self.client = client
        self.configmap_path = configmap_path
        self.gate = asyncio.Semaphore(concurrency)
        self.random = random.Random(seed)
        self.log = log
        self.delay: tuple[float, float] | None = None  # None: catch-up (at once, no restart)
        self.nodes: dict[str, NodeView] = {}
        self.configs: dict[str, str] = {}
        self.meter = Meter()
        # node -> the label a job is confirming (or has confirmed and awaits the echo of)
        self.working: dict[str, str | None] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.writes = 0
        self.failed = 0
        self.synced = asyncio.Event()
        self._config_lock = asyncio.Lock()

    # -- modes and state -------------------------------------------------------------------

    def realistic(self, delay: tuple[float, float] = REALISTIC) -> None:
        self.delay = delay

    def idle(self) -> bool:
        """Nothing to confirm and nothing under way (after a catch-up: every node confirmed)."""
        return self.synced.is_set() and not self.working and not self.meter.down

    async def load_configs(self) -> None:
        async with self._config_lock:
            status, body = await self.client.get(self.configmap_path)
            if status == 200:
                self.configs = dict((body or {}).get("data") or {})

    async def sharing(self, label: str | None) -> agents.Sharing | None:
        found = sharing_of(label, self.configs)
        if found is None and label and label not in self.configs:
            await self.load_configs()  # a new key: the operator wrote it before the label
            found = sharing_of(label, self.configs)
        return found

    # -- the watch -------------------------------------------------------------------------

    async def run(self) -> None:
        """List then watch nodes forever (re-listing on expiry); answer and meter each."""
        await self.load_configs()
        while True:
            try:
                version = await self._list()
                self.synced.set()
                while True:
                    params = {"resourceVersion": version, "allowWatchBookmarks": "true"}
                    watch = self.client.watch(NODES_PATH, params=params)
                    async with contextlib.aclosing(watch) as events:
                        async for event in events:
                            obj = event.get("object") or {}
                            if event.get("type") == "ERROR":
                                raise ApiError(method="WATCH", path="", status=410, body=obj)
                            version = obj.get("metadata", {}).get("resourceVersion", version)
                            if event.get("type") in ("ADDED", "MODIFIED"):
                                self.observe(obj)
                            elif event.get("type") == "DELETED":
                                name = str(obj.get("metadata", {}).get("name"))
                                self.nodes.pop(name, None)
                                self.meter.forget(name)
            except asyncio.CancelledError:
                for task in list(self.tasks):
                    task.cancel()
                raise
            except Exception as exc:  # expired or dropped: list again
                self.log(f"  [gfd] node watch: {exc!r}; listing again")
                await asyncio.sleep(0.2)

    async def _list(self) -> str:
        params = {"limit": "500"}
        while True:
            status, page = await self.client.get(NODES_PATH, params=params)
            if status != 200:
                raise ApiError(method="LIST", path=NODES_PATH, status=status, body=page)
            for item in page["items"]:
                self.observe(item)
            token = page["metadata"].get("continue")
            if not token:
                return str(page["metadata"]["resourceVersion"])
            params = {"limit": "500", "continue": token}

    def observe(self, obj: Mapping[str, Any]) -> None:
        name = str(obj.get("metadata", {}).get("name"))
        node = view(obj)
        self.nodes[name] = node
        ok = confirmed(node, sharing_of(node.config, self.configs))
        self.meter.observe(name, node.config, ok)
        if ok:
            self.working.pop(name, None)
            return
        if name in self.working and self.working[name] == node.config:
            return  # under way, or done and this event is older than its writes
        self._start(name, node)

    def _start(self, name: str, node: NodeView) -> None:
        self.working[name] = node.config
        task = asyncio.create_task(self._confirm(name, node.config, seen=time.monotonic()))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- the agents ------------------------------------------------------------------------

    async def _confirm(self, name: str, label: str | None, *, seen: float) -> None:
        delay = self.delay
        if delay is not None:
            first = self.random.uniform(*delay) - REGISTER_AFTER
            await asyncio.sleep(max(0.0, seen + first - time.monotonic()))
        sharing = await self.sharing(label)
        if sharing is None or self._moved(name, label):
            self._release(name, label)  # the plugin would not run it, or the label moved on
            return
        done = True
        if delay is not None:
            done = await self._status(name, restarted(self.nodes[name]))
            if done:
                await asyncio.sleep(REGISTER_AFTER)
        done = done and not self._moved(name, label)
        done = done and await self._status(name, registered(self.nodes[name], sharing))
        stamp = str(int(time.time()))
        done = done and await self._labels(name, relabelled(self.nodes[name], sharing, stamp=stamp))
        if not done:
            self._release(name, label)
            await asyncio.sleep(1.0)
            node = self.nodes.get(name)
            if node is not None and name not in self.working:
                ok = confirmed(node, await self.sharing(node.config))
                if not ok:
                    self._start(name, node)  # a failed write, or a label that moved on
        # Otherwise ``working`` keeps the label until the watch shows the node confirmed: an
        # older event of this node (from before these writes) must not start the job again.

    def _moved(self, name: str, label: str | None) -> bool:
        node = self.nodes.get(name)
        return node is None or node.config != label

    def _release(self, name: str, label: str | None) -> None:
        if self.working.get(name) == label:
            del self.working[name]

    async def _status(self, name: str, resources: Mapping[str, str | None]) -> bool:
        body = {"status": {"capacity": dict(resources), "allocatable": dict(resources)}}
        return await self._patch(
            f"{NODES_PATH}/{name}/status", body, STRATEGIC_MERGE, manager="kubelet"
        )

    async def _labels(self, name: str, labels: Mapping[str, str | None]) -> bool:
        body = {"metadata": {"labels": dict(labels)}}
        return await self._patch(
            f"{NODES_PATH}/{name}", body, "application/merge-patch+json", manager="gfd"
        )

    async def _patch(self, path: str, body: Any, content_type: str, *, manager: str) -> bool:
        for attempt in range(10):
            async with self.gate:
                try:
                    status, answer = await self.client.patch(
                        path, body, content_type=content_type, params={"fieldManager": manager}
                    )
                except (aiohttp.ClientError, TimeoutError):
                    status, answer = 0, None
            if status == 200:
                self.writes += 1
                return True
            if status not in (0, 409, 429, 500, 503, 504):
                break
            await asyncio.sleep(0.2 * (attempt + 1))
        self.failed += 1
        self.log(f"  [gfd] PATCH {path} failed: {status} {str(answer)[:200]}")
        return False

"""Kubelet's part in running pods, on the simulator's nodes: admit, then start or reject.

Follows the pods bound to a node (list + watch, all namespaces).  Each pod of one of the
simulator's nodes that is still ``Pending`` is admitted once, in the order seen, against what
the node offers at that moment (``podadmission.admit``: the device plugin's healthy devices and
the Node's allocatable); its status then becomes ``Running`` or, when rejected, ``Failed``, in
one write to ``pods/status`` as field manager ``kubelet``.  A pod found already running is
counted as admitted and costs no write; finished pods leave the watch (its field selector) and
free what they held.  ``GpuClusterSimulator`` wires it to its nodes (``run_pods``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp

from gpushare_testing.bodyparts import rfc3339
from gpushare_testing.nodeagents import NodeAgents
from gpushare_testing.podadmission import (
    Admitted,
    NodeResources,
    Rejection,
    admit,
    pod_requests,
    rejected_status,
    running_status,
)
from gpushare_testing.rawclient import ApiError, JsonObject, RawClient

__all__ = ["KubeletView", "PodAgent", "kubelet_view"]

logger = logging.getLogger(__name__)

# Bound and not finished: a pod that finishes (or is rejected) leaves the watch with a DELETED.
_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
_PODS = "/api/v1/pods"

# What kubelet knows of its node: what it admits against, and the Node (for the pod's IPs).
KubeletView = Callable[[str], tuple[NodeResources, JsonObject] | None]


def kubelet_view(
    agents: NodeAgents | None, node: JsonObject | None
) -> tuple[NodeResources, JsonObject] | None:
    """What kubelet admits against on a simulated node: the Node's allocatable, and the
    devices the plugin serves (``NodeAgents``, which kubelet's device manager knows at once)."""
    if agents is None or node is None:
        return None
    allocatable = node.get("status", {}).get("allocatable") or {}
    plugin = agents.status()["allocatable"]
    resources = NodeResources.of(
        allocatable=allocatable, plugin=plugin, registered=agents.registered
    )
    return resources, node


def _key(pod: JsonObject) -> tuple[str, str, str]:
    metadata = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName") or ""
    return str(metadata.get("uid", "")), str(node), (pod.get("status") or {}).get("phase") or ""


class PodAgent:
    """Plays kubelet's pod admission and start for the nodes ``view`` knows."""

    def __init__(self, client: RawClient, *, view: KubeletView) -> None:
        self.client = client
        self._view = view
        self._decided: dict[str, tuple[str, Admitted | Rejection]] = {}  # uid -> node, outcome
        self._admitted: dict[str, dict[str, Admitted]] = {}  # node -> uid -> what it holds
        self._unknown: dict[str, dict[str, JsonObject]] = {}  # pending pods of nodes not ours
        self._to_write: dict[str, JsonObject] = {}  # uid -> the latest body still Pending
        self._writing = False
        self._wake = asyncio.Event()
        self.listed = asyncio.Event()
        self.rejections: dict[str, Rejection] = {}  # "namespace/name" -> why, for tests to read

    # -- what the simulator calls ------------------------------------------------------------

    def node_added(self, name: str) -> None:
        """A node became ours: admit the pods that were bound to it before."""
        for pod in self._unknown.pop(name, {}).values():
            self._see(pod)

    @property
    def idle(self) -> bool:
        """Every pod seen has its status written (or is on its way to us through the watch)."""
        return self.listed.is_set() and not self._to_write and not self._writing

    def start(self) -> list[asyncio.Task[None]]:
        """The agent's two tasks (the watch, the status writer); the caller cancels them."""
        return [
            asyncio.create_task(self.watch(), name="gpu-sim-pods"),
            asyncio.create_task(self.write(), name="gpu-sim-kubelet"),
        ]

    async def watch(self) -> None:
        version = await self._list()
        while True:
            try:
                version = await self._follow(version)
            except (aiohttp.ClientError, TimeoutError, ValueError, ApiError) as exc:
                logger.warning("pod watch failed: %s; retrying", exc)
                await asyncio.sleep(0.5)

    async def write(self) -> None:
        """Write the statuses due, one at a time, for as long as the simulator runs."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._to_write:
                uid, pod = next(iter(self._to_write.items()))
                del self._to_write[uid]
                self._writing = True
                try:
                    await self._write(uid, pod)
                except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
                    logger.warning("simulated kubelet failed to write a pod status: %s", exc)
                    self._to_write.setdefault(uid, pod)
                    await asyncio.sleep(0.5)
                finally:
                    self._writing = False

    # -- following the pods ------------------------------------------------------------------

    async def _list(self) -> str:
        params, seen = {"limit": "500", "fieldSelector": _SELECTOR}, set()
        while True:
            status, page = await self.client.get(_PODS, params=params)
            if status != 200:
                raise ApiError(method="LIST", path=_PODS, status=status, body=page)
            for pod in page["items"]:
                seen.add(_key(pod)[0])
                self._see(pod)
            if not page["metadata"].get("continue"):
                break
            params = {**params, "continue": page["metadata"]["continue"]}
        for uid in set(self._decided) - seen:  # gone while we were not watching
            self._forget(uid)
        self.listed.set()
        return str(page["metadata"]["resourceVersion"])

    async def _follow(self, version: str) -> str:
        params = {"resourceVersion": version, "allowWatchBookmarks": "true"}
        params["fieldSelector"] = _SELECTOR
        async with contextlib.aclosing(self.client.watch(_PODS, params=params)) as events:
            async for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":  # 410 Gone: our resourceVersion was compacted away
                    logger.info("pod watch expired (%s); listing again", obj.get("message"))
                    return await self._list()
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind == "DELETED":
                    self._forget(_key(obj)[0])
                elif kind in ("ADDED", "MODIFIED"):
                    self._see(obj)
        return version

    # -- deciding ----------------------------------------------------------------------------

    def _see(self, pod: JsonObject) -> None:
        uid, node, phase = _key(pod)
        if phase in ("Succeeded", "Failed"):  # our own write's answer, after the watch's DELETED
            self._forget(uid)
            return
        view = self._view(node)
        if view is None:
            if phase in ("", "Pending"):
                self._unknown.setdefault(node, {})[uid] = pod
            return
        if uid not in self._decided:
            self._decide(uid, node, pod, view[0], started=phase not in ("", "Pending"))
        if phase in ("", "Pending"):
            self._to_write[uid] = pod
            self._wake.set()
        else:
            self._to_write.pop(uid, None)

    def _decide(
        self, uid: str, node: str, pod: JsonObject, resources: NodeResources, *, started: bool
    ) -> None:
        requests = pod_requests(pod.get("spec") or {})
        held = self._admitted.setdefault(node, {})
        if started:  # running already (an earlier kubelet, a test): it holds what it asked for
            devices = {n: v for n, v in requests.items() if n in resources.devices}
            outcome: Admitted | Rejection = Admitted(requests=requests, devices=devices)
        else:
            outcome = admit(requests=requests, node=resources, others=held.values())
        self._decided[uid] = (node, outcome)
        if isinstance(outcome, Admitted):
            held[uid] = outcome
            return
        metadata = pod.get("metadata") or {}
        name = f"{metadata.get('namespace')}/{metadata.get('name')}"
        self.rejections[name] = outcome
        logger.info("simulated kubelet on %s rejected %s: %s", node, name, outcome.message)

    def _forget(self, uid: str) -> None:
        decided = self._decided.pop(uid, None)
        if decided is not None:
            self._admitted.get(decided[0], {}).pop(uid, None)
        self._to_write.pop(uid, None)
        for pods in self._unknown.values():
            pods.pop(uid, None)

    async def _write(self, uid: str, pod: JsonObject) -> None:
        """One status write, conditional on the version decided on: a newer one comes through
        the watch (and is written then, if still Pending)."""
        decided, (_, node, _) = self._decided.get(uid), _key(pod)
        view = self._view(node)
        if decided is None or view is None:
            return
        outcome = decided[1]
        if isinstance(outcome, Rejection):
            status = rejected_status(outcome)
        else:
            status = running_status(pod=pod, node=view[1], now=rfc3339(datetime.now(UTC)))
        metadata = pod["metadata"]
        path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/status"
        body = {"metadata": {"resourceVersion": metadata["resourceVersion"]}, "status": status}
        code, written = await self.client.patch(path, body, params={"fieldManager": "kubelet"})
        if code in (404, 409):
            return
        if code != 200:
            raise ApiError(method="PATCH", path=path, status=code, body=written)
        self._see(written)

"""Kubelet's part in running pods, on the simulator's nodes: admit, start or reject, and stop.

Follows the pods bound to a node (list + watch, all namespaces).  Each pod of one of the
simulator's nodes that is still ``Pending`` is admitted once, in the order seen, against what
the node offers at that moment (``podadmission.admit``: the device plugin's healthy devices and
the Node's allocatable); its status then becomes ``Running`` or, when rejected, ``Failed``, in
one write to ``pods/status`` as field manager ``kubelet``.  A pod found already running is
counted as admitted and costs no write; finished pods leave the watch (its field selector) and
free what they held.

An admitted pod that gets a ``deletionTimestamp`` (a graceful delete, an eviction) is stopped
as kubelet does (``podtermination``): after its whole grace period (at least 2 s) its terminal
status (``Failed``, containers killed) is written, then it is deleted with grace period 0 and
its uid as precondition.  It holds its devices until its containers have stopped, even if
someone force-deletes it meanwhile (they would still be stopping).  A pod deleted before it
started is not started.  Every write goes with kubelet's user agent (``KUBELET_USER_AGENT``),
so the audit log tells them from the test's own.  ``GpuClusterSimulator`` wires it to its
nodes (``run_pods``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
import orjson

from gpushare_testing import draplugin
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
from gpushare_testing.podtermination import final_delete, stop_seconds, terminated_status
from gpushare_testing.rawclient import MERGE_PATCH, ApiError, JsonObject, RawClient

__all__ = ["KUBELET_USER_AGENT", "KubeletView", "PodAgent", "kubelet_view"]

# As a kubelet of the control plane's version says who it is (rest.DefaultKubernetesUserAgent).
KUBELET_USER_AGENT: Final = "kubelet/v1.37.2 (linux/amd64) kubernetes/simulated"

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
        self._stopping: dict[str, tuple[float, JsonObject]] = {}  # uid -> when, latest body
        self._stop_wake = asyncio.Event()
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

    @property
    def stopping(self) -> frozenset[str]:
        """The uids of the pods being stopped: deleted, their grace period not over, or their
        last writes not yet made."""
        return frozenset(self._stopping)

    def start(self) -> list[asyncio.Task[None]]:
        """The agent's tasks (the watch, the status writer, the stopper); the caller cancels
        them."""
        return [
            asyncio.create_task(self.watch(), name="gpu-sim-pods"),
            asyncio.create_task(self.write(), name="gpu-sim-kubelet"),
            asyncio.create_task(self.stop(), name="gpu-sim-kubelet-stop"),
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

    async def stop(self) -> None:
        """Stop each deleted pod once its grace period is over, for as long as the simulator
        runs."""
        loop = asyncio.get_running_loop()
        while True:
            self._stop_wake.clear()
            for uid in [u for u, (at, _) in self._stopping.items() if at <= loop.time()]:
                try:
                    await self._stop(uid)
                except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
                    logger.warning("simulated kubelet failed to stop a pod: %s", exc)
                    self._stopping[uid] = (loop.time() + 0.5, self._stopping[uid][1])
            due = min((at for at, _ in self._stopping.values()), default=None)
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation
            # that comes as the event is set, and the simulator's exit would wait for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(due):
                    await self._stop_wake.wait()

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
        if uid in self._stopping:  # ours until it is gone, whatever the watch says
            self._stop_later(uid, pod)
            return
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
        if stop_seconds(pod) is not None and isinstance(self._decided[uid][1], Admitted):
            self._to_write.pop(uid, None)  # deleted before it started: it never will
            self._stop_later(uid, pod)
            return
        if phase in ("", "Pending"):
            self._to_write[uid] = pod
            self._wake.set()
        else:
            self._to_write.pop(uid, None)

    def _decide(
        self, uid: str, node: str, pod: JsonObject, resources: NodeResources, *, started: bool
    ) -> None:
        requests = pod_requests(pod.get("spec") or {})
        # What DRA serves through the pod's extended-resource claim is not kubelet's to fit.
        for resource in draplugin.served_by_claims(pod):
            requests.pop(resource, None)
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

    def _stop_later(self, uid: str, pod: JsonObject) -> None:
        """Keep the pod's latest body; the stop is due after its grace period, counted from
        when it was first seen deleted (a shorter one given later brings it forward)."""
        now, grace = asyncio.get_running_loop().time(), stop_seconds(pod)
        at = self._stopping.get(uid, (float("inf"), pod))[0]
        if grace is not None and now + grace < at:
            at = now + grace
            self._stop_wake.set()
        self._stopping[uid] = (at, pod)

    def _forget(self, uid: str) -> None:
        if uid in self._stopping:  # gone from the watch; its containers are still stopping
            return
        self._release(uid)

    def _release(self, uid: str) -> None:
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
        code, written = await self._patch_status(path, body)
        if code in (404, 409):
            return
        if code != 200:
            raise ApiError(method="PATCH", path=path, status=code, body=written)
        self._see(written)

    async def _stop(self, uid: str) -> None:
        """The containers are stopped: the devices are free (kubelet's device manager counts
        only active pods), then the terminal status is written and the pod deleted.

        Freed before the status write, not after the delete: once the pod shows ``Failed``
        kube-scheduler no longer counts it either, and may bind a replacement to its GPU at
        once, before the delete.
        """
        self._release(uid)
        pod = self._stopping[uid][1]
        metadata = pod["metadata"]
        path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}"
        final = await self._write_terminal(uid, pod, path)
        if final is not None:
            code, answer = await self._send("DELETE", path, final_delete(final))
            if code not in (200, 404, 409):  # 409: the uid precondition failed: not ours
                raise ApiError(method="DELETE", path=path, status=code, body=answer)
        del self._stopping[uid]

    async def _write_terminal(self, uid: str, pod: JsonObject, path: str) -> JsonObject | None:
        """Write the pod's terminal status; ``None`` if the pod is gone.

        A write refused for an older resourceVersion (an eviction's condition came in between)
        is made again on the pod as it is now; a pod terminal already keeps its phase.
        """
        for _ in range(5):
            if _key(pod)[2] in ("Succeeded", "Failed"):
                return pod  # a test wrote it: kubelet keeps a terminal phase
            status = terminated_status(pod=pod, now=rfc3339(datetime.now(UTC)))
            body = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]}}
            code, written = await self._patch_status(f"{path}/status", body | {"status": status})
            if code == 200:
                return dict(written)
            if code == 404:
                return None
            if code != 409:
                raise ApiError(method="PATCH", path=f"{path}/status", status=code, body=written)
            code, written = await self.client.get(path)
            if code == 404 or (code == 200 and written["metadata"].get("uid") != uid):
                return None  # gone, or another pod of the same name
            if code != 200:
                raise ApiError(method="GET", path=path, status=code, body=written)
            pod = written
        raise ApiError(method="PATCH", path=f"{path}/status", status=409, body="conflicts")

    async def _patch_status(self, path: str, body: JsonObject) -> tuple[int, Any]:
        params = {"fieldManager": "kubelet"}
        return await self._send("PATCH", path, body, params=params, content_type=MERGE_PATCH)

    async def _send(
        self,
        method: str,
        path: str,
        body: JsonObject,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One request with kubelet's user agent (``RawClient`` sends its own)."""
        headers = {"Content-Type": content_type, "User-Agent": KUBELET_USER_AGENT}
        async with self.client.session.request(
            method,
            self.client.server + path,
            params=params,
            data=orjson.dumps(body),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response:
            raw = await response.read()
        return response.status, orjson.loads(raw) if raw else None

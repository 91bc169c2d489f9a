"""The kopf-native variant: gpushare's core logic, with Nodes and Pods delivered by kopf.

This is how a kopf operator is usually written: ``@kopf.on.event`` handlers for every kind it
reads, kopf's default settings (its per-event body handling, per-object memories, logging and
posting included), and the business logic called from the handlers.  The logic is ours,
unchanged (``ClusterCache``, ``Reconciler``, ``WriteLoop`` with its token bucket), so the same
write rules hold and the benchmark measures only how events reach it: kopf's pipeline vs
gpushare's informer.

Run: ``KUBECONFIG=... python -m benchmarks.scale.kopfnative --http-port 8081``.  ``/stats``
answers JSON (cached objects, dirty-queue depth, writes, whether its caches are synced).

"Synced" needs a definition kopf does not have: it delivers the initial listing as events with
no end marker.  At startup this program lists each kind once with ``limit=1`` to learn how many
objects exist (``remainingItemCount``), and calls its caches synced when it has seen that many
distinct ones.  Only then does the writer start: like ours, it never writes from a partial
picture.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from typing import Any

import kopf
from aiohttp import web

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api import flagvalues, models
from gpushare_operator.core.records import pods as core_pods
from gpushare_operator.kube import http
from gpushare_operator.kube.connection import ApiHandle, open_handle
from gpushare_operator.kube.events import EventRecorder
from gpushare_operator.kube.ratelimit import TokenBucket
from gpushare_operator.kube.writeloop import ConfigMapRef, WriteLoop
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.gates import AlwaysLeader

logger = logging.getLogger("kopfnative")

CONFIGMAP = "gpushare-device-plugin-configs"
COUNTED = {
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/pods",
    "GPUNodeState": f"/apis/{models.GROUP}/{models.VERSION}/{models.NODE_STATE_PLURAL}",
    "GPUSharingPolicy": f"/apis/{models.GROUP}/{models.VERSION}/{models.POLICY_PLURAL}",
}


class KopfNative:
    """The state, planner and writer of ours, fed from kopf handlers."""

    def __init__(self, *, handle: ApiHandle, args: argparse.Namespace) -> None:
        self.handle = handle
        self.namespace = args.device_plugin_namespace
        self.cache = ClusterCache()
        self.reconciler = Reconciler(
            self.cache,
            timings=Timings(
                propagation_delay=args.config_propagation_delay,
                key_grace_period=args.config_key_grace_period,
                mismatch_timeout=args.mismatch_timeout,
            ),
            max_unavailable=args.max_unavailable,
        )
        gate = AlwaysLeader()
        self.writer = WriteLoop(
            api=handle.api,
            cache=self.cache,
            reconciler=self.reconciler,
            gate=gate,
            bucket=TokenBucket(qps=args.write_qps, burst=args.write_burst),
            recorder=EventRecorder(api=handle.api, allowed=gate.is_leader),
            config=ConfigMapRef(namespace=self.namespace, name=CONFIGMAP),
        )
        self.http_port: int = args.http_port
        self.expected: dict[str, int] = {}
        self.seen: dict[str, set[str]] | None = {kind: set() for kind in COUNTED}
        self.configmap_exists = False
        self.configmap_seen = False
        self.synced = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self._http: web.AppRunner | None = None

    # -- startup ---------------------------------------------------------------------------

    async def count_existing(self) -> None:
        for kind, path in COUNTED.items():
            page = await http.request(
                self.handle.api, method="GET", path=path, query=[("limit", "1")]
            )
            remaining = int(page["metadata"].get("remainingItemCount") or 0)
            self.expected[kind] = len(page["items"]) + remaining
        try:
            await http.request(
                self.handle.api,
                method="GET",
                path=f"/api/v1/namespaces/{self.namespace}/configmaps/{CONFIGMAP}",
            )
            self.configmap_exists = True
        except http.ApiError as exc:
            if exc.status != 404:
                raise

    def saw(self, kind: str, key: str) -> None:
        if self.seen is None:
            return
        self.seen[kind].add(key)
        self.check_synced()

    def check_synced(self) -> None:
        if self.seen is None or not self.expected:
            return
        if self.configmap_exists and not self.configmap_seen:
            return
        if all(len(self.seen[kind]) >= count for kind, count in self.expected.items()):
            self.seen = None  # free the names: only needed until the first sync
            if not self.configmap_exists:
                self.cache.set_config_data(None, initial=True)
            self.synced.set()

    async def start(self) -> None:
        await self.count_existing()
        self.check_synced()
        app = web.Application()
        app.router.add_get("/stats", self.stats)
        self._http = web.AppRunner(app)
        await self._http.setup()
        await web.TCPSite(self._http, "127.0.0.1", self.http_port).start()
        self.tasks.append(asyncio.create_task(self.write_when_synced()))

    async def write_when_synced(self) -> None:
        await self.synced.wait()
        logger.info("caches synced: %d GPU nodes", len(self.cache.nodes))
        await self.writer.run()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._http is not None:
            await self._http.cleanup()

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "synced": self.synced.is_set(),
                "nodes": len(self.cache.nodes),
                "pods": len(self.cache.usage.pods),
                "dirty": self.writer.backlog,
                "writes": sum(self.writer.counters.ok.values()),
                "failed_writes": sum(self.writer.counters.failed.values()),
            }
        )


def build_registry(native: KopfNative) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    cache = native.cache

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(**native.handle.credentials())

    @kopf.on.startup(registry=registry)
    async def startup(**_: Any) -> None:
        await native.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await native.stop()

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(event: kopf.RawEvent, **_: Any) -> None:
        obj: dict[str, Any] = dict(event.get("object") or {})
        name = str(obj.get("metadata", {}).get("name"))
        if event.get("type") == "DELETED":
            cache.delete_node(name)
        else:
            cache.upsert_node(obj)
            native.saw("Node", name)

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        obj: dict[str, Any] = dict(event.get("object") or {})
        uid = core_pods.uid_of(obj)
        phase = (obj.get("status") or {}).get("phase")
        if event.get("type") == "DELETED" or phase in ("Succeeded", "Failed"):
            cache.delete_pod(uid)
        else:
            cache.upsert_pod(obj)
        native.saw("Pod", uid)

    @kopf.on.event(models.GROUP, models.VERSION, models.NODE_STATE_PLURAL, registry=registry)
    async def node_state_event(event: kopf.RawEvent, **_: Any) -> None:
        obj: dict[str, Any] = dict(event.get("object") or {})
        name = str(obj.get("metadata", {}).get("name"))
        if event.get("type") == "DELETED":
            cache.delete_node_state(name)
        else:
            cache.upsert_node_state(obj)
            native.saw("GPUNodeState", name)

    @kopf.on.event(models.GROUP, models.VERSION, models.POLICY_PLURAL, registry=registry)
    async def policy_event(event: kopf.RawEvent, **_: Any) -> None:
        obj: dict[str, Any] = dict(event.get("object") or {})
        name = str(obj.get("metadata", {}).get("name"))
        if event.get("type") == "DELETED":
            cache.delete_policy(name)
        else:
            cache.upsert_policy(obj)
            native.saw("GPUSharingPolicy", name)

    @kopf.on.event("", "v1", "configmaps", registry=registry)
    async def configmap_event(event: kopf.RawEvent, **_: Any) -> None:
        obj: dict[str, Any] = dict(event.get("object") or {})
        metadata = obj.get("metadata") or {}
        if (metadata.get("namespace"), metadata.get("name")) != (native.namespace, CONFIGMAP):
            return
        deleted = event.get("type") == "DELETED"
        first = not native.synced.is_set()
        cache.set_config_data(None if deleted else dict(obj.get("data") or {}), initial=first)
        native.configmap_seen = True
        native.check_synced()

    return registry


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale.kopfnative")
    parser.add_argument("--device-plugin-namespace", default="gpu-operator")
    parser.add_argument("--write-qps", type=float, default=20.0)
    parser.add_argument("--write-burst", type=int, default=50)
    parser.add_argument("--config-propagation-delay", type=float, default=75.0)
    parser.add_argument("--config-key-grace-period", type=float, default=300.0)
    parser.add_argument("--mismatch-timeout", type=float, default=300.0)
    parser.add_argument(
        "--max-unavailable",
        type=flagvalues.max_unavailable,
        default="10%",
        help="the cluster-wide rollout budget, as ours (the bench runs both at 100%%: unpaced)",
    )
    parser.add_argument("--http-port", type=int, default=8081)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with await open_handle() as handle:
        native = KopfNative(handle=handle, args=args)
        # kopf's defaults throughout; standalone only because there is no peering CRD here.
        await kopf.operator(
            registry=build_registry(native),
            settings=kopf.OperatorSettings(),
            standalone=True,
            clusterwide=True,
            stop_flag=stop,
        )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

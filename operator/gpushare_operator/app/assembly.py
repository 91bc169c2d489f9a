"""The operator's parts, built once and started/stopped by kopf's startup/cleanup handlers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from gpushare_operator.app.settings import Settings
from gpushare_operator.cache.planner import Planner, Timings
from gpushare_operator.cache.sinks import ConfigMapSink, NodeSink, NodeStateSink, PodSink
from gpushare_operator.cache.state import ClusterState
from gpushare_operator.core import models
from gpushare_operator.kube import listing
from gpushare_operator.kube.connection import ApiHandle
from gpushare_operator.kube.events import EventRecorder
from gpushare_operator.kube.informer import Informer, Target
from gpushare_operator.kube.leadership import AlwaysLeader, LeaderGate
from gpushare_operator.kube.ratelimit import TokenBucket
from gpushare_operator.kube.writer import ConfigTarget, Writer

logger = logging.getLogger(__name__)

POLICIES_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.POLICY_PLURAL}"
NODE_STATES_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.NODE_STATE_PLURAL}"
# Finished pods hold no slots; with this server-side selector, a pod that finishes arrives as
# DELETED, and the 50,000 pods of a big cluster's history are never listed at all.
PODS = Target(
    path="/api/v1/pods",
    kind="Pod",
    field_selector="status.phase!=Succeeded,status.phase!=Failed",
)


@dataclass
class Assembly:
    settings: Settings
    handle: ApiHandle
    gate: LeaderGate = field(default_factory=AlwaysLeader)
    state: ClusterState = field(default_factory=ClusterState)
    informers: list[Informer] = field(default_factory=list)
    writer: Writer | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.settings
        api = self.handle.api
        self.planner = Planner(
            self.state,
            timings=Timings(
                propagation_delay=s.config_propagation_delay,
                key_grace_period=s.config_key_grace_period,
                mismatch_timeout=s.mismatch_timeout,
            ),
        )
        configmap = Target(
            path=f"/api/v1/namespaces/{s.device_plugin_namespace}/configmaps",
            kind="ConfigMap",
            field_selector=f"metadata.name={s.device_plugin_configmap}",
        )
        self.informers = [
            Informer(
                api=api, target=Target(path="/api/v1/nodes", kind="Node"), sink=NodeSink(self.state)
            ),
            Informer(
                api=api,
                target=Target(path=NODE_STATES_PATH, kind="GPUNodeState"),
                sink=NodeStateSink(self.state),
            ),
            Informer(api=api, target=configmap, sink=ConfigMapSink(self.state)),
            Informer(api=api, target=PODS, sink=PodSink(self.state)),
        ]
        self.state.on_new_resource = self.informers[-1].request_relist
        self.writer = Writer(
            api=api,
            state=self.state,
            planner=self.planner,
            gate=self.gate,
            bucket=TokenBucket(qps=s.write_qps, burst=s.write_burst),
            recorder=EventRecorder(api=api),
            config=ConfigTarget(
                namespace=s.device_plugin_namespace, name=s.device_plugin_configmap
            ),
        )

    def connection_info(self) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(**self.handle.credentials())

    @property
    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers)

    async def start(self) -> None:
        self._spawn(self._run(), name="gpushare")

    async def _run(self) -> None:
        # Policies first: they say which resources to keep pods for, before the first pod list.
        await self._prime_policies()
        for informer in self.informers:
            self._spawn(informer.run(), name=f"informer-{informer.kind}")
        await self._write_when_synced()

    async def _prime_policies(self) -> None:
        backoff = 0.5
        while True:
            try:
                items = await listing.list_all(self.handle.api, path=POLICIES_PATH)
            except Exception as exc:  # any failure: log, back off, retry
                logger.warning("cannot list policies (%s); retrying in %.0f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            for item in items:
                self.state.upsert_policy(item)
            return

    def _spawn(self, coro: Any, *, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def _write_when_synced(self) -> None:
        """Never write from a partial picture: a missing policy would look like a release."""
        await asyncio.gather(*(informer.synced.wait() for informer in self.informers))
        logger.info(
            "caches synced: %d GPU nodes, %d policies, %d node states, %d GPU pods",
            len(self.state.nodes),
            len(self.state.policies),
            len(self.state.node_states),
            len(self.state.usage.pods),
        )
        assert self.writer is not None
        await self.writer.run()

    async def stop(self) -> None:
        for task in reversed(self._tasks):
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

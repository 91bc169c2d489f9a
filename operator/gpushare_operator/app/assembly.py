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
from gpushare_operator.cache.state import ClusterState, ConfigMapSink, NodeSink, NodeStateSink
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
        ]
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
        for informer in self.informers:
            self._spawn(informer.run(), name=f"informer-{informer.kind}")
        self._spawn(self._write_when_synced(), name="writer")

    def _spawn(self, coro: Any, *, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def _write_when_synced(self) -> None:
        """Never write from a partial picture: a missing policy would look like a release."""
        for item in await listing.list_all(self.handle.api, path=POLICIES_PATH):
            self.state.upsert_policy(item)
        await asyncio.gather(*(informer.synced.wait() for informer in self.informers))
        logger.info(
            "caches synced: %d GPU nodes, %d policies, %d node states",
            len(self.state.nodes),
            len(self.state.policies),
            len(self.state.node_states),
        )
        assert self.writer is not None
        await self.writer.run()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

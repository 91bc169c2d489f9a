"""The operator's parts, built once and started/stopped by kopf's startup/cleanup handlers."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

import kopf
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.gc_collector import GCCollector

from gpushare_operator.app import heap, metrics, serving
from gpushare_operator.app.looplag import LoopLagMonitor
from gpushare_operator.app.settings import Settings
from gpushare_operator.app.webhook import Webhook
from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import (
    BudgetSink,
    ClaimSink,
    ConfigMapSink,
    DeviceClassSink,
    NodeSink,
    NodeStateSink,
    PodSink,
    SliceSink,
)
from gpushare_operator.core.api import models
from gpushare_operator.core.records.nodes import carries_mig_config
from gpushare_operator.core.rollout.rollouts import Counts
from gpushare_operator.core.slots.slotclasses import Offer
from gpushare_operator.kube import access, connection, reading
from gpushare_operator.kube.connection import ApiHandle
from gpushare_operator.kube.election import LeaseElector, LeaseTimings
from gpushare_operator.kube.events import EventRecorder, ObjectRef
from gpushare_operator.kube.informer import Informer
from gpushare_operator.kube.ratelimit import TokenBucket
from gpushare_operator.kube.writeloop import ConfigMapRef, WriteLoop
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler

log = structlog.get_logger(__name__)

LEASE_NAME = "gpushare-operator"
POLICIES_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.POLICY_PLURAL}"
POLICIES = reading.Collection(path=POLICIES_PATH, kind=models.POLICY_KIND, page_size=500)
NODE_STATES_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.NODE_STATE_PLURAL}"
# Finished pods hold no slots; with this server-side selector, a pod that finishes arrives as
# DELETED, and the 50,000 pods of a big cluster's history are never listed at all.
# Events of what the operator only reads are taken in batches: fewer, bigger reads halve the
# CPU of a storm of heartbeats, for at most this much latency (docs/reading.md).
READ_ONLY_BATCH_WINDOW = 0.25
PODS = reading.Collection(
    path="/api/v1/pods",
    kind="Pod",
    field_selector="status.phase!=Succeeded,status.phase!=Failed",
    page_size=250,  # ~8 KB a pod: about the 2 MB of a page of 100 Nodes, in fewer round trips
    batch_window=READ_ONLY_BATCH_WINDOW,
)
# What podPolicy Evict's choice of victims reads (core.rollout.budgets), as kube-scheduler's does.
# A
# 403 (a ClusterRole from before the chart granted it) counts as no budget: the Eviction API
# still keeps every budget, and the list is retried until allowed.
BUDGETS = reading.Collection(
    path="/apis/policy/v1/poddisruptionbudgets",
    kind="PodDisruptionBudget",
    forbidden_is_empty=True,
)
# Backend DRA: NVIDIA's kubelet plugin's ResourceSlices (a node's devices) and DeviceClasses
# (ours, and any other serving the same extended resource).  On a cluster without
# resource.k8s.io/v1 (before 1.34) or a ClusterRole from before the chart granted them, both
# list as empty (kube/informer.py) and are retried; DRA policies' nodes then wait.
SLICES = reading.Collection(
    path="/apis/resource.k8s.io/v1/resourceslices",
    kind="ResourceSlice",
    batch_window=READ_ONLY_BATCH_WINDOW,
    forbidden_is_empty=True,
)
# The claims holding those devices: a DRA node's allocated slots are counted from them (a pod
# may ask through a ResourceClaimTemplate, naming no resource).  Batched like pods: a claim
# changes as often as the pod it serves.
CLAIMS = reading.Collection(
    path="/apis/resource.k8s.io/v1/resourceclaims",
    kind="ResourceClaim",
    batch_window=READ_ONLY_BATCH_WINDOW,
    forbidden_is_empty=True,
)
DEVICE_CLASSES = reading.Collection(
    path="/apis/resource.k8s.io/v1/deviceclasses",
    kind="DeviceClass",
    forbidden_is_empty=True,
)
# A watch is re-opened every ~5 minutes and bookmarks arrive about once a minute: an informer
# silent for this long is stuck, and /healthz says so.
INFORMER_STALL_TIMEOUT = 600.0
POLICY_RESYNC_PERIOD = 60.0
# On stop, the writes already sent get the time left before our renew deadline, less this: the
# lease goes back only once they are answered, and well before it could have run out.
STOP_MARGIN = 1.0


def _report_death(task: asyncio.Task[None]) -> None:
    """Say at once when a long-running task dies (/healthz will also fail)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("task died", task=task.get_name(), error=repr(task.exception()))


class Assembly:
    def __init__(self, *, settings: Settings, handle: ApiHandle) -> None:
        self.settings = s = settings
        self.handle = handle
        api = handle.api
        self.cache = ClusterCache(dra_sharing=s.dra_sharing)
        self.cache.mig_config_name = s.mig_parted_configmap
        self.cache.queue.cap = s.write_backoff_cap
        self.registry = CollectorRegistry()
        # Collections per generation: a full one walks every object the caches hold (the
        # webhook's budget is none during a run of admissions; docs/performance.md).
        GCCollector(registry=self.registry)
        self.telemetry = metrics.PrometheusTelemetry(self.registry)
        self.registry.register(metrics.StateCollector(MetricsReadings(self)))
        self.loop_lag = LoopLagMonitor(registry=self.registry)
        configuration = handle.configuration
        self.gate = LeaseElector(
            # Its own client (pool, timeouts) in its own thread: see kube/election.py.
            connect=lambda: connection.election_client(configuration),
            namespace=s.namespace,
            name=LEASE_NAME,
            identity=s.identity,
            timings=LeaseTimings(
                lease_duration=s.lease_duration,
                renew_deadline=s.renew_deadline,
                retry_period=s.retry_period,
            ),
            on_change=self._leadership_changed,
        )
        # The writer's gate, not the elector's: no Event either once a graceful stop began.
        self.recorder = EventRecorder(api=api, allowed=lambda: self.writer.may_write())
        self.reconciler = Reconciler(
            self.cache,
            timings=Timings(
                propagation_delay=s.config_propagation_delay,
                key_grace_period=s.config_key_grace_period,
                mismatch_timeout=s.mismatch_timeout,
            ),
            max_unavailable=s.max_unavailable,
        )
        self.informers = self._informers()
        self.cache.on_new_resource = self.informers[-1].request_relist
        # A budget reading a pod label key no record keeps: the pods are listed again.
        self.cache.budgets.on_new_keys = self.informers[-1].request_relist
        self.writer = WriteLoop(
            api=api,
            cache=self.cache,
            reconciler=self.reconciler,
            gate=self.gate,
            bucket=TokenBucket(qps=s.write_qps, burst=s.write_burst),
            recorder=self.recorder,
            config=ConfigMapRef(
                namespace=s.device_plugin_namespace,
                name=s.device_plugin_configmap,
                mig_name=s.mig_parted_configmap,
            ),
            telemetry=self.telemetry,
            concurrency=s.write_concurrency,
            policy_max_wait=s.policy_status_max_delay,
        )
        self.webhook: Webhook | None = None
        if s.webhook_enabled:
            self.webhook = Webhook(
                settings=s,
                handle=handle,
                cache=self.cache,
                telemetry=self.telemetry,
                may_write=lambda: self.writer.may_write(),
                recorder=self.recorder,
                caches_synced=lambda: self.caches_synced,
                admitted=self.telemetry.admitted,
                admission_took=self.telemetry.admission_took,
            )
            tls = self.webhook.tls
            self.registry.register(metrics.WebhookCertificate(lambda: tls.validity))
            # Run on the server's own loop, in its thread.
            self.webhook.server.also_run = LoopLagMonitor(registry=self.registry, webhook=True).run
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._http: serving.Servers | None = None
        self._primed = False

    def _informers(self) -> list[Informer]:
        s, api, telemetry = self.settings, self.handle.api, self.telemetry
        configmap = reading.Collection(
            path=f"/api/v1/namespaces/{s.device_plugin_namespace}/configmaps",
            kind="ConfigMap",
            field_selector=f"metadata.name={s.device_plugin_configmap}",
            forbidden_is_empty=True,  # until the chart's Role exists there; the writer says so
            keep_managed_fields=True,  # who owns each key (one small object)
        )
        nodes = reading.Collection(
            path="/api/v1/nodes",
            kind="Node",
            batch_window=READ_ONLY_BATCH_WINDOW,
            keep_managed_fields_of=carries_mig_config,
        )
        mig_configmap = reading.Collection(
            path=f"/api/v1/namespaces/{s.device_plugin_namespace}/configmaps",
            kind="ConfigMap",
            field_selector=f"metadata.name={s.mig_parted_configmap}",
            forbidden_is_empty=True,
            keep_managed_fields=True,
        )
        node_states = reading.Collection(path=NODE_STATES_PATH, kind="GPUNodeState")
        read: list[tuple[reading.Collection, reading.Sink]] = [
            (nodes, NodeSink(self.cache)),
            (SLICES, SliceSink(self.cache)),
            (CLAIMS, ClaimSink(self.cache)),
            (DEVICE_CLASSES, DeviceClassSink(self.cache)),
            (node_states, NodeStateSink(self.cache)),
            (configmap, ConfigMapSink(self.cache)),
            (mig_configmap, ConfigMapSink(self.cache, mig=True)),
            (BUDGETS, BudgetSink(self.cache)),  # before the pods: see _run
            (PODS, PodSink(self.cache)),  # last: on_new_resource re-lists it
        ]
        return [Informer(api=api, collection=c, sink=k, telemetry=telemetry) for c, k in read]

    def connection_info(self) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(**self.handle.credentials())

    # -- health ----------------------------------------------------------------------------------

    @property
    def caches_synced(self) -> bool:
        return self._primed and all(informer.synced.is_set() for informer in self.informers)

    @property
    def synced(self) -> bool:
        """Ready (/readyz): caches synced, and the webhook, when served, has a certificate."""
        return self.caches_synced and (self.webhook is None or self.webhook.ready)

    def health_problem(self, *, now: float) -> str | None:
        """Why /healthz should fail: a dead task, or an informer stalled past its timeout."""
        for name, task in self._tasks.items():
            if task.done():
                return (
                    f"{name} stopped: {task.exception() if not task.cancelled() else 'cancelled'}"
                )
        for informer in self.informers:
            idle = now - informer.stats.last_activity
            if informer.synced.is_set() and idle > INFORMER_STALL_TIMEOUT:
                return f"{informer.kind} informer silent for {idle:.0f} s"
        return None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        configuration = self.handle.configuration
        self._http = await serving.serve(
            settings=self.settings,
            health=self,
            registry=self.registry,
            # Its own client (pool), capped and rate-limited: see kube/access.py.
            reviews=lambda: access.api_reviews(configuration),
        )
        self._spawn("loop-lag", self.loop_lag.run())
        if self.webhook is not None:  # from the start: followers serve as soon as they can
            for informer in self.webhook.informers:
                self._spawn(f"informer-{informer.kind}", informer.run())
            self._spawn("webhook-certificate", self.webhook.rotator.run())
            self._spawn("webhook-server", self.webhook.server.run())
        self._spawn("bootstrap", self._run())

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(_report_death)
        self._tasks[name] = task

    async def _run(self) -> None:
        # Policies first: they say which resources to keep pods for, before the first pod list.
        await self._prime_policies()
        *others, budgets, pods = self.informers
        for informer in (*others, budgets):
            self._spawn(f"informer-{informer.kind}", informer.run())
        # And the budgets, which say which pod labels to keep: a pod list taken before them
        # would be taken again.
        await budgets.synced.wait()
        self._spawn(f"informer-{pods.kind}", pods.run())
        await self._write_when_synced()

    async def _prime_policies(self) -> None:
        backoff = 0.5
        while True:
            try:
                items = await reading.list_all(self.handle.api, POLICIES)
            except Exception as exc:  # any failure: log, back off, retry
                log.warning(
                    "cannot list policies; retrying",
                    kind=models.POLICY_KIND,
                    error=str(exc),
                    retry_in=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            for item in items:
                self.cache.upsert_policy(item)
            self._primed = True
            return

    async def _write_when_synced(self) -> None:
        """Never write from a partial picture: a missing policy would look like a release."""
        await asyncio.gather(*(informer.synced.wait() for informer in self.informers))
        log.info(
            "caches synced",
            gpu_nodes=len(self.cache.nodes),
            policies=len(self.cache.policies),
            node_states=len(self.cache.node_states),
            gpu_pods=len(self.cache.usage.pods),
            disruption_budgets=len(self.cache.budgets),
        )
        self.cache.settle_initial_keys()
        heap.release_free_heap()
        heap.freeze_survivors()
        self._spawn("elector", self.gate.run())
        self._spawn("policy-resync", self._resync_policies())
        await self.writer.run()

    async def _resync_policies(self) -> None:
        """kopf re-lists on a broken watch without telling us what disappeared meanwhile: list
        policies now and then, and forget those that are gone (level-based, like the informers)."""
        while True:
            await asyncio.sleep(POLICY_RESYNC_PERIOD)
            known = {name: p.uid for name, p in self.cache.policies.items()}
            try:
                items = await reading.list_all(self.handle.api, POLICIES)
            except Exception as exc:  # the next round tries again
                log.warning("policy resync failed", kind=models.POLICY_KIND, error=str(exc))
                continue
            listed = {str(item["metadata"]["name"]): item for item in items}
            # Only what we knew before listing and the listing no longer has: a policy that kopf
            # delivered while we listed is not ours to drop.  Updates stay kopf's job.
            for name, uid in known.items():
                current = self.cache.policies.get(name)
                if name not in listed and current is not None and current.uid == uid:
                    log.info("policy gone while unwatched", kind=models.POLICY_KIND, name=name)
                    self.cache.delete_policy(name)
            for name, item in listed.items():
                if name not in self.cache.policies:
                    self.cache.upsert_policy(item)

    async def _leadership_changed(self, leader: bool) -> None:
        if self.webhook is not None:
            self.webhook.rotator.changed()  # a new leader looks at the certificate at once
        # Only the new leader says so: a replica that lost the lease may not write anything,
        # and the new leader's Event records the handover.
        if not leader:
            return
        ref = ObjectRef("coordination.k8s.io/v1", "Lease", LEASE_NAME, "", self.settings.namespace)
        await self.recorder.post(
            ref=ref,
            type_="Normal",
            reason="LeaderElected",
            message=f"{self.settings.identity} leads",
        )

    async def stop(self) -> None:
        """Stop writing, let what was sent land, and only then hand the lease back.

        The elector keeps renewing meanwhile, in its own thread, so the drain cannot cost us the
        lease; the drain is bounded by the time left before our renew deadline all the same.
        Cancelling a request that is already sent does not unsend it: were the lease released
        first, a follower could lead while our last writes still land.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, self.gate.time_left() - STOP_MARGIN)
        drained = await self.writer.stop(timeout=deadline - loop.time())
        # The new leader's Event, if one is still being posted, shares the same deadline.
        await self.gate.stop(release=drained, settle=max(0.0, deadline - loop.time()))
        if not drained:
            log.warning("writes still in flight at stop: the lease is left to run out")
        await self._cancel(list(self._tasks))
        if self._http is not None:
            await self._http.cleanup()

    async def _cancel(self, names: list[str]) -> None:
        tasks = [self._tasks.pop(name) for name in names if name in self._tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class MetricsReadings:
    """metrics.Readings of an Assembly: the one place that knows which part keeps what the
    gauges show.  Read at scrape time, so the parts built after it (the writer) are there."""

    def __init__(self, assembly: Assembly) -> None:
        self._assembly = assembly

    def cache_sizes(self) -> Iterable[tuple[str, int]]:
        cache = self._assembly.cache
        return (
            ("Node", len(cache.nodes)),
            ("Pod", len(cache.usage.pods)),
            ("GPUSharingPolicy", len(cache.policies)),
            ("GPUNodeState", len(cache.node_states)),
            ("PodDisruptionBudget", len(cache.budgets)),
        )

    def write_backlog(self) -> int:
        return self._assembly.writer.backlog

    def is_leader(self) -> bool:
        return self._assembly.gate.is_leader()

    def policies(self) -> Iterable[str]:
        return self._assembly.cache.policies.keys()

    def rendered_status(self, policy: str) -> Mapping[str, Any] | None:
        return self._assembly.reconciler.memory.rendered_policies.get(policy)

    def rollout_counts(self, policy: str) -> Counts:
        return self._assembly.reconciler.book.counts(policy)

    def unavailable_nodes(self) -> int:
        return self._assembly.reconciler.book.unavailable()

    def max_unavailable_nodes(self) -> int:
        return self._assembly.reconciler.book.cluster_budget()

    def node_phases(self) -> Iterable[tuple[str, str, int]]:
        counted: collections.Counter[tuple[str, str]] = collections.Counter()
        for status in self._assembly.cache.node_states.values():
            counted[(str(status.get("policy") or ""), str(status.get("phase") or "Unknown"))] += 1
        return ((policy, phase, n) for (policy, phase), n in sorted(counted.items()))

    def slot_offers(self) -> Iterable[tuple[Offer, int]]:
        offers = self._assembly.cache.slot_offers
        return ((offer, offers.nodes(offer)) for offer in offers.offers())

"""The one place that writes: drains dirty sets through the planner, at a bounded rate.

Order: the device-plugin ConfigMap first, alone (a key is written before any label names it),
then nodes (labels by server-side apply, GPUNodeState status), several at once but never two
writes for one object at a time, then policy statuses, which count what the node writes
achieved and so wait until their nodes have settled.  Every write waits for the leader gate and
for a token (see ``writing``).

A graceful ``stop()`` refuses every write not yet sent (a job waiting for a token gives up at
once) and waits for those already on the wire to come back, instead of cancelling them: a
cancelled request may still reach the API server, after the lease has been handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

import structlog
from kubernetes_asyncio import client

from gpushare_operator.cache.state import ClusterState
from gpushare_operator.core.workqueue import CONFIG, CONFIG_KEY, NODE, POLICY
from gpushare_operator.kube.events import EventRecorder
from gpushare_operator.kube.inflight import InFlight, Key
from gpushare_operator.kube.leadership import LeaderGate
from gpushare_operator.kube.ratelimit import TokenBucket
from gpushare_operator.kube.telemetry import Telemetry
from gpushare_operator.kube.writing import (
    RETRY_AFTER,
    ConfigTarget,
    LostLeadership,
    ObjectWriter,
    WriteCounters,
)
from gpushare_operator.reconcile.planner import Planner

__all__ = ["ConfigTarget", "Writer"]

log = structlog.get_logger(__name__)

POLICY_EVERY = 10  # node rounds per policy round while both are dirty
POLICY_POLL = 0.5  # how often a held-back policy status looks again at its nodes
DEFAULT_CONCURRENCY = 16  # writes in flight; the token bucket sets the rate
DEFAULT_POLICY_MAX_WAIT = 60.0  # seconds a policy status waits for its nodes to settle

Job = tuple[Key, Coroutine[Any, Any, None]]


class _StoppingGate:
    """The leader gate as the writer's jobs see it: shut for good once the writer stops."""

    def __init__(self, *, gate: LeaderGate, stopping: asyncio.Event) -> None:
        self._gate = gate
        self._stopping = stopping

    def is_leader(self) -> bool:
        return not self._stopping.is_set() and self._gate.is_leader()

    def time_left(self) -> float:
        return 0.0 if self._stopping.is_set() else self._gate.time_left()

    async def wait_leader(self) -> None:
        await self._gate.wait_leader()


class _StoppingBucket(TokenBucket):
    """The writer's token bucket, except that a job waiting for a token gives up (as if
    leadership were lost) when the writer stops: at a low ``--write-qps`` the wait could
    otherwise outlast the lease.  It keeps no tokens itself; every one comes from ``inner``."""

    def __init__(self, *, inner: TokenBucket, stopping: asyncio.Event) -> None:
        self._inner = inner
        self._stopping = stopping

    async def take(self) -> None:
        if self._stopping.is_set():
            raise LostLeadership()
        taking = asyncio.ensure_future(self._inner.take())
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({taking, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (taking, stopped):
                task.cancel()
            await asyncio.gather(taking, stopped, return_exceptions=True)
        if self._stopping.is_set():
            raise LostLeadership()
        taking.result()


class Writer:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        state: ClusterState,
        planner: Planner,
        gate: LeaderGate,
        bucket: TokenBucket,
        recorder: EventRecorder,
        config: ConfigTarget,
        telemetry: Telemetry | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        policy_max_wait: float = DEFAULT_POLICY_MAX_WAIT,
    ) -> None:
        self._state = state
        self._planner = planner
        self._gate = gate
        self._stopping = asyncio.Event()
        self._idle = asyncio.Event()  # the loop is not running a write of its own
        self._idle.set()
        self._out = ObjectWriter(
            api=api,
            state=state,
            planner=planner,
            gate=_StoppingGate(gate=gate, stopping=self._stopping),
            bucket=_StoppingBucket(inner=bucket, stopping=self._stopping),
            recorder=recorder,
            config=config,
            telemetry=telemetry,
        )
        self._node_rounds = 0
        self.settle = 0.2  # seconds to let a burst of events land before planning
        self.policy_max_wait = policy_max_wait
        self._queue = state.dirty
        self._flight = InFlight(limit=concurrency, finished=self._finished)
        self._wake = asyncio.Event()
        state.dirty.set_waker(self._wake.set)

    @property
    def counters(self) -> WriteCounters:
        return self._out.counters

    @property
    def backlog(self) -> int:
        """Objects still to be written: queued, being written, a policy status held back, or
        a failed write waiting for its back-off (plain timers, such as a node's Mismatch
        deadline, are not work yet)."""
        queue = self._queue
        sizes = queue.sizes()
        return sizes["queued"] + sizes["processing"] + queue.timers(POLICY) + queue.retrying()

    def writes_allowed(self) -> bool:
        """Whether a write may start now: we lead and the writer has not been stopped (the
        Event recorder asks too, so that no Event is posted after a graceful stop began)."""
        return not self._stopping.is_set() and self._gate.is_leader()

    async def run(self) -> None:
        try:
            await self._loop()
        finally:
            # Cancelled outright: nothing may be left running.  Ended by stop(): the jobs
            # already sent are stop()'s to wait for.
            if not self._stopping.is_set():
                await self._flight.cancel()

    async def stop(self, *, timeout: float) -> bool:
        """Take no new write; give those already sent up to ``timeout`` seconds to come back.

        True if none is left on the wire; what did not come back in time is cancelled, and the
        caller should then not hand the lease back early (a cancelled request may still land).
        """
        deadline = time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        if not self._idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout=max(0.0, timeout))
        drained = await self._flight.drain(timeout=deadline - time.monotonic())
        if not drained or not self._idle.is_set():
            log.warning(
                "writes still in flight at stop; cancelling them", busy=len(self._flight.busy)
            )
            await self._flight.cancel()
            return False
        return True

    async def _until_leader_or_stopped(self) -> None:
        waiting = asyncio.ensure_future(self._gate.wait_leader())
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopped):
                task.cancel()
            await asyncio.gather(waiting, stopped, return_exceptions=True)

    async def _loop(self) -> None:
        leading = False
        while not self._stopping.is_set():
            if not self._gate.is_leader():
                leading = False
                await self._until_leader_or_stopped()
                continue
            if not leading:
                # Gaining leadership: look at everything once; only differences get written.
                leading = True
                self.resync()
            next_due = self._planner.due()
            if not self._state.dirty:
                await self._sleep_until(next_due)
                # Let a burst that woke us finish arriving: it becomes one write per object.
                await asyncio.sleep(self.settle)
                continue
            try:
                await self._dispatch_one()
            except Exception:  # never let one bad object stop all writing
                log.exception("writer round failed; continuing")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=RETRY_AFTER)

    def resync(self) -> None:
        self._planner.rollouts.restart()
        dirty = self._state.dirty
        dirty.config()
        dirty.many_nodes(self._state.nodes)
        dirty.many_policies(self._state.policies)

    async def _sleep_until(self, when: float | None) -> None:
        self._wake.clear()
        if self._state.dirty:
            return
        timeout = None if when is None else max(0.0, when - self._state.clock())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=timeout)

    # -- choosing the next job -------------------------------------------------------------------

    async def _dispatch_one(self) -> None:
        """Take a slot, then choose what to write: chosen late, a job plans from fresh state."""
        await self._flight.slot()
        if self._stopping.is_set():
            self._flight.release()
            return
        try:
            job = self._next_job()
        except BaseException:
            self._flight.release()
            raise
        if job is None:
            self._flight.release()
            return
        key, work = job
        if key[0] == "config":
            # A barrier: nodes planned while the ConfigMap write is out would not see their new
            # key yet, and would publish a Pending status only to replace it a moment later.
            self._idle.clear()
            try:
                await self._flight.run_here(key, self._guarded(key, work))
            finally:
                self._idle.set()
        else:
            self._flight.spawn(key, self._guarded(key, work))

    def _next_job(self) -> Job | None:
        """The next key the queue hands out (processing from now until ``_finished``)."""
        queue = self._queue
        if queue.get(CONFIG) is not None:
            return CONFIG_KEY, self._out.write_config()
        # Every few node rounds a policy gets its turn: sustained node churn (pods coming and
        # going) must not keep policy status unpublished.
        self._node_rounds += 1
        if queue.policies and self._node_rounds % POLICY_EVERY == 0:
            job = self._policy_job()
            if job is not None:
                return job
        node = queue.get(NODE)
        if node is not None:
            return (NODE, node), self._out.node_job(node)
        return self._policy_job()

    def _policy_job(self) -> Job | None:
        queue = self._queue
        while (name := queue.get(POLICY)) is not None:
            if not self._policy_should_wait(name):
                return (POLICY, name), self._out.write_policy(name)
            queue.done((POLICY, name))  # its timer brings it back
        return None

    def _policy_should_wait(self, name: str) -> bool:
        """Hold a policy's status while some of its nodes still have a write coming.

        Its counts would change again a moment later: a 2,500-node rollout would rewrite the
        status dozens of times.  ``policy_max_wait`` bounds the wait, so sustained churn still
        shows up in the policy's numbers.
        """
        now = self._state.clock()
        since = self._queue.waiting_since((POLICY, name))
        deadline = (now if since is None else since) + self.policy_max_wait
        busy = self._queue.processing(NODE)
        if now < deadline and self._planner.policy_unsettled(name, busy=busy):
            self._planner.recheck(min(now + POLICY_POLL, deadline), POLICY, name)
            return True
        return False

    async def _guarded(self, key: Key, work: Coroutine[Any, Any, None]) -> None:
        self._out.new_job()
        try:
            await work
        except LostLeadership:
            # The gate may open again without the loop ever seeing it closed (one late
            # renewal): keep the object queued rather than count on a resync.
            self._queue.add(key)
        except Exception:  # never let one bad object stop all writing
            log.exception("write failed; retrying", kind=key[0], name=key[1])
            self._out.retry_later(*key)
        else:
            if not self._out.job_failed():
                self._queue.succeeded(key)  # its back-off starts again from the bottom
        finally:
            # A job may have set a timer (a retry, a propagation wait) while the loop slept
            # until an earlier one: wake it to look at the timers again.
            self._wake.set()

    def _finished(self, key: Key) -> None:
        self._queue.done(key)

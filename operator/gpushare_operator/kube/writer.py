"""The one place that writes: drains dirty sets through the planner, at a bounded rate.

Order: the device-plugin ConfigMap first, alone (a key is written before any label names it),
then nodes (labels by server-side apply, GPUNodeState status), several at once but never two
writes for one object at a time, then policy statuses, which count what the node writes
achieved and so wait until their nodes have settled.  Every write waits for the leader gate and
for a token (see ``writing``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

import structlog
from kubernetes_asyncio import client

from gpushare_operator.cache.state import ClusterState
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
        self._out = ObjectWriter(
            api=api,
            state=state,
            planner=planner,
            gate=gate,
            bucket=bucket,
            recorder=recorder,
            config=config,
            telemetry=telemetry,
        )
        self._node_rounds = 0
        self.settle = 0.2  # seconds to let a burst of events land before planning
        self.policy_max_wait = policy_max_wait
        self._policy_waiting: dict[str, float] = {}  # policy -> since when its write waits
        self._flight = InFlight(limit=concurrency, again=self._dirty_again)
        self._wake = asyncio.Event()
        state.dirty.set_waker(self._wake.set)

    @property
    def counters(self) -> WriteCounters:
        return self._out.counters

    @property
    def backlog(self) -> int:
        """Objects still to be written: dirty, being written, or a policy status held back."""
        return len(self._state.dirty) + len(self._flight.busy) + len(self._policy_waiting)

    async def run(self) -> None:
        try:
            await self._loop()
        finally:
            await self._flight.cancel()

    async def _loop(self) -> None:
        leading = False
        while True:
            if not self._gate.is_leader():
                leading = False
                await self._gate.wait_leader()
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
                await asyncio.sleep(RETRY_AFTER)

    def resync(self) -> None:
        dirty = self._state.dirty
        self._policy_waiting.clear()
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
            await self._flight.run_here(key, self._guarded(key, work))
        else:
            self._flight.spawn(key, self._guarded(key, work))

    def _next_job(self) -> Job | None:
        dirty = self._state.dirty
        if dirty.pop_config() and self._flight.claim(("config", "")):
            return ("config", ""), self._out.write_config()
        # Every few node rounds a policy gets its turn: sustained node churn (pods coming and
        # going) must not keep policy status unpublished.
        self._node_rounds += 1
        if dirty.policies and self._node_rounds % POLICY_EVERY == 0:
            job = self._policy_job()
            if job is not None:
                return job
        while (node := dirty.pop_node()) is not None:
            if self._flight.claim(("node", node)):
                return ("node", node), self._out.node_job(node)
        return self._policy_job()

    def _policy_job(self) -> Job | None:
        dirty = self._state.dirty
        while (name := dirty.pop_policy()) is not None:
            if not self._policy_should_wait(name) and self._flight.claim(("policy", name)):
                return ("policy", name), self._out.write_policy(name)
        return None

    def _policy_should_wait(self, name: str) -> bool:
        """Hold a policy's status while some of its nodes still have a write coming.

        Its counts would change again a moment later: a 2,500-node rollout would rewrite the
        status dozens of times.  ``policy_max_wait`` bounds the wait, so sustained churn still
        shows up in the policy's numbers.
        """
        now = self._state.clock()
        since = self._policy_waiting.setdefault(name, now)
        deadline = since + self.policy_max_wait
        busy = self._flight.busy_names("node")
        if now < deadline and self._planner.policy_unsettled(name, busy=busy):
            self._planner.recheck(min(now + POLICY_POLL, deadline), "policy", name)
            return True
        del self._policy_waiting[name]
        return False

    async def _guarded(self, key: Key, work: Coroutine[Any, Any, None]) -> None:
        self._out.new_job()
        try:
            await work
        except LostLeadership:
            # The gate may open again without the loop ever seeing it closed (one late
            # renewal): keep the object dirty rather than count on a resync.
            self._dirty_again(key)
        except Exception:  # never let one bad object stop all writing
            log.exception("write failed; retrying", kind=key[0], name=key[1])
            self._out.retry_later(*key)
        finally:
            # A job may have set a timer (a retry, a propagation wait) while the loop slept
            # until an earlier one: wake it to look at the timers again.
            self._wake.set()

    def _dirty_again(self, key: Key) -> None:
        kind, name = key
        if kind == "node":
            self._state.dirty.node(name)
        elif kind == "policy":
            self._state.dirty.policy(name)
        else:
            self._state.dirty.config()

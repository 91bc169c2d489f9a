"""The one place that writes: the write loop, in controller-runtime's shape.

Each turn takes the key ``reconcile.turns`` names, plans it (``Reconciler.plan``, pure), sends
the plan's requests (``kube.patching``), hands plan and answer to ``Reconciler.learn`` and acts
on the ``Orders`` it returns in one switch (``_act``): nothing else touches the work queue but
the cache marking what its events change.  Several jobs run at once (``InFlight``), never two
for one object; every request waits for the leader gate and a token of the write rate.

A graceful ``stop()`` refuses every write not yet sent (a job waiting for a token gives up at
once) and waits for those already on the wire to come back, instead of cancelling them: a
cancelled request may still reach the API server, after the lease has been handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable

import structlog
from kubernetes_asyncio import client

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api import defaults
from gpushare_operator.core.workqueue import (
    CONFIG_KEY,
    DEVICE_CLASSES_KEY,
    MIG_CONFIG,
    MIG_CONFIG_KEY,
    NODE,
    POLICY,
    Key,
)
from gpushare_operator.kube.configuring import ConfigMapRef, ConfigMapWrites
from gpushare_operator.kube.deviceclasses import DeviceClassWrites
from gpushare_operator.kube.events import EventRecorder
from gpushare_operator.kube.inflight import InFlight
from gpushare_operator.kube.leadership import LeaderGate
from gpushare_operator.kube.patching import Patches
from gpushare_operator.kube.ratelimit import TokenBucket
from gpushare_operator.kube.sending import Sender, Tokens, WriteCounters
from gpushare_operator.kube.telemetry import NoTelemetry, Telemetry
from gpushare_operator.reconcile import turns
from gpushare_operator.reconcile.outcomes import (
    Done,
    Gone,
    LeadershipLost,
    Orders,
    Refused,
    Retry,
    Written,
)
from gpushare_operator.reconcile.plans import ConfigPlan, Plan, Stage
from gpushare_operator.reconcile.reconciler import Reconciler

__all__ = ["ConfigMapRef", "WriteLoop"]

log = structlog.get_logger(__name__)

ROUND_FAILED_PAUSE = 5.0  # seconds to wait after a turn failed outright (a bug, not the API)
_PLAN_KIND = {"node": "node", "policy": "policy", "config": "configmap"}  # the metric's label


class WriteLoop:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        cache: ClusterCache,
        reconciler: Reconciler,
        gate: LeaderGate,
        bucket: TokenBucket,
        recorder: EventRecorder,
        config: ConfigMapRef,
        telemetry: Telemetry | None = None,
        concurrency: int = defaults.WRITE_CONCURRENCY,
        policy_max_wait: float = defaults.POLICY_STATUS_MAX_DELAY,
    ) -> None:
        self._cache = cache
        self._queue = cache.queue
        self._reconciler = reconciler
        self._gate = gate
        self._bucket = bucket
        self._telemetry: Telemetry = telemetry or NoTelemetry()
        self._stopping = asyncio.Event()  # set once by stop(): no request is sent after it
        self._idle = asyncio.Event()  # clear while the loop runs a job itself (the ConfigMap)
        self._idle.set()
        self._sender = Sender(api=api, permit=self, recorder=recorder, telemetry=telemetry)
        self._patches = Patches(sender=self._sender, cache=cache)
        self._configmap = ConfigMapWrites(
            sender=self._sender, cache=cache, memory=reconciler.memory, config=config
        )
        self._mig_configmap = ConfigMapWrites(
            sender=self._sender,
            cache=cache,
            memory=reconciler.memory,
            config=ConfigMapRef(namespace=config.namespace, name=config.mig_name),
            what="mig-parted",
        )
        self._classes = DeviceClassWrites(sender=self._sender, cache=cache)
        self._flight = InFlight(limit=concurrency, finished=self._queue.done)
        self._wake = asyncio.Event()
        self._queue.set_waker(self._wake.set)
        self._turns = 0
        self.settle = 0.2  # seconds to let a burst of events land before planning
        self.policy_max_wait = policy_max_wait

    # -- what others read ------------------------------------------------------------------------

    @property
    def counters(self) -> WriteCounters:
        return self._sender.counters

    @property
    def backlog(self) -> int:
        """Objects still to be written: queued, being written, a policy status held back, or
        a failed write waiting for its back-off (plain timers, such as a node's Mismatch
        deadline or a rollout's progress deadline, are not work yet)."""
        queue = self._queue
        sizes = queue.sizes()
        return sizes["queued"] + sizes["processing"] + queue.postponed(POLICY) + queue.retrying()

    # -- the permit every request asks (kube.patching.Permit) ------------------------------------

    def may_write(self) -> bool:
        """Whether a write may start now: we lead and the loop has not been stopped (the Event
        recorder asks too, so that no Event is posted after a graceful stop began)."""
        return not self._stopping.is_set() and self._gate.is_leader()

    def time_left(self) -> float:
        return 0.0 if self._stopping.is_set() else self._gate.time_left()

    async def token(self) -> bool:
        """A token of the write rate; False if the loop stopped while waiting (at a low
        ``--write-qps`` the wait could otherwise outlast the lease)."""
        if self._stopping.is_set():
            return False
        return await _first_of(self._bucket.take(), stop=self._stopping)

    # -- running ---------------------------------------------------------------------------------

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

    async def _loop(self) -> None:
        leading = False
        while not self._stopping.is_set():
            if not self._gate.is_leader():
                leading = False
                await _first_of(self._gate.wait_leader(), stop=self._stopping)
                continue
            if not leading:
                # Gaining leadership: look at everything once; only differences get written.
                leading = True
                self.resync()
            next_due = self._tick()
            if not self._queue:
                await self._sleep_until(next_due)
                # Let a burst that woke us finish arriving: it becomes one write per object.
                await asyncio.sleep(self.settle)
                continue
            try:
                await self._dispatch_one()
            except Exception:  # never let one bad object stop all writing
                log.exception("writer round failed; continuing")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=ROUND_FAILED_PAUSE)

    def resync(self) -> None:
        """Look at every object once (on gaining leadership)."""
        self._reconciler.restart()
        cache = self._cache
        configs = {CONFIG_KEY, MIG_CONFIG_KEY, DEVICE_CLASSES_KEY}
        everything = configs | {(NODE, n) for n in cache.nodes}
        self._act(None, Orders(mark=frozenset(everything | {(POLICY, p) for p in cache.policies})))

    def _tick(self) -> float | None:
        """Run the timers: the admission pass, then the queue's own; when the next is due."""
        queue = self._queue
        tick = self._reconciler.tick(busy=bool(queue.nodes) or bool(queue.processing(NODE)))
        self._act(None, tick.orders)
        timer = queue.next_due()
        due = [when for when in (tick.again_at, timer) if when is not None]
        return min(due, default=None)

    async def _sleep_until(self, when: float | None) -> None:
        self._wake.clear()
        if self._queue:
            return
        timeout = None if when is None else max(0.0, when - self._cache.clock())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=timeout)

    # -- one turn --------------------------------------------------------------------------------

    async def _dispatch_one(self) -> None:
        """Take a slot, then choose what to write: chosen late, a job plans from fresh state."""
        await self._flight.slot()
        if self._stopping.is_set():
            self._flight.release()
            return
        self._turns += 1
        turn = turns.next_turn(
            self._queue,
            turn=self._turns,
            settling=self._reconciler,
            now=self._cache.clock(),
            max_wait=self.policy_max_wait,
        )
        key = self._take(turn)
        if key is None:
            self._flight.release()
            return
        if turn.alone:
            self._idle.clear()
            try:
                await self._flight.run_here(key, self._job(key))
            finally:
                self._idle.set()
        else:
            self._flight.spawn(key, self._job(key))

    def _take(self, turn: turns.Turn) -> Key | None:
        """Hold back what the turn defers; take its key (processing until its job ends)."""
        for deferred, until in turn.deferred:
            self._queue.postpone(deferred, until)
        if turn.key is None or not self._queue.take(turn.key):
            return None
        return turn.key

    async def _job(self, key: Key) -> None:
        try:
            orders = await self._work(key)
        except Exception:  # never let one bad object stop all writing
            log.exception("write failed; retrying", kind=key[0], name=key[1])
            orders = Orders(Retry("unexpected error"))
        self._act(key, orders)
        # A job may have set a timer (a retry, a propagation wait) while the loop slept until
        # an earlier one: wake it to look at the timers again.
        self._wake.set()

    async def _work(self, key: Key) -> Orders:
        """Plan, send, learn; a second stage when the first asks for one."""
        if key == DEVICE_CLASSES_KEY:
            return Orders(await self._classes.sync(Tokens(self, prepaid=False)))
        plan = self._plan(key, Stage.FIRST)
        tokens = Tokens(self, prepaid=False)
        if plan.writes:
            # No token for a plan with nothing to send; planning again after the wait folds
            # whatever arrived meanwhile (the rest of a burst of pod events) into this write.
            if not await self.token():
                return Orders(LeadershipLost())
            tokens = Tokens(self, prepaid=True)
            plan = self._plan(key, Stage.FIRST)
        orders = self._reconciler.learn(plan, await self._write(plan, tokens))
        while orders.again is not None:
            plan = self._plan(key, orders.again)
            orders = orders.then(self._reconciler.learn(plan, await self._write(plan, tokens)))
        return orders

    async def _write(self, plan: Plan, tokens: Tokens) -> Written | None:
        if isinstance(plan, ConfigPlan):
            writes = self._mig_configmap if plan.target == MIG_CONFIG else self._configmap
            return await writes.write(plan, tokens=tokens)
        return await self._patches.write(plan, tokens=tokens)

    def _plan(self, key: Key, stage: Stage) -> Plan:
        started = time.perf_counter()
        try:
            return self._reconciler.plan(key, stage=stage)
        finally:
            self._telemetry.reconciled(
                _PLAN_KIND.get(key[0], key[0]), time.perf_counter() - started
            )

    def _act(self, key: Key | None, orders: Orders) -> None:
        """The one switch on the queue: what a job (or a tick, for ``key`` None) ordered."""
        queue = self._queue
        for other in orders.mark:
            queue.add(other)
        queue.first(NODE, orders.first)
        for timed, when in orders.at:
            queue.add_at(timed, when)
        if key is None:
            return
        match orders.outcome:
            case Done() | Gone():
                queue.succeeded(key)  # its back-off starts again from the bottom
            case Retry() | Refused():
                # Again on its back-off, which grows with each failure in a row: an object that
                # keeps failing asks for ever fewer writes.
                delay = queue.failed(key)
                log.debug("write retry scheduled", kind=key[0], name=key[1], retry_in=delay)
            case LeadershipLost():
                # The gate may open again without the loop ever seeing it closed (one late
                # renewal): keep the object queued rather than count on a resync.
                queue.add(key)


async def _first_of(waiting: Awaitable[None], *, stop: asyncio.Event) -> bool:
    """Wait for ``waiting`` or for ``stop``; True if ``waiting`` finished first."""
    task = asyncio.ensure_future(waiting)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, stopped):
            pending.cancel()
        await asyncio.gather(task, stopped, return_exceptions=True)
    if stop.is_set():
        return False
    task.result()
    return True

"""Leader election on a coordination.k8s.io/v1 Lease, with fencing on the renew deadline.

Every replica keeps its caches warm; only the holder of the Lease writes.  Expiry of someone
else's lease is judged on our own monotonic clock from when we last saw the record change (as
client-go does), so clock skew between replicas does not matter.  Our own leadership ends the
moment ``renew_deadline`` passes without a successful renewal: that is earlier than
``lease_duration``, after which another replica may take the lease, so two writers never overlap.

The election runs in a thread of its own, with its own event loop and its own API client
(connection pool, timeouts): a renewal never waits behind the writer's requests, the informers'
watches, or a long step of the main loop (decoding a re-list page, planning a big rollout).  The
main loop only reads ``is_leader()``/``time_left()``, which are computed from a timestamp the
election thread sets, and is woken through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client

from gpushare_operator.core.api import defaults
from gpushare_operator.kube import http

log = structlog.get_logger(__name__)

FAILURES = (http.ApiError, aiohttp.ClientError, OSError, TimeoutError)


@dataclass(frozen=True, slots=True)
class LeaseTimings:
    lease_duration: float = defaults.LEASE_DURATION
    renew_deadline: float = defaults.RENEW_DEADLINE
    retry_period: float = defaults.RETRY_PERIOD

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry-period < renew-deadline < lease-duration")

    @property
    def request_timeout(self) -> float:
        """One Lease request's timeout: half the renew deadline, so that a request hung on a
        dead connection leaves time for at least one more attempt on a fresh one."""
        return self.renew_deadline / 2


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """Schedule ``callback`` on another thread's loop; a closed loop is ending: skip it."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(
        self,
        *,
        connect: Callable[[], client.ApiClient],
        namespace: str,
        name: str,
        identity: str,
        timings: LeaseTimings,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        # Called in the election thread: an aiohttp session belongs to the loop that made it.
        self._connect = connect
        self._api: client.ApiClient | None = None
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._name = name
        self._namespace = namespace
        self.identity = identity
        self._timings = timings
        self._clock = clock
        self._on_change = on_change
        self._renewed_at: float | None = None  # start of our last successful acquire/renew
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._record: dict[str, Any] | None = None  # the Lease as we last wrote it
        self.renewals = 0
        self.transitions = 0
        # Main-loop side.
        self._leading = asyncio.Event()
        self._announcing: set[asyncio.Task[None]] = set()
        # Election-thread side.
        self._thread: threading.Thread | None = None
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._release_on_stop = False
        self.released = False

    # -- the gate (read from any thread) ---------------------------------------------------------

    def is_leader(self) -> bool:
        renewed = self._renewed_at
        return renewed is not None and self._clock() < renewed + self._timings.renew_deadline

    def time_left(self) -> float:
        renewed = self._renewed_at
        if renewed is None:
            return 0.0
        return max(0.0, renewed + self._timings.renew_deadline - self._clock())

    async def wait_leader(self) -> None:
        while not self.is_leader():
            self._leading.clear()
            await self._leading.wait()

    # -- lifecycle (main loop) -------------------------------------------------------------------

    async def run(self) -> None:
        """Elect in the election thread until ``stop()``; cancelling this stops it too."""
        if self._thread is not None:
            raise RuntimeError("the elector runs once")
        main = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._thread_main, args=(main,), name="lease-elector", daemon=True
        )
        self._thread.start()
        try:
            await self._wait_finished()
        except asyncio.CancelledError:
            # Abrupt end (no release): the lease runs out on its own.
            self._request_stop(release=False)
            await self._wait_finished()
            raise
        finally:
            await self._end_announcements()

    async def _wait_finished(self) -> None:
        # Shielded: cancelling a wrapped future would cancel the thread's own future with it.
        await asyncio.shield(asyncio.wrap_future(self._finished))

    async def stop(self, *, release: bool, settle: float = 0.0) -> None:
        """Stop renewing; with ``release`` hand the lease back first, so a follower takes over
        at once instead of waiting ``lease_duration`` for it to run out.

        A change callback still running (the new leader's Event) gets ``settle`` seconds to
        finish first; if it does not, the lease is not released, as for any write left on the
        wire."""
        if self._thread is None:
            self._stopping = True  # never started: never will
            return
        if self._announcing:
            await asyncio.wait(set(self._announcing), timeout=max(0.0, settle))
        settled = not self._announcing
        await self._end_announcements()
        self._request_stop(release=release and settled)
        await self._wait_finished()

    def _request_stop(self, *, release: bool) -> None:
        self._release_on_stop = self._release_on_stop or release
        self._stopping = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            _call_soon(loop, wake.set)

    async def _end_announcements(self) -> None:
        for task in list(self._announcing):
            task.cancel()
        if self._announcing:
            await asyncio.wait(self._announcing)

    def _announce_soon(self, main: asyncio.AbstractEventLoop, leader: bool) -> None:
        """From the election thread: run the change callbacks on the main loop, unawaited."""

        def spawn() -> None:
            task = main.create_task(self._announce(leader), name="lease-announce")
            self._announcing.add(task)
            task.add_done_callback(self._announcing.discard)

        _call_soon(main, spawn)

    async def _announce(self, leader: bool) -> None:
        self.transitions += 1
        if self._on_change is not None:
            await self._on_change(leader)

    # -- the election thread ---------------------------------------------------------------------

    def _thread_main(self, main: asyncio.AbstractEventLoop) -> None:
        try:
            asyncio.run(self._elect(main))
        except BaseException as exc:  # hand any failure to run()'s caller on the main loop
            self._finished.set_exception(exc)
        else:
            self._finished.set_result(None)

    async def _elect(self, main: asyncio.AbstractEventLoop) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self._stopping:
            self._wake.set()
        self._api = self._connect()
        try:
            await self._rounds(main)
            if self._release_on_stop:
                await self._release()
        finally:
            self._renewed_at = None
            await self._api.close()
            self._loop = None

    async def _rounds(self, main: asyncio.AbstractEventLoop) -> None:
        assert self._wake is not None
        was_leader = False
        while not self._stopping:
            started = self._clock()
            try:
                await self._try_acquire_or_renew(started)
            except FAILURES as exc:
                log.warning("lease attempt failed", kind="Lease", name=self._name, error=str(exc))
            leader = self.is_leader()
            if leader:
                # Every round, not only on a change: the gate can close by the clock alone and
                # reopen with the next renewal without this thread seeing it closed.
                _call_soon(main, self._leading.set)
            if leader != was_leader:
                was_leader = leader
                log.info(
                    "leadership acquired" if leader else "leadership lost",
                    kind="Lease",
                    name=self._name,
                    namespace=self._namespace,
                    identity=self.identity,
                )
                self._announce_soon(main, leader)
            # A fixed rate from each attempt's start: a slow answer does not stretch the period.
            pause = max(0.0, started + self._timings.retry_period - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=pause)

    # -- one attempt -----------------------------------------------------------------------------

    def _timeout(self) -> float:
        """No request outlives the renew deadline, and none takes the whole of it."""
        timeout = self._timings.request_timeout
        if self.is_leader():
            timeout = min(timeout, self.time_left())
        return max(0.1, timeout)

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        assert self._api is not None, "the election thread opens the client"
        return await http.request(
            self._api, method=method, path=path, body=body, timeout=self._timeout()
        )

    async def _read(self) -> dict[str, Any] | None:
        try:
            lease = await self._call("GET", f"{self._path}/{self._name}")
        except http.ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(lease)

    def _expired(self, spec: dict[str, Any]) -> bool:
        seen = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
        if seen != self._observed:
            self._observed, self._observed_at = seen, self._clock()
        duration = float(spec.get("leaseDurationSeconds") or self._timings.lease_duration)
        return self._clock() > self._observed_at + duration

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = _micro_time()
        spec = dict(previous or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if previous else 0
            )
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self._timings.lease_duration),
            renewTime=now,
        )
        return spec

    async def _put(self, lease: dict[str, Any], started: float) -> bool:
        """Compare-and-swap on the resourceVersion in ``lease``: False if someone wrote first."""
        try:
            written = await self._call("PUT", f"{self._path}/{self._name}", lease)
        except http.ApiError as exc:
            if exc.status == 409:
                self._record = None
                return False
            raise
        self._won(written, started)
        return True

    def _won(self, written: Any, started: float) -> None:
        self._record = dict(written) if isinstance(written, dict) else None
        self._renewed_at = started
        self.renewals += 1

    async def _try_acquire_or_renew(self, started: float) -> None:
        if self._stopping:
            return  # stopping (perhaps released): never take it again
        record = self._record
        if record is not None and self.is_leader():
            # While we lead, the Lease is as we last wrote it unless someone took it: renew from
            # that copy, one request instead of two (a conflict sends us to the slow path).
            lease = dict(record, spec=self._spec(record.get("spec") or {}))
            if await self._put(lease, started):
                return
        lease_or_none = await self._read()
        if lease_or_none is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": self._spec(None),
            }
            self._won(await self._call("POST", self._path, body), started)
            return
        lease = lease_or_none
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity and not self._expired(spec):
            self._renewed_at = None
            self._record = None
            return
        lease["spec"] = self._spec(spec)
        await self._put(lease, started)  # a conflict: someone else won; look again next round

    async def _release(self) -> None:
        """Hand the lease back: empty holder, one-second duration, so a follower takes it now."""
        if not self.is_leader():
            return
        try:
            lease = self._record or await self._read()
            self._renewed_at = None  # the gate shuts before the release can land
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = dict(lease.get("spec") or {})
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro_time())
            await self._call("PUT", f"{self._path}/{self._name}", dict(lease, spec=spec))
            self.released = True
            log.info("lease released", kind="Lease", name=self._name, identity=self.identity)
        except FAILURES as exc:
            log.warning("lease release failed", kind="Lease", name=self._name, error=str(exc))

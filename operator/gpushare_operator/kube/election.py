"""Leader election on a coordination.k8s.io/v1 Lease, with fencing on the renew deadline.

Every replica keeps its caches warm; only the holder of the Lease writes.  Expiry of someone
else's lease is judged on our own monotonic clock from when we last saw the record change (as
client-go does), so clock skew between replicas does not matter.  Our own leadership ends the
moment ``renew_deadline`` passes without a successful renewal: that is earlier than
``lease_duration``, after which another replica may take the lease, so two writers never overlap.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client

from gpushare_operator.kube import http

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseTimings:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry-period < renew-deadline < lease-duration")


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        timings: LeaseTimings,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        self._api = api
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
        self._leading = asyncio.Event()
        self.transitions = 0
        self._announcing: asyncio.Task[None] | None = None
        self._closed = False

    # -- the gate --------------------------------------------------------------------------------

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

    # -- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        was_leader = False
        while True:
            started = self._clock()
            try:
                await self._try_acquire_or_renew(started)
            except (http.ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("lease attempt failed", kind="Lease", name=self._name, error=str(exc))
            leader = self.is_leader()
            if leader:
                self._leading.set()
            if leader != was_leader:
                was_leader = leader
                # Not awaited: a slow Event post must not delay the next renewal.
                self._announcing = asyncio.create_task(self._announce(leader))
            await asyncio.sleep(self._timings.retry_period)

    async def _announce(self, leader: bool) -> None:
        self.transitions += 1
        log.info(
            "leadership acquired" if leader else "leadership lost",
            kind="Lease",
            name=self._name,
            namespace=self._namespace,
            identity=self.identity,
        )
        if self._on_change is not None:
            await self._on_change(leader)

    async def _read(self) -> dict[str, Any] | None:
        try:
            lease = await http.request(
                self._api, method="GET", path=f"{self._path}/{self._name}", timeout=5
            )
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

    async def _try_acquire_or_renew(self, started: float) -> None:
        if self._closed:
            return  # released on shutdown: never take it again
        lease = await self._read()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": self._spec(None),
            }
            await http.request(self._api, method="POST", path=self._path, body=body, timeout=5)
            self._renewed_at = started
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity and not self._expired(spec):
            self._renewed_at = None
            return
        lease["spec"] = self._spec(spec)
        try:
            # PUT with the resourceVersion we read: compare-and-swap, one winner.
            await http.request(
                self._api, method="PUT", path=f"{self._path}/{self._name}", body=lease, timeout=5
            )
        except http.ApiError as exc:
            if exc.status == 409:
                return  # someone else wrote it first; look again next round
            raise
        self._renewed_at = started

    async def release(self) -> None:
        """On clean shutdown: hand the lease back at once, so a follower need not wait it out."""
        self._closed = True
        if not self.is_leader():
            return
        self._renewed_at = None
        try:
            lease = await self._read()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro_time())
            await http.request(
                self._api, method="PUT", path=f"{self._path}/{self._name}", body=lease, timeout=5
            )
            log.info("lease released", kind="Lease", name=self._name, identity=self.identity)
        except (http.ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("lease release failed", kind="Lease", name=self._name, error=str(exc))

"""Two operator replicas, ``a`` and ``b``, next to the GPU node simulator: who holds the Lease,
and what the API server saw each of them write.

Each replica has its own client identity (users ``gpushare-a`` and ``gpushare-b``, Lease
identities ``a`` and ``b``), so the audit log tells their writes apart.  Lease timings are scaled
down from the defaults (15 s / 10 s / 2 s) to keep the tests short; the invariants are the same.
The ``start_replicas`` fixture starts them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from gpushare_testing.apiobjects import operator_writes
from gpushare_testing.auditlog import AuditEvent, is_lease, received, succeeded
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OPERATOR_NAMESPACE, RunningOperator
from gpushare_testing.quiet import quiet
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

logger = logging.getLogger(__name__)

LEASE_PATH = (
    f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/gpushare-operator"
)
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6.0, 4.0, 1.0
TIMING_FLAGS = (
    "--lease-duration",
    f"{LEASE_DURATION:g}",
    "--renew-deadline",
    f"{RENEW_DEADLINE:g}",
    "--retry-period",
    f"{RETRY_PERIOD:g}",
)
USERS = {"a": "gpushare-a", "b": "gpushare-b"}  # Lease identity -> client-certificate user
TAKEOVER_AFTER_RELEASE = 3.0  # seconds from SIGTERM of the leader to the follower leading


def report(message: str) -> None:
    """A measured figure: in the test's output (-s or on failure) and in the INFO log."""
    print(message)
    logger.info(message)


@dataclass
class Replicas:
    """Replicas ``a`` and ``b`` of one test, and what the API server saw them do."""

    plane: ControlPlane
    sim: GpuClusterSimulator
    namespace: str  # the test's (the device plugin's): quiet's markers go there
    since: datetime  # this test's start: audit events before it belong to other tests
    running: dict[str, RunningOperator]

    def writes(self, identity: str, *, after: datetime | None = None) -> list[AuditEvent]:
        start = after or self.since
        events = operator_writes(self.plane, user=USERS[identity])
        return sorted((e for e in events if received(e) >= start), key=received)

    def lease_wins(self, identity: str, *, after: datetime | None = None) -> list[AuditEvent]:
        """Successful Lease writes: acquisitions, renewals and (on shutdown) the release."""
        return [e for e in self.writes(identity, after=after) if is_lease(e) and succeeded(e)]

    async def holder(self) -> str:
        status, body = await self.sim.client.get(LEASE_PATH)
        if status != 200:
            return ""
        return str((body.get("spec") or {}).get("holderIdentity") or "")

    async def wait_holder(self, identity: str, *, timeout: float) -> None:
        await eventually(
            self.holder,
            until=lambda held: held == identity,
            timeout=timeout,
            interval=0.05,
            what=f"the Lease to be held by {identity}",
        )

    async def roles(self) -> tuple[str, str]:
        """(leader, follower), once one of the two holds the Lease."""
        leader = await eventually(
            self.holder,
            until=lambda held: held in self.running,
            timeout=LEASE_DURATION + 10,
            what="a leader",
        )
        follower = next(identity for identity in self.running if identity != leader)
        return leader, follower

    async def quiet(self, *identities: str) -> list[AuditEvent]:
        """Until the simulator is idle and the replicas named (all that run, by default) are
        quiet (``gpushare_testing.quiet``); the audit log up to then."""
        await self.sim.wait_idle()
        names = identities or tuple(i for i, r in self.running.items() if r.proc.poll() is None)
        chosen = [self.running[identity] for identity in names]
        return await quiet(self.plane, chosen, namespace=self.namespace)


def delete_lease(plane: ControlPlane) -> None:
    """Lease objects outlive tests (one control plane per session): start from none."""
    status, raw = plane.request("DELETE", LEASE_PATH)
    assert status in (200, 404), raw

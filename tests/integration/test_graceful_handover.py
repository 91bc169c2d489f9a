"""SIGTERM in the middle of a burst of writes: the old leader's last write lands before the new
leader's first.

Two replicas (users ``gpushare-a`` and ``gpushare-b``) at ``--write-qps 150``; a pool of 200 GPU
nodes and its policy give the leader ~600 writes to make, and it is sent SIGTERM once it is well
into them, with writes on the wire.  The API server's audit log says when each write was
received and when its answer was complete (``stageTimestamp`` at ResponseComplete): every write
of the old leader must be complete before its own Lease release is received, and before the new
leader's first write.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing.auditlog import (
    AuditEvent,
    completed,
    describe,
    is_lease,
    received,
    seconds,
    succeeded,
)
from gpushare_testing.replicas import TAKEOVER_AFTER_RELEASE, Replicas, report
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

# Enough nodes that the labels, creates and first statuses alone (3 writes a node) last about
# 4 s at this rate: the agents' reactions, which the rest of the writes wait for, are slower.
NODES = 200
# Fast enough that writes are always on the wire (16 in flight), slow enough that the burst
# outlasts the poll that decides when to send the signal.
WRITE_FLAGS = ("--write-qps", "150", "--write-burst", "16")


async def test_sigterm_during_a_burst_no_old_write_lands_after_the_new_leaders_first(
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: Callable[..., Awaitable[Replicas]],
) -> None:
    replicas = await start_replicas(*WRITE_FLAGS)
    leader, follower = await replicas.roles()
    pool = h.unique("burst")
    members = await sim.create_gpu_nodes(pool=pool, count=NODES, gpus=4)
    await h.add_policy(sim, policies, h.policy(h.unique("p"), pool=pool, replicas=4))

    def burst_writes() -> list[AuditEvent]:
        return [
            e
            for e in replicas.writes(leader)
            if not is_lease(e) and e["objectRef"].get("name") in members
        ]

    async def into_the_burst() -> int:
        return len(burst_writes())

    # Well into it: a third of the node writes made, the rest queued behind the token bucket.
    await eventually(into_the_burst, until=lambda n: n >= NODES, timeout=60, interval=0.05)
    stopping = replicas.running[leader]
    terminated_at = datetime.now(UTC)
    stopping.proc.send_signal(signal.SIGTERM)
    await replicas.wait_holder(follower, timeout=TAKEOVER_AFTER_RELEASE + 5)
    assert await stopping.exited() == 0
    for node in members:  # the new leader finishes the burst
        await h.wait_phase(sim, node, "Verified")

    old = [e for e in replicas.writes(leader) if not is_lease(e)]
    # The last Lease write after the signal is the release (it renews while it drains).
    release = replicas.lease_wins(leader, after=terminated_at)[-1]
    new = [e for e in replicas.writes(follower) if not is_lease(e)]
    first_new = received(new[0])
    last_old = max(completed(e) for e in old)
    in_flight = [e for e in old if completed(e) >= terminated_at]
    report(
        f"SIGTERM after {len(burst_writes())} of the burst's writes: {len(in_flight)} old "
        f"write(s) completed after the signal; the last old write completed "
        f"{seconds(last_old, terminated_at):.3f} s after it, the release was received "
        f"{seconds(received(release), terminated_at):.3f} s after it, the new leader's first "
        f"write {seconds(first_new, terminated_at):.3f} s after it ({len(new)} new writes)"
    )
    # Writes were on the wire at the signal: they were let finish...
    assert in_flight, "no write in flight at the signal: the burst ended too soon"
    # ...and nothing of the old leader's lands after its release, nor after the new leader's first.
    released = received(release)
    assert last_old <= released, describe([e for e in old if completed(e) > released])
    assert last_old <= first_new, describe([e for e in old if completed(e) > first_new])
    late = [
        e for e in replicas.writes(leader, after=released) if e["auditID"] != release["auditID"]
    ]
    assert late == [], describe(late)
    # And the burst was really cut in two: the new leader wrote some of the pool's nodes.
    assert {e["objectRef"].get("name") for e in new if succeeded(e)} & set(members)

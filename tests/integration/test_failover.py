"""Two operator replicas against the real API server: who leads, who writes, and failover.

Each test runs two ``python -m gpushare_operator run`` processes with distinct client
identities (users ``gpushare-a`` and ``gpushare-b``, Lease identities ``a`` and ``b``) next to
the GPU node simulator, and judges them by the API server's audit log: which user wrote which
object, and when (``requestReceivedTimestamp``) relative to the signal sent to the leader.

Lease timings are scaled down from the defaults (15 s / 10 s / 2 s) to keep the runtime short:
``--lease-duration 6 --renew-deadline 4 --retry-period 1``.  The invariants are the same.

Killing the leader "with pending work" freezes it (SIGSTOP) before the work is created and kills
it afterwards: a frozen process cannot write, so the work is certainly left to the follower, and
times are measured from the freeze, when the leader stopped renewing (the stricter reference).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import rolloutaudit
from gpushare_testing.auditlog import describe, is_lease, received, seconds, succeeded
from gpushare_testing.operators import OPERATOR_NAMESPACE
from gpushare_testing.replicas import (
    LEASE_DURATION,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    TAKEOVER_AFTER_RELEASE,
    Replicas,
    report,
)
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

StartReplicas = Callable[..., Awaitable[Replicas]]


@dataclass
class Fleet:
    """A pool of GPU nodes under one policy, and a spare node outside it."""

    pool: str
    policy: str
    members: list[str]
    spare: str


async def fleet(sim: GpuClusterSimulator, created: list[str]) -> Fleet:
    pool = h.unique("pool")
    members = await sim.create_gpu_nodes(pool=pool, count=2, gpus=4)
    [spare] = await sim.create_gpu_nodes(pool=h.unique("spare"), count=1, gpus=4)
    policy = h.unique("p")
    await h.add_policy(sim, created, h.policy(policy, pool=pool, replicas=4))
    return Fleet(pool=pool, policy=policy, members=members, spare=spare)


async def converged(sim: GpuClusterSimulator, f: Fleet) -> str:
    """Wait for every member Verified and the policy's status to say so; returns its key."""
    for node in f.members:
        await h.wait_phase(sim, node, "Verified")
    body = await eventually(
        lambda: h.get_policy(sim.client, f.policy),
        until=lambda b: (b.get("status") or {}).get("verifiedNodes") == len(f.members),
        what=f"{f.policy} to count its nodes verified",
    )
    return str(body["status"]["configKey"])


async def config_label(sim: GpuClusterSimulator, node: str) -> str | None:
    labels = (await h.node(sim.client, node))["metadata"].get("labels") or {}
    value = labels.get(h.CONFIG_LABEL)
    return None if value is None else str(value)


async def wait_label(
    sim: GpuClusterSimulator, node: str, value: str | None, *, timeout: float = 30
) -> None:
    await eventually(
        lambda: config_label(sim, node),
        until=lambda current: current == value,
        timeout=timeout,
        interval=0.05,
        what=f"{node}'s config label to be {value!r}",
    )


# -- the scenarios -------------------------------------------------------------------------------


async def test_only_the_leader_ever_writes(
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: StartReplicas,
) -> None:
    f = await fleet(sim, policies)
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    report(f"leader {leader}, follower {follower}")
    await converged(sim, f)

    # More work while both run: the policy changes and a node joins the pool.
    await h.patch_policy(sim.client, f.policy, {"replicas": 2})
    await sim.relabel(f.spare, {"pool": f.pool})
    for node in [*f.members, f.spare]:
        await h.wait_phase(sim, node, "Verified", replicas=2)
    await replicas.quiet(leader)

    assert await replicas.holder() == leader
    led = replicas.writes(leader)
    written = {e["objectRef"].get("resource") for e in led if succeeded(e)}
    assert {"configmaps", "nodes", "gpunodestates", "gpusharingpolicies", "leases"} <= written
    assert all(succeeded(e) for e in led if is_lease(e)), describe(led)
    followed = replicas.writes(follower)
    # At most a lost race to create the Lease (409); nothing else, and no Lease win.
    assert [e for e in followed if not is_lease(e) or succeeded(e)] == [], describe(followed)
    report(
        f"leader {leader} made {len([e for e in led if not is_lease(e)])} writes and "
        f"{len(led) - len([e for e in led if not is_lease(e)])} Lease writes; follower "
        f"{follower} made {len(followed)} write attempts (failed Lease creates only)"
    )


async def test_sigkill_follower_takes_over_and_finishes_pending_work(
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: StartReplicas,
) -> None:
    f = await fleet(sim, policies)
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    key = await converged(sim, f)
    await replicas.quiet(leader)
    dying = replicas.running[leader]

    frozen_at = datetime.now(UTC)
    dying.proc.send_signal(signal.SIGSTOP)
    try:
        # Pending work the leader will never do: a node joins the pool, another leaves it.
        await sim.relabel(f.spare, {"pool": f.pool})
        await sim.relabel(f.members[0], {"pool": h.unique("elsewhere")})
        dying.proc.send_signal(signal.SIGKILL)
        assert await dying.exited() == -signal.SIGKILL
    finally:
        dying.resume()

    await wait_label(sim, f.spare, key, timeout=LEASE_DURATION + 10)
    await wait_label(sim, f.members[0], None)
    await h.wait_phase(sim, f.spare, "Verified")
    await h.wait_phase(sim, f.members[0], "Unmanaged")

    [last_renewal] = replicas.lease_wins(leader)[-1:]
    takeover = replicas.lease_wins(follower)[0]
    taken = received(takeover)
    new_writes = replicas.writes(follower)
    label_writes = rolloutaudit.config_applies(
        [e for e in new_writes if succeeded(e)], (f.spare, f.members[0])
    )
    assert {e["objectRef"]["name"] for e in label_writes} == {f.spare, f.members[0]}
    finished = max(received(e) for e in label_writes)
    takeover_s, finished_s = seconds(taken, frozen_at), seconds(finished, frozen_at)
    report(
        f"SIGKILL: {follower} took the Lease {takeover_s:.2f} s after {leader} froze and wrote "
        f"the pending node labels {finished_s:.2f} s after (bound "
        f"{LEASE_DURATION + 2 * RETRY_PERIOD:g} s = lease + 2 retry periods)"
    )
    assert finished_s <= LEASE_DURATION + 2 * RETRY_PERIOD
    # No overlap: the Lease was taken only once it could have expired, and the dead leader's
    # writes all precede its last renewal's deadline.
    assert taken >= received(last_renewal) + timedelta(seconds=LEASE_DURATION)
    # A frozen process sends nothing; the API server may still receive, just after the
    # freeze, a request the leader sent just before it.  The leader was quiet, so such a
    # request can only be its periodic Lease renewal: at most one, and before the takeover.
    late = replicas.writes(leader, after=frozen_at)
    report(f"SIGKILL: {leader}'s requests received after the freeze: {describe(late)}")
    assert all(is_lease(e) for e in late) and len(late) <= 1, describe(late)
    assert all(received(e) < taken for e in replicas.writes(leader)), "the leaders overlapped"
    assert [e for e in new_writes if received(e) < taken and not is_lease(e)] == []


async def test_sigterm_releases_the_lease_and_the_follower_leads_at_once(
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: StartReplicas,
) -> None:
    f = await fleet(sim, policies)
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    key = await converged(sim, f)
    stopping = replicas.running[leader]

    await sim.relabel(f.spare, {"pool": f.pool})  # pending: done by whoever leads
    terminated_at = datetime.now(UTC)
    stopping.proc.send_signal(signal.SIGTERM)
    await replicas.wait_holder(follower, timeout=TAKEOVER_AFTER_RELEASE + 5)
    assert await stopping.exited() == 0
    assert "lease released" in stopping.logs()

    await wait_label(sim, f.spare, key)
    await h.wait_phase(sim, f.spare, "Verified")

    # The leaving leader's last Lease write is its release; it may renew while it drains.
    [*_, release] = replicas.lease_wins(leader, after=terminated_at)
    released = received(release)
    takeover = replicas.lease_wins(follower)[0]
    taken = received(takeover)
    report(
        f"SIGTERM: {leader} released the Lease {seconds(released, terminated_at):.2f} s after "
        f"the signal; {follower} took it {seconds(taken, terminated_at):.2f} s after the signal"
        f" (bound {TAKEOVER_AFTER_RELEASE:g} s)"
    )
    assert seconds(taken, terminated_at) <= TAKEOVER_AFTER_RELEASE
    assert released <= taken
    # Nothing written by the leaving leader after its release, nor by the follower before
    # it took over.
    late = [
        e for e in replicas.writes(leader, after=released) if e["auditID"] != release["auditID"]
    ]
    assert late == [], describe(late)
    early = [e for e in replicas.writes(follower) if received(e) < taken and not is_lease(e)]
    assert early == [], describe(early)


async def test_sigstop_past_the_lease_fences_the_old_leader(
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: StartReplicas,
) -> None:
    f = await fleet(sim, policies)
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    key = await converged(sim, f)
    await replicas.quiet(leader)
    frozen = replicas.running[leader]

    frozen_at = datetime.now(UTC)
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        await replicas.wait_holder(follower, timeout=LEASE_DURATION + 5)
        # Changes that need writes, while the old leader is frozen: its caches will hear of
        # them when it wakes, with its writer still believing, for a moment, that it leads.
        await sim.relabel(f.spare, {"pool": f.pool})
        await sim.relabel(f.members[0], {"pool": h.unique("elsewhere")})
        await wait_label(sim, f.spare, key)
        await wait_label(sim, f.members[0], None)
        pause = LEASE_DURATION + RETRY_PERIOD - seconds(datetime.now(UTC), frozen_at)
        await asyncio.sleep(max(0.0, pause))  # frozen for longer than the lease in any case
        continued_at = datetime.now(UTC)
        frozen.proc.send_signal(signal.SIGCONT)
        # And a change after it woke, with its informers running again.
        await sim.relabel(f.members[0], {"pool": f.pool})
        await wait_label(sim, f.members[0], key)

        # Within a few elector rounds the woken replica knows it follows; once both are quiet,
        # everything either wrote is in the audit log.
        async def rejoined() -> bool:
            lost = any(line.get("event") == "leadership lost" for line in frozen.log_lines())
            return lost and await frozen.leader_gauge() == 0

        await eventually(rejoined, timeout=3 * RETRY_PERIOD + 5, what=f"{leader} to follow")
        await replicas.quiet(leader, follower)
    finally:
        frozen.resume()

    [last_renewal] = [e for e in replicas.lease_wins(leader) if received(e) < frozen_at][-1:]
    taken = received(replicas.lease_wins(follower)[0])
    report(
        f"SIGSTOP: {leader} frozen for {seconds(continued_at, frozen_at):.2f} s "
        f"(lease {LEASE_DURATION:g} s); {follower} took the Lease "
        f"{seconds(taken, frozen_at):.2f} s after the freeze, "
        f"{seconds(taken, received(last_renewal)):.2f} s after {leader}'s last renewal"
    )
    # No overlap: the Lease changed hands only once the old leader's could have expired.
    assert taken >= received(last_renewal) + timedelta(seconds=LEASE_DURATION)
    # It rejoined as a follower: alive, the Lease stays with the other, and it says so.
    assert frozen.proc.poll() is None
    assert await replicas.holder() == follower
    assert await frozen.leader_gauge() == 0
    assert await replicas.running[follower].leader_gauge() == 1
    assert any(line.get("event") == "leadership lost" for line in frozen.log_lines())
    # The relabels were written by the new leader.
    new_writes = replicas.writes(follower, after=frozen_at)
    touched = {
        e["objectRef"].get("name")
        for e in new_writes
        if e["objectRef"].get("resource") == "nodes" and succeeded(e)
    }
    assert {f.spare, f.members[0]} <= touched
    # Fencing: its last renewal started before the freeze, so its renew deadline had passed by
    # this moment; from then on, at most a Lease attempt that lost (409), no write of any kind.
    fence = frozen_at + timedelta(seconds=RENEW_DEADLINE)
    after_fence = replicas.writes(leader, after=fence)
    report(f"SIGSTOP: {leader}'s write attempts after its renew deadline: {describe(after_fence)}")
    assert [e for e in after_fence if not is_lease(e) or succeeded(e)] == [], describe(after_fence)


async def test_resync_after_takeover_writes_nothing_when_the_cluster_matches(
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: StartReplicas,
) -> None:
    f = await fleet(sim, policies)
    await sim.relabel(f.spare, {"pool": f.pool})  # three managed nodes
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    await converged(sim, Fleet(f.pool, f.policy, [*f.members, f.spare], f.spare))
    await replicas.quiet(leader)

    terminated_at = datetime.now(UTC)
    replicas.running[leader].proc.send_signal(signal.SIGTERM)
    await replicas.wait_holder(follower, timeout=TAKEOVER_AFTER_RELEASE + 5)
    assert await replicas.running[leader].exited() == 0
    taken = received(replicas.lease_wins(follower)[0])
    # The resync runs at once on gaining leadership: everything it wrote is in the log by quiet.
    await replicas.quiet(follower)
    successor = replicas.running[follower]
    assert any(line.get("event") == "leadership acquired" for line in successor.log_lines())

    after = replicas.writes(follower, after=terminated_at)
    leadership_events = [
        e
        for e in after
        if e["objectRef"].get("resource") == "events"
        and e["objectRef"].get("namespace") == OPERATOR_NAMESPACE
    ]
    changes = [e for e in after if not is_lease(e) and e not in leadership_events]
    report(
        f"resync after takeover ({follower} leads {seconds(taken, terminated_at):.2f} s after "
        f"SIGTERM): {len(changes)} writes, {len(leadership_events)} leadership Event(s)"
    )
    assert changes == [], describe(changes)
    assert await successor.leader_gauge() == 1

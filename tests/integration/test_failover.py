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
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.simulator import GpuClusterSimulator
from tests.integration import helpers as h
from tests.integration.conftest import OPERATOR_NAMESPACE, OperatorFactory, RunningOperator
from tests.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

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
AuditEvent = dict[str, Any]


def report(message: str) -> None:
    """A measured figure: in the test's output (-s or on failure) and in the INFO log."""
    print(message)
    logger.info(message)


# -- the audit log -------------------------------------------------------------------------------


def received(event: AuditEvent) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"])


def code(event: AuditEvent) -> int:
    return int((event.get("responseStatus") or {}).get("code") or 0)


def succeeded(event: AuditEvent) -> bool:
    return 200 <= code(event) < 300


def is_lease(event: AuditEvent) -> bool:
    return bool(event["objectRef"].get("resource") == "leases")


def describe(events: list[AuditEvent]) -> list[str]:
    """One line per write, for assertion messages."""
    return [
        f"{e['requestReceivedTimestamp']} {e['verb']} {e['objectRef'].get('resource')}"
        f"/{e['objectRef'].get('name')}"
        f"{'/' + e['objectRef']['subresource'] if e['objectRef'].get('subresource') else ''}"
        f" in {e['objectRef'].get('namespace') or '-'}"
        f" -> {code(e)}"
        for e in events
    ]


def seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


# -- two replicas --------------------------------------------------------------------------------


@dataclass
class Replicas:
    """Replicas ``a`` and ``b`` of one test, and what the API server saw them do."""

    plane: ControlPlane
    sim: GpuClusterSimulator
    since: datetime  # this test's start: audit events before it belong to other tests
    running: dict[str, RunningOperator]

    def writes(self, identity: str, *, after: datetime | None = None) -> list[AuditEvent]:
        start = after or self.since
        events = h.operator_writes(self.plane, user=USERS[identity])
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


def delete_lease(plane: ControlPlane) -> None:
    """Lease objects outlive tests (one control plane per session): start from none."""
    status, raw = plane.request("DELETE", LEASE_PATH)
    assert status in (200, 404), raw


@pytest.fixture
def replicas_factory(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    start_operator: OperatorFactory,
) -> Callable[[], Awaitable[Replicas]]:
    async def start() -> Replicas:
        since = datetime.now(UTC)
        delete_lease(control_plane)
        running: dict[str, RunningOperator] = {}
        for identity, user in USERS.items():
            running[identity] = await start_operator(
                "--device-plugin-namespace",
                namespace,
                "--identity",
                identity,
                *TIMING_FLAGS,
                user=user,
                wait=False,
            )
        for operator in running.values():
            await operator.wait_synced()
        return Replicas(plane=control_plane, sim=sim, since=since, running=running)

    return start


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


def phase_of(state: dict[str, Any] | None) -> str | None:
    phase = (state or {}).get("status", {}).get("phase")
    return None if phase is None else str(phase)


async def wait_phase(
    sim: GpuClusterSimulator, node: str, phase: str, *, replicas: int | None = None
) -> None:
    def reached(state: dict[str, Any] | None) -> bool:
        if phase_of(state) != phase:
            return False
        return replicas is None or (state or {})["status"].get("replicas") == replicas

    await eventually(
        lambda: h.node_state(sim.client, node),
        until=reached,
        what=f"{node} to be {phase}" + ("" if replicas is None else f" with {replicas} replicas"),
    )


async def converged(sim: GpuClusterSimulator, f: Fleet) -> str:
    """Wait for every member Verified and the policy's status to say so; returns its key."""
    for node in f.members:
        await wait_phase(sim, node, "Verified")
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


async def settle(replicas: Replicas, identity: str, *, quiet: float = 2.0) -> None:
    """Until the simulator is idle and ``identity`` has written nothing for ``quiet`` seconds."""
    await replicas.sim.wait_idle()

    def changes() -> int:
        return len([e for e in replicas.writes(identity) if not is_lease(e)])

    deadline = time.monotonic() + 30
    count, changed = changes(), time.monotonic()
    while time.monotonic() - changed < quiet:
        assert time.monotonic() < deadline, "the leader never stopped writing"
        await asyncio.sleep(0.25)
        now = changes()
        if now != count:
            count, changed = now, time.monotonic()


async def exited(operator: RunningOperator, *, timeout: float = 30) -> int:
    """The exit code, waiting without blocking the event loop (the simulator runs on it)."""

    async def returncode() -> int | None:
        return operator.proc.poll()

    result = await eventually(
        returncode, until=lambda rc: rc is not None, timeout=timeout, what="the operator to exit"
    )
    assert result is not None
    return result


def resume(operator: RunningOperator) -> None:
    """SIGCONT a possibly frozen operator, so that nothing is left stopped behind a test."""
    if operator.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            operator.proc.send_signal(signal.SIGCONT)


async def leader_gauge(operator: RunningOperator) -> float:
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        text = await response.text()
    for family in text_string_to_metric_families(text):
        if family.name == "gpushare_leader":
            return float(family.samples[0].value)
    raise AssertionError(f"no gpushare_leader in /metrics:\n{text}")


# -- the scenarios -------------------------------------------------------------------------------


async def test_only_the_leader_ever_writes(
    sim: GpuClusterSimulator,
    policies: list[str],
    replicas_factory: Callable[[], Awaitable[Replicas]],
) -> None:
    f = await fleet(sim, policies)
    replicas = await replicas_factory()
    leader, follower = await replicas.roles()
    report(f"leader {leader}, follower {follower}")
    await converged(sim, f)

    # More work while both run: the policy changes and a node joins the pool.
    await h.patch_policy(sim.client, f.policy, {"replicas": 2})
    await sim.relabel(f.spare, {"pool": f.pool})
    for node in [*f.members, f.spare]:
        await wait_phase(sim, node, "Verified", replicas=2)
    await settle(replicas, leader)

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
    replicas_factory: Callable[[], Awaitable[Replicas]],
) -> None:
    f = await fleet(sim, policies)
    replicas = await replicas_factory()
    leader, follower = await replicas.roles()
    key = await converged(sim, f)
    await settle(replicas, leader, quiet=RETRY_PERIOD)
    dying = replicas.running[leader]

    frozen_at = datetime.now(UTC)
    dying.proc.send_signal(signal.SIGSTOP)
    try:
        # Pending work the leader will never do: a node joins the pool, another leaves it.
        await sim.relabel(f.spare, {"pool": f.pool})
        await sim.relabel(f.members[0], {"pool": h.unique("elsewhere")})
        dying.proc.send_signal(signal.SIGKILL)
        assert await exited(dying) == -signal.SIGKILL
    finally:
        resume(dying)

    await wait_label(sim, f.spare, key, timeout=LEASE_DURATION + 10)
    await wait_label(sim, f.members[0], None)
    await wait_phase(sim, f.spare, "Verified")
    await wait_phase(sim, f.members[0], "Unmanaged")

    [last_renewal] = replicas.lease_wins(leader)[-1:]
    takeover = replicas.lease_wins(follower)[0]
    taken = received(takeover)
    new_writes = replicas.writes(follower)
    label_writes = [
        e
        for e in new_writes
        if e["objectRef"].get("resource") == "nodes"
        and e["objectRef"].get("name") in (f.spare, f.members[0])
        and succeeded(e)
    ]
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
    assert replicas.writes(leader, after=frozen_at) == []
    assert [e for e in new_writes if received(e) < taken and not is_lease(e)] == []


async def test_sigterm_releases_the_lease_and_the_follower_leads_at_once(
    sim: GpuClusterSimulator,
    policies: list[str],
    replicas_factory: Callable[[], Awaitable[Replicas]],
) -> None:
    f = await fleet(sim, policies)
    replicas = await replicas_factory()
    leader, follower = await replicas.roles()
    key = await converged(sim, f)
    stopping = replicas.running[leader]

    await sim.relabel(f.spare, {"pool": f.pool})  # pending: done by whoever leads
    terminated_at = datetime.now(UTC)
    stopping.proc.send_signal(signal.SIGTERM)
    await replicas.wait_holder(follower, timeout=TAKEOVER_AFTER_RELEASE + 5)
    assert await exited(stopping) == 0
    assert "lease released" in stopping.logs()

    await wait_label(sim, f.spare, key)
    await wait_phase(sim, f.spare, "Verified")

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
    replicas_factory: Callable[[], Awaitable[Replicas]],
) -> None:
    f = await fleet(sim, policies)
    replicas = await replicas_factory()
    leader, follower = await replicas.roles()
    key = await converged(sim, f)
    await settle(replicas, leader, quiet=RETRY_PERIOD)
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
        await asyncio.sleep(3 * RETRY_PERIOD)  # a few elector rounds of the woken replica
    finally:
        resume(frozen)

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
    assert await leader_gauge(frozen) == 0
    assert await leader_gauge(replicas.running[follower]) == 1
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
    replicas_factory: Callable[[], Awaitable[Replicas]],
) -> None:
    f = await fleet(sim, policies)
    await sim.relabel(f.spare, {"pool": f.pool})  # three managed nodes
    replicas = await replicas_factory()
    leader, follower = await replicas.roles()
    await converged(sim, Fleet(f.pool, f.policy, [*f.members, f.spare], f.spare))
    await settle(replicas, leader)

    terminated_at = datetime.now(UTC)
    replicas.running[leader].proc.send_signal(signal.SIGTERM)
    await replicas.wait_holder(follower, timeout=TAKEOVER_AFTER_RELEASE + 5)
    assert await exited(replicas.running[leader]) == 0
    taken = received(replicas.lease_wins(follower)[0])
    # The resync runs at once on gaining leadership: give it well over what it needs.
    await asyncio.sleep(3 * RETRY_PERIOD)
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
    assert await leader_gauge(successor) == 1

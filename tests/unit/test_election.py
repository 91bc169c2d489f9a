"""Lease election logic against an in-memory API: CAS, expiry on our clock, fencing, release,
and the election thread: renewals on their own loop, whatever the main loop is doing."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from gpushare_operator.kube import election, http
from gpushare_operator.kube.election import LeaseElector, LeaseTimings
from gpushare_testing.builders import Clock
from gpushare_testing.fakeapi import FakeApi
from gpushare_testing.waiting import eventually

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/gpushare-operator"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(http, "request", fake.request)
    return fake


class NoClient:
    """Stands in for the elector's ApiClient: the fake request ignores it; only close() runs."""

    closed = False

    async def close(self) -> None:
        self.closed = True


def no_client() -> client.ApiClient:
    return cast(client.ApiClient, NoClient())


def elector(identity: str, clock: Clock) -> LeaseElector:
    e = LeaseElector(
        connect=no_client,
        namespace="ops",
        name="gpushare-operator",
        identity=identity,
        timings=LeaseTimings(lease_duration=15, renew_deadline=10, retry_period=2),
        clock=clock,
    )
    e._api = no_client()  # what the election thread does first; these tests call one round
    return e


def test_timings_must_nest() -> None:
    with pytest.raises(ValueError, match="retry-period < renew-deadline < lease-duration"):
        LeaseTimings(lease_duration=10, renew_deadline=10, retry_period=2)


async def test_first_comer_creates_and_leads(api: FakeApi) -> None:
    clock = Clock(100.0)
    a, b = elector("a", clock), elector("b", clock)
    await a._try_acquire_or_renew(clock())
    await b._try_acquire_or_renew(clock())
    assert a.is_leader()
    assert not b.is_leader()
    assert api.objects[LEASE]["spec"]["holderIdentity"] == "a"


async def test_gate_closes_at_the_renew_deadline_before_the_lease_expires(api: FakeApi) -> None:
    clock = Clock(100.0)
    a, b = elector("a", clock), elector("b", clock)
    await a._try_acquire_or_renew(clock())
    await b._try_acquire_or_renew(clock())  # b first sees a's record now
    clock.now += 10.01  # a could not renew (stopped, partitioned): its own gate is shut...
    assert not a.is_leader()
    await b._try_acquire_or_renew(clock())  # ...while b must still wait for the lease to lapse
    assert not b.is_leader()
    clock.now += 5
    await b._try_acquire_or_renew(clock())
    assert b.is_leader()
    spec = api.objects[LEASE]["spec"]
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1


async def test_expiry_is_judged_on_our_clock_from_the_last_change_we_saw(api: FakeApi) -> None:
    clock = Clock(100.0)
    a, b = elector("a", clock), elector("b", clock)
    await a._try_acquire_or_renew(clock())
    for _ in range(10):  # a renews every 2 s for 20 s; b never sees the lease go stale
        clock.now += 2
        await a._try_acquire_or_renew(clock())
        await b._try_acquire_or_renew(clock())
        assert a.is_leader()
        assert not b.is_leader()


async def test_concurrent_takeover_has_one_winner(api: FakeApi) -> None:
    clock = Clock(100.0)
    a = elector("a", clock)
    await a._try_acquire_or_renew(clock())
    b, c = elector("b", clock), elector("c", clock)
    await b._try_acquire_or_renew(clock())
    await c._try_acquire_or_renew(clock())
    clock.now += 16
    # Both read the expired lease, then both write: the second PUT carries a stale version.
    b_view, c_view = await b._read(), await c._read()
    assert b_view is not None
    assert c_view is not None
    assert b._expired(b_view["spec"])
    assert c._expired(c_view["spec"])
    await b._try_acquire_or_renew(clock())
    stale = dict(c_view, spec=c._spec(c_view["spec"]))
    with pytest.raises(http.ApiError) as conflict:
        await http.request(None, method="PUT", path=LEASE, body=stale)  # type: ignore[arg-type]
    assert conflict.value.status == 409
    assert api.objects[LEASE]["spec"]["holderIdentity"] == "b"


async def test_release_hands_the_lease_over_at_once(api: FakeApi) -> None:
    clock = Clock(100.0)
    a, b = elector("a", clock), elector("b", clock)
    await a._try_acquire_or_renew(clock())
    await b._try_acquire_or_renew(clock())
    a._stopping = True
    await a._release()
    assert not a.is_leader()
    assert api.objects[LEASE]["spec"]["holderIdentity"] == ""
    await b._try_acquire_or_renew(clock())  # no waiting out the lease
    assert b.is_leader()


async def test_api_errors_do_not_make_a_leader(api: FakeApi) -> None:
    clock = Clock(100.0)
    a = elector("a", clock)
    api.fail_with = 500
    with pytest.raises(http.ApiError):
        await a._try_acquire_or_renew(clock())
    assert not a.is_leader()
    assert election.LeaseTimings().lease_duration == 15


async def test_a_leader_renews_with_one_request(api: FakeApi) -> None:
    clock = Clock(100.0)
    a = elector("a", clock)
    await a._try_acquire_or_renew(clock())
    api.calls.clear()
    clock.now += 2
    await a._try_acquire_or_renew(clock())
    assert api.calls == [("PUT", LEASE)]  # from the copy it wrote last: no GET first
    assert a.is_leader()


async def test_a_lost_race_on_the_fast_path_falls_back_to_reading(api: FakeApi) -> None:
    clock = Clock(100.0)
    a = elector("a", clock)
    await a._try_acquire_or_renew(clock())
    api.objects[LEASE]["metadata"]["resourceVersion"] = "changed"  # someone wrote meanwhile
    api.calls.clear()
    clock.now += 2
    await a._try_acquire_or_renew(clock())
    assert api.calls == [("PUT", LEASE), ("GET", LEASE), ("PUT", LEASE)]
    assert a.is_leader()


class TimedApi(FakeApi):
    """The fake API, noting when each Lease write landed and each request's timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed: list[float] = []
        self.timeouts: list[float] = []

    async def request(
        self, api: object, *, method: str, path: str, body: Any = None, **kw: Any
    ) -> Any:
        self.timeouts.append(float(kw["timeout"]))
        result = await super().request(api, method=method, path=path, body=body)
        if method in ("PUT", "POST"):
            self.renewed.append(time.monotonic())
        return result


FAST = LeaseTimings(lease_duration=3, renew_deadline=2, retry_period=0.1)


def live(identity: str, **kw: Any) -> LeaseElector:
    return LeaseElector(
        connect=no_client, namespace="ops", name="gpushare-operator", identity=identity, **kw
    )


async def test_renewals_keep_their_period_while_the_main_loop_is_blocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = TimedApi()
    monkeypatch.setattr(http, "request", fake.request)
    a = live("a", timings=FAST)
    task = asyncio.create_task(a.run())
    try:
        await asyncio.wait_for(a.wait_leader(), timeout=5)
        blocked_at = time.monotonic()
        # One long synchronous step on the main loop (a re-list page decoded, a rollout
        # planned): longer than the renew deadline.  Renewals happen in the election thread.
        time.sleep(FAST.renew_deadline + 0.5)  # noqa: ASYNC251 - blocking the loop is the point
        unblocked_at = time.monotonic()
        assert a.is_leader()
        during = [t for t in fake.renewed if blocked_at <= t <= unblocked_at]
        gaps = [b - a_ for a_, b in itertools.pairwise(during)]
        assert len(during) >= 10, during
        assert max(gaps) < 4 * FAST.retry_period, gaps
    finally:
        await a.stop(release=True)
        await task
    assert fake.objects[LEASE]["spec"]["holderIdentity"] == ""  # released on the way out
    assert max(fake.timeouts) <= FAST.request_timeout


async def test_a_cancelled_elector_stops_renewing_and_keeps_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = TimedApi()
    monkeypatch.setattr(http, "request", fake.request)
    a = live("a", timings=FAST)
    task = asyncio.create_task(a.run())
    await asyncio.wait_for(a.wait_leader(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    count = len(fake.renewed)
    await asyncio.sleep(3 * FAST.retry_period)
    assert len(fake.renewed) == count  # the thread is gone
    assert not a.is_leader()
    assert fake.objects[LEASE]["spec"]["holderIdentity"] == "a"  # not released: it runs out


async def test_leadership_changes_are_announced_on_the_main_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = TimedApi()
    monkeypatch.setattr(http, "request", fake.request)
    seen: list[tuple[bool, bool]] = []
    main = asyncio.get_running_loop()

    async def on_change(leader: bool) -> None:
        seen.append((leader, asyncio.get_running_loop() is main))

    a = live("a", timings=FAST, on_change=on_change)
    task = asyncio.create_task(a.run())
    try:

        async def announced() -> list[tuple[bool, bool]]:
            return seen

        await eventually(announced, timeout=5, what="the leadership announcement")
        assert seen == [(True, True)]
        assert a.transitions == 1
    finally:
        await a.stop(release=False)
        await task


async def test_stop_before_run_never_elects(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = TimedApi()
    monkeypatch.setattr(http, "request", fake.request)
    a = live("a", timings=FAST)
    await a.stop(release=True)  # stopped before its caches synced
    assert fake.calls == []
    assert not a.is_leader()

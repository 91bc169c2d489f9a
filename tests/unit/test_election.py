"""Lease election logic against an in-memory API: CAS, expiry on our clock, fencing, release."""

from __future__ import annotations

import pytest

from gpushare_operator.kube import election, http
from gpushare_operator.kube.election import LeaseElector, LeaseTimings
from tests.unit.fakeapi import FakeApi

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/gpushare-operator"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(http, "request", fake.request)
    return fake


def elector(identity: str, clock: Clock) -> LeaseElector:
    return LeaseElector(
        api=None,  # type: ignore[arg-type]  # the fake request ignores it
        namespace="ops",
        name="gpushare-operator",
        identity=identity,
        timings=LeaseTimings(lease_duration=15, renew_deadline=10, retry_period=2),
        clock=clock,
    )


def test_timings_must_nest() -> None:
    with pytest.raises(ValueError, match="retry-period < renew-deadline < lease-duration"):
        LeaseTimings(lease_duration=10, renew_deadline=10, retry_period=2)


async def test_first_comer_creates_and_leads(api: FakeApi) -> None:
    clock = Clock()
    a, b = elector("a", clock), elector("b", clock)
    await a._try_acquire_or_renew(clock())
    await b._try_acquire_or_renew(clock())
    assert a.is_leader()
    assert not b.is_leader()
    assert api.objects[LEASE]["spec"]["holderIdentity"] == "a"


async def test_gate_closes_at_the_renew_deadline_before_the_lease_expires(api: FakeApi) -> None:
    clock = Clock()
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
    clock = Clock()
    a, b = elector("a", clock), elector("b", clock)
    await a._try_acquire_or_renew(clock())
    for _ in range(10):  # a renews every 2 s for 20 s; b never sees the lease go stale
        clock.now += 2
        await a._try_acquire_or_renew(clock())
        await b._try_acquire_or_renew(clock())
        assert a.is_leader()
        assert not b.is_leader()


async def test_concurrent_takeover_has_one_winner(api: FakeApi) -> None:
    clock = Clock()
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
    clock = Clock()
    a, b = elector("a", clock), elector("b", clock)
    await a._try_acquire_or_renew(clock())
    await b._try_acquire_or_renew(clock())
    await a.release()
    assert not a.is_leader()
    assert api.objects[LEASE]["spec"]["holderIdentity"] == ""
    await b._try_acquire_or_renew(clock())  # no waiting out the lease
    assert b.is_leader()


async def test_api_errors_do_not_make_a_leader(api: FakeApi) -> None:
    clock = Clock()
    a = elector("a", clock)
    api.fail_with = 500
    with pytest.raises(http.ApiError):
        await a._try_acquire_or_renew(clock())
    assert not a.is_leader()
    assert election.LeaseTimings().lease_duration == 15

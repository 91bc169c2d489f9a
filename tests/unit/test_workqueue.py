"""The work queue's contract, point by point, on a fake clock."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core.workqueue import CONFIG_KEY, NODE, POLICY, WorkQueue
from gpushare_testing import writepath
from gpushare_testing.builders import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock(100.0)


@pytest.fixture
def queue(clock: Clock) -> WorkQueue:
    return WorkQueue(clock=clock, rng=random.Random(7))


def test_a_key_is_queued_once_however_often_it_is_marked(queue: WorkQueue) -> None:
    for _ in range(5):
        queue.node("a")
    queue.node("b")
    assert len(queue) == 2
    assert [queue.get(NODE), queue.get(NODE), queue.get(NODE)] == ["a", "b", None]


def test_a_key_being_processed_is_not_handed_out_again(queue: WorkQueue) -> None:
    queue.node("a")
    assert queue.get(NODE) == "a"
    queue.node("a")  # dirty again while its write is out
    assert queue.get(NODE) is None
    assert queue.pending((NODE, "a"))
    queue.done((NODE, "a"))
    assert queue.get(NODE) == "a"  # handed back, not lost
    queue.done((NODE, "a"))
    assert queue.get(NODE) is None and not queue.pending((NODE, "a"))


def test_kinds_are_taken_separately_first_marked_first(queue: WorkQueue) -> None:
    queue.policy("p")
    queue.node("b")
    queue.config()
    queue.node("a")
    assert queue.get(POLICY) == "p"
    assert queue.get("config") == ""
    assert [queue.get(NODE), queue.get(NODE)] == ["b", "a"]
    assert queue.pending(CONFIG_KEY)


def test_a_delayed_add_comes_due_and_an_earlier_timer_wins(queue: WorkQueue, clock: Clock) -> None:
    queue.add_after((NODE, "a"), 10)
    queue.add_after((NODE, "a"), 30)  # a later deadline for the same key: ignored
    queue.add_after((NODE, "a"), 5)  # an earlier one wins
    assert queue.next_due() == 105
    assert queue.get(NODE) is None
    clock.now += 5
    assert queue.next_due() is None  # the superseded 10 s and 30 s entries are gone too
    assert queue.get(NODE) == "a"


def test_a_timer_for_a_key_in_flight_queues_it_after_done(queue: WorkQueue, clock: Clock) -> None:
    queue.node("a")
    assert queue.get(NODE) == "a"
    queue.add_after((NODE, "a"), 1)
    clock.now += 1
    queue.next_due()
    assert queue.get(NODE) is None
    queue.done((NODE, "a"))
    assert queue.get(NODE) == "a"


def test_back_off_grows_with_jitter_and_resets_on_success(queue: WorkQueue) -> None:
    key = (NODE, "a")
    delays = [queue.failed(key) for _ in range(20)]
    for failures, delay in enumerate(delays):
        assert queue.base <= delay <= min(queue.cap, queue.base * 2**failures) or (
            failures == 0 and delay == queue.base
        )
    assert max(delays[-5:]) > 100 * max(delays[:3])  # grows by orders of magnitude
    assert queue.failures(key) == 20
    queue.succeeded(key)
    assert queue.failures(key) == 0
    assert queue.failed(key) <= queue.base


@given(st.integers(min_value=0, max_value=40), st.integers(min_value=0, max_value=2**32))
def test_back_off_stays_within_its_bounds(failures: int, seed: int) -> None:
    queue = WorkQueue(clock=lambda: 0.0, rng=random.Random(seed))
    key = (NODE, "a")
    for _ in range(failures):
        queue.failed(key)
    delay = queue.failed(key)
    assert queue.base <= delay <= max(queue.base, min(queue.cap, queue.base * 2**failures))


def test_the_cap_holds(queue: WorkQueue) -> None:
    key = (NODE, "a")
    for _ in range(100):
        assert queue.failed(key) <= queue.cap


def test_waiting_since_is_the_first_mark_until_done(queue: WorkQueue, clock: Clock) -> None:
    key = (POLICY, "p")
    queue.add(key)
    clock.now += 3
    queue.add(key)
    assert queue.waiting_since(key) == 100
    assert queue.get(POLICY) == "p"
    queue.done(key)
    assert queue.waiting_since(key) is None


def test_forget_drops_everything_about_a_key(queue: WorkQueue) -> None:
    key = (NODE, "gone")
    queue.add(key)
    queue.failed(key)
    queue.add_after(key, 50)
    queue.forget(key)
    assert not queue.pending(key)
    assert queue.sizes() == {
        "queued": 0,
        "processing": 0,
        "again": 0,
        "timers": 0,
        "failures": 0,
        "since": 0,
    }


def test_marking_wakes_the_writer(queue: WorkQueue) -> None:
    woken = []
    queue.set_waker(lambda: woken.append(1))
    queue.node("a")
    queue.add_after((NODE, "b"), 1)
    assert len(woken) == 2


def test_keys_put_first_come_out_before_those_marked_earlier(queue: WorkQueue) -> None:
    queue.many_nodes(["a", "b", "c"])
    queue.first(NODE, ["c", "d"])
    assert writepath.take_nodes(queue) == ["c", "d", "a", "b"]
    assert queue.get(NODE) is None


def test_a_key_marked_during_its_own_write_waits_anew_from_then(
    queue: WorkQueue, clock: Clock
) -> None:
    queue.policy("p")
    assert queue.get(POLICY) == "p"
    clock.now += 60  # a long hold, then its write
    queue.policy("p")  # marked again while being written
    queue.done((POLICY, "p"))
    assert queue.waiting_since((POLICY, "p")) == clock.now  # not the old mark: no rush

"""Jittered back-off and Retry-After: the delays an informer waits before listing again."""

from __future__ import annotations

import itertools

import pytest

from gpushare_operator.kube.backoff import Backoff, retry_after_seconds
from gpushare_testing.builders import Clock


def test_delays_double_up_to_the_cap_and_are_stretched_by_the_jitter() -> None:
    clock = Clock(0.0)
    backoff = Backoff(initial=0.2, cap=3.0, jitter=0.5, clock=clock, rng=lambda: 1.0)
    delays = []
    for _ in range(7):
        delays.append(backoff.next())
        clock.now += 0.1
    assert delays == pytest.approx([0.3, 0.6, 1.2, 2.4, 3.0, 3.0, 3.0])


def test_jitter_spreads_delays_between_base_and_base_plus_jitter() -> None:
    randoms = itertools.cycle([0.0, 0.5, 0.999])
    delays = [Backoff(initial=1.0, jitter=0.5, rng=lambda: next(randoms)).next() for _ in range(3)]
    assert delays == pytest.approx([1.0, 1.25, 1.4995])


def test_the_sequence_starts_over_only_after_a_quiet_spell() -> None:
    clock = Clock(0.0)
    backoff = Backoff(initial=0.2, cap=30.0, jitter=0.0, reset_after=60.0, clock=clock)
    assert [backoff.next() for _ in range(3)] == pytest.approx([0.2, 0.4, 0.8])
    clock.now += 59.0  # failing again within the spell: keeps growing
    assert backoff.next() == pytest.approx(1.6)
    clock.now += 61.0
    assert backoff.next() == pytest.approx(0.2)


def test_retry_after_is_a_floor_even_above_the_cap() -> None:
    backoff = Backoff(initial=0.2, cap=1.0, jitter=0.5, rng=lambda: 0.5)
    assert backoff.next(retry_after=7.0) == pytest.approx(7.35)  # 7 s, plus up to 10 % spread
    assert backoff.next(retry_after=0.0) == pytest.approx(0.5)  # own delay when it is longer


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"Retry-After": " 1.5 "}, 1.5),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),  # never sent by kube
        ({"Retry-After": "-1"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_retry_after_header(headers: dict[str, str] | None, seconds: float | None) -> None:
    assert retry_after_seconds(headers) == seconds

"""Which policy governs a node: priority first, then the name that sorts first."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core.resolution import losers, rank_key, ranked, winner


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    priority: int


def test_no_candidates_no_winner() -> None:
    assert winner([]) is None
    assert losers([]) == []
    assert ranked(iter(())) == []


def test_single_candidate_wins_alone() -> None:
    only = Policy("inference", 0)
    assert winner([only]) is only
    assert losers([only]) == []


def test_highest_priority_wins() -> None:
    low, high = Policy("a-low", 1), Policy("z-high", 100)
    assert winner([low, high]) is high
    assert winner([high, low]) is high
    assert losers([low, high]) == [low]


def test_negative_priorities_rank_below_zero() -> None:
    below, zero = Policy("a", -5), Policy("b", 0)
    assert winner([below, zero]) is zero


def test_ties_go_to_the_name_that_sorts_first() -> None:
    batch, inference = Policy("batch", 10), Policy("inference", 10)
    assert winner([inference, batch]) is batch
    assert losers([inference, batch]) == [inference]


def test_losers_are_strongest_first() -> None:
    policies = [Policy("c", 1), Policy("a", 5), Policy("b", 5), Policy("d", 9)]
    assert [p.name for p in ranked(policies)] == ["d", "a", "b", "c"]
    assert [p.name for p in losers(policies)] == ["a", "b", "c"]


def test_rank_key() -> None:
    assert rank_key(Policy("x", 7)) == (-7, "x")
    assert rank_key(Policy("a", 7)) < rank_key(Policy("b", 7)) < rank_key(Policy("a", 6))


def test_winner_accepts_any_iterable_once() -> None:
    policies = (Policy(name, priority) for name, priority in [("b", 1), ("a", 1)])
    found = winner(policies)
    assert found is not None
    assert found.name == "a"


unique_policies = st.lists(
    st.builds(Policy, name=st.text("abcxyz-", min_size=1, max_size=6), priority=st.integers(-3, 3)),
    unique_by=lambda p: p.name,
    max_size=12,
)


@given(unique_policies, st.randoms(use_true_random=False))
def test_winner_does_not_depend_on_order(policies: list[Policy], rng: random.Random) -> None:
    shuffled = list(policies)
    rng.shuffle(shuffled)
    assert winner(shuffled) == winner(policies)
    assert losers(shuffled) == losers(policies)


@given(unique_policies)
def test_winner_outranks_every_loser(policies: list[Policy]) -> None:
    found = winner(policies)
    if not policies:
        assert found is None
        return
    assert found is not None
    rest = losers(policies)
    assert sorted([found, *rest], key=lambda p: p.name) == sorted(policies, key=lambda p: p.name)
    for loser in rest:
        assert found.priority > loser.priority or (
            found.priority == loser.priority and found.name < loser.name
        )

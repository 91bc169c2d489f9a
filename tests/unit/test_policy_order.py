"""Policies only move forward, whichever of kopf's watch and our own lists delivers first.

Every interleaving of a list answer (taken before a change) with the watch event of that change
is played against the cache: a deleted policy never comes back, and an older generation never
replaces a newer one.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_operator.cache.cluster import TOMBSTONE_SECONDS, ClusterCache
from gpushare_testing.builders import Clock, policy


def versioned(body: dict[str, Any], *, version: int, generation: int = 1) -> dict[str, Any]:
    metadata = {**body["metadata"], "resourceVersion": str(version), "generation": generation}
    return {**body, "metadata": metadata}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> ClusterCache:
    return ClusterCache(clock=clock)


def test_a_list_answered_before_a_delete_does_not_resurrect(cache: ClusterCache) -> None:
    listed = versioned(policy("p"), version=10)
    cache.upsert_policy(listed)
    cache.delete_policy("p", uid="uid-p")  # kopf's DELETED, applied first
    cache.upsert_policy(listed)  # then the stale list's item
    assert "p" not in cache.policies


def test_a_delete_after_the_list_removes_it(cache: ClusterCache) -> None:
    listed = versioned(policy("p"), version=10)
    cache.upsert_policy(listed)  # the list first
    cache.delete_policy("p", uid="uid-p")  # then the watch's DELETED
    assert "p" not in cache.policies


def test_a_recreated_policy_of_the_same_name_is_a_new_object(cache: ClusterCache) -> None:
    cache.upsert_policy(versioned(policy("p"), version=10))
    cache.delete_policy("p", uid="uid-p")
    again = versioned(policy("p"), version=20)
    again["metadata"]["uid"] = "uid-p-2"
    cache.upsert_policy(again)
    assert cache.policies["p"].uid == "uid-p-2"
    cache.delete_policy("p", uid="uid-p")  # a late DELETED of the first incarnation
    assert cache.policies["p"].uid == "uid-p-2"


@pytest.mark.parametrize("list_first", [True, False], ids=["list-then-watch", "watch-then-list"])
def test_an_older_generation_never_replaces_a_newer(cache: ClusterCache, list_first: bool) -> None:
    old = versioned(policy("p", replicas=2), version=10, generation=1)
    new = versioned(policy("p", replicas=8), version=11, generation=2)
    for body in (old, new) if list_first else (new, old):
        cache.upsert_policy(body)
    held = cache.policies["p"]
    assert (held.generation, held.replicas) == (2, 8)


def test_an_older_status_only_echo_is_ignored(cache: ClusterCache) -> None:
    cache.upsert_policy(versioned(policy("p"), version=10))
    newer = versioned(policy("p"), version=12)
    newer["status"] = {"matchedNodes": 3}
    cache.upsert_policy(newer)
    stale = versioned(policy("p"), version=11)
    stale["status"] = {"matchedNodes": 1}
    cache.upsert_policy(stale)
    assert cache.policy_status["p"] == {"matchedNodes": 3}


def test_tombstones_are_forgotten_once_no_list_can_be_that_old(
    cache: ClusterCache, clock: Clock
) -> None:
    cache.upsert_policy(versioned(policy("p"), version=10))
    cache.delete_policy("p", uid="uid-p")
    clock.now += TOMBSTONE_SECONDS / 2
    cache.upsert_policy(versioned(policy("q"), version=11))
    cache.delete_policy("q", uid="uid-q")
    clock.now += TOMBSTONE_SECONDS / 2 + 1
    cache.expire_tombstones()
    assert set(cache.deleted_policies) == {"uid-q"}

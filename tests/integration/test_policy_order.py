"""Policies only move forward, with objects and versions from the real API server.

A list of policies is taken, then the policy is edited (a new generation) or deleted through
the API; the list answer and the watch event of the change then reach the cache in both orders.
The versions, uids and generations are the API server's own, so the cache's rules are checked
against what a real list and a real watch carry, not against numbers a test made up.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_testing import apiobjects as h
from gpushare_testing.simulator import GpuClusterSimulator

pytestmark = pytest.mark.usefixtures("crds_installed")

POLICIES = f"{h.API}/gpusharingpolicies"


async def _listed(sim: GpuClusterSimulator, name: str) -> dict[str, Any]:
    """The policy as a list answer carries it (the list taken now, delivered later)."""
    body = await h.ok(sim.client, "GET", POLICIES)
    [item] = [i for i in body["items"] if i["metadata"]["name"] == name]
    return dict(item)


async def _watched(sim: GpuClusterSimulator, name: str, *, since: str) -> dict[str, Any]:
    """The next watch event about the policy after ``since``: what kopf would hand us."""
    params = {"resourceVersion": since, "fieldSelector": f"metadata.name={name}"}
    async with contextlib.aclosing(sim.client.watch(POLICIES, params=params)) as events:
        async for event in events:
            if event.get("type") in ("MODIFIED", "DELETED"):
                return dict(event)
    raise AssertionError("the watch ended without the change")


def _deliver(cache: ClusterCache, event: dict[str, Any]) -> None:
    obj = event["object"]
    if event["type"] == "DELETED":
        cache.delete_policy(obj["metadata"]["name"], uid=obj["metadata"]["uid"])
    else:
        cache.upsert_policy(obj)


@pytest.mark.parametrize("list_last", [True, False], ids=["watch-then-list", "list-then-watch"])
async def test_a_stale_list_never_resurrects_a_deleted_policy(
    sim: GpuClusterSimulator, list_last: bool
) -> None:
    name = h.unique("gone")
    created = await h.create_policy(sim.client, h.policy(name, pool=h.unique("pool")))
    listed = await _listed(sim, name)
    await h.delete_policy(sim.client, name)
    deleted = await _watched(sim, name, since=created["metadata"]["resourceVersion"])
    assert deleted["type"] == "DELETED"

    cache = ClusterCache()
    cache.upsert_policy(created)  # what the cache held before
    for step in [deleted, listed] if list_last else [listed, deleted]:
        if "type" in step:
            _deliver(cache, step)
        else:
            cache.upsert_policy(step)
    assert name not in cache.policies


@pytest.mark.parametrize("list_last", [True, False], ids=["watch-then-list", "list-then-watch"])
async def test_a_stale_list_never_rolls_a_policy_back(
    sim: GpuClusterSimulator, policies: list[str], list_last: bool
) -> None:
    name = h.unique("edited")
    await h.add_policy(sim, policies, h.policy(name, pool=h.unique("pool"), replicas=2))
    listed = await _listed(sim, name)
    await h.patch_policy(sim.client, name, {"replicas": 8})
    modified = await _watched(sim, name, since=listed["metadata"]["resourceVersion"])
    assert modified["object"]["metadata"]["generation"] == 2

    cache = ClusterCache()
    for step in [modified, listed] if list_last else [listed, modified]:
        if "type" in step:
            _deliver(cache, step)
        else:
            cache.upsert_policy(step)
    held = cache.policies[name]
    assert (held.generation, held.replicas) == (2, 8)

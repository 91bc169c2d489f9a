"""One replica's write path over a cache, with no API: each write a plan makes is played back
as the watch event it would cause (a label write as the Node's next version, GFD's confirmation
as another).  A new ``leader`` over the same cache is a failover: nothing of the last survives."""

from __future__ import annotations

import datetime
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.plans import NodePlan
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, node, on
from gpushare_testing.writepath import PlanningLoop

TIMINGS = Timings(propagation_delay=1, key_grace_period=300, mismatch_timeout=60)
EPOCH = 1_800_000_000.0


def leader(cache: ClusterCache, *, budget: int | str = "100%") -> PlanningLoop:
    """A replica's write path over the same cache: a new one is a new leader.  Its wall clock
    follows the cache's, so that times it publishes read back as they would."""

    def wall() -> str:
        return datetime.datetime.fromtimestamp(cache.wallclock(), datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    reconciler = Reconciler(
        cache, timings=TIMINGS, max_unavailable=budget, wallclock=wall, epoch=cache.wallclock
    )
    return PlanningLoop(reconciler)


def changed(loop: PlanningLoop, clock: Clock, rounds: int = 3) -> list[str]:
    """Some write-loop rounds; the label writes each round plans are played back as written
    (the node now names its new key; GFD has not confirmed it)."""
    out: list[str] = []
    for _ in range(rounds):
        for plan in loop.plan_queued_nodes():
            if plan.labels is not None:
                if config_change(plan):
                    out.append(plan.name)
                labelled(loop.cache, plan.name, plan.labels)
        clock.now += 1
        loop.due()
    return out


def config_change(plan: NodePlan) -> bool:
    """Whether the plan's label write changes the node's config (or releases it), rather than
    only its slot labels, which a Verified node gains with no change of config."""
    decision = plan.facts.decision
    return decision is not None and decision.labels is not None


def labelled(cache: ClusterCache, name: str, labels: dict[str, str | None]) -> None:
    record = cache.nodes[name]
    body = node(name, **{k: v for k, v in record.labels.items() if k not in labels})
    body["metadata"]["labels"].update({k: v for k, v in labels.items() if v is not None})
    body["status"]["allocatable"] = dict(record.allocatable) | {"cpu": "8"}
    body["status"]["capacity"] = dict(record.allocatable)
    update(cache, body)


def update(cache: ClusterCache, body: dict[str, Any]) -> None:
    """The node's next version, as its watch event brings it."""
    held = cache.nodes.get(body["metadata"]["name"])
    version = int(held.resource_version) + 1 if held is not None else 1
    body["metadata"]["resourceVersion"] = str(version)
    cache.upsert_node(body)


def confirm(cache: ClusterCache, name: str, replicas: int) -> None:
    """GFD and kubelet confirm what the node's label names."""
    record = cache.nodes[name]
    update(cache, node(name, **on(str(record.config_label), "p", replicas)))


def published(loop: PlanningLoop, name: str) -> dict[str, Any]:
    """Plan the node's status and play it back as written (a slot-label write first, as the
    loop plans the status from the Node that write returns)."""
    plan = loop.plan_node(name)
    if plan.labels is not None and not config_change(plan):
        labelled(loop.cache, name, plan.labels)
        plan = loop.plan_node(name)
    status = plan.status or loop.cache.node_states[name]
    loop.cache.upsert_node_state({"metadata": {"name": name}, "status": status})
    return dict(status)

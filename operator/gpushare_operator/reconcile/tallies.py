"""A policy's tally: what its status counts of the nodes it matches, governs and confirms."""

from __future__ import annotations

from typing import Protocol

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import nodephases, policystatus, resolution
from gpushare_operator.core.models import NodePhase
from gpushare_operator.core.nodes import NodeRecord
from gpushare_operator.core.policies import CompiledPolicy


class Deciding(Protocol):
    """What a tally needs of the planner: the cache, and each node's decision."""

    @property
    def cache(self) -> ClusterCache: ...

    def decide(self, record: NodeRecord) -> nodephases.NodeDecision: ...


def tally(planner: Deciding, policy: CompiledPolicy) -> policystatus.PolicyTally:
    cache = planner.cache
    counted = policystatus.PolicyTally()
    for node in sorted(cache.index.nodes_of(policy.name)):
        record = cache.nodes.get(node)
        if record is None:
            continue
        counted.matched += 1
        decision = planner.decide(record)
        winner = decision.policy
        if winner is not None and winner.name == policy.name:
            _count(counted, record, decision, policy)
            if decision.phase is not NodePhase.UNSUPPORTED:
                held = {r: cache.usage.node_usage(node, r)[0] for r in policy.resources}
                counted.classes.add(record, policy, held=held)
            continue
        problem = nodephases.unsupported(record, policy)
        outranks = winner is None or resolution.rank_key(policy) < resolution.rank_key(winner)
        if problem is not None and outranks and policy.usable:
            counted.unsupported += 1  # skipped here: the next usable policy governs it
            counted.skipped.append((node, problem[1]))
        else:
            counted.conflicts.append((node, winner.name if winner else "none"))
    counted.allocated = cache.usage.policy_slots(policy.name)
    if policy.mig is not None:
        counted.allocated_by = cache.usage.policy_resource_slots(policy.name)
    return counted


def _count(
    counted: policystatus.PolicyTally,
    record: NodeRecord,
    decision: nodephases.NodeDecision,
    policy: CompiledPolicy,
) -> None:
    counted.governed += 1
    phase = decision.phase
    if phase is NodePhase.UNSUPPORTED:
        counted.unsupported += 1
        counted.unusable += 1
        problem = nodephases.unsupported(record, policy)
        counted.skipped.append((record.name, problem[1] if problem else decision.message))
        return
    gpus = record.gpus or 0
    counted.gpus += gpus
    if policy.mig is not None:  # MIG devices per GPU depend on the model
        for resource, per_gpu in policy.mig.slots_per_gpu(record.product).items():
            counted.capacity += gpus * per_gpu
            counted.capacity_by[resource] = counted.capacity_by.get(resource, 0) + gpus * per_gpu
    else:
        counted.capacity += gpus * (policy.replicas or 0)
    if phase in (NodePhase.APPLIED, NodePhase.VERIFIED, NodePhase.MISMATCH):
        counted.applied += 1
    if phase is NodePhase.VERIFIED:
        counted.verified += 1
    elif phase is NodePhase.MISMATCH:
        counted.mismatched += 1
    elif phase is NodePhase.PENDING:
        counted.pending += 1

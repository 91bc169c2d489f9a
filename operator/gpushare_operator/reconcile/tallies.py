"""A policy's tally: what its status counts of the nodes it matches, governs and confirms."""

from __future__ import annotations

from typing import Protocol

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import policystatus, resolution
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.dra import draclaims, draslots
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy

Held = tuple[int, int]  # (slots, pods holding them)


def held(cache: ClusterCache, record: NodeRecord, policy: CompiledPolicy) -> dict[str, Held]:
    """Slots held on the node per resource of ``policy``, and by how many pods.

    On a node DRA serves, its devices are allocated by ResourceClaims whatever a pod spec names
    (an ``nvidia.com/gpu`` request gets a claim the scheduler makes; a pod may also ask through
    a ResourceClaimTemplate and name no resource at all): counted from the claims, a MIG device
    under its profile's resource (``core.dra.draclaims.by_resource``).  Elsewhere from the pods'
    requests, as the device plugin allocates them.
    """
    if dra.is_on(record) and policy.resources:
        held, pods = cache.dra.held_devices(record.name)
        devices = cache.dra.devices(record.name)
        counts = draclaims.by_resource(held, devices, resources=policy.resources)
        first = policy.resources[0]  # the pods are counted once, under the first
        return {r: (n, pods if r == first else 0) for r, n in counts.items()}
    return {r: cache.usage.node_usage(record.name, r) for r in policy.resources}


def usage(
    cache: ClusterCache, record: NodeRecord, policy: CompiledPolicy | None, resource: str
) -> Held:
    """Slots of ``resource`` held on the node and the pods holding them, as ``held`` counts
    them (from claims on a node DRA serves, from pod requests elsewhere)."""
    if policy is not None and dra.is_on(record) and resource in policy.resources:
        return held(cache, record, policy)[resource]
    return cache.usage.node_usage(record.name, resource)


def devices(cache: ClusterCache, record: NodeRecord, policy: CompiledPolicy) -> int:
    """The GPUs a node's capacity is counted from: on a node of a DRA policy that DRA serves,
    those its ResourceSlice lists (what claims can be allocated from); else GFD's count."""
    if policy.dra and dra.is_on(record):
        return dra.gpu_count(cache.dra.devices(record.name))
    return record.gpus or 0


def slot_view(cache: ClusterCache, record: NodeRecord, policy: CompiledPolicy | None) -> NodeRecord:
    """The node as its slots read: on a node DRA serves under a DRA policy, with the memory its
    ResourceSlice states (``core.dra.draslots``); elsewhere as GFD labels it."""
    if policy is None or not policy.dra or not dra.is_on(record):
        return record
    return draslots.view(record, cache.dra.devices(record.name), resources=policy.resources)


class Deciding(Protocol):
    """What a tally needs of the planner: the cache, and each node's decision."""

    @property
    def cache(self) -> ClusterCache: ...

    def decide(self, record: NodeRecord) -> nodephases.NodeDecision: ...


def tally(planner: Deciding, policy: CompiledPolicy) -> policystatus.PolicyTally:
    cache = planner.cache
    counted = policystatus.PolicyTally()
    # The pods' count of the policy's slots, corrected on the nodes DRA serves (``held``).
    claimed = 0
    for node in sorted(cache.index.nodes_of(policy.name)):
        record = cache.nodes.get(node)
        if record is None:
            continue
        counted.matched += 1
        decision = planner.decide(record)
        winner = decision.policy
        if winner is not None and winner.name == policy.name:
            _count(counted, record, decision, policy, devices=devices(cache, record, policy))
            if decision.phase is not NodePhase.UNSUPPORTED:
                slots = {r: n for r, (n, _) in held(cache, record, policy).items()}
                counted.classes.add(slot_view(cache, record, policy), policy, held=slots)
                if dra.is_on(record):
                    claimed += sum(slots.values()) - cache.usage.node_total(node)
            continue
        problem = nodephases.unsupported(record, policy)
        outranks = winner is None or resolution.rank_key(policy) < resolution.rank_key(winner)
        if problem is not None and outranks and policy.usable:
            counted.unsupported += 1  # skipped here: the next usable policy governs it
            counted.skipped.append((node, problem[1]))
        else:
            counted.conflicts.append((node, winner.name if winner else "none"))
    counted.allocated = cache.usage.policy_slots(policy.name) + claimed
    if policy.mig is not None:
        counted.allocated_by = cache.usage.policy_resource_slots(policy.name)
    return counted


def _count(
    counted: policystatus.PolicyTally,
    record: NodeRecord,
    decision: nodephases.NodeDecision,
    policy: CompiledPolicy,
    *,
    devices: int,
) -> None:
    """``devices``: the GPUs its capacity is counted from (the function ``devices`` above)."""
    counted.governed += 1
    phase = decision.phase
    if phase is NodePhase.UNSUPPORTED:
        counted.unsupported += 1
        counted.unusable += 1
        problem = nodephases.unsupported(record, policy)
        counted.skipped.append((record.name, problem[1] if problem else decision.message))
        return
    counted.gpus += record.gpus or 0
    gpus = devices
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

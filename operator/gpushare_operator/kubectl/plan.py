"""``kubectl gpushare plan``: what applying (or deleting) policies would do, before doing it.

Steps: read the manifests; dry-run each through the API server (any refusal: exit 1, in the
API server's words); read the cluster into the operator's state; forecast with the operator's
planner and rollout book (``kubectl.forecast``); when a policy as planned may evict (podPolicy
Evict), the PodDisruptionBudgets are read before the pods: the victims are chosen by them, as
the operator chooses, and the plan names those that would refuse an eviction now; report.
Exit 2 when the plan would leave a node overcommitted or Unsupported, or a node that must be
drained cannot be, or take
from a pod that asked for GPU memory the slot class that holds its request
(``kubectl.memoryplan``), so that a pipeline can stop there; 0 otherwise.  An eviction is no
overcommit: a node drained for its change does not make the exit status 2, whatever its
budgets say now (they may allow it later; the operator retries until eviction.timeout).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from gpushare_operator.core.api import defaults
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.kubectl import cluster, disruptions, manifests, memoryplan
from gpushare_operator.kubectl.evictions import NodeEvictions
from gpushare_operator.kubectl.forecast import Forecast, Forecaster
from gpushare_operator.kubectl.output import Trace
from gpushare_operator.kubectl.standings import (
    GOVERNED,
    POOL_LABELS,
    UNMANAGED,
    NodeStanding,
    RolloutPace,
)

EXIT_CLEAN, EXIT_ERROR, EXIT_BLOCKED = 0, 1, 2
_SPEC_FIELDS = ("strategy", "replicas", "priority", "nodeSelector", "resourceName", "paused")


@dataclass(frozen=True, slots=True)
class PlanOptions:
    files: Sequence[str] = ()
    deletions: Sequence[str] = ()
    cluster_ref: cluster.ClusterRef = field(default_factory=cluster.ClusterRef)
    max_unavailable: int | str = defaults.MAX_UNAVAILABLE
    pace: RolloutPace = field(default_factory=RolloutPace)
    pool_labels: Sequence[str] = POOL_LABELS
    trace: Trace = field(default_factory=Trace)


class PlanError(Exception):
    """The plan cannot be made (the message says why; exit 1)."""


async def make_plan(options: PlanOptions, *, errors: TextIO = sys.stderr) -> dict[str, Any]:
    """The plan's report; raises PlanError (after printing refusals) when it cannot be made."""
    # Every name checked before the first request (kube/objectpaths.py says why).
    documents, skipped = manifests.read_policies(options.files)
    deletions = manifests.checked_deletions(options.deletions)
    for what in skipped:
        errors.write(f"note: {what} is not a GPUSharingPolicy: left out of the plan\n")
    names = [str(d["metadata"]["name"]) for d in documents] + deletions
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PlanError(f"planned more than once: {', '.join(twice)}")
    if not names:
        raise PlanError("nothing to plan: give -f FILE with policies, or --delete NAME")
    forecaster = Forecaster(
        max_unavailable=options.max_unavailable,
        pace=options.pace,
        pool_labels=options.pool_labels,
    )
    trace, cache = options.trace, forecaster.cache
    async with cluster.connected(options.cluster_ref) as api:
        planned, refusals = await manifests.dry_run(api, documents, deletions)
        for refusal in refusals:
            errors.write(f"{refusal}\n")
        if refusals:
            raise PlanError(f"the API server refused {len(refusals)} of {len(names)} object(s)")
        trace.mark(f"dry run: {len(planned)} object(s) accepted")
        await cluster.load_policies(api, cache)
        current = dict(cache.policies)
        bodies = [manifests.for_state(p) for p in planned]
        forecaster.track_resources_of(bodies)
        await cluster.load_configmap(api, cache, options.cluster_ref)
        trace.mark(f"read {len(current)} policies and the device-plugin ConfigMap")
        evicting = forecaster.may_evict(bodies)
        budgets: list[dict[str, Any]] = []
        if evicting:  # before the pods: they say which pod labels the choice of victims reads
            budgets = await cluster.load_budgets(api)
            for body in budgets:
                cache.budgets.upsert(body)
            trace.mark(f"read {len(budgets)} PodDisruptionBudgets")
        keep = forecaster.keep_pod_details if evicting else None
        await cluster.load_fleet(api, cache, pod_sink=keep)
        trace.mark(
            f"read {len(cache.nodes)} GPU nodes, {len(cache.node_states)} GPUNodeStates,"
            f" {len(cache.usage.pods)} pods asking for GPU slots"
        )
        snapshot = memoryplan.Snapshot.take(cache)  # before the forecast settles any node
        forecast = forecaster.run(bodies)
        memory = memoryplan.find(forecast, snapshot, before=current, after=dict(cache.policies))
        trace.mark(
            f"forecast: {len(forecast.changes)} node(s) change, {len(forecast.batches)} batches"
        )
    return report(
        forecast=forecast,
        planned=planned,
        current=current,
        after=dict(forecaster.cache.policies),
        options=options,
        budgets=budgets,
        details=forecaster.pod_details,
        memory=memory,
    )


# -- the report --------------------------------------------------------------------------------


def report(
    *,
    forecast: Forecast,
    planned: Sequence[manifests.Planned],
    current: Mapping[str, CompiledPolicy],
    after: Mapping[str, CompiledPolicy],
    options: PlanOptions,
    budgets: Sequence[Mapping[str, Any]] = (),
    details: Mapping[str, disruptions.PodDetails] | None = None,
    memory: Sequence[memoryplan.MemoryMisfit] = (),
) -> dict[str, Any]:
    by_name = {p.name: p for p in planned}
    memory_requests = memoryplan.as_dicts(memory)
    problems = _problems(forecast) + memoryplan.problems(memory_requests)
    evicted = {
        node: _evictions(e, budgets, details or {}) for node, e in forecast.evictions.items()
    }
    last = forecast.batches[-1].ends_at if forecast.batches else 0.0
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "Plan",
        "policies": [
            _policy(name, forecast, by_name.get(name), current.get(name), after.get(name))
            for name in forecast.policies()
        ],
        "nodes": [
            {
                "name": c.name,
                "pool": c.pool,
                "before": c.before.as_dict(),
                "after": c.after.as_dict(),
                "evictions": evicted.get(c.name, []),
            }
            for c in forecast.changes
        ],
        "overcommitted": _misfits(forecast),
        "memoryRequests": memory_requests,
        "unsupported": [
            {
                "node": c.name,
                "pool": c.pool,
                "policy": c.after.policy,
                "reason": c.after.reason,
                "why": c.after.why,
            }
            for c in forecast.unsupported
        ],
        "configKeys": {"written": forecast.keys_written, "unused": forecast.keys_unused},
        "migLayouts": {"written": forecast.layouts_written},
        "rollout": {
            "propagationDelaySeconds": forecast.start_delay,
            "writeQPS": options.pace.write_qps,
            "verifySeconds": options.pace.verify_seconds,
            "clusterMaxUnavailable": options.max_unavailable,
            "batches": len(forecast.batches),
            "nodes": sum(len(b.nodes) for b in forecast.batches),
            "evictions": sum(len(pods) for pods in evicted.values()),
            "estimatedSeconds": round(last, 1),
        },
        "unservedByDRA": [
            {"node": u.node, "pod": f"{u.namespace}/{u.name}", "resource": u.resource}
            for u in forecast.unserved
        ],
        "problems": problems,
        "exitCode": EXIT_BLOCKED if problems else EXIT_CLEAN,
    }


def _problems(forecast: Forecast) -> list[str]:
    problems = []
    for misfit in forecast.misfits:
        evictions = forecast.evictions.get(misfit.node)
        if misfit.memory and (evictions is None or evictions.stuck is None):
            continue  # the memory requests' own section says it (kubectl.memoryplan)
        if evictions is not None and evictions.stuck is not None:
            problems.append(
                f"node {misfit.node} cannot be drained (podPolicy Evict): {evictions.stuck};"
                " it would keep its config"
            )
        elif misfit.mig:
            changes = "it changes backend" if misfit.backend else "its MIG layout changes"
            problems.append(
                f"node {misfit.node} would wait for {len(misfit.pods)} GPU pod(s) to end before"
                f" {changes} (podPolicy WaitForPods; tainted meanwhile)"
            )
        else:
            problems.append(f"node {misfit.node} would be overcommitted: {misfit.why}")
    for change in forecast.unsupported:
        problems.append(
            f"node {change.name} would be Unsupported ({change.after.reason}): {change.after.why}"
        )
    for pod in forecast.unserved:
        problems.append(
            f"pod {pod.namespace}/{pod.name} on node {pod.node} asks for {pod.resource}, which"
            f" backend DRA does not serve there (its DeviceClass serves {pod.served}): once it"
            " is gone it could not be placed on that node again"
        )
    return problems


def _misfits(forecast: Forecast) -> list[dict[str, Any]]:
    waiting = {h.node for h in forecast.held if h.reason == "WaitingForPods"}
    stuck = {n: e.stuck for n, e in forecast.evictions.items() if e.stuck is not None}
    return [
        {
            "node": m.node,
            "pool": m.pool,
            "why": m.why,
            "waitsForPods": m.node in waiting,
            "migChange": m.mig,
            "backendChange": m.backend,
            **({"notEvictable": stuck[m.node]} if m.node in stuck else {}),
            "pods": [
                {
                    "namespace": p.namespace,
                    "name": p.name,
                    "phase": p.phase,
                    **_requests(p.requests),
                }
                for p in m.pods
            ],
        }
        for m in forecast.misfits
        if not m.memory
    ]


def _requests(requests: Sequence[tuple[str, int]]) -> dict[str, Any]:
    return {"requests": dict(requests)}


def _evictions(
    evictions: NodeEvictions,
    budgets: Sequence[Mapping[str, Any]],
    details: Mapping[str, disruptions.PodDetails],
) -> list[dict[str, Any]]:
    """The pods the node's change would evict, in the operator's order, each with the
    PodDisruptionBudgets that would refuse its eviction now."""
    return [
        {
            "namespace": pod.namespace,
            "name": pod.name,
            **_requests(pod.requests),
            "priority": pod.priority,
            "blockedBy": disruptions.blocking(pod, details.get(pod.uid), budgets),
        }
        for pod in evictions.pods
    ]


def _action(planned: manifests.Planned | None) -> str:
    """create, update, delete; unchanged for a file's policy that the dry run left as it is;
    affected for a policy that only gains or loses nodes."""
    if planned is None:
        return "affected"
    if planned.action == "update" and planned.current is not None:
        generation = (planned.current.get("metadata") or {}).get("generation")
        if (planned.answer.get("metadata") or {}).get("generation") == generation:
            return "unchanged"
    return planned.action


def _spec_changes(planned: manifests.Planned | None) -> dict[str, Any]:
    if planned is None or planned.action != "update" or planned.current is None:
        return {}
    old, new = planned.current.get("spec") or {}, planned.answer.get("spec") or {}
    fields = [*_SPEC_FIELDS, *sorted(k for k in {*old, *new} if k not in _SPEC_FIELDS)]
    return {
        f: {"before": old.get(f), "after": new.get(f)} for f in fields if old.get(f) != new.get(f)
    }


def _policy(
    name: str,
    forecast: Forecast,
    planned: manifests.Planned | None,
    before: CompiledPolicy | None,
    after: CompiledPolicy | None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "action": _action(planned)}
    if planned is not None and planned.action != "delete":
        entry["generation"] = {
            "before": before.generation if before else None,
            "after": (planned.answer.get("metadata") or {}).get("generation"),
        }
        entry["spec"] = _spec_changes(planned)
    entry["configKey"] = {
        "before": before.config_key if before else None,
        "after": None if planned and planned.action == "delete" else after and after.config_key,
    }
    entry["pools"] = _pools(name, forecast)
    entry["capacity"] = {
        "before": sum(p["capacity"]["before"] for p in entry["pools"]),
        "after": sum(p["capacity"]["after"] for p in entry["pools"]),
    }
    entry["rollout"] = _rollout(name, forecast)
    return entry


def _pools(name: str, forecast: Forecast) -> list[dict[str, Any]]:
    pools: defaultdict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "nodes": {"before": 0, "after": 0},
            "capacity": {"before": 0, "after": 0},
            "slotsByResource": {},
            "layouts": {"before": [], "after": []},
            "gained": [],
            "lost": [],
            "changed": [],
        }
    )
    for when, standings in (("before", forecast.before), ("after", forecast.after)):
        for node, standing in standings.items():
            if standing.policy != name:
                continue
            entry = pools[forecast.pools[node]]
            entry["nodes"][when] += 1
            entry["capacity"][when] += standing.capacity
            by_resource = entry["slotsByResource"]
            # What the policy's config offers there (an Unsupported node's are not its own).
            for resource, slots in standing.slots if standing.standing == GOVERNED else ():
                counts = by_resource.setdefault(resource, {"before": 0, "after": 0})
                counts[when] += slots
            if standing.mig_config is not None:
                _count_layout(entry["layouts"][when], forecast.products.get(node), standing)
    for change in forecast.changes:
        was, now = change.before.policy, change.after.policy
        if now == name and was != name:
            pools[change.pool]["gained"].append({"node": change.name, "from": was})
        elif was == name and now != name:
            to = None if change.after.standing == UNMANAGED else now
            pools[change.pool]["lost"].append({"node": change.name, "to": to})
        elif was == name:
            pools[change.pool]["changed"].append(change.name)
    for entry in pools.values():
        entry["slotsByResource"] = dict(sorted(entry["slotsByResource"].items()))
    return [{"pool": pool, **pools[pool]} for pool in sorted(pools)]


def _count_layout(
    layouts: list[dict[str, Any]], product: str | None, standing: NodeStanding
) -> None:
    """One more node of ``product`` on the standing's MIG layout (one entry per model)."""
    for entry in layouts:
        if (entry["product"], entry["config"]) == (product, standing.mig_config):
            entry["nodes"] += 1
            return
    layouts.append(
        {"product": product, "config": standing.mig_config, "layout": standing.layout, "nodes": 1}
    )
    layouts.sort(key=lambda e: (str(e["product"]), str(e["config"])))


def _rollout(name: str, forecast: Forecast) -> dict[str, Any]:
    budget = forecast.budgets.get(name)
    batches: list[dict[str, Any]] = []
    for batch in forecast.batches:
        nodes = [node for node, charged in batch.nodes if charged == name]
        if nodes:
            batches.append({"batch": batch.index, "nodes": nodes, "endsAt": round(batch.ends_at)})
    canary = budget.canary if budget else 0
    if batches and canary and len(batches[0]["nodes"]) <= canary and len(batches) > 1:
        batches[0]["canary"] = True
    held = [
        {"node": h.node, "reason": h.reason, "message": h.message}
        for h in forecast.held
        if h.policy == name
    ]
    return {
        "maxUnavailable": budget.max_unavailable if budget else None,
        "canary": canary,
        "nodes": sum(len(b["nodes"]) for b in batches),
        "batches": batches,
        "held": held,
        "estimatedSeconds": batches[-1]["endsAt"] if batches else 0,
    }

"""``kubectl gpushare status``: every policy's standing, the free slots of each slot class
(``kubectl.freeslots``), and with ``--policy`` the policy's nodes.

The counts are worked out now, from the cluster as it is, by the operator's own code
(``Planner.tally`` over the same slim records, the same usage ledger); the rollout's progress is
what the operator published (``status.rollout``), since only the operator knows which of its
nodes it has admitted.  A policy whose status has not caught up with its spec says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.kubectl import cluster, freeslots
from gpushare_operator.kubectl.forecast import KEY_GRACE_PERIOD, MISMATCH_TIMEOUT
from gpushare_operator.kubectl.output import Style, slots, table
from gpushare_operator.kubectl.standings import DRA_SHARING, POOL_LABELS, pool_of, standing_of
from gpushare_operator.reconcile import tallies
from gpushare_operator.reconcile.planner import Planner, Timings
from gpushare_operator.reconcile.reconciler import Reconciler


class UnknownPolicy(LookupError):
    """``--policy NAME`` names no policy."""


def new_planner(cache: ClusterCache) -> Planner:
    timings = Timings(
        propagation_delay=0.0, key_grace_period=KEY_GRACE_PERIOD, mismatch_timeout=MISMATCH_TIMEOUT
    )
    # The budget does not matter to a status: the plugin shows what the operator published.
    return Reconciler(cache, timings=timings, max_unavailable=1).planner


async def make_status(
    cluster_ref: cluster.ClusterRef, *, policy: str | None = None
) -> dict[str, Any]:
    cache = ClusterCache(dra_sharing=DRA_SHARING)
    planner = new_planner(cache)
    async with cluster.connected(cluster_ref) as api:
        items = await cluster.load_policies(api, cache)
        if policy is not None and policy not in cache.policies:
            raise UnknownPolicy(f'GPUSharingPolicy "{policy}" not found')
        await cluster.load_configmap(api, cache, cluster_ref)
        await cluster.load_fleet(api, cache)
    published = {str(i["metadata"]["name"]): i.get("status") or {} for i in items}
    report: dict[str, Any] = {
        "policies": [
            _policy(planner, p, published.get(name, {}), deleting=name in cache.deleting)
            for name, p in sorted(cache.policies.items())
        ],
        "slotClasses": freeslots.slot_classes(planner),
    }
    if policy is not None:
        report["nodes"] = _nodes(planner, policy)
    return report


def _policy(
    planner: Planner, policy: CompiledPolicy, published: Mapping[str, Any], *, deleting: bool
) -> dict[str, Any]:
    tally = planner.tally(policy)
    rollout = published.get("rollout") or {}
    ready: Mapping[str, Any] = next(
        (c for c in published.get("conditions") or () if c.get("type") == "Ready"), {}
    )
    return {
        "name": policy.name,
        "strategy": str(policy.strategy) if policy.strategy else None,
        "replicas": policy.replicas,
        "priority": policy.priority,
        "generation": policy.generation,
        "observedGeneration": published.get("observedGeneration"),
        "configKey": policy.config_key,
        "matched": tally.matched,
        "governed": tally.governed,
        "applied": tally.applied,
        "verified": tally.verified,
        "pending": tally.pending,
        "mismatched": tally.mismatched,
        "conflicting": len(tally.conflicts),
        "unsupported": tally.unsupported,
        "gpus": tally.gpus,
        "slots": {"allocated": tally.allocated, "capacity": tally.capacity},
        "rollout": {k: rollout[k] for k in ("generation", "state", "progress") if k in rollout},
        "ready": {k: ready[k] for k in ("status", "reason", "message") if k in ready},
        "paused": policy.paused,
        "deleting": deleting,
        "error": policy.error,
    }


def _nodes(planner: Planner, name: str) -> list[dict[str, Any]]:
    cache = planner.cache
    rows = []
    for node in sorted(cache.index.nodes_of(name)):
        record = cache.nodes[node]
        decision = planner.decide(record)
        standing = standing_of(record, decision)
        published = cache.node_states.get(node) or {}
        ready = next(
            (c for c in published.get("conditions") or () if c.get("type") == "Ready"), None
        )
        allocated, pods = tallies.usage(cache, record, decision.policy, standing.resource)
        rows.append(
            {
                "name": node,
                "pool": pool_of(record.labels, POOL_LABELS),
                "policy": standing.policy,
                "phase": published.get("phase") or str(decision.phase),
                "reason": (ready or {}).get("reason") or decision.reason,
                "published": bool(published),
                "configKey": record.config_label,
                "gpus": standing.gpus,
                "slots": {"allocated": allocated, "capacity": standing.capacity},
                "pods": pods,
                "eviction": eviction_of(published),
            }
        )
    return rows


def eviction_of(published: Mapping[str, Any]) -> dict[str, Any] | None:
    """podPolicy Evict on the node, as the operator published it: the pods still to go and the
    PodDisruptionBudgets that refused them; ``blocked`` once it gave up (EvictionBlocked)."""
    block = published.get("eviction")
    if not isinstance(block, Mapping):
        return None
    return {
        "policy": block.get("policy"),
        "startedAt": block.get("startedAt"),
        "pods": list(block.get("pods") or ()),
        "blockedBy": list(block.get("blockedBy") or ()),
        "blocked": bool(block.get("blockedAt")),
        "reason": block.get("reason"),
    }


def eviction_line(name: str, eviction: Mapping[str, Any]) -> str:
    pods = ", ".join(eviction["pods"]) or "none left"
    refused = ", ".join(eviction["blockedBy"])
    if eviction["blocked"]:
        line = f"{name}: eviction given up ({eviction['reason']}), keeps its config; pods: {pods}"
    else:
        line = f"{name}: evicting {pods}"
    return line + (f"; refused by PodDisruptionBudget(s) {refused}" if refused else "")


def render(report: Mapping[str, Any], style: Style) -> str:
    rows = []
    for p in report["policies"]:
        rollout = p["rollout"]
        progress = " ".join(str(rollout[k]) for k in ("state", "progress") if k in rollout)
        if p["observedGeneration"] != p["generation"]:
            progress = f"generation {p['generation']} not yet observed"
        name = p["name"] + (" (deleting)" if p["deleting"] else "")
        rows.append(
            (
                name,
                p["strategy"] or "-",
                p["replicas"] or "-",
                p["priority"],
                p["matched"],
                p["applied"],
                p["verified"],
                progress or "-",
                slots(p["slots"]["allocated"], p["slots"]["capacity"], style),
            )
        )
    headers = (
        "POLICY",
        "STRATEGY",
        "REPLICAS",
        "PRIORITY",
        "MATCHED",
        "APPLIED",
        "VERIFIED",
        "ROLLOUT",
        "SLOTS",
    )
    text = table(headers, rows) if rows else "No GPUSharingPolicies."
    if rows:
        text += "\n\n" + freeslots.render(report["slotClasses"], style)
    if "nodes" in report:
        text += "\n\n" + _render_nodes(report["nodes"], style)
    return text + "\n"


def _render_nodes(nodes: list[Mapping[str, Any]], style: Style) -> str:
    if not nodes:
        return "The policy selects no GPU node."
    rows = [
        (
            n["name"],
            n["pool"],
            n["policy"] or "-",
            n["phase"] if n["published"] else f"{n['phase']} (no GPUNodeState yet)",
            n["reason"],
            slots(n["slots"]["allocated"], n["slots"]["capacity"], style),
            n["pods"],
            n["configKey"] or "-",
        )
        for n in nodes
    ]
    headers = ("NODE", "POOL", "GOVERNED BY", "PHASE", "REASON", "SLOTS", "PODS", "CONFIG KEY")
    lines = [table(headers, rows)]
    lines.extend(eviction_line(n["name"], n["eviction"]) for n in nodes if n["eviction"])
    return "\n".join(lines)

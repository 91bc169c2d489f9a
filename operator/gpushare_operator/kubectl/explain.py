"""``kubectl gpushare explain node NAME``: why a node is configured the way it is.

Which policies select it, ranked as the operator ranks them (``core.resolution``), which one
governs it and why (``nodephases.choose``: the first usable by rank that can work there); its
phase and conditions as the operator published them, and recent Events about it; the config
key it carries and that key's content in the device-plugin ConfigMap; for MIG its layout (as
published in ``status.mig``, and as the policies as they are would have it, with the reason a
MIG policy cannot work there: ``kubectl.migexplanations``); what its slots promise of GPU
memory, where the figure comes from and the slot labels that say it (``kubectl.promises``); and
which pods hold its slots, from the same usage ledger the operator keeps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import resolution
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.kube import objectpaths, reading
from gpushare_operator.kubectl import cluster, migexplanations, promises
from gpushare_operator.kubectl.output import Style, slots, table
from gpushare_operator.kubectl.standings import DRA_SHARING, POOL_LABELS, pool_of, standing_of
from gpushare_operator.kubectl.status import eviction_line, eviction_of, new_planner
from gpushare_operator.reconcile import tallies

EVENTS_SHOWN = 10


class UnknownNode(LookupError):
    """No such node, or not a GPU node."""


async def explain_node(cluster_ref: cluster.ClusterRef, name: str) -> dict[str, Any]:
    objectpaths.checked(name, kind=cluster.NODES.kind)  # before any request (kube/objectpaths.py)
    cache = ClusterCache(dra_sharing=DRA_SHARING)
    planner = new_planner(cache)
    async with cluster.connected(cluster_ref) as api:
        await cluster.load_policies(api, cache)
        await cluster.load_configmap(api, cache, cluster_ref)
        if await cluster.load_node(api, cache, name) is None:
            raise UnknownNode(f'node "{name}" not found')
        about = reading.Collection(
            path=objectpaths.path(cluster.EVENTS),
            kind=cluster.EVENTS.kind,
            field_selector=f"involvedObject.name={name}",
            page_size=250,
        )
        events = await cluster.read_all(api, about, purpose="the recent Events about the node")
    record = cache.nodes.get(name)
    if record is None:
        raise UnknownNode(f'node "{name}" is not a GPU node: gpushare leaves it alone')
    decision = planner.decide(record)
    target_now = standing_of(record, decision)
    published = cache.node_states.get(name) or {}
    return {
        "node": name,
        "pool": pool_of(record.labels, POOL_LABELS),
        "gpus": record.gpus,
        "product": record.product,
        "policies": _ranking(cache, record, decision.policy),
        "governedBy": decision.policy.name if decision.policy else None,
        "phase": {
            "published": published.get("phase"),
            "conditions": published.get("conditions") or [],
            "now": {"phase": str(decision.phase), "reason": decision.reason},
            "eviction": eviction_of(published),
        },
        "events": _events(events),
        "config": _config(cache, record, decision.policy),
        "mig": migexplanations.explain(cache, record, decision, published=published),
        "slotPromise": promises.explain(
            tallies.slot_view(cache, record, decision.policy),  # a DRA node: its slice's memory
            decision,
            phase=str(published.get("phase") or decision.phase),
        ),
        "slots": _slots(cache, record, decision.policy, target_now.resource, target_now.capacity),
    }


def _ranking(
    cache: ClusterCache, record: NodeRecord, winner: CompiledPolicy | None
) -> list[dict[str, Any]]:
    matched = [cache.policies[p] for p in cache.index.policies_of(record.name)]
    candidates = cache.candidates(record.name)
    return [
        {
            "name": policy.name,
            "priority": policy.priority,
            **_outcome(cache, record, policy, winner=winner, candidates=candidates),
        }
        for policy in resolution.ranked(matched)
    ]


def _outcome(
    cache: ClusterCache,
    record: NodeRecord,
    policy: CompiledPolicy,
    *,
    winner: CompiledPolicy | None,
    candidates: Sequence[CompiledPolicy],
) -> dict[str, str]:
    if policy.name in cache.deleting:
        return {"outcome": "deleting", "why": "being deleted: it governs no node any more"}
    if not policy.usable:
        return {"outcome": "invalid", "why": policy.error or "its spec is invalid"}
    problem = nodephases.unsupported(record, policy)
    if winner is not None and policy.name == winner.name:
        return {"outcome": "governs", "why": _why_winner(record, policy, candidates)}
    if winner is None:  # cannot be: a usable match always governs
        return {"outcome": "outranked", "why": "no policy governs this node"}
    if problem is not None and resolution.rank_key(policy) < resolution.rank_key(winner):
        return {"outcome": "skipped", "why": f"it cannot work here ({problem[0]}): {problem[1]}"}
    if policy.priority < winner.priority:
        why = f"lower priority than {winner.name} ({policy.priority} < {winner.priority})"
    else:
        why = f"same priority as {winner.name} ({policy.priority}), whose name sorts first"
    return {"outcome": "outranked", "why": why}


def _why_winner(
    record: NodeRecord, policy: CompiledPolicy, candidates: Sequence[CompiledPolicy]
) -> str:
    problem = nodephases.unsupported(record, policy)
    if problem is not None:
        return (
            "no selecting policy can work here, so the first by rank reports it"
            f" ({problem[0]}): {problem[1]}"
        )
    ahead = [p.name for p in candidates if resolution.rank_key(p) < resolution.rank_key(policy)]
    if ahead:  # they outrank it, and choose() passed them over: they cannot work here
        return f"the first by rank that can work here ({', '.join(ahead)} cannot)"
    others = [p for p in candidates if resolution.rank_key(p) > resolution.rank_key(policy)]
    if not others:
        return "the only usable policy that selects this node"
    runner_up = others[0]
    if policy.priority > runner_up.priority:
        return (
            f"highest priority ({policy.priority}; next: {runner_up.name} at {runner_up.priority})"
        )
    return f"same priority as {runner_up.name} ({policy.priority}); its name sorts first"


def _events(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    def when(event: Mapping[str, Any]) -> str:
        return str(
            event.get("lastTimestamp")
            or event.get("eventTime")
            or event.get("firstTimestamp")
            or (event.get("metadata") or {}).get("creationTimestamp")
            or ""
        )

    about = [e for e in events if (e.get("involvedObject") or {}).get("kind")]
    recent = sorted(about, key=when)[-EVENTS_SHOWN:]
    return [
        {
            "time": when(e),
            "type": e.get("type"),
            "reason": e.get("reason"),
            "object": f"{e['involvedObject']['kind']}/{e['involvedObject'].get('name')}",
            "count": e.get("count") or 1,
            "message": e.get("message"),
        }
        for e in recent
    ]


def _config(
    cache: ClusterCache, record: NodeRecord, policy: CompiledPolicy | None
) -> dict[str, Any]:
    data = cache.config_data or {}
    carried = record.config_label
    wanted = policy.config_key if policy is not None else None
    out: dict[str, Any] = {
        "carried": carried,
        "wanted": wanted,
        "ours": record.policy_label is not None,
        "content": data.get(carried) if carried else None,
        "inConfigMap": carried in data if carried else None,
    }
    if wanted and wanted != carried:
        out["wantedContent"] = data.get(wanted) or (policy.config_text if policy else None)
    return out


def _slots(
    cache: ClusterCache,
    record: NodeRecord,
    policy: CompiledPolicy | None,
    resource: str,
    capacity: int,
) -> dict[str, Any]:
    """The node's slots as the operator counts them: on a node DRA serves, from the claims
    allocated there (``claimedDevices``: a pod asking through a ResourceClaimTemplate names no
    resource, and is counted only there)."""
    node = record.name
    allocated, _ = tallies.usage(cache, record, policy, resource)
    pods = sorted(
        (p for p in cache.usage if p.node == node and p.holds_slots),
        key=lambda p: (p.namespace, p.name),
    )
    held = cache.usage.node_slots(node)
    extra: dict[str, Any] = {}
    if dra.is_on(record):
        devices, holders = cache.dra.held_devices(node)
        extra = {"claimedDevices": sorted(devices), "claimPods": holders}
    return {
        **extra,
        "resource": resource,
        "allocated": allocated,
        "capacity": capacity,
        # Slots of other resources: pods placed under the config the node still runs (a
        # change held back for them, say) hold a resource its target does not advertise.
        "otherResources": {r: n for r, n in sorted(held.items()) if r != resource},
        "pods": [
            {
                "namespace": p.namespace,
                "name": p.name,
                "phase": p.phase,
                "requests": dict(p.requests),
            }
            for p in pods
        ],
    }


def render(report: Mapping[str, Any], style: Style) -> str:
    parts = [_render_head(report, style), _render_policies(report, style)]
    parts.append(_render_phase(report, style))
    parts.append(_render_config(report["config"], style))
    if report.get("mig"):
        parts.append(migexplanations.render(report["mig"], style))
    if report.get("slotPromise"):
        parts.append(promises.render(report["slotPromise"], style))
    parts.append(_render_slots(report["slots"], style))
    return "\n\n".join(parts) + "\n"


def _render_head(report: Mapping[str, Any], style: Style) -> str:
    gpus = report["gpus"] if report["gpus"] is not None else "?"
    product = report["product"] or "unknown GPU"
    governed = report["governedBy"] or "no policy (default config: no sharing)"
    return (
        style.heading(f"Node {report['node']}")
        + f"\n  pool {report['pool']}, {gpus} x {product}\n  governed by: {governed}"
    )


def _render_policies(report: Mapping[str, Any], style: Style) -> str:
    heading = style.heading("Policies that select it (winner first):")
    if not report["policies"]:
        return heading + "\n  none: no GPUSharingPolicy selects this node"
    rows = [(p["name"], p["priority"], p["outcome"], p["why"]) for p in report["policies"]]
    return heading + "\n" + table(("POLICY", "PRIORITY", "OUTCOME", "WHY"), rows, indent="  ")


def _render_phase(report: Mapping[str, Any], style: Style) -> str:
    phase = report["phase"]
    shown = phase["published"] or "no GPUNodeState published"
    lines = [style.heading(f"Phase: {shown}")]
    conditions = [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
        for c in phase["conditions"]
    ]
    if conditions:
        lines.append(table(("CONDITION", "STATUS", "REASON", "MESSAGE"), conditions, indent="  "))
    now = phase["now"]
    eviction = phase.get("eviction")
    if eviction:
        lines.append("  " + eviction_line("podPolicy Evict", eviction))
    if phase["published"] == "Evicting":
        # Its change waits for the evictions: what the config alone says comes after them.
        lines.append(f"  once its pods are gone: {now['phase']} ({now['reason']})")
    elif now["phase"] != phase["published"]:
        lines.append(f"  from the cluster as it is now: {now['phase']} ({now['reason']})")
    events = [
        (e["time"], e["type"], e["reason"], e["object"], e["message"]) for e in report["events"]
    ]
    lines.append(style.heading("Recent events:"))
    if events:
        lines.append(table(("TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"), events, indent="  "))
    else:
        lines.append("  none")
    return "\n".join(lines)


def _render_config(config: Mapping[str, Any], style: Style) -> str:
    carried = config["carried"]
    lines = [style.heading(f"Config key: {carried or 'none (the default config applies)'}")]
    if carried and not config["ours"]:
        lines.append("  set by someone else (no gpushare.dev/policy label): gpushare leaves it")
    if carried and config["content"] is None:
        lines.append("  not in the device-plugin ConfigMap")
    elif carried:
        lines.extend("  | " + line for line in str(config["content"]).rstrip().splitlines())
    if config.get("wantedContent") is not None or (
        config["wanted"] != carried and config["wanted"]
    ):
        lines.append(f"  to become: {config['wanted']}")
        lines.extend("  | " + line for line in str(config.get("wantedContent") or "").splitlines())
    return "\n".join(lines)


def _render_slots(usage: Mapping[str, Any], style: Style) -> str:
    used = slots(usage["allocated"], usage["capacity"], style)
    lines = [style.heading(f"Slots ({usage['resource']}): {used}")]
    others = usage.get("otherResources") or {}
    if others:
        held = ", ".join(f"{n} {r}" for r, n in others.items())
        lines.append(f"  also held by its pods: {held}")
    if "claimedDevices" in usage:
        claimed = ", ".join(usage["claimedDevices"]) or "none"
        lines.append(
            f"  served by DRA: devices claimed {claimed} (claims reserved for"
            f" {usage['claimPods']} pods)"
        )
    rows = [
        (
            f"{p['namespace']}/{p['name']}",
            p["phase"],
            ", ".join(f"{n} {r}" for r, n in p["requests"].items()),
        )
        for p in usage["pods"]
    ]
    lines.append(table(("POD", "PHASE", "REQUESTS"), rows, indent="  ") if rows else "  no pods")
    return "\n".join(lines)

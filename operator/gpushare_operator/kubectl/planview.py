"""The plan's report as text: per policy and pool (with MIG layouts and slots by resource),
the pods it evicts or waits for, then the problems and the verdict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpushare_operator.kubectl import memoryplan
from gpushare_operator.kubectl.output import Style, duration, names, plural, table

_ACTIONS = {
    "create": "created",
    "update": "updated",
    "delete": "deleted",
    "unchanged": "spec unchanged",
    "affected": "affected by the change",
}


def render(report: Mapping[str, Any], style: Style) -> str:
    parts = [_summary(report)]
    quiet = [p["name"] for p in report["policies"] if _quiet(p)]
    if quiet:
        parts.append(f"Unchanged, and no node moves: {', '.join(quiet)}")
    for policy in report["policies"]:
        if not _quiet(policy):
            parts.append(_policy(policy, style))
    evicting = [n for n in report["nodes"] if n.get("evictions")]
    if evicting:
        parts.append(_evicted(evicting, style))
    waits = [m for m in report["overcommitted"] if m.get("migChange") and m["waitsForPods"]]
    if waits:
        parts.append(_mig_waits(waits, style))
    others = [m for m in report["overcommitted"] if m not in waits]
    if others:
        parts.append(_overcommitted(others, style))
    memory = memoryplan.render(report.get("memoryRequests") or [], style)
    if memory:
        parts.append(memory)
    if report["unsupported"]:
        rows = [
            (u["node"], u["pool"], u["policy"], u.get("reason") or "-", u["why"])
            for u in report["unsupported"]
        ]
        heading = style.heading("Nodes left Unsupported (no selecting policy can work there):")
        headers = ("NODE", "POOL", "POLICY", "REASON", "WHY")
        parts.append(heading + "\n" + table(headers, rows, indent="  "))
    parts.append(_keys(report["configKeys"], style))
    layouts = (report.get("migLayouts") or {}).get("written") or {}
    if layouts:
        lines = [style.heading("mig-parted ConfigMap (config.yaml):")]
        lines.extend(f"  layout written: {name} ({text})" for name, text in layouts.items())
        parts.append("\n".join(lines))
    parts.append(_verdict(report))
    return "\n\n".join(parts) + "\n"


def _quiet(policy: Mapping[str, Any]) -> bool:
    """A policy of the files that the plan leaves as it is, on the same nodes."""
    moved = any(p["gained"] or p["lost"] or p["changed"] for p in policy["pools"])
    return policy["action"] == "unchanged" and not moved


def _summary(report: Mapping[str, Any]) -> str:
    rollout = report["rollout"]
    changed = len(report["nodes"])
    line = f"Plan: {plural(changed, 'node')} change"
    if changed == 1:
        line += "s"
    if rollout["nodes"]:
        line += (
            f"; {plural(rollout['nodes'], 'label change')} in"
            f" {plural(rollout['batches'], 'batch')}, about {duration(rollout['estimatedSeconds'])}"
        )
    wait = rollout["propagationDelaySeconds"]
    extra = f" (a new config key waits {duration(wait)} to propagate first)" if wait else ""
    if rollout.get("evictions"):
        extra += f"; {plural(rollout['evictions'], 'pod')} evicted first (podPolicy Evict)"
    assumptions = (
        f"Estimates: {rollout['writeQPS']:g} writes/s, {duration(rollout['verifySeconds'])}"
        f" from a label change to Verified, cluster-wide maxUnavailable"
        f" {rollout['clusterMaxUnavailable']}."
    )
    return line.replace("batchs", "batches") + extra + ".\n" + assumptions


def _spec_line(policy: Mapping[str, Any]) -> list[str]:
    lines = []
    for name, change in (policy.get("spec") or {}).items():
        lines.append(f"  spec.{name}: {_value(change['before'])} -> {_value(change['after'])}")
    key = policy["configKey"]
    if key["before"] != key["after"]:
        lines.append(f"  config key: {key['before'] or '(none)'} -> {key['after'] or '(none)'}")
    return lines


def _value(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return "(unset)" if value is None else str(value)


def _policy(policy: Mapping[str, Any], style: Style) -> str:
    generation = policy.get("generation")
    title = f"GPUSharingPolicy {policy['name']}: {_ACTIONS[policy['action']]}"
    if generation and generation.get("before") and generation["after"] != generation["before"]:
        title += f" (generation {generation['before']} -> {generation['after']})"
    lines = [style.heading(title), *_spec_line(policy)]
    rows = [
        (
            p["pool"],
            f"{p['nodes']['before']} -> {p['nodes']['after']}",
            len(p["gained"]),
            len(p["lost"]),
            len(p["changed"]),
            f"{p['capacity']['before']} -> {p['capacity']['after']}",
        )
        for p in policy["pools"]
    ]
    headers = ("POOL", "NODES", "GAINED", "LOST", "CHANGED", "SLOTS")
    lines.append(table(headers, rows, indent="  "))
    for pool in policy["pools"]:
        lines.extend(_layouts(pool))
        lines.extend(_movements(pool))
    loses = any(p["lost"] and any(x["to"] for x in p["lost"]) for p in policy["pools"])
    lines.extend(_rollout(policy["rollout"], loses=loses))
    return "\n".join(lines)


def _layouts(pool: Mapping[str, Any]) -> list[str]:
    """A pool's MIG layouts per GPU model, before -> after, and its slots by resource when
    there is more than one resource (or it changes): one total would hide which."""
    lines = []
    where, layouts = pool["pool"], pool.get("layouts") or {}
    before = {e["product"]: e for e in layouts.get("before") or []}
    after = {e["product"]: e for e in layouts.get("after") or []}
    for product in sorted({*before, *after}, key=str):
        was, now = before.get(product), after.get(product)
        if was is not None and now is not None and was["config"] == now["config"]:
            lines.append(f"  {where}: layout on {product}: {_layout(now)}, unchanged")
        elif now is not None:
            origin = f" (was {_layout(was)})" if was is not None else ""
            lines.append(f"  {where}: layout on {product}: {_layout(now)}{origin}")
        elif was is not None:
            lines.append(f"  {where}: layout on {product}: {_layout(was)} -> none")
    slots = pool.get("slotsByResource") or {}
    if len(slots) > 1 or (slots and layouts.get("after")) or (slots and layouts.get("before")):
        shown = ", ".join(f"{r}: {n['before']} -> {n['after']}" for r, n in slots.items())
        lines.append(f"  {where}: slots by resource: {shown}")
    return lines


def _layout(entry: Mapping[str, Any]) -> str:
    nodes = plural(entry["nodes"], "node")
    return f"{entry['layout']} per GPU (mig-parted config {entry['config']}; {nodes})"


def _movements(pool: Mapping[str, Any]) -> list[str]:
    lines = []
    where = pool["pool"]
    for source, nodes in _nodes_by(pool["gained"], "from"):
        origin = f"from {source}" if source else "unmanaged until now"
        lines.append(f"  {where}: gains {names(nodes)} ({origin})")
    for winner, nodes in _nodes_by(pool["lost"], "to"):
        fate = f"won by {winner}" if winner else "released: no policy selects them"
        lines.append(f"  {where}: loses {names(nodes)} ({fate})")
    if pool["changed"]:
        lines.append(f"  {where}: changes {names(pool['changed'])} (new config)")
    return lines


def _nodes_by(moves: Sequence[Mapping[str, Any]], key: str) -> list[tuple[str, list[str]]]:
    """The moved nodes grouped by the policy under ``key`` ("" for none), in name order."""
    grouped: dict[str, list[str]] = {}
    for move in moves:
        grouped.setdefault(move[key] or "", []).append(move["node"])
    return sorted(grouped.items())


def _rollout(rollout: Mapping[str, Any], *, loses: bool) -> list[str]:
    if not rollout["batches"] and not rollout["held"]:
        if loses:
            return ["  rollout: the nodes it loses change in the rollout of the policy taking them"]
        return ["  rollout: no node changes its config"]
    budget = f"maxUnavailable {rollout['maxUnavailable']}, canary {rollout['canary']}"
    lines = [f"  rollout: {plural(rollout['nodes'], 'node')} ({budget})"]
    for batch in rollout["batches"]:
        label = " (canary)" if batch.get("canary") else ""
        lines.append(
            f"    batch {batch['batch']}{label}: {names(batch['nodes'], limit=3)}"
            f"  [done by ~{duration(batch['endsAt'])}]"
        )
    if rollout["batches"]:
        lines.append(f"    estimated: {duration(rollout['estimatedSeconds'])}")
    held: dict[str, list[str]] = {}
    for node in rollout["held"]:
        held.setdefault(node["reason"], []).append(node["node"])
    for reason, nodes in sorted(held.items()):
        lines.append(f"    held ({reason}): {names(nodes)}")
    return lines


def _evicted(nodes: Sequence[Mapping[str, Any]], style: Style) -> str:
    lines = [style.heading("Pods evicted before their node changes (podPolicy Evict):")]
    refused = False
    for node in nodes:
        pods = node["evictions"]
        lines.append(f"  {node['name']} ({node['pool']}): {plural(len(pods), 'pod')}")
        rows = [
            (
                f"{p['namespace']}/{p['name']}",
                p["priority"],
                ", ".join(f"{n} {r}" for r, n in p["requests"].items()),
                ", ".join(p["blockedBy"]) or "-",
            )
            for p in pods
        ]
        refused = refused or any(p["blockedBy"] for p in pods)
        headers = ("POD", "PRIORITY", "HOLDS", "REFUSED NOW BY")
        lines.append(table(headers, rows, indent="    "))
    if refused:
        lines.append(
            "  A PodDisruptionBudget that allows no disruption now refuses the eviction: the"
            " operator retries until the policy's eviction.timeout, then leaves the node on its"
            " config (EvictionBlocked)."
        )
    return "\n".join(lines)


def _overcommitted(items: Sequence[Mapping[str, Any]], style: Style) -> str:
    lines = [style.heading("Pods that would hold more slots than their node's new config has:")]
    for item in items:
        wait = " (WaitForPods: the node keeps its config until they fit)"
        if item.get("notEvictable"):
            wait = f" (podPolicy Evict cannot drain it: {item['notEvictable']})"
        held = item["waitsForPods"] or bool(item.get("notEvictable"))
        lines.append(f"  {item['node']} ({item['pool']}): {item['why']}{wait * held}")
        rows = [
            (
                f"{p['namespace']}/{p['name']}",
                p["phase"],
                ", ".join(f"{n} {r}" for r, n in p["requests"].items()),
            )
            for p in item["pods"]
        ]
        lines.append(table(("POD", "PHASE", "HOLDS"), rows, indent="    "))
    return "\n".join(lines)


def _mig_waits(items: Sequence[Mapping[str, Any]], style: Style) -> str:
    lines = [
        style.heading(
            "Pods a MIG change waits for (the layout changes only on idle GPUs; podPolicy"
            " WaitForPods, the node tainted meanwhile):"
        )
    ]
    for item in items:
        lines.append(f"  {item['node']} ({item['pool']}): {plural(len(item['pods']), 'pod')}")
        rows = [
            (
                f"{p['namespace']}/{p['name']}",
                p["phase"],
                ", ".join(f"{n} {r}" for r, n in p["requests"].items()),
            )
            for p in item["pods"]
        ]
        lines.append(table(("POD", "PHASE", "HOLDS"), rows, indent="    "))
    return "\n".join(lines)


def _keys(keys: Mapping[str, Any], style: Style) -> str:
    lines = [style.heading("Device-plugin ConfigMap:")]
    written = sorted(keys["written"])
    lines.append("  keys written: " + (", ".join(written) if written else "none"))
    unused = keys["unused"]
    if unused:
        lines.append(
            "  keys no longer named by any policy (deleted after --config-key-grace-period): "
            + ", ".join(unused)
        )
    return "\n".join(lines)


def _verdict(report: Mapping[str, Any]) -> str:
    if not report["problems"]:
        return "Result: clean (exit 0)."
    lines = [f"Result: blocked (exit {report['exitCode']}):"]
    lines.extend(f"  - {problem}" for problem in report["problems"])
    return "\n".join(lines)

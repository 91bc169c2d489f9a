"""``explain node`` for MIG: the layout a node has and why, as the operator sees it.

What the operator published (``status.mig``: the mig-parted config, the layout per GPU, the MIG
manager's state, slots per GPU by resource), what the node's labels say now (the layout label,
who set it, the MIG manager's state), and why, from the policies as they are: which policy
governs it and the layout its GPU model gets (``CompiledMig``), or the reason a MIG policy
cannot work there (``core.migphases.unsupported``: MIGLayoutDoesNotFit, MIGModelUnknown,
MIGNotCapable, MIGConfigOwnedByOther), or that MIG is to go off first for a policy without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import migphases
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.decisions import NodeDecision
from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.kubectl.output import Style


def explain(
    cache: ClusterCache,
    record: NodeRecord,
    decision: NodeDecision,
    *,
    published: Mapping[str, Any],
) -> dict[str, Any] | None:
    """The node's MIG section; None for a node MIG has nothing to do with (no MIG policy
    selects it, no layout label, nothing published)."""
    policies = [cache.policies[p] for p in cache.index.policies_of(record.name)]
    mig_policies = [p for p in policies if p.mig is not None]
    shown = published.get("mig")
    if not mig_policies and record.mig_config_label is None and not shown:
        return None
    label = record.mig_config_label
    return {
        "published": dict(shown) if isinstance(shown, Mapping) else None,
        "label": label,
        "labelSetBy": list(record.mig_config_owners) or None,  # None: ours, or no label
        "state": record.mig_state,
        "product": record.product,
        "labelLayout": _layout_in_configmap(cache, label),
        "wanted": _wanted(cache, record, decision.policy),
        "why": _why(record, decision, mig_policies),
        "unsupported": _refusals(record, mig_policies),
    }


def _layout_in_configmap(cache: ClusterCache, name: str | None) -> str | None:
    """The layout the mig-parted ConfigMap holds under ``name``; None if it holds none."""
    layouts = cache.mig_config.layouts or {}
    if name is None or name not in layouts:
        return None
    layout = layouts[name]
    return miggeometry.describe(layout.as_dict()) if layout is not None else "MIG disabled"


def _wanted(
    cache: ClusterCache, record: NodeRecord, policy: CompiledPolicy | None
) -> dict[str, Any] | None:
    status = migphases.status(record, policy) if policy is not None else None
    if status is None:
        return None
    name = status.get("config")
    return {
        "config": name,
        "layout": status.get("layout"),
        "slotsPerGPU": status.get("slotsPerGPU"),
        "inConfigMap": name in (cache.mig_config.layouts or {}),
    }


def _why(record: NodeRecord, decision: NodeDecision, mig_policies: list[CompiledPolicy]) -> str:
    policy = decision.policy
    if record.mig_config_owners:
        owners = ", ".join(record.mig_config_owners)
        return (
            f"nvidia.com/mig.config is set by field manager {owners}: gpushare never changes a"
            " MIG layout it did not write"
        )
    if decision.phase is NodePhase.UNSUPPORTED and policy is not None and policy.mig is not None:
        return (
            f"policy {policy.name} is MIG but cannot work here ({decision.reason}):"
            f" {decision.message}"
        )
    if policy is not None and policy.mig is not None:
        layout = policy.mig.layouts.get(record.product or "")
        shown = miggeometry.describe(layout.as_dict()) if layout is not None else "?"
        return (
            f"policy {policy.name} governs it: every {record.product} GPU gets {shown}"
            f" (mig-parted config {migphases.layout_name(record, policy)},"
            f" migStrategy {policy.mig.strategy})"
        )
    if migphases.mig_enabled_by_us(record) or (
        record.mig_config_label == migconfigs.ALL_DISABLED and not migphases.disabled(record)
    ):
        after = f"policy {policy.name}'s config" if policy is not None else "the default config"
        return (
            f"no MIG policy governs it: MIG is disabled ({migconfigs.ALL_DISABLED}) before {after}"
        )
    if mig_policies:
        return "a MIG policy selects it but does not govern it (see the ranking above)"
    return "no MIG policy governs it"


def _refusals(record: NodeRecord, mig_policies: list[CompiledPolicy]) -> list[dict[str, str]]:
    """Every selecting MIG policy that cannot work here, with the reason and its message."""
    found = []
    for policy in sorted(mig_policies, key=lambda p: p.name):
        problem = migphases.unsupported(record, policy)
        if problem is not None:
            found.append({"policy": policy.name, "reason": problem[0], "message": problem[1]})
    return found


def render(mig: Mapping[str, Any], style: Style) -> str:
    published = mig.get("published") or {}
    if published:
        title = f"MIG layout: {published.get('layout')} per GPU ({published.get('config')})"
    else:
        title = "MIG layout: none published"
    lines = [style.heading(title)]
    if published:
        per_gpu = ", ".join(f"{n} {r}" for r, n in (published.get("slotsPerGPU") or {}).items())
        lines.append(f"  state {published.get('state') or '-'}; slots per GPU: {per_gpu or '-'}")
    label = mig.get("label")
    if label is not None:
        setter = mig.get("labelSetBy")
        by = f"set by {', '.join(setter)}" if setter else "ours"
        content = mig.get("labelLayout") or "not in the mig-parted ConfigMap"
        lines.append(
            f"  label nvidia.com/mig.config={label} ({by}; {content});"
            f" nvidia.com/mig.config.state={mig.get('state') or '-'}"
        )
    lines.append(f"  why: {mig['why']}")
    wanted = mig.get("wanted")
    if wanted and wanted.get("config") != label:
        where = "" if wanted.get("inConfigMap") else ", not in the mig-parted ConfigMap yet"
        lines.append(f"  to become: {wanted.get('layout')} ({wanted.get('config')}{where})")
    for refusal in mig.get("unsupported") or ():
        lines.append(f"  {refusal['policy']}: {refusal['reason']}: {refusal['message']}")
    return "\n".join(lines)

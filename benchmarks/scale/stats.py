"""Pure helpers of the scale benchmark: /proc parsing, percentiles, metrics text, the table.

Kept free of I/O and of the control plane so that ``tests/unit/test_bench_scale_smoke.py`` can
check them in milliseconds: a benchmark whose arithmetic is wrong reports confident nonsense.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
# Clock ticks per second for /proc/<pid>/stat's utime/stime (100 on every Linux we run on).
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation, as numpy's default does.

    NaN for no values: an empty phase must show up as a missing figure, not as 0 s of lag.
    """
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def parse_proc_status(text: str) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of ``/proc/<pid>/status``, in bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            number, _, unit = rest.strip().partition(" ")
            scale = {"kB": 1024, "mB": MIB}.get(unit.strip(), 1)
            out[key] = int(number) * scale
    return out


def parse_proc_stat_cpu(text: str, *, ticks: int = CLK_TCK) -> float:
    """User + system CPU seconds of ``/proc/<pid>/stat`` (fields 14 and 15).

    The command name (field 2) is parenthesised and may hold spaces or parentheses itself, so
    fields are counted from the last ``)``.
    """
    fields = text[text.rindex(")") + 2 :].split()
    # After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12 here.
    return (int(fields[11]) + int(fields[12])) / ticks


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (name, labels, value); comments skipped."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def metric_sum(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
    name: str,
    **labels: str,
) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for sample, have, value in samples
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    )


def cpu_share(cpu_seconds: float, wall_seconds: float, *, cores: int) -> float:
    """CPU seconds over a window as a share of the machine (0-1): how busy a process kept it."""
    if wall_seconds <= 0 or cores <= 0:
        return math.nan
    return cpu_seconds / (wall_seconds * cores)


# -- budgets and the table -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the README table: a figure for both variants and, for ours, its budget."""

    label: str
    unit: str
    ours: float | None
    kopf: float | None
    budget: str  # human text, e.g. "≤ 200"
    ok: bool | None  # None: no budget on this row


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("PASS" if ok else "MISS")


def render_table(rows: Sequence[Row]) -> str:
    """A Markdown table, as pasted into the README."""
    lines = [
        "| measure | unit | gpushare | kopf-native | budget (gpushare) | |",
        "|---|---|---:|---:|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.label} | {row.unit} | {fmt(row.ours)} | {fmt(row.kopf)} | {row.budget} "
            f"| {verdict(row.ok)} |"
        )
    return "\n".join(lines)


def _get(result: Mapping[str, Any] | None, *path: str) -> float | None:
    node: Any = result
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return None if node is None else float(node)


def build_rows(
    ours: Mapping[str, Any] | None,
    kopf: Mapping[str, Any] | None,
    *,
    qps: float,
    delayed: Mapping[str, Any] | None = None,
    paced: Mapping[str, Any] | None = None,
) -> list[Row]:
    """The table's rows from both variants' result dicts, with ours checked against §5 budgets."""

    def both(*path: str) -> tuple[float | None, float | None]:
        return _get(ours, *path), _get(kopf, *path)

    def le(value: float | None, limit: float | None) -> bool | None:
        if value is None or limit is None or math.isnan(value):
            return None if limit is None else False
        return value <= limit

    cold = both("cold_start", "converged_s")
    synced = both("cold_start", "synced_s")
    peak = both("rss", "peak_mib")
    steady = both("rss", "steady_mib")
    cpu = both("cpu", "total_s")
    storm_cpu = both("heartbeat_storm", "cpu_s")
    storm_writes = both("heartbeat_storm", "writes")
    roll_s = both("rollout", "seconds")
    roll_w = both("rollout", "writes")
    roll_min = both("rollout", "minimum_writes")
    lag50 = both("pod_churn", "lag_p50_s")
    lag99 = both("pod_churn", "lag_p99_s")
    ratio_limit = None if storm_cpu[1] is None else 0.2 * storm_cpu[1]
    writes_ok = None
    if roll_w[0] is not None and roll_min[0] is not None:
        writes_ok = roll_w[0] <= roll_min[0]
    return [
        Row("cold start: caches synced", "s", *synced, "", None),
        Row("cold start: converged", "s", *cold, "", None),
        Row("peak RSS", "MiB", *peak, "≤ 200", le(peak[0], 200)),
        Row("steady RSS", "MiB", *steady, "", None),
        Row("CPU, whole run", "s", *cpu, "", None),
        Row(
            "heartbeat storm: CPU",
            "s",
            *storm_cpu,
            f"≤ 0.2 x kopf-native ({fmt(ratio_limit, 2)})",
            le(storm_cpu[0], ratio_limit),
        ),
        Row("heartbeat storm: API writes", "writes", *storm_writes, "= 0", le(storm_writes[0], 0)),
        Row(
            f"rollout of {fmt(_get(ours, 'rollout', 'nodes'))} nodes at {fmt(qps, 0)} QPS",
            "s",
            *roll_s,
            "≤ 60",
            le(roll_s[0], 60),
        ),
        Row("rollout: writes issued", "writes", *roll_w, "= minimum", writes_ok),
        Row("rollout: minimum writes", "writes", *roll_min, "", None),
        Row("pod churn: status lag p50", "s", *lag50, "", None),
        Row("pod churn: status lag p99", "s", *lag99, "≤ 2", le(lag99[0], 2)),
        *delayed_rows(delayed, qps=qps),
        *paced_rows(paced),
    ]


def delayed_rows(delayed: Mapping[str, Any] | None, *, qps: float) -> list[Row]:
    """The rollout at the default propagation delay with edits during the wait (ours only)."""
    if delayed is None:
        return []
    writes, minimum = _get(delayed, "writes"), _get(delayed, "minimum_writes")
    label = (
        f"rollout of {fmt(_get(delayed, 'nodes'))} nodes at {fmt(qps, 0)} QPS,"
        f" {fmt(_get(delayed, 'propagation_delay_s'))} s propagation delay,"
        f" {fmt(_get(delayed, 'edits'))} policy edits during the wait"
    )
    ok = None if writes is None or minimum is None else writes <= minimum
    return [
        Row(label, "s", _get(delayed, "seconds"), None, "", None),
        Row(f"{label}: writes issued", "writes", writes, None, "= minimum", ok),
        Row(f"{label}: minimum writes", "writes", minimum, None, "", None),
    ]


def paced_rows(paced: Mapping[str, Any] | None) -> list[Row]:
    """The paced rollout with the GFD responder (ours only; the kopf-native variant runs the
    same planner, so its pacing would be the same)."""
    if paced is None:
        return []
    rollout = paced.get("rollout") or {}
    label = (
        f"paced rollout of {fmt(_get(paced, 'nodes'))} nodes"
        f" (maxUnavailable {rollout.get('maxUnavailable', '?')},"
        f" canary {rollout.get('canary', '?')},"
        f" {fmt(_get(paced, 'propagation_delay_s'))} s propagation delay, GFD responder)"
    )
    seconds, limit = _get(paced, "seconds"), _get(paced, "time_budget_s")
    peak, allowed = _get(paced, "max_unavailable"), _get(paced, "max_unavailable_budget")
    writes, minimum = _get(paced, "writes"), _get(paced, "minimum_writes")

    def le(value: float | None, bound: float | None) -> bool | None:
        if bound is None:
            return None
        return value is not None and not math.isnan(value) and value <= bound

    return [
        Row(
            f"{label}: to all Verified (GNS)",
            "s",
            seconds,
            None,
            f"≤ {fmt(limit)}",
            le(seconds, limit),
        ),
        Row(
            f"{label}: to all confirmed (node labels)",
            "s",
            _get(paced, "seconds_node_labels"),
            None,
            "",
            None,
        ),
        Row(
            f"{label}: max unavailable (API side)",
            "nodes",
            peak,
            None,
            f"≤ {fmt(allowed)}",
            le(peak, allowed),
        ),
        Row(f"{label}: writes issued", "writes", writes, None, "≤ at most", le(writes, minimum)),
        Row(f"{label}: at most (a wait said by every node)", "writes", minimum, None, "", None),
        Row(f"{label}: leader CPU", "s", _get(paced, "leader_cpu_s"), None, "", None),
    ]


def render_relist(relist: Mapping[str, Any] | None) -> str:
    """The re-list rows: one per listing mode, with the server side's CPU beside the lister's."""
    if not relist:
        return ""
    labels = {
        "paged": "paged quorum list (before)",
        "streaming": "streaming list from the watch cache (after)",
    }
    lines = [
        "| re-list | pods | wall s | lister CPU s | kube-apiserver CPU s | etcd CPU s"
        " | lister peak RSS growth MiB | mode that ran |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for mode, label in labels.items():
        r = relist.get(mode)
        if r is None:
            continue
        lines.append(
            f"| re-list {fmt(_get(r, 'pods'))} pods: {label} | {fmt(_get(r, 'pods'))}"
            f" | {fmt(_get(r, 'wall_s'), 2)} | {fmt(_get(r, 'lister_cpu_s'), 2)}"
            f" | {fmt(_get(r, 'system_cpu_s', 'kube-apiserver'), 2)}"
            f" | {fmt(_get(r, 'system_cpu_s', 'etcd'), 2)}"
            f" | {fmt(_get(r, 'rss_growth_mib'))} | {r.get('list_mode', '?')} |"
        )
    return "\n".join(lines)

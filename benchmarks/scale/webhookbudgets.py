"""The webhook phase's budgets, judged from its windows (pure: no cluster, no clock).

Each budget is the operator's own share or a ratio within one run, never the API server's
coarse buckets alone (they start at 5 ms and mostly measure two shared cores):

- **CPU per admission** at most 0.5 ms: the operator process's CPU over the labelled window
  (from ``/proc``, everything included: TLS, HTTP, the answer, and the pod informer taking in
  each created pod), less its rate over the unlabelled window of the same pods (the idle rate:
  heartbeats, the informers, the Lease), divided by the admissions it answered;
- **its own p99** at most 2 ms (labelled window) and 3 ms while every node's heartbeat storms
  (storm window), from ``gpushare_webhook_admission_seconds`` (the review whole in hand to its
  answer handed to the kernel: the wall time to the write plus the write's CPU), whose buckets
  have edges at 2 and 3 ms: judged by the share of admissions at or under the edge (99 % or
  more), so the verdict never rests on an interpolation.  How long the review took to arrive,
  first byte to last, is the API server's and the network's
  (``gpushare_webhook_review_receive_seconds``), and how long the write kept the thread off its
  core once the API server had the answer is the machine's
  (``gpushare_webhook_write_wait_seconds``): both reported beside it;
- **no full collection** (``python_gc_collections_total{generation="2"}``) in any window.

Reported beside them, not judged: pod creates with and without the label, interleaved in one
window (the loader's own timing), and the API server's share of admissions within 5 and 25 ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from benchmarks.scale import stats

CPU_PER_ADMISSION_MS: Final = 0.5
OWN_P99_MS: Final = 2.0
OWN_P99_STORM_MS: Final = 3.0
FULL_COLLECTIONS: Final = 0


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0 or math.isnan(numerator):
        return None
    return round(numerator / denominator, 2)


def latency_summary(latencies: Sequence[float]) -> dict[str, float | None]:
    """The loader's exact percentiles (ms) of its creates."""
    if not latencies:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "p50_ms": round(stats.percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(stats.percentile(latencies, 99) * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
    }


def cpu_per_admission_ms(
    *, labelled: Mapping[str, Any], idle: Mapping[str, Any], admissions: float
) -> float | None:
    """The operator's CPU (ms) per admission over the labelled window, its idle rate taken
    out: ``labelled`` and ``idle`` are two windows' ``CpuWindow.result()``."""
    spent, wall = labelled["cpu_s"].get("gpushare"), labelled["wall_s"]
    rest, rest_wall = idle["cpu_s"].get("gpushare"), idle["wall_s"]
    if not admissions or spent is None or rest is None or not rest_wall:
        return None
    if math.isnan(spent) or math.isnan(rest):
        return None
    return float(1000 * (spent - rest * wall / rest_wall) / admissions)


def share_within(summary: Mapping[str, Any], edge_ms: float) -> float | None:
    """The share of a histogram summary's observations at or under ``edge_ms`` (an edge of
    its buckets), None if it has no such edge."""
    return next((share for edge, share in summary["under_ms"] if edge == edge_ms), None)


def judged(value: float | None, limit: float, *, at_most: bool = True) -> str:
    if value is None:
        return "n/a"
    return "PASS" if (value <= limit if at_most else value >= limit) else "FAIL"


def own_p99_verdict(summary: Mapping[str, Any], limit_ms: float) -> dict[str, Any]:
    """The operator's p99 judged by its buckets: 99 % at or under ``limit_ms``."""
    share = share_within(summary, limit_ms)
    return {
        "limit_ms": limit_ms,
        "p99_ms": summary.get("p99_ms"),
        "share_within": share,
        "verdict": judged(share, 0.99, at_most=False),
    }


def budgets(windows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Every budget of the phase, from its windows (``baseline``, ``webhook``, ``storm``,
    ``interleaved``), with its verdict."""
    hook, storm = windows["webhook"], windows["storm"]
    admissions = hook["operator_admission"]["count"]
    cpu = cpu_per_admission_ms(
        labelled=hook["cpu"], idle=windows["baseline"]["cpu"], admissions=admissions
    )
    collections = sum(w.get("full_collections", 0) for w in windows.values())
    return {
        "cpu_per_admission_ms": {
            "value": None if cpu is None else round(cpu, 3),
            "limit": CPU_PER_ADMISSION_MS,
            "admissions": admissions,
            "verdict": judged(cpu, CPU_PER_ADMISSION_MS),
        },
        "own_p99": own_p99_verdict(hook["operator_admission"], OWN_P99_MS),
        "own_p99_storm": own_p99_verdict(storm["operator_admission"], OWN_P99_STORM_MS),
        "full_collections": {
            "value": collections,
            "limit": FULL_COLLECTIONS,
            "verdict": judged(collections, FULL_COLLECTIONS),
        },
    }


def interleaved(latencies: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Pod creates with and without the label from one window, and their ratio (p50, p99)."""
    with_label = latency_summary(latencies.get("labelled", ()))
    without = latency_summary(latencies.get("unlabelled", ()))
    return {
        "labelled": with_label,
        "unlabelled": without,
        "p50_ratio": ratio(with_label["p50_ms"], without["p50_ms"]),
        "p99_ratio": ratio(with_label["p99_ms"], without["p99_ms"]),
    }

"""The webhook phase's pure parts: histogram arithmetic, the verdict, and what a pod should get.

``python -m benchmarks.scale --only webhook`` reads its headline figure from two scrapes of the
API server's coarse buckets; a delta that dropped a new series, a quantile that interpolated
differently from PromQL's ``histogram_quantile``, or a verdict that called an interpolated p99
proven would report confident nonsense there, and nothing would fail.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from benchmarks.scale import webhook, webhookbudgets

from gpushare_testing import webhooks as wh

INF = math.inf
# The API server's buckets for apiserver_admission_webhook_admission_duration_seconds.
EDGES = (0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 10.0, 25.0, INF)


def cumulative(*counts: float) -> dict[float, float]:
    """Per-bucket counts (one per edge of EDGES, +Inf last) as cumulative buckets."""
    assert len(counts) == len(EDGES)
    out, total = {}, 0.0
    for edge, count in zip(EDGES, counts, strict=True):
        total += count
        out[edge] = total
    return out


def test_a_delta_counts_series_that_appeared_and_takes_a_reset_as_all_new() -> None:
    before = {0.005: 10.0, 0.025: 12.0, INF: 12.0}
    after = {0.005: 15.0, 0.025: 20.0, INF: 21.0, 0.1: 21.0}
    assert webhook.delta(before, after) == {0.005: 5.0, 0.025: 8.0, INF: 9.0, 0.1: 21.0}
    assert webhook.delta({"a": 7.0}, {"a": 3.0}) == {"a": 3.0}  # restarted: 3 since


def test_quantile_interpolates_within_a_bucket_from_zero_in_the_lowest() -> None:
    # 990 under 5 ms, 10 in 5-25 ms.
    buckets = cumulative(990, 10, 0, 0, 0, 0, 0, 0, 0)
    # p50: rank 500 of 990 in [0, 5 ms].
    assert webhook.quantile(0.5, buckets) == pytest.approx(0.005 * 500 / 990)
    # p99: rank 990 is exactly the first bucket's count: its upper edge.
    assert webhook.quantile(0.99, buckets) == pytest.approx(0.005)
    # p99.5: rank 995, 5 of the 10 in (5, 25] ms: halfway.
    assert webhook.quantile(0.995, buckets) == pytest.approx(0.015)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_edge() -> None:
    buckets = cumulative(1, 0, 0, 0, 0, 0, 0, 0, 99)
    assert webhook.quantile(0.99, buckets) == 25.0


def test_quantile_edge_cases_follow_promql() -> None:
    assert math.isnan(webhook.quantile(0.5, cumulative(0, 0, 0, 0, 0, 0, 0, 0, 0)))
    assert math.isnan(webhook.quantile(0.5, {0.005: 3.0, 0.025: 4.0}))  # no +Inf bucket
    assert math.isnan(webhook.quantile(0.5, {INF: 3.0}))  # fewer than two buckets
    assert webhook.quantile(-0.1, cumulative(1, 0, 0, 0, 0, 0, 0, 0, 0)) == -INF
    assert webhook.quantile(1.1, cumulative(1, 0, 0, 0, 0, 0, 0, 0, 0)) == INF
    # A lowest bucket at or below 0 gives its own edge, no interpolation.
    assert webhook.quantile(0.2, {0.0: 5.0, 1.0: 10.0, INF: 10.0}) == 0.0


def test_quantile_sorts_its_buckets_and_forces_them_monotonic() -> None:
    shuffled = {INF: 100.0, 0.025: 100.0, 0.005: 50.0}
    assert webhook.quantile(0.75, shuffled) == pytest.approx(0.015)
    # A count lower than the one below it (a scrape torn between series) is raised to it.
    torn = {0.005: 50.0, 0.025: 40.0, 0.1: 100.0, INF: 100.0}
    assert webhook.quantile(0.5, torn) == pytest.approx(0.005)
    assert webhook.quantile(0.75, torn) == pytest.approx(0.025 + 0.075 * 25 / 50)


def test_the_share_under_each_edge_and_the_summary_in_ms() -> None:
    buckets = cumulative(900, 95, 5, 0, 0, 0, 0, 0, 0)
    assert webhook.share_within(buckets, 0.005) == pytest.approx(0.9)
    assert webhook.share_within(buckets, 0.025) == pytest.approx(0.995)
    assert math.isnan(webhook.share_within(buckets, 0.01))  # not an edge
    summary = webhook.summarize(buckets)
    assert summary["count"] == 1000
    assert summary["p50_ms"] == pytest.approx(1000 * 0.005 * 500 / 900, abs=1e-3)
    # rank 990: 90 of the 95 in (5, 25] ms.
    assert summary["p99_ms"] == pytest.approx(1000 * (0.005 + 0.02 * 90 / 95), abs=1e-3)
    assert summary["under_ms"][:3] == [[5.0, 0.9], [25.0, 0.995], [100.0, 1.0]]
    assert len(summary["under_ms"]) == len(EDGES) - 1  # every finite edge
    empty = webhook.summarize({})
    assert empty["count"] == 0 and empty["p99_ms"] is None and empty["under_ms"] == []


def test_the_verdict_says_whether_the_buckets_prove_it() -> None:
    proven = webhook.budget_verdict(cumulative(995, 5, 0, 0, 0, 0, 0, 0, 0))
    assert proven["verdict"] == "PASS" and proven["p99_ms"] == pytest.approx(4.975)
    assert proven["evidence"].startswith("proven by the buckets: 99.50% at or under 5 ms")
    # 98% under 5 ms, all under 25 ms: p99 interpolated to 15 ms, neither proven.
    between = webhook.budget_verdict(cumulative(980, 20, 0, 0, 0, 0, 0, 0, 0))
    assert between["verdict"] == "FAIL" and between["p99_ms"] == pytest.approx(15.0)
    assert between["evidence"] == "interpolated: the p99 lies in the 5-25 ms bucket"
    # 98.8% under 5 ms: rank 990 is 2 of the 12 above, 8.33 ms: a PASS that is not proven.
    lucky = webhook.budget_verdict(cumulative(988, 12, 0, 0, 0, 0, 0, 0, 0))
    assert lucky["verdict"] == "PASS" and lucky["p99_ms"] == pytest.approx(8.333, abs=1e-3)
    assert lucky["evidence"].startswith("interpolated")
    slow = webhook.budget_verdict(cumulative(500, 400, 100, 0, 0, 0, 0, 0, 0))
    assert slow["verdict"] == "FAIL"
    assert slow["evidence"] == "proven by the buckets: only 90.00% at or under 25 ms"
    none = webhook.budget_verdict({})
    assert none["verdict"] == "n/a" and none["p99_ms"] is None


def test_histograms_are_read_from_a_scrape_by_series_and_summed_by_le() -> None:
    text = "\n".join(
        [
            "# HELP apiserver_admission_webhook_admission_duration_seconds [STABLE] ...",
            "# TYPE apiserver_admission_webhook_admission_duration_seconds histogram",
            *(
                f'apiserver_admission_webhook_admission_duration_seconds_bucket{{le="{le}",'
                f'name="{name}",operation="CREATE",rejected="{rejected}",type="admit"}} {n}'
                for name, rejected, counts in (
                    (wh.WEBHOOK_NAME, "false", (90, 99, 100)),
                    (wh.WEBHOOK_NAME, "true", (1, 2, 2)),
                    ("other.example.com", "false", (5, 5, 5)),
                )
                for le, n in zip(("0.005", "0.025", "+Inf"), counts, strict=True)
            ),
            'apiserver_admission_webhook_admission_duration_seconds_count{name="'
            + wh.WEBHOOK_NAME
            + '",operation="CREATE",rejected="false",type="admit"} 100',
            'apiserver_request_duration_seconds_bucket{verb="POST",resource="pods",'
            'subresource="",le="0.005"} 3',
            'apiserver_request_duration_seconds_bucket{verb="POST",resource="pods",'
            'subresource="binding",le="0.005"} 7',
            'apiserver_request_duration_seconds_bucket{verb="GET",resource="pods",'
            'subresource="",le="0.005"} 11',
            "process_cpu_seconds_total 12.5",
        ]
    )
    samples = webhook.relevant(text, (webhook.ADMISSION_METRIC, webhook.REQUEST_METRIC + "_bucket"))
    assert not any(name == "process_cpu_seconds_total" for name, _, _ in samples)
    ours = webhook.histogram(samples, webhook.ADMISSION_METRIC, webhook.is_webhook)
    assert ours == {0.005: 91.0, 0.025: 101.0, INF: 102.0}
    creates = webhook.histogram(samples, webhook.REQUEST_METRIC, webhook.is_pod_create)
    assert creates == {0.005: 3.0}
    counts = webhook.series(
        samples,
        f"{webhook.ADMISSION_METRIC}_count",
        ("name", "rejected"),
        webhook.is_webhook,
    )
    assert counts == {f"name={wh.WEBHOOK_NAME},rejected=false": 100.0}


def test_the_operators_writes_are_read_by_kind_and_outcome() -> None:
    samples = [
        ("gpushare_writes_total", {"kind": "secret", "outcome": "ok"}, 1.0),
        ("gpushare_writes_total", {"kind": "node-labels", "outcome": "ok"}, 0.0),
    ]
    assert webhook.writes(samples) == {"kind=secret,outcome=ok": 1}


def test_each_size_of_the_load_lands_in_another_class() -> None:
    classes = webhook.offers()
    # MPS at 8, 4, 2 replicas of an H100's 81559 MiB, and Exclusive; time-slicing offers none.
    assert classes == [10194, 20389, 40779, 81559]
    chosen = [webhook.expected_class(size, classes) for size in webhook.SIZES]
    assert chosen == [10194, 20389, 40779, 40779, 81559]
    assert set(chosen) == set(classes)  # the load reaches every class
    assert webhook.expected_class("80Gi", classes) is None  # 81920 MiB: refused


def test_the_class_given_is_read_from_the_mutated_pod() -> None:
    body = webhook.pod_body("p", size="10Gi")
    assert body["metadata"]["labels"][wh.REQUEST_LABEL] == "10Gi"
    assert "uid" not in body["metadata"] and "status" not in body
    assert "nodeName" not in body["spec"] and "ownerReferences" not in body["metadata"]
    assert webhook.placed_class(body) is None  # not mutated
    container = body["spec"]["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = "1"
    expression = {"key": "gpushare.dev/slot-memory-mib", "operator": "Lt", "values": ["20390"]}
    body["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [expression]}}
            ]
        }
    }
    assert webhook.placed_class(body) == 20389
    plain = webhook.pod_body("q", size=None)
    assert wh.REQUEST_LABEL not in plain["metadata"]["labels"]


def test_every_node_is_expected_under_its_pools_policy() -> None:
    expected = webhook.expected_policies(10)
    assert len(expected) == 10
    assert set(expected.values()) == {webhook.policy_name(pool) for pool in webhook.POLICIES}
    exclusive = webhook.policy_body("training")["spec"]
    assert exclusive["strategy"] == "Exclusive" and "replicas" not in exclusive


def test_ratios_and_latency_summaries() -> None:
    assert webhook.lag_summary([0.001, 0.250, 0.004]) == {
        "max_ms": 250.0,
        "median_ms": 4.0,
        "samples": 3,
    }
    assert webhook.lag_summary([])["max_ms"] is None
    assert webhook.ratio(30.0, 10.0) == 3.0
    assert webhook.ratio(None, 10.0) is None and webhook.ratio(3.0, 0.0) is None
    summary = webhook.latency_summary([0.010] * 99 + [0.110])
    assert summary["p50_ms"] == 10.0 and summary["max_ms"] == 110.0
    assert webhook.latency_summary([]) == {"p50_ms": None, "p99_ms": None, "max_ms": None}


# -- the budgets (webhookbudgets) ----------------------------------------------------------------


def cpu(gpushare: float, wall: float) -> dict[str, Any]:
    return {"cpu_s": {"gpushare": gpushare}, "wall_s": wall}


def test_cpu_per_admission_takes_the_idle_rate_out() -> None:
    # 4.5 s over 60 s labelled, 1.2 s over 40 s idle (1.8 s over 60 s): 2.7 s for 6,000.
    got = webhookbudgets.cpu_per_admission_ms(
        labelled=cpu(4.5, 60), idle=cpu(1.2, 40), admissions=6000
    )
    assert got == pytest.approx(0.45)
    assert (
        webhookbudgets.cpu_per_admission_ms(labelled=cpu(1, 60), idle=cpu(1, 60), admissions=0)
        is None
    )
    nan = webhookbudgets.cpu_per_admission_ms(
        labelled=cpu(math.nan, 6), idle=cpu(1, 6), admissions=5
    )
    assert nan is None


def own(*counts: float) -> dict[str, Any]:
    """An operator histogram summary from per-bucket counts at 1, 2, 3 ms and +Inf."""
    edges = (0.001, 0.002, 0.003, INF)
    buckets, total = {}, 0.0
    for edge, count in zip(edges, counts, strict=True):
        total += count
        buckets[edge] = total
    return webhook.summarize(buckets)


def test_the_own_p99_is_judged_by_the_share_at_or_under_its_edge() -> None:
    assert webhookbudgets.own_p99_verdict(own(900, 95, 5, 0), 2.0)["verdict"] == "PASS"
    failed = webhookbudgets.own_p99_verdict(own(900, 89, 11, 0), 2.0)
    assert failed["verdict"] == "FAIL" and failed["share_within"] == pytest.approx(0.989)
    assert webhookbudgets.own_p99_verdict(own(900, 89, 11, 0), 3.0)["verdict"] == "PASS"
    # An edge the histogram does not have is no verdict at all.
    assert webhookbudgets.own_p99_verdict(own(1, 0, 0, 0), 2.5)["verdict"] == "n/a"


def window(*, gpushare: float, wall: float, shares: tuple[float, ...], gcs: int = 0) -> Any:
    summary = own(*shares)
    latencies = {"p50_ms": 5.0, "p99_ms": 9.0, "max_ms": 12.0}
    return {
        "cpu": cpu(gpushare, wall)
        | {"machine_busy_share": 0.5, "others_share": 0.01}
        | {"loadavg_start": [1.0], "loadavg_end": [1.0]},
        "operator_admission": summary,
        "operator_receive": summary,
        "admission": summary,
        "full_collections": gcs,
        "load": {
            "failed": {},
            "misplaced": 0,
            "client_latency": latencies,
            "achieved_per_s": 100.0,
        },
        "operator_loop_lag": {"max_ms": 3.0, "median_ms": 1.0, "samples": 5},
        "webhook_loop_lag": {"max_ms": 1.0, "median_ms": 0.5, "samples": 5},
        "heartbeats": None,
        "operator_outcomes": {},
        "operator_writes": {},
    }


def test_every_budget_is_judged_and_the_report_renders() -> None:
    windows = {
        "baseline": window(gpushare=1.2, wall=60, shares=(0, 0, 0, 0)),
        "webhook": window(gpushare=4.2, wall=60, shares=(5990, 10, 0, 0)),
        "storm": window(gpushare=9.0, wall=60, shares=(5000, 800, 100, 100), gcs=1),
        "interleaved": window(gpushare=3.0, wall=60, shares=(3000, 0, 0, 0)),
    }
    windows["interleaved"]["interleaved"] = webhookbudgets.interleaved(
        {"labelled": [0.010, 0.012], "unlabelled": [0.005, 0.006]}
    )
    judged = webhookbudgets.budgets(windows)
    assert judged["cpu_per_admission_ms"]["value"] == pytest.approx(0.5)
    assert judged["cpu_per_admission_ms"]["verdict"] == "PASS"
    assert judged["own_p99"]["verdict"] == "PASS"
    assert judged["own_p99_storm"]["verdict"] == "FAIL"  # 98.3% within 3 ms
    assert judged["full_collections"] == {"value": 1, "limit": 0, "verdict": "FAIL"}
    result = {
        **windows,
        "budgets": judged,
        "budget": {"evidence": "interpolated"},
        "budget_conditions": True,
        "nodes": 5000,
        "rate_per_s": 100.0,
        "seconds": 60.0,
        "cores": 2,
    }
    text = webhook.render(result)
    assert "| operator CPU per admission" in text and "| full collections" in text
    assert "x2 / x2" in text  # the interleaved ratios (10/5, 12/6)

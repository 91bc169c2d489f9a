"""The scale benchmark's pure helpers: what its numbers are computed with (no control plane).

``make bench-scale`` takes up to half an hour against a real API server; a wrong percentile, a
misread ``/proc`` field or a table that drops a MISS would only show up there, if at all.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from benchmarks.scale import cluster, delayed, gfd, paced, stats

STAT = (
    "4242 (python -m gpushare (x)) S 1 4242 4242 0 -1 4194560 52312 0 0 0 "
    "1234 567 0 0 20 0 3 0 123456 512000000 40000 18446744073709551615"
)
STATUS = "Name:\tpython\nVmHWM:\t  180000 kB\nVmRSS:\t  150000 kB\nThreads:\t3\n"


def test_percentile_interpolates_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 50) == pytest.approx(50.5)
    assert stats.percentile(values, 99) == pytest.approx(99.01)
    assert stats.percentile([3.0], 99) == 3.0
    assert math.isnan(stats.percentile([], 50))
    with pytest.raises(ValueError, match="outside"):
        stats.percentile([1.0], 101)


def test_proc_parsing_survives_spaces_and_parentheses_in_the_name() -> None:
    assert stats.parse_proc_stat_cpu(STAT, ticks=100) == pytest.approx(18.01)
    assert stats.parse_proc_status(STATUS) == {"VmHWM": 180000 * 1024, "VmRSS": 150000 * 1024}


def test_metrics_text_is_parsed_and_summed_by_label() -> None:
    text = (
        "# HELP gpushare_writes_total API writes\n"
        'gpushare_writes_total{kind="node-labels",outcome="ok"} 7.0\n'
        'gpushare_writes_total{kind="policy",outcome="ok"} 3.0\n'
        'gpushare_writes_total{kind="policy",outcome="http_409"} 1.0\n'
        'gpushare_cache_objects{kind="Node"} 500.0\n'
        "gpushare_write_queue_depth 0.0\n"
    )
    samples = stats.parse_metrics(text)
    assert stats.metric_sum(samples, "gpushare_writes_total", outcome="ok") == 10
    assert stats.metric_sum(samples, "gpushare_cache_objects", kind="Node") == 500
    assert stats.metric_sum(samples, "gpushare_write_queue_depth") == 0


def test_table_checks_budgets_and_says_miss() -> None:
    ours = {
        "rss": {"peak_mib": 150.0},
        "heartbeat_storm": {"cpu_s": 1.0, "writes": 0},
        "rollout": {"nodes": 2500, "seconds": 250.0, "writes": 5021, "minimum_writes": 5021},
        "pod_churn": {"lag_p99_s": 1.2},
    }
    kopf = {"rss": {"peak_mib": 900.0}, "heartbeat_storm": {"cpu_s": 20.0, "writes": 0}}
    rows = {row.label.split(" at ")[0]: row for row in stats.build_rows(ours, kopf, qps=20)}
    assert rows["peak RSS"].ok is True
    assert rows["heartbeat storm: CPU"].ok is True  # 1.0 <= 0.2 x 20
    assert rows["heartbeat storm: API writes"].ok is True
    assert rows["rollout of 2,500 nodes"].ok is False  # 250 s > 60 s
    assert rows["rollout: writes issued"].ok is True
    assert rows["pod churn: status lag p99"].ok is True
    table = stats.render_table(list(rows.values()))
    assert "| MISS |" in table and "| PASS |" in table and "n/a" in table


def test_churn_lag_matches_first_publication_after_the_change() -> None:
    seen = {("n1", 3): [9.0, 10.4], ("n2", 1): [20.0]}
    expectations = [("n1", 3, 10.0), ("n2", 1, 19.0), ("n3", 1, 5.0)]
    lags, missing = cluster.churn_lags(expectations, seen, deadline=100.0)
    assert sorted(lags) == pytest.approx([0.4, 1.0])
    assert missing == 1


def test_churn_lag_counts_a_coalesced_change_as_published_by_the_later_status() -> None:
    # create (3) at 10.0 and delete (2) at 10.5, published as one status "2" at 11.0
    seen = {("n1", 2): [1.0, 11.0]}
    lags, missing = cluster.churn_lags([("n1", 3, 10.0), ("n1", 2, 10.5)], seen, deadline=99.0)
    assert sorted(lags) == pytest.approx([0.5, 1.0])
    assert missing == 0


def test_bench_policies_and_expected_winners_agree() -> None:
    names = {p["metadata"]["name"] for p in cluster.policy_bodies()}
    assert len(names) == 20
    for index in range(40):
        assert cluster.expected_policy(index, rollout=False) in names
    halves = [cluster.expected_policy(i, rollout=True) for i in range(100)]
    assert halves.count(cluster.ROLLOUT_POLICY) == 50


def test_pod_bodies_are_bound_and_one_in_five_is_shared() -> None:
    pods = [cluster.pod_body(i, nodes=10) for i in range(10)]
    assert all(p["spec"]["nodeName"].startswith("gpu-") for p in pods)
    assert all("managedFields" not in p["metadata"] and "uid" not in p["metadata"] for p in pods)
    shared = [p for p in pods if "nvidia.com/gpu.shared" in str(p["spec"]["containers"])]
    assert len(shared) == 2


def test_audit_tail_follows_the_log_through_a_rotation(tmp_path: Path) -> None:
    def line(user: str, verb: str) -> str:
        event = {
            "stage": "ResponseComplete",
            "verb": verb,
            "user": {"username": user},
            "objectRef": {"resource": "gpunodestates", "subresource": "status"},
            "stageTimestamp": "2026-11-29T18:00:00.000000Z",
        }
        return json.dumps(event, separators=(",", ":")) + "\n"

    log = tmp_path / "audit.log"
    log.write_text(line("bench-a", "patch") + line("someone", "patch"))
    tail = cluster.AuditTail(log, ["bench-a"])
    tail.poll()
    with log.open("a") as handle:  # written just before the rotation
        handle.write(line("bench-a", "patch"))
    log.rename(tmp_path / "audit-2026-11-29T18-00-00.000.log")
    log.write_text(line("bench-a", "create"))
    writes = tail.between("bench-a", 0, 2e9)
    assert [what for _, what in writes] == [
        "patch gpunodestates/status",
        "patch gpunodestates/status",
        "create gpunodestates/status",
    ]


def test_delayed_rollout_rows_are_ours_only_and_say_the_delay() -> None:
    delayed = {
        "nodes": 2500,
        "propagation_delay_s": 75.0,
        "edits": 3,
        "seconds": 330.0,
        "writes": 5012,
        "minimum_writes": 5006,
    }
    rows = stats.build_rows({}, {}, qps=20, delayed=delayed)
    late = [row for row in rows if "propagation delay" in row.label]
    assert [row.unit for row in late] == ["s", "writes", "writes"]
    assert "2,500 nodes" in late[0].label and "75 s propagation delay" in late[0].label
    assert "3 policy edits" in late[0].label
    assert all(row.kopf is None for row in late)
    assert late[1].ok is False  # 5,012 writes > the minimum 5,006: said, not hidden
    assert stats.build_rows({}, {}, qps=20) == stats.build_rows({}, {}, qps=20, delayed=None)
    assert not any("propagation delay" in row.label for row in stats.build_rows({}, {}, qps=20))


def test_relist_table_has_one_row_per_mode_and_the_mode_that_ran() -> None:
    relist = {
        "paged": {
            "pods": 50000,
            "list_mode": "paged",
            "wall_s": 12.5,
            "lister_cpu_s": 9.0,
            "system_cpu_s": {"kube-apiserver": 6.0, "etcd": 2.5},
            "rss_growth_mib": 80.0,
        },
        "streaming": {
            "pods": 50000,
            "list_mode": "paged",  # the server refused streaming lists: the row must say so
            "wall_s": 7.0,
            "lister_cpu_s": 8.0,
            "system_cpu_s": {"kube-apiserver": 3.0},
            "rss_growth_mib": 70.0,
        },
    }
    lines = stats.render_relist(relist).splitlines()
    assert len(lines) == 4
    assert "re-list 50,000 pods: paged quorum list (before)" in lines[2]
    assert "re-list 50,000 pods: streaming list from the watch cache (after)" in lines[3]
    assert lines[2].endswith("| paged |") and lines[3].endswith("| paged |")
    assert "| 12.50 |" in lines[2] and "| n/a |" in lines[3]  # etcd missing: n/a, not 0
    assert stats.render_relist(None) == ""


def test_delayed_rollout_names_the_policies_whose_status_was_written(tmp_path: Path) -> None:
    def line(user: str, name: str, subresource: str | None, stamp: str) -> str:
        ref = {"resource": "gpusharingpolicies", "name": name}
        if subresource:
            ref["subresource"] = subresource
        event = {
            "stage": "ResponseComplete",
            "verb": "patch",
            "user": {"username": user},
            "objectRef": ref,
            "stageTimestamp": stamp,
        }
        return json.dumps(event, separators=(",", ":")) + "\n"

    log = tmp_path / "audit.log"
    inside, outside = "2026-11-29T18:00:05.000000Z", "2026-11-29T17:00:00.000000Z"
    log.write_text(
        line("bench-a", "dev-wide", "status", inside)
        + line("bench-a", "dev-wide", "status", inside)
        + line("bench-a", "rollout", "status", inside)
        + line("bench-a", "rollout", None, inside)  # the spec, not the status
        + line("bench-a", "rollout", "status", outside)
        + line("someone", "rollout", "status", inside)
    )
    start = cluster.epoch("2026-11-29T18:00:00.000000Z")
    counts = delayed.policy_status_writes(log, "bench-a", start, start + 60)
    assert counts == {"dev-wide": 2, "rollout": 1}


def _node(
    *, config: str | None, replicas: str, strategy: str, gpu: str, shared: str | None
) -> dict[str, Any]:
    labels = {
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.replicas": replicas,
        "nvidia.com/gpu.sharing-strategy": strategy,
    }
    if config is not None:
        labels["nvidia.com/device-plugin.config"] = config
    allocatable = {"cpu": "63080m", "nvidia.com/gpu": gpu}
    if shared is not None:
        allocatable["nvidia.com/gpu.shared"] = shared
    return {"metadata": {"name": "n1", "labels": labels}, "status": {"allocatable": allocatable}}


CONFIGS = {
    "ts-4": "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
    "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    "ts-3-plain": "version: v1\nsharing:\n  timeSlicing:\n"
    "    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n",
}


def test_gfd_responder_restarts_registers_and_relabels_as_the_agents_do() -> None:
    before = gfd.view(_node(config="ts-4", replicas="1", strategy="none", gpu="8", shared=None))
    sharing = gfd.sharing_of("ts-4", CONFIGS)
    assert sharing is not None and sharing.replicas == 4
    assert not gfd.confirmed(before, sharing)
    assert gfd.restarted(before) == {"nvidia.com/gpu": "0"}  # the plugin is down: 0, kept
    # Renamed: the shared resource appears, the old one stays registered at 0.
    assert gfd.registered(before, sharing) == {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "32"}
    labels = gfd.relabelled(before, sharing, stamp="1")
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert "nvidia.com/gpu.product" not in labels  # renamed: GFD adds no -SHARED suffix
    after = gfd.view(
        _node(config="ts-4", replicas="4", strategy="time-slicing", gpu="0", shared="32")
    )
    assert gfd.confirmed(after, sharing)
    # The restart alone (labels right, allocatable 0) is not a confirmation.
    down = gfd.view(
        _node(config="ts-4", replicas="4", strategy="time-slicing", gpu="0", shared="0")
    )
    assert not gfd.confirmed(down, sharing)
    # Not renamed: the product gets -SHARED, as GFD names a replicated resource.
    plain = gfd.sharing_of("ts-3-plain", CONFIGS)
    assert plain is not None
    relabel = gfd.relabelled(before, plain, stamp="1")
    assert relabel["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    # A label naming a key the ConfigMap lacks: the plugin does not run, never confirmed.
    assert gfd.sharing_of("nope", CONFIGS) is None
    assert not gfd.confirmed(after, None)


def test_meter_counts_unavailable_nodes_and_keeps_the_peak() -> None:
    meter = gfd.Meter()
    meter.reset()
    for name in ("a", "b", "c"):
        meter.observe(name, "k2", False)
    meter.observe("a", "k2", False)  # still down: no new point
    meter.observe("a", "k2", True)
    meter.observe("d", "k2", False)
    meter.observe("b", "k2", True)
    assert meter.peak == 3
    assert sorted(meter.down) == ["c", "d"]
    assert [count for _, count in meter.series] == [0, 1, 2, 3, 2, 3, 2]
    assert meter.confirmed_at["a"][0] == "k2" and len(meter.durations) == 2


def test_paced_rollout_minimum_budget_and_rows() -> None:
    assert paced.budget(2500, total_nodes=5000) == 250
    assert paced.budget(250, total_nodes=500) == 25
    minimum = paced.minimum_writes(nodes=2500, canary=1, changing_s=130.0)
    assert minimum == {
        "patch configmaps": 1,
        # Pending, RolloutWaiting (all but the canary), Applied, Verified
        "patch gpunodestates/status": 9999,
        "patch gpusharingpolicies/status": 4,  # generation, 2 progress reports, completion
        "patch nodes": 5000,  # the config change, then the slot labels once Verified
    }
    # 75 s wait + 12,499 writes at 100 QPS + 11 batches (canary, then 10 of 250) x 5 s
    assert paced.time_budget(nodes=2500, canary=1, allowed=250, delay=75, qps=100) == pytest.approx(
        75 + 124.99 + 55
    )
    result = {
        "nodes": 2500,
        "rollout": {"maxUnavailable": "10%", "canary": 1},
        "propagation_delay_s": 75.0,
        "seconds": 200.0,
        "time_budget_s": 230.0,
        "max_unavailable": 251,
        "max_unavailable_budget": 250,
        "writes": 12505,
        "minimum_writes": 12504,
        "leader_cpu_s": 20.0,
    }
    rows = stats.build_rows({}, {}, qps=100, paced=result)
    mine = [row for row in rows if row.label.startswith("paced rollout")]
    assert "maxUnavailable 10%, canary 1, 75 s propagation delay" in mine[0].label
    assert [row.ok for row in mine] == [True, None, False, False, None, None]
    assert all(row.kopf is None for row in mine)

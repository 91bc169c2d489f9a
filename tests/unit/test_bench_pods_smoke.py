"""The pod benchmark on a tiny cluster: it runs, reports every budget, and both sides agree.

No timing is asserted here (two shared cores make any threshold flaky); this only keeps
``make bench`` from rotting between the times someone runs it.  What is deterministic is
asserted: non-GPU pods schedule nothing, and the baseline's scheduler rule is the real one.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from benchmarks import __main__ as bench_main
from benchmarks import naive_pods, pods

from gpushare_operator.core.records.pods import effective_request

CONFIG = pods.Config(nodes=20, pods=200, small=50, rounds=1, naive_changes=2)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "pods.json"
    written = pods.run(dataclasses.replace(CONFIG, out=out))
    assert orjson.loads(out.read_bytes()) == orjson.loads(orjson.dumps(written))
    return written


def test_report_has_every_section(report: dict[str, Any]) -> None:
    assert report.keys() >= {"events", "memory", "flat", "naive", "workload", "budgets"}
    ratios = report["events"]["ours_over_json_loads"]
    assert ratios.keys() >= {"gpu", "plain", "all", "added_gpu", "modified_plain"}
    for contenders in report["events"]["ns_per_event"].values():
        assert contenders.keys() == {"json_loads", "orjson_loads", "ours"}
    assert report["flat"].keys() >= {"small_over_json_loads", "large_over_small"}


def test_workload_is_the_intended_mix(report: dict[str, Any]) -> None:
    counts = report["events"]["events_per_round"]
    assert counts["added_gpu"] + counts["added_plain"] == CONFIG.pods
    assert counts["added_gpu"] == CONFIG.pods // 5  # one in five asks for GPU slots
    assert counts["modified_gpu"] > 0 and counts["deleted_plain"] > 0
    assert report["memory"]["gpu_records"] == counts["added_gpu"]
    # 4 of the 5 pools have a policy (less any node it cannot work on), and pods on them move
    # that policy's counter.
    assert 0 < report["workload"]["nodes_governed"] <= CONFIG.nodes * 4 // 5
    assert all(slots > 0 for slots in report["workload"]["policy_slots"].values())


def test_both_sizes_agree_with_the_baseline(report: dict[str, Any]) -> None:
    naive = report["naive"]
    assert naive["small"]["pods_cached"] == CONFIG.small
    assert naive["large"]["pods_cached"] == CONFIG.pods
    # small: blocks of five pods fill one node each; large: every node has a GPU pod.
    assert naive["small"]["nodes_agreeing"] == CONFIG.small // 5
    assert naive["large"]["nodes_agreeing"] == CONFIG.nodes


def test_non_gpu_pods_schedule_nothing(report: dict[str, Any]) -> None:
    dirty = report["events"]["dirty_objects_per_event"]
    assert all(dirty[f"{kind}_plain"] == 0 for kind in pods.KINDS)
    assert all(dirty[f"{kind}_gpu"] > 0 for kind in pods.KINDS)


def test_every_budget_is_in_the_table(report: dict[str, Any]) -> None:
    rows = report["budgets"]
    assert len(rows) == 9
    assert all({"measure", "ours", "naive", "budget", "pass"} <= row.keys() for row in rows)
    table = pods.table(report)
    assert table.count("\n|") == len(rows) + 1
    assert all(row["measure"] in table for row in rows)


def test_main_prints_the_table_and_exits_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--nodes", "10", "--pods", "50", "--small", "25", "--rounds", "1"]
    assert pods.main([*argv, "--naive-changes", "2", "--out", str(tmp_path / "out.json")]) == 0
    assert "| Measure |" in capsys.readouterr().out
    assert (tmp_path / "out.json").exists()


def test_the_baseline_applies_the_scheduler_rule() -> None:
    """Every pod shape of the workload, and the rule's corners, as ``core.records.pods`` computes
    them."""
    work = pods.build_workload(CONFIG)
    bodies = [orjson.loads(line)["object"] for line in work.added[:200]]

    def container(amount: int, *, sidecar: bool = False) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": str(amount)}
        return {"resources": {"limits": limits}} | ({"restartPolicy": "Always"} if sidecar else {})

    corners = [
        {
            "initContainers": [container(1, sidecar=True), container(3)],
            "containers": [container(1)],
        },
        {
            "initContainers": [container(3), container(2, sidecar=True)],
            "containers": [container(1)],
        },
        {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {}}}]},
    ]
    specs = [body["spec"] for body in bodies] + corners
    for spec in specs:
        for resource in pods.TRACKED:
            assert naive_pods.effective_request(spec, resource) == effective_request(spec, resource)


def test_make_bench_runs_each_benchmark_in_its_own_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []

    def call(command: list[str]) -> int:
        ran.append(command)
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    assert bench_main.main([]) == 0
    assert ran == [
        [sys.executable, "-m", "benchmarks.ingest"],
        [sys.executable, "-m", "benchmarks.pods"],
        [sys.executable, "-m", "benchmarks.dra"],
        [sys.executable, "-m", "benchmarks.admission"],
        [sys.executable, "-m", "benchmarks.process"],
    ]
    with pytest.raises(SystemExit):
        bench_main.main(["nodes"])

"""The process benchmark's arithmetic and table (no control plane: ``make bench`` runs it whole)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from benchmarks import process
from benchmarks.__main__ import BENCHMARKS, commands


def measured(
    *, storm_cpu: float, idle_cpu: float, events: float, beside: list[float] | None = None
) -> dict[str, object]:
    line = b'{"type":"MODIFIED","object":' + orjson.dumps({"a": list(range(2000))}) + b"}\n"
    storm = {
        "patches": events,
        "events": events,
        "storm_seconds": 10.0,
        "storm_cpu_seconds": storm_cpu,
        "idle_cpu_seconds": idle_cpu,
        "events_per_second": events / 10.0,
    }
    return {"storm": storm, "line_bytes": len(line), "line": line, "beside": beside or []}


def test_cpu_per_event_is_net_of_idle_and_a_ratio_to_json_loads_of_the_same_line() -> None:
    config = process.Config(out=Path("unused.json"))
    report = process.figures(measured(storm_cpu=1.2, idle_cpu=0.2, events=1000), config)
    assert report["operator_ns_per_event"] == 1_000_000  # (1.2 - 0.2) s / 1000 events
    ratio = report["operator_ns_per_event"] / report["json_loads_ns_per_event"]
    assert report["operator_over_json_loads"] == pytest.approx(ratio, abs=0.01)
    assert report["pass"] is (ratio <= process.BUDGET)
    json.dumps(report)  # the JSON file can hold it


def test_json_loads_under_the_storms_load_is_the_denominator_when_measured() -> None:
    config = process.Config(out=Path("unused.json"))
    beside = [100_000.0, 90_000.0, 500_000.0]  # median 100 µs
    report = process.figures(
        measured(storm_cpu=0.3, idle_cpu=0.0, events=1000, beside=beside), config
    )
    assert report["json_loads_ns_per_event"] == 100_000
    assert report["operator_over_json_loads"] == 3.0
    assert report["json_loads_passes_beside"] == 3


def test_the_sidecar_times_json_loads_until_terminated(tmp_path: Path) -> None:
    line = tmp_path / "line.json"
    line.write_bytes(orjson.dumps({"a": list(range(500))}))
    into: list[float] = []
    with process.loads_beside(line.read_bytes(), into):
        pass  # the sidecar has made its first pass before the block runs
    assert into and all(ns > 0 for ns in into)


def test_the_table_has_the_budget_row_and_says_miss() -> None:
    config = process.Config(out=Path("unused.json"))
    report = process.figures(measured(storm_cpu=100.0, idle_cpu=0.0, events=10), config)
    table = process.table(report)
    assert "| Operator process CPU per Node event" in table
    assert "≤ 3.0" in table
    assert "**MISS**" in table


def test_every_heartbeat_differs_so_that_each_patch_makes_an_event() -> None:
    beats = {orjson.dumps(process.heartbeat(seq)) for seq in range(5000)}
    assert len(beats) == 5000


def test_make_bench_runs_it() -> None:
    assert "process" in BENCHMARKS
    assert commands(["process"])[0][-1] == "benchmarks.process"

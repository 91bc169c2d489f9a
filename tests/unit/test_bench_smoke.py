"""The ingest benchmark on a tiny cluster: it runs, reports every budget, and both sides agree.

No timing is asserted here (two shared cores make any threshold flaky); this only keeps
``make bench`` from rotting between the times someone runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from benchmarks import ingest, naive

from gpushare_operator.core.labelling.selectors import compile_selector

EVENT_KEYS = {
    "json_loads_ns_per_event",
    "orjson_loads_ns_per_event",
    "ours_ns_per_event",
    "naive_ns_per_event",
    "ours_over_json_loads",
    "naive_over_ours",
    "dirty_objects_per_event",
    "planned_node_writes_per_event",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "ingest.json"
    config = ingest.Config(nodes=50, policies=12, rounds=2, naive_events=10, mig_nodes=10, out=out)
    written = ingest.run(config)
    assert orjson.loads(out.read_bytes()) == orjson.loads(orjson.dumps(written))
    return written


def test_report_has_every_section(report: dict[str, Any]) -> None:
    # 12 policies cover the inference pool and two batch policies; widened, inference-default
    # adds the batch pool: 10 + 10 of the 50 nodes end up matched.
    assert report["agreement"] == {"equal": True, "nodes_matched": 20}
    for kind in ("heartbeat", "label_change"):
        assert report["events"][kind].keys() >= EVENT_KEYS
    assert report["memory"]["ours_bytes_per_node"] > 0
    assert report["reevaluation"]["nodes_whose_match_changed"] == 10  # the batch pool joins


def test_heartbeats_schedule_nothing(report: dict[str, Any]) -> None:
    beat = report["events"]["heartbeat"]
    assert beat["dirty_objects_per_event"] == 0
    assert beat["planned_node_writes_per_event"] == 0


def test_every_budget_is_in_the_table(report: dict[str, Any]) -> None:
    rows = report["budgets"]
    assert len(rows) == 9  # 6, and 3 for the MIG nodes
    assert all({"measure", "ours", "budget", "pass"} <= row.keys() for row in rows)
    table = ingest.table(report)
    assert table.count("\n|") == len(rows) + 1
    assert all(row["measure"] in table for row in rows)


def test_main_prints_the_table_and_exits_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--nodes", "10", "--policies", "5", "--rounds", "1", "--naive-events", "2"]
    assert ingest.main([*argv, "--out", str(tmp_path / "out.json")]) == 0
    printed = capsys.readouterr().out
    assert "| Measure |" in printed
    assert (tmp_path / "out.json").exists()


@pytest.mark.parametrize("body", ingest.policy_bodies(50), ids=lambda b: b["metadata"]["name"])
def test_naive_parser_agrees_with_compiled_selectors(body: dict[str, Any]) -> None:
    """The baseline's straightforward parser means what the real compiler means, node by node."""
    raw = body["spec"]["nodeSelector"]
    compiled, parsed = compile_selector(raw), naive.parse_selector(raw)
    for index in range(25):
        labels = ingest.node_body(index)["metadata"]["labels"]
        assert compiled.matches(labels) == naive.selector_matches(parsed, labels)

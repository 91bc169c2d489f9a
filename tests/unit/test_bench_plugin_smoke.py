"""The plugin benchmark's own pieces, without a control plane: its edit and its verdicts."""

from __future__ import annotations

from pathlib import Path

import yaml
from benchmarks import plugin_plan


def test_the_edit_adds_the_rollout_policy_and_changes_one_pools_replicas(tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all(plugin_plan.edit(tmp_path).read_text()))
    assert [d["metadata"]["name"] for d in documents] == ["rollout", "inference-base"]
    assert documents[1]["spec"]["replicas"] == 3


def test_the_table_passes_within_budget_and_misses_beyond_it() -> None:
    fast = {"wall_s": 9.0, "peak_rss_mib": 120.0, "cpu_s": 4.0}
    slow = {"wall_s": 16.0, "peak_rss_mib": 320.0, "cpu_s": 9.0}
    assert plugin_plan.table([fast] * 3, 5000, 50000).count("PASS") == 2
    assert plugin_plan.table([slow] * 3, 5000, 50000).count("MISS") == 2

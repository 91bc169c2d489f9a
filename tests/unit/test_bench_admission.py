"""``benchmarks.admission`` measures what it says: its review is one the webhook mutates into
the class its size asks for, and its table judges every budget (no timings asserted)."""

from __future__ import annotations

import base64

import orjson
from benchmarks import admission as bench

from gpushare_operator.core.slots import memoryrequests


def test_the_review_is_a_labelled_pod_create_the_webhook_mutates() -> None:
    raw = bench.review(2)  # 20Gi: the MPS class of 40,779 MiB (MPS 4 offers 20,389)
    body = orjson.loads(raw)
    pod = body["request"]["object"]
    assert pod["metadata"]["labels"][memoryrequests.REQUEST_LABEL] == "20Gi"
    assert pod["metadata"]["managedFields"] and "uid" not in pod["metadata"]
    answer = orjson.loads(bench.handler()(raw).body)["response"]
    assert answer["allowed"] is True and answer["uid"] == body["request"]["uid"]
    ops = orjson.loads(base64.b64decode(answer["patch"]))
    (affinity,) = [op["value"] for op in ops if op["path"] == "/spec/affinity"]
    (preferred,) = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"][0]["values"] == ["40780"]


def test_the_table_judges_each_budget() -> None:
    report = {key: 0.0 for _, key, _, _ in bench.BUDGETS}
    report |= {
        "answer_us": 20.0,
        "orjson_loads_us": 10.0,
        "peak_kib_median": 1.0,
        "review_bytes": 1,
        "answer_bytes": 1,
        "gen0": 0,
        "gen1": 0,
    }
    assert "MISS" not in bench.table(report)
    for _, key, _, budget in bench.BUDGETS:
        missed = report | {key: budget + 1}
        assert "**MISS**" in bench.table(missed), key

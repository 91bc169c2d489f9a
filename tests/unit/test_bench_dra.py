"""``benchmarks.dra`` measures what it says: its bodies are read as the operator reads a live
slice and claim, and its table judges every budget (a small run, no timings asserted)."""

from __future__ import annotations

import orjson
from benchmarks import dra as bench

from gpushare_operator.core.dra import draclaims
from gpushare_operator.core.dra import driver as dra


def test_the_bodies_are_what_the_operator_keeps_and_a_foreign_claim_is_not() -> None:
    record = dra.slice_record(bench.slice_body(3, mig=True))
    assert record is not None and record.node == "gpu-node-00003"
    assert len(record.devices) == bench.GPUS * 7
    assert {d.profile for d in record.devices} == {"1g.10gb"}
    claim = draclaims.claim_record(bench.claim_body(9))
    assert claim is not None and claim.devices == [("gpu-node-00001", "gpu-1")]
    assert claim.pods == ("10000000-0000-4000-8000-000000000009",)
    assert draclaims.claim_record(bench.claim_body(9, driver="nic.example.com")) is None
    # Identical devices of two nodes are one record: a slice costs a pointer per device.
    other = dra.slice_record(bench.slice_body(4, mig=True))
    assert other is not None and other.devices[0] is record.devices[0]


def test_the_handler_fills_the_cache_and_the_table_judges_each_budget() -> None:
    cache, handle = bench.handler("ResourceClaim")
    for line in bench.lines([bench.claim_body(i) for i in range(16)]):
        handle(line)
    assert len(cache.dra.claims) == 16
    assert cache.dra.held("gpu-node-00001") == (8, 8)
    report = {key: 0.0 for _, key, _, _ in bench.BUDGETS}
    report |= {
        "bytes_per_claim": 10_000.0,
        "slice_over_orjson": 1.0,
        "mig_slice_over_orjson": 1.0,
        "claim_over_orjson": 1.0,
        "slice_line_bytes": 1,
        "mig_slice_line_bytes": 1,
        "claim_line_bytes": 1,
    }
    shown = bench.table(report)
    assert shown.count("PASS") == len(bench.BUDGETS) - 1
    assert "| memory per kept claim | 10,000 B | ≤ 576 B | **MISS** |" in shown
    assert orjson.loads(orjson.dumps(report)) == report

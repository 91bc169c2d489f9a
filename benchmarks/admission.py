"""``make bench`` (``admission``): what one memory-request admission costs the webhook's thread.

The answer to a pod's AdmissionReview (``app.admission.MemoryRequests`` over
``core.slots.reviews``: decode the review, decide, build the JSON patch from the placement,
encode) is timed against its floor, ``orjson.loads`` of the same review, in the same run; and
traced: the most memory one admission holds at once (tracemalloc's peak over what was held
before it), what it leaves behind, and how many full collections a long run of admissions
causes.  The review is what kube-apiserver sends for a realistic unbound pod (6.6 KB with its
managedFields and the ``gpushare.dev/gpu-memory`` label), the offers those the scale
benchmark's five pools make.

Budgets (the issue's): at most 32 KiB allocated per admission, no full collection during the
run, nothing left behind.  Time per admission over ``orjson.loads`` is judged at most 4x:
decoding is the floor, and the rest (the decision, a patch of a few hundred bytes, encoding
the answer) should cost no more than decoding three times over.  The CPU per admission over a
real API server, TLS and HTTP included, is ``make bench-scale BENCH_SCALE_ARGS='--only
webhook'``.
"""

from __future__ import annotations

import array
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, Final

import orjson

from benchmarks import verdicts
from gpushare_operator.app.admission import MemoryRequests
from gpushare_operator.core.slots import memoryrequests, reviews
from gpushare_operator.core.slots.slotclasses import Isolation, Offer
from gpushare_testing import podbodies

ROUNDS: Final = 7
PER_ROUND: Final = 2_000
TRACED: Final = 1_000
GC_RUN: Final = 20_000
SIZES: Final = ("8Gi", "10Gi", "20Gi", "32Gi", "64Gi")
# The scale benchmark's pools: MPS at 8, 4 and 2 replicas and Exclusive on 80 GB H100s.
OFFERS: Final = reviews.Offers(
    synced=True,
    offers=(
        Offer(10194, "nvidia.com/gpu", Isolation.MPS, "research"),
        Offer(20389, "nvidia.com/gpu", Isolation.MPS, "inference"),
        Offer(40779, "nvidia.com/gpu", Isolation.MPS, "batch"),
        Offer(81559, "nvidia.com/gpu", Isolation.EXCLUSIVE, "training"),
    ),
    gpu_resources=frozenset({"nvidia.com/gpu", "nvidia.com/gpu.shared"}),
)


def review(index: int) -> bytes:
    """kube-apiserver's AdmissionReview of the ``index``-th labelled pod's creation."""
    pod = podbodies.plain_pod(name=f"job-{index:05d}", node=None, phase="Pending")
    pod["metadata"]["labels"][memoryrequests.REQUEST_LABEL] = SIZES[index % len(SIZES)]
    # Not set until the object is stored (managedFields are: the field manager runs first).
    for key in ("uid", "creationTimestamp", "resourceVersion"):
        pod["metadata"].pop(key, None)
    pod.pop("status", None)
    request = {
        "uid": f"a1b2c3d4-0000-4000-8000-{index:012d}",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"]["name"],
        "namespace": pod["metadata"]["namespace"],
        "operation": "CREATE",
        "userInfo": {
            "username": "system:serviceaccount:kube-system:job-controller",
            "uid": "5d6f7e8a-0000-4000-8000-000000000001",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system"],
        },
        "object": pod,
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    body = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}
    return orjson.dumps(body)


def handler() -> Callable[[bytes], Any]:
    answer = MemoryRequests(offers=lambda: OFFERS)

    def handle(raw: bytes) -> Any:
        reply = answer("/gpu-memory", raw)
        assert reply.status == 200, reply.body
        return reply

    return handle


def per_call(fn: Callable[[bytes], Any], raws: list[bytes]) -> float:
    """Mean ns per call over ``raws``, the collector off."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for raw in raws:
            fn(raw)
        return (time.perf_counter_ns() - start) / len(raws)
    finally:
        gc.enable()


def timed(raws: list[bytes]) -> dict[str, float]:
    """Best of rounds, the two interleaved round by round."""
    handle = handler()
    ours, floor = [], []
    for _ in range(ROUNDS):
        floor.append(per_call(orjson.loads, raws))
        ours.append(per_call(handle, raws))
    return {
        "answer_us": min(ours) / 1000,
        "orjson_loads_us": min(floor) / 1000,
        "answer_over_orjson": min(ours) / min(floor),
    }


def traced(raws: list[bytes]) -> dict[str, float]:
    """The most one admission holds at once (peak over what was held before it), and what
    ``TRACED`` admissions leave behind; the answers are dropped as a server drops them."""
    handle = handler()
    for raw in raws[:100]:  # warm: what is allocated once per process is not per admission
        handle(raw)
    todo = raws[:TRACED]
    # Made before tracing: storing into it allocates nothing (a list of new ints would be
    # 40 B a measurement, counted as left behind).
    peaks = array.array("q", bytes(8 * len(todo)))
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for index, raw in enumerate(todo):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            handle(raw)
            peaks[index] = tracemalloc.get_traced_memory()[1] - before
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    return {
        "peak_kib_max": max(peaks) / 1024,
        "peak_kib_median": statistics.median(peaks) / 1024,
        "left_bytes_per_admission": max(0, left) / TRACED,
    }


def collections(raws: list[bytes]) -> dict[str, int]:
    """Collections per generation during ``GC_RUN`` admissions, the collector on as in the
    operator."""
    handle = handler()
    counts = [0, 0, 0]

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            counts[info["generation"]] += 1

    gc.collect()
    gc.callbacks.append(note)
    try:
        for index in range(GC_RUN):
            handle(raws[index % len(raws)])
    finally:
        gc.callbacks.remove(note)
    return {"gen0": counts[0], "gen1": counts[1], "full_collections": counts[2]}


def measure() -> dict[str, Any]:
    raws = [review(index) for index in range(PER_ROUND)]
    return {
        **timed(raws),
        **traced(raws),
        **collections(raws),
        "review_bytes": len(raws[0]),
        "answer_bytes": len(handler()(raws[0]).body),
    }


# (measure, key, unit, budget)
BUDGETS: Final[tuple[verdicts.Budget, ...]] = (
    ("answer ÷ orjson.loads of the review", "answer_over_orjson", "x", 4.0),
    ("memory allocated per admission (peak)", "peak_kib_max", "KiB", 32.0),
    ("memory left per admission", "left_bytes_per_admission", "B", 16.0),
    (f"full collections over {GC_RUN:,} admissions", "full_collections", "", 0),
)


def table(report: dict[str, Any]) -> str:
    rows = verdicts.budget_rows(report, BUDGETS)
    rows.append(
        f"\nPer admission (reported): {report['answer_us']:.1f} µs against"
        f" {report['orjson_loads_us']:.1f} µs for orjson.loads alone; a review of"
        f" {report['review_bytes']:,} B answered in {report['answer_bytes']:,} B; median peak"
        f" {report['peak_kib_median']:.1f} KiB; collections {report['gen0']:,} / {report['gen1']:,}"
        f" / {report['full_collections']} (generations 0 / 1 / 2)."
    )
    return "\n".join(rows)


def main() -> int:
    report = measure()
    print(table(report))
    print(json.dumps({k: round(v, 3) for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

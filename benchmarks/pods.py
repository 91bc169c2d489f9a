"""``make bench``: the Pod ingest path, in process, against json.loads and the anchor's pattern.

docs/architecture.md promises that pods are projected at ingest into slim records (only pods asking
for a shared GPU resource are kept at all) and that usage is incremental: a pod event moves its own
contribution and nothing sums over all pods. This benchmark holds the code to that on realistic
bodies (``testing.bodies``: ~8 KB of JSON per pod, managedFields included), fed as pre-encoded
watch-event lines through the read path's real ``_handle_line`` into a real ``ClusterCache`` that
already holds thousands of GPU nodes and a few policies, so that pods land on governed nodes and the
per-policy counters move.

It reports (a) each pod event's cost as a ratio to ``json.loads`` of the same bytes, for GPU
and non-GPU pods apart, (b) the bytes kept per GPU pod record and for non-GPU pods (none),
and (c) the cost of one pod change with 5,000 and with 50,000 pods cached, next to
:mod:`benchmarks.naive_pods`, which rebuilds all usage from deep copies of every cached pod per
change: ours must stay flat where the baseline grows with the cache.  Both must end with the
same per-node totals, or the run fails.

Conventions are those of :mod:`benchmarks.ingest`: ratios within a round (the machines are
shared and noisy), contenders interleaved with a rotating order, the cyclic GC off inside a
timed pass, medians over rounds.  The baseline costs seconds per change at 50,000 pods, so it
is timed on a few sampled changes; its cost is a deterministic walk of the whole cache, so a few
are enough.

Run it from the repository root: ``python -m benchmarks.pods`` (``--help`` for the sizes).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson

from benchmarks.ingest import drain, environment, log, node_body, sample, timed
from benchmarks.naive_pods import NaivePodCache, Totals
from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import NodeSink, PodSink
from gpushare_operator.core.records.nodes import GPU_RESOURCE, SHARED_RESOURCE
from gpushare_operator.kube.reading import Collection, Reader
from gpushare_testing.bodies import Body, watch_event_line
from gpushare_testing.podbodies import plain_pod, shared_gpu_pod

Handler = Callable[[bytes], object]

KINDS = ("added", "modified", "deleted")
GROUPS = ("gpu", "plain")
BLOCK = 5  # pods per block, all on one node: the first asks for GPU slots, four do not
SAMPLED_EVERY = 5  # every 5th run of 5 blocks (25 pods, 5 nodes, every pool) is sampled
MS = 1_000_000  # ns per ms
NAIVE_TRACED = 250  # pods whose whole bodies are traced into the baseline's cache: ~13 MiB
CHUNK = 100  # lines per turn when contenders take turns (~0.8 MB of JSON, milliseconds each)

# One policy per pool but training (left ungoverned); two advertise <resource>.shared.
POOL_POLICIES: dict[str, dict[str, Any]] = {
    "inference": {"strategy": "TimeSlicing", "replicas": 4, "renameByDefault": True},
    "batch": {"strategy": "MPS", "replicas": 4},
    "dev": {"strategy": "TimeSlicing", "replicas": 8, "renameByDefault": True},
    "research": {"strategy": "TimeSlicing", "replicas": 2},
}
TRACKED = (GPU_RESOURCE, SHARED_RESOURCE)


@dataclass(frozen=True)
class Config:
    nodes: int = 5_000
    pods: int = 50_000
    small: int = 5_000  # the smaller cache of the flat-cost comparison
    rounds: int = 5
    naive_changes: int = 6  # seconds each at 50,000 pods: time a sample, there and back
    out: Path = field(default_factory=lambda: Path(".bench") / "pods.json")


@dataclass(frozen=True)
class Workload:
    """Pre-encoded watch-event lines, built before anything is timed or traced.

    Every pod is ADDED; the sampled ones arrive Pending, turn Running (a status-only MODIFIED)
    and are DELETED, the others arrive Running.  ``changes`` are the sampled GPU pods among
    the first ``small``: Pending → Running, then back, so a pass leaves a cache as it found it.
    """

    nodes: list[bytes]
    policies: list[Body]
    added: list[bytes]  # every pod, in pod order
    lines: dict[tuple[str, str], list[bytes]]  # (kind, group) → lines
    changes: list[bytes]

    def count(self, kind: str, group: str) -> int:
        return len(self.lines[(kind, group)])


# -- the workload -------------------------------------------------------------------------------


def is_gpu(index: int) -> bool:
    return index % BLOCK == 0


def is_sampled(index: int) -> bool:
    return (index // (BLOCK * BLOCK)) % SAMPLED_EVERY == 0


def policy_bodies() -> list[Body]:
    """Each pool's policy, selecting that pool's nodes."""
    return [
        {
            "apiVersion": "gpushare.dev/v1alpha1",
            "kind": "GPUSharingPolicy",
            "metadata": {"name": f"{pool}-shared", "uid": f"0000-{index:04d}", "generation": 1},
            "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}, **spec},
        }
        for index, (pool, spec) in enumerate(POOL_POLICIES.items())
    ]


def advertised(pool: str) -> str:
    """The resource pods ask for on this pool's nodes: what its policy advertises."""
    spec = POOL_POLICIES.get(pool, {})
    return SHARED_RESOURCE if spec.get("renameByDefault") else GPU_RESOURCE


def pod_body(index: int, node: str, pool: str, phase: str) -> Body:
    """Pod ``index``: a web pod, or (one in five) an inference server asking for GPU slots.

    The servers vary where the scheduler's effective-request rule does: every 4th asks for two
    slots, every 7th adds an init container asking as much, every 11th a one-slot sidecar.
    """
    if not is_gpu(index):
        namespace = ("storefront", "payments", "search")[index % 3]
        return plain_pod(name=f"web-{index:06d}", node=node, namespace=namespace, phase=phase)
    serial = index // BLOCK
    count = 2 if serial % 4 == 3 else 1
    return shared_gpu_pod(
        name=f"infer-{index:06d}",
        node=node,
        namespace=("ml-serving", "research")[serial % 2],
        resource=advertised(pool),
        count=count,
        phase=phase,
        init_count=count if serial % 7 == 0 else 0,
        sidecar_count=1 if serial % 11 == 0 else 0,
    )


def build_workload(config: Config) -> Workload:
    nodes = [node_body(index) for index in range(config.nodes)]
    node_lines = [
        watch_event_line("ADDED", body, resource_version=str(1_000 + index))
        for index, body in enumerate(nodes)
    ]
    placement = [(b["metadata"]["name"], b["metadata"]["labels"]["pool"]) for b in nodes]
    del nodes
    added: list[bytes] = []
    lines: dict[tuple[str, str], list[bytes]] = {(k, g): [] for k in KINDS for g in GROUPS}
    there: list[bytes] = []
    back: list[bytes] = []
    for index in range(config.pods):
        group = "gpu" if is_gpu(index) else "plain"
        node, pool = placement[(index // BLOCK) % config.nodes]
        version = 100_000 + 4 * index
        first = "Pending" if is_sampled(index) else "Running"
        line = watch_event_line(
            "ADDED", pod_body(index, node, pool, first), resource_version=str(version)
        )
        added.append(line)
        lines[("added", group)].append(line)
        if not is_sampled(index):
            continue
        running = pod_body(index, node, pool, "Running")
        modified = watch_event_line("MODIFIED", running, resource_version=str(version + 1))
        lines[("modified", group)].append(modified)
        lines[("deleted", group)].append(
            watch_event_line("DELETED", running, resource_version=str(version + 2))
        )
        if group == "gpu" and index < config.small:
            there.append(modified)
            pending = pod_body(index, node, pool, "Pending")
            back.append(watch_event_line("MODIFIED", pending, resource_version=str(version + 3)))
    return Workload(node_lines, policy_bodies(), added, lines, there + back)


# -- gpushare and the baseline --------------------------------------------------------------


def ours(work: Workload, pods: Sequence[bytes] = ()) -> tuple[ClusterCache, Handler]:
    """A fresh ClusterCache with the policies and nodes, and the pod informer's line handler.

    ``pods`` (ADDED lines) are ingested too, untimed; the dirty set is drained, as the writer
    would, so that what follows starts from a quiet cache.
    """
    cache = ClusterCache()
    for body in work.policies:
        cache.upsert_policy(body)
    node_handler = _handler(Collection(path="/api/v1/nodes", kind="Node"), NodeSink(cache))
    for line in work.nodes:
        node_handler(line)
    handle = _handler(Collection(path="/api/v1/pods", kind="Pod"), PodSink(cache))
    for line in pods:
        handle(line)
    drain(cache)
    return cache, handle


def _handler(collection: Collection, sink: NodeSink | PodSink) -> Handler:
    reader = Reader(api=cast(Any, None), collection=collection, sink=sink)  # never touches the API
    return reader._handle_line


def our_totals(cache: ClusterCache) -> Totals:
    """node → resource → (slots, pods), read off the incremental ledger."""
    totals: Totals = {}
    for node in cache.nodes:
        for resource in TRACKED:
            used = cache.usage.node_usage(node, resource)
            if used != (0, 0):
                totals.setdefault(node, {})[resource] = used
    return totals


def policy_slots(cache: ClusterCache) -> dict[str, int]:
    """Each policy's allocated slots; raise unless they sum what its governed nodes hold."""
    usage = cache.usage
    expected: defaultdict[str, int] = defaultdict(int)
    for node in cache.nodes:
        governor = usage.governor(node)
        if governor is not None:
            held = (usage.node_usage(node, resource)[0] for resource in governor[1])
            expected[governor[0]] += sum(held)
    slots = {name: usage.policy_slots(name) for name in cache.policies}
    if any(slots[name] != expected[name] for name in slots):
        raise RuntimeError(f"per-policy counters {slots} != sums over their nodes {expected}")
    return slots


def check_agreement(cache: ClusterCache, naive: NaivePodCache, *, when: str) -> int:
    """Raise unless ours and the baseline (rebuilt now) hold the same per-node totals."""
    mine, theirs = our_totals(cache), naive.rebuild()
    if mine != theirs:
        wrong = sorted(n for n in mine.keys() | theirs.keys() if mine.get(n) != theirs.get(n))
        example = {n: (mine.get(n), theirs.get(n)) for n in wrong[:3]}
        raise RuntimeError(f"{when}: ours and naive disagree on {len(wrong)} nodes, e.g. {example}")
    return len(mine)


def clear_pods(cache: ClusterCache) -> None:
    """Delete what a round left (untimed), and check every counter is back to zero."""
    for uid in list(cache.usage.pods):
        cache.delete_pod(uid)
    drain(cache)
    if our_totals(cache) or any(policy_slots(cache).values()):
        raise RuntimeError("usage counters did not return to zero once every pod was deleted")


# -- measuring ----------------------------------------------------------------------------------


def interleaved(
    contenders: Mapping[str, Handler], lines: Sequence[bytes], shift: int
) -> dict[str, int]:
    """Nanoseconds each contender spends on one pass over ``lines``, taking turns chunk by chunk.

    Every contender handles a chunk before any moves to the next, so a stateful one still sees
    the lines in order, and a burst of load from a neighbour lands on all of them rather than on
    whichever pass it happened to overlap.  The turn order rotates from chunk to chunk.  As in
    ``timed``, the cyclic GC is collected first and off during the pass.
    """
    names = tuple(contenders)
    totals = dict.fromkeys(names, 0)
    gc.collect()
    gc.disable()
    try:
        for number, start in enumerate(range(0, len(lines), CHUNK)):
            chunk = lines[start : start + CHUNK]
            for name in rotated(names, shift + number):
                handle = contenders[name]
                began = time.perf_counter_ns()
                for line in chunk:
                    handle(line)
                totals[name] += time.perf_counter_ns() - began
    finally:
        gc.enable()
    return totals


def traced_bytes(action: Callable[[], object]) -> tuple[int, int]:
    """Bytes still allocated after ``action``, and the peak on the way."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        action()
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before, peak - before


def rotated(items: Sequence[str], shift: int) -> list[str]:
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


Key = tuple[str, str, str]  # (contender, kind, group)


@dataclass
class Rounds:
    """Per-round nanoseconds of whole passes, keyed (contender, kind, group)."""

    ns: defaultdict[Key, list[int]] = field(default_factory=lambda: defaultdict(list))
    dirty: defaultdict[tuple[str, str], list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def ratio(self, top: str, bottom: str, passes: Sequence[tuple[str, str]]) -> float:
        """Median over rounds of Σ top ÷ Σ bottom over ``passes``: one round saw one noise."""
        rounds = len(self.ns[(top, *passes[0])])
        per_round = [
            sum(self.ns[(top, *p)][r] for p in passes)
            / sum(self.ns[(bottom, *p)][r] for p in passes)
            for r in range(rounds)
        ]
        return statistics.median(per_round)


def measure_events(cache: ClusterCache, handle: Handler, work: Workload, rounds: int) -> Rounds:
    """Every pod ADDED, the sampled ones MODIFIED then DELETED; json.loads beside each pass.

    ``state`` holds no pods when called and holds none after each round (the rest are deleted
    untimed).  The contenders' order, and the groups', rotate from round to round.
    """
    contenders: dict[str, Handler] = {
        "json_loads": json.loads,
        "orjson_loads": orjson.loads,
        "ours": handle,
    }
    result = Rounds()
    for round_ in range(rounds):
        for kind in KINDS:
            for group in rotated(GROUPS, round_):
                passes = interleaved(contenders, work.lines[(kind, group)], round_)
                for name, ns in passes.items():
                    result.ns[(name, kind, group)].append(ns)
                result.dirty[(kind, group)].append(len(cache.queue))
                drain(cache)
        clear_pods(cache)
    return result


def event_summary(result: Rounds, work: Workload) -> dict[str, Any]:
    every = [(k, g) for k in KINDS for g in GROUPS]
    selections = {
        "gpu": [(k, "gpu") for k in KINDS],
        "plain": [(k, "plain") for k in KINDS],
        "all": every,
        **{f"{k}_{g}": [(k, g)] for k, g in every},
    }
    per_event = {
        f"{k}_{g}": {
            name: round(statistics.median(result.ns[(name, k, g)]) / max(1, work.count(k, g)))
            for name in ("json_loads", "orjson_loads", "ours")
        }
        for k, g in every
    }
    return {
        "events_per_round": {f"{k}_{g}": work.count(k, g) for k, g in every},
        "ns_per_event": per_event,
        "ours_over_json_loads": {
            name: round(result.ratio("ours", "json_loads", passes), 3)
            for name, passes in selections.items()
        },
        "ours_over_orjson_loads": {
            name: round(result.ratio("ours", "orjson_loads", passes), 3)
            for name, passes in selections.items()
        },
        "dirty_objects_per_event": {
            f"{k}_{g}": round(statistics.fmean(result.dirty[(k, g)]) / max(1, work.count(k, g)), 4)
            for k, g in every
        },
        "samples_ns_per_pass": {"/".join(key): ns for key, ns in result.ns.items()},
    }


def measure_memory(work: Workload) -> dict[str, Any]:
    """Bytes kept: every ADDED pod into a fresh state; only the non-GPU ones into another.

    The dirty set is drained inside the trace (the writer's job): it is a queue, not the cache.
    """
    cache, handle = ours(work)
    kept, peak = traced_bytes(functools.partial(_feed, handle, work.added, cache))
    records = len(cache.usage.pods)
    del cache, handle
    plain_cache, plain_handle = ours(work)
    plain = work.lines[("added", "plain")]
    plain_kept, _ = traced_bytes(functools.partial(_feed, plain_handle, plain, plain_cache))
    if plain_cache.usage.pods:
        raise RuntimeError("a non-GPU pod was kept")
    del plain_cache, plain_handle
    naive = NaivePodCache(TRACKED)
    traced = min(len(work.added), NAIVE_TRACED)
    naive_kept, _ = traced_bytes(functools.partial(_feed, naive.cache_line, work.added[:traced]))
    return {
        "gpu_records": records,
        "ours_bytes_kept": kept,
        "ours_bytes_per_gpu_record": kept / max(1, records),
        "ours_peak_bytes_while_ingesting": peak,
        "plain_pods": len(plain),
        "ours_bytes_kept_for_plain_pods": plain_kept,
        "ours_bytes_per_plain_pod": plain_kept / max(1, len(plain)),
        "naive_bytes_per_pod": naive_kept / traced,
        "naive_pods_traced": traced,
    }


def _feed(handle: Handler, lines: Sequence[bytes], cache: ClusterCache | None = None) -> None:
    """Every line through ``handle``; then ``cache``'s write queue drained, as the loop would."""
    for line in lines:
        handle(line)
    if cache is not None:
        drain(cache)


def measure_flat(
    small: tuple[ClusterCache, Handler],
    large: tuple[ClusterCache, Handler],
    changes: list[bytes],
    rounds: int,
) -> dict[str, Any]:
    """The same pod changes against a cache of ``small`` and of all pods, json.loads beside."""
    contenders = {"json_loads": json.loads, "ours_small": small[1], "ours_large": large[1]}
    ns: defaultdict[str, list[int]] = defaultdict(list)
    for round_ in range(rounds):
        for name, spent in interleaved(contenders, changes, round_).items():
            ns[name].append(spent)
        drain(small[0])
        drain(large[0])

    def ratio(top: str, bottom: str) -> float:
        return statistics.median(a / b for a, b in zip(ns[top], ns[bottom], strict=True))

    return {
        "changes_per_pass": len(changes),
        "rounds": rounds,
        "ns_per_change": {k: round(statistics.median(v) / len(changes)) for k, v in ns.items()},
        "small_over_json_loads": round(ratio("ours_small", "json_loads"), 3),
        "large_over_json_loads": round(ratio("ours_large", "json_loads"), 3),
        "large_over_small": round(ratio("ours_large", "ours_small"), 3),
        "samples_ns_per_pass": dict(ns),
    }


def naive_changes(cache: NaivePodCache, lines: Sequence[bytes]) -> dict[str, Any]:
    """Each change timed alone, json.loads of the same line timed right before it."""
    naive_ns: list[int] = []
    json_ns: list[int] = []
    for line in lines:
        json_ns.append(timed(functools.partial(json.loads, line))[0])
        naive_ns.append(timed(functools.partial(cache.handle_line, line))[0])
    return {
        "pods_cached": len(cache.pods),
        "changes": len(lines),
        "ms_per_change": statistics.median(naive_ns) / MS,
        "over_json_loads": statistics.median(a / b for a, b in zip(naive_ns, json_ns, strict=True)),
        "samples_ms": [round(ns / MS, 1) for ns in naive_ns],
    }


def allocated_per_change(handle: Handler, lines: Sequence[bytes]) -> int:
    """Median of the peak bytes allocated while one change is handled (the anchor's figure).

    A median, because now and then a change is the one whose insert makes a dict grow.
    """
    return round(
        statistics.median(traced_bytes(functools.partial(handle, line))[1] for line in lines)
    )


# -- the run ------------------------------------------------------------------------------------


def run(config: Config) -> dict[str, Any]:
    """The whole benchmark; writes ``config.out`` and returns what it wrote."""
    if not 0 < config.small <= config.pods:
        raise ValueError("--small must be between 1 and --pods")
    started = time.perf_counter()
    work = build_workload(config)
    if not work.changes:
        raise ValueError("--small holds no sampled GPU pod: make it at least 25")
    mean_line = statistics.fmean(map(len, work.added))
    log(f"built {config.pods} pods over {config.nodes} nodes ({mean_line / 1024:.1f} KiB a line)")
    memory = measure_memory(work)
    log("timing pod events")
    cache, handle = ours(work)
    events = event_summary(measure_events(cache, handle, work, config.rounds), work)
    log(f"timing {len(work.changes)} pod changes at {config.small} and {config.pods} pods")
    for line in work.added:
        handle(line)
    drain(cache)
    small = ours(work, work.added[: config.small])
    flat = measure_flat(small, (cache, handle), work.changes, 3 * config.rounds)
    our_alloc = allocated_per_change(handle, sample(work.changes, 20, paired=True))
    drain(cache)
    naive = measure_naive(work, config, small[0], cache)
    report: dict[str, Any] = {
        "benchmark": "pods",
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(config).items()},
        "workload": {
            "mean_line_bytes": round(mean_line),
            "policies": len(work.policies),
            "nodes_governed": sum(cache.usage.governor(n) is not None for n in cache.nodes),
            "policy_slots": policy_slots(cache),
        },
        "events": events,
        "memory": memory,
        "flat": flat | {"ours_bytes_allocated_per_change": our_alloc},
        "naive": naive,
        "seconds": round(time.perf_counter() - started, 1),
    }
    report["budgets"] = budgets(report)
    config.out.parent.mkdir(parents=True, exist_ok=True)
    config.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    return report


def measure_naive(
    work: Workload, config: Config, small: ClusterCache, large: ClusterCache
) -> dict[str, Any]:
    """The baseline at both cache sizes, checked against ours at each."""
    cache = NaivePodCache(TRACKED)
    changes = sample(work.changes, config.naive_changes, paired=True)
    result: dict[str, Any] = {}
    gc.freeze()  # its cache is millions of long-lived objects: keep collections off them
    try:
        for label, upto, state in (("small", config.small, small), ("large", config.pods, large)):
            for line in work.added[len(cache.pods) : upto]:
                cache.cache_line(line)
            gc.freeze()
            log(f"naive: {len(changes)} changes at {len(cache.pods)} pods")
            result[label] = naive_changes(cache, changes)
            result[label]["nodes_agreeing"] = check_agreement(state, cache, when=label)
            if label == "small":
                there_and_back = [changes[0], changes[len(changes) // 2]]
                allocated = allocated_per_change(cache.handle_line, there_and_back)
                result[label]["bytes_allocated_per_change"] = allocated
    finally:
        gc.unfreeze()
    return result


# -- budgets and the table ----------------------------------------------------------------------

TIMES = "\N{MULTIPLICATION SIGN}"


def _row(
    measure: str, unit: str, ours_value: float, naive_value: float | None, budget: float
) -> dict[str, Any]:
    return {
        "measure": measure,
        "unit": unit,
        "ours": ours_value,
        "naive": naive_value,
        "budget": budget,
        "pass": ours_value <= budget if unit != "B/pod" else ours_value < budget,
    }


def budgets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's budgets; ``naive`` is the baseline's figure for the same measure, if any."""
    ratios, memory = report["events"]["ours_over_json_loads"], report["memory"]
    flat, naive = report["flat"], report["naive"]
    small, large = naive["small"], naive["large"]
    size = f"{small['pods_cached']:,}", f"{large['pods_cached']:,}"
    naive_growth = large["ms_per_change"] / small["ms_per_change"]
    dirty = report["events"]["dirty_objects_per_event"]
    plain_dirty = max(dirty[f"{kind}_plain"] for kind in KINDS)
    return [
        _row("GPU pod event ÷ json.loads", "x", ratios["gpu"], None, 1.0),
        _row("non-GPU pod event ÷ json.loads", "x", ratios["plain"], None, 1.0),
        _row("any pod event ÷ json.loads (all kinds, 20% GPU)", "x", ratios["all"], None, 1.0),
        _row("memory per kept GPU pod record", "B", memory["ours_bytes_per_gpu_record"],
             memory["naive_bytes_per_pod"], 512),
        _row(f"memory kept for {memory['plain_pods']:,} non-GPU pods", "B/pod",
             memory["ours_bytes_per_plain_pod"], memory["naive_bytes_per_pod"], 1),
        _row("objects marked dirty per non-GPU pod event", "", plain_dirty, None, 0),
        _row(f"pod change ÷ json.loads, {size[0]} pods cached", "x",
             flat["small_over_json_loads"], small["over_json_loads"], 1.0),
        _row(f"pod change ÷ json.loads, {size[1]} pods cached", "x",
             flat["large_over_json_loads"], large["over_json_loads"], 1.0),
        _row(f"pod change at {size[1]} ÷ at {size[0]} pods cached", "x",
             flat["large_over_small"], naive_growth, 1.25),
    ]  # fmt: skip


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "B":
        return f"{value:,.0f} B" if value < 10_240 else f"{value / 1024:,.1f} KiB"
    if unit == "B/pod":
        return f"{value:,.2f} B/pod" if value < 10_240 else f"{value / 1024:,.1f} KiB/pod"
    if unit == "":
        return f"{value:g}"
    if value >= 100:
        return f"{value:,.0f}{TIMES}"
    return f"{value:,.2f}{TIMES}"


def table(report: dict[str, Any]) -> str:
    """The budget table in markdown, plus the facts a reader needs to trust it."""
    lines = [
        "| Measure | gpushare | naive baseline | Budget | Result |",
        "|---|---|---|---|---|",
    ]
    for row in report["budgets"]:
        unit = row["unit"]
        budget = f"≤ {_number(row['budget'], unit)}"
        if unit == "B/pod":
            budget = "< 1 B/pod (nothing kept)"
        elif row["budget"] == 0:
            budget = "= 0"
        verdict = "PASS" if row["pass"] else "**MISS**"
        lines.append(
            f"| {row['measure']} | {_number(row['ours'], unit)} | {_number(row['naive'], unit)}"
            f" | {budget} | {verdict} |"
        )
    return "\n".join(lines) + "\n\n" + _footnote(report)


def _footnote(report: dict[str, Any]) -> str:
    config, work, events = report["config"], report["workload"], report["events"]
    memory, flat, naive = report["memory"], report["flat"], report["naive"]
    per_event = events["ns_per_event"]
    micros = ", ".join(
        f"{key.replace('_', ' ')} {_micros(per_event[key])}"
        for key in ("added_gpu", "added_plain", "modified_gpu", "deleted_gpu")
    )
    return (
        f"{config['pods']:,} pods ({work['mean_line_bytes']:,} B per watch line, 1 in 5 asking"
        f" for GPU slots) on {config['nodes']:,} GPU nodes, {work['policies']} policies governing"
        f" {work['nodes_governed']:,} of them; median of {config['rounds']} rounds."
        f" Per event, json.loads / orjson.loads / gpushare: {micros}."
        f" {memory['gpu_records']:,} GPU pod records kept in"
        f" {memory['ours_bytes_kept'] / 2**20:.1f} MiB;"
        f" {memory['plain_pods']:,} non-GPU pods left {memory['ours_bytes_kept_for_plain_pods']:,}"
        f" B in all. Dirty objects per GPU pod event (ADDED/MODIFIED/DELETED): {_dirtied(events)}."
        f" Pod changes: {flat['changes_per_pass']} per pass, median of"
        f" {flat['rounds']} rounds; naive from {naive['large']['changes']} sampled changes"
        f" ({naive['small']['ms_per_change']:,.0f} ms each at {naive['small']['pods_cached']:,}"
        f" pods, {naive['large']['ms_per_change']:,.0f} ms at"
        f" {naive['large']['pods_cached']:,}), allocating"
        f" {naive['small']['bytes_allocated_per_change'] / 2**20:,.0f} MiB per change at"
        f" {naive['small']['pods_cached']:,} pods against"
        f" {flat['ours_bytes_allocated_per_change'] / 1024:,.0f} KiB for gpushare."
    )


def _dirtied(events: dict[str, Any]) -> str:
    dirty = events["dirty_objects_per_event"]
    return "/".join(f"{dirty[f'{kind}_gpu']:.2f}" for kind in KINDS)


def _micros(ns: dict[str, int]) -> str:
    names = ("json_loads", "orjson_loads", "ours")
    return " / ".join(f"{ns[n] / 1000:.0f}" for n in names) + " µs"


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pods", description=__doc__)
    defaults = Config()
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--pods", type=int, default=defaults.pods)
    parser.add_argument(
        "--small", type=int, default=defaults.small, help="pods in the smaller cache"
    )
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument(
        "--naive-changes", type=int, default=defaults.naive_changes, help="sampled per size"
    )
    parser.add_argument("--out", type=Path, default=defaults.out)
    args = parser.parse_args(argv)
    return Config(args.nodes, args.pods, args.small, args.rounds, args.naive_changes, args.out)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; exit 0 even on a MISS (a budget is a signal, not a build break)."""
    config = parse_args(argv)
    report = run(config)
    print(table(report))
    missed = [row["measure"] for row in report["budgets"] if not row["pass"]]
    if missed:
        print(f"\nMISS: {', '.join(missed)} (details in {config.out})")
    else:
        print(f"\nAll budgets met (details in {config.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

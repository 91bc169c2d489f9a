"""``make bench``: the Node ingest path, in process, against json.loads and a naive baseline.

docs/architecture.md promises that a Node event costs little more than decoding it, that a heartbeat
touches no index and schedules no write, that a cached node is a 1-2 KiB record, and that a
selector change re-matches thousands of nodes in milliseconds.  This benchmark holds the code to
those promises on realistic bodies (``testing.bodies``: ~16 KB of JSON per GPU node) by feeding
pre-encoded watch-event lines through the read path's real ``_handle_line`` into the real
``ClusterCache``, and the same lines through :mod:`benchmarks.naive`, the pattern the design's
anchors fixed.  Both must end with the same node → policies mapping, or the run fails.

Costs are reported as ratios to ``json.loads`` of the same bytes, measured in the same round:
the machines this runs on are shared and noisy, and a ratio within a round survives that where an
absolute time does not.  Like ``timeit``, the cyclic GC is off inside a timed pass (and run
between passes), so that one pass does not pay for collecting another's garbage; neither path
makes reference cycles, so nothing accumulates.  Every figure is a median over the rounds,
except the naive re-evaluation (tens of seconds), which runs once.

Run it from the repository root: ``python -m benchmarks.ingest`` (``--help`` for the sizes).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson

from benchmarks import mignodes
from benchmarks.naive import NaiveController
from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import NodeSink
from gpushare_operator.core.records.nodes import GPU_COUNT, GPU_PRODUCT
from gpushare_operator.core.records.policies import compile_policy
from gpushare_operator.kube.reading import Collection, Reader
from gpushare_operator.reconcile.planner import Planner, Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing import writepath
from gpushare_testing.bodies import (
    Body,
    gpu_node,
    heartbeat,
    relabel,
    watch_event_line,
)

Handler = Callable[[bytes], object]
T = TypeVar("T")

H100, A100, L4, T4 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4", "Tesla-T4"
POOL_PRODUCTS: dict[str, tuple[str, ...]] = {
    "inference": (H100, L4),
    "batch": (A100, H100),
    "training": (H100,),
    "dev": (T4, L4),
    "research": (A100, H100, L4),
}
POOLS = tuple(POOL_PRODUCTS)
# GPUs per machine and MiB per GPU, as GFD reports them for the instance types in bodies.py.
GPU_SHAPES: dict[str, tuple[int, int]] = {
    H100: (8, 81559),
    A100: (8, 81920),
    L4: (8, 23034),
    T4: (4, 15360),
}
MIG_CAPABLE = frozenset({H100, A100})
ZONE = "topology.kubernetes.io/zone"
HEARTBEAT_AT = "2025-04-02T09:30:00Z"
MS = 1_000_000  # ns per ms


@dataclass(frozen=True)
class Config:
    nodes: int = 5_000
    policies: int = 50
    rounds: int = 5
    naive_events: int = 500  # the naive baseline costs milliseconds per event: time a sample
    mig_nodes: int = 1_000  # H100s on a mixed MIG layout, cached apart (benchmarks.mignodes)
    out: Path = field(default_factory=lambda: Path(".bench") / "ingest.json")


@dataclass(frozen=True)
class Workload:
    """Pre-encoded watch-event lines, built before anything is timed or traced."""

    added: list[bytes]
    heartbeats: list[bytes]
    # Every node relabelled, then every node relabelled back: each line is a real label change,
    # and a full pass leaves the caches as the ADDED lines made them.
    label_changes: list[bytes]
    policies: list[Body]
    changed_selector: dict[str, Any]  # the new nodeSelector of policies[0]


def sample(lines: list[bytes], events: int, *, paired: bool = False) -> list[bytes]:
    """Every k-th line, about ``events`` of them; ``paired`` keeps there-and-back halves whole."""
    if not paired:
        return lines[:: max(1, len(lines) // max(1, events))]
    half = len(lines) // 2
    stride = max(1, half // max(1, events // 2))
    return lines[:half:stride] + lines[half::stride]


# -- the workload -------------------------------------------------------------------------------


def node_body(index: int) -> Body:
    """Node ``index`` of the cluster: pools round-robin, each with its own mix of GPU models."""
    pool = POOLS[index % len(POOLS)]
    products = POOL_PRODUCTS[pool]
    product = products[(index // len(POOLS)) % len(products)]
    gpus, memory = GPU_SHAPES[product]
    mig = ("mixed" if index % 7 == 0 else "single") if product in MIG_CAPABLE else "none"
    return gpu_node(
        name=f"gpu-{pool}-{index:05d}",
        pool=pool,
        product=product,
        gpus=gpus,
        memory_mib=memory,
        mig_strategy=mig,
    )


def gfd_refresh(node: Body) -> dict[str, str | None]:
    """The labels GFD rewrites once a sharing config is live on the node."""
    stamp = int(node["metadata"]["labels"]["nvidia.com/gfd.timestamp"]) + 3_600
    return {
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/gfd.timestamp": str(stamp),
    }


def _req(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def _templates(pool: str) -> list[tuple[str, dict[str, Any], int, str, int]]:
    """Ten policies per pool: (suffix, nodeSelector, priority, strategy, replicas).

    Overlapping on purpose, as priorities exist for: a node matches 3 to 6 of them.
    """
    product, count = GPU_PRODUCT, GPU_COUNT
    rows: list[tuple[str, list[dict[str, Any]], int, str, int]] = [
        ("default", [], 10, "TimeSlicing", 2),
        ("h100", [_req(product, "In", H100)], 100, "TimeSlicing", 4),
        ("a100", [_req(product, "In", A100)], 100, "MPS", 4),
        ("small", [_req(product, "In", L4, T4)], 90, "TimeSlicing", 8),
        ("eight", [_req(count, "In", "8")], 50, "TimeSlicing", 2),
        ("counted", [_req(count, "Exists")], 20, "TimeSlicing", 3),
        ("zone-a", [_req(ZONE, "In", "us-east-2a")], 200, "MPS", 4),
        ("zone-bc", [_req(ZONE, "In", "us-east-2b", "us-east-2c"), _req(product, "NotIn", T4)],
         150, "TimeSlicing", 2),
        ("whole", [_req("nvidia.com/mig.capable", "In", "true"),
                   _req("nvidia.com/gpu.family", "NotIn", "turing")], 120, "MPS", 8),
        ("canary", [_req("gpushare.dev/canary", "In", "true")], 999, "MPS", 16),
    ]  # fmt: skip
    own = {"matchLabels": {"pool": pool}}
    return [
        (suffix, own | ({"matchExpressions": exprs} if exprs else {}), priority, strategy, replicas)
        for suffix, exprs, priority, strategy, replicas in rows
    ]


def policy_bodies(count: int) -> list[Body]:
    """``count`` GPUSharingPolicies, pool by pool; policies[0] is ``inference-default``."""
    bodies = []
    for index in range(count):
        pool = POOLS[(index // 10) % len(POOLS)]
        suffix, selector, priority, strategy, replicas = _templates(pool)[index % 10]
        name = f"{pool}-{suffix}" + (f"-{index // 50}" if index >= 50 else "")
        spec = {"nodeSelector": selector, "priority": priority, "strategy": strategy}
        bodies.append(
            {
                "apiVersion": "gpushare.dev/v1alpha1",
                "kind": "GPUSharingPolicy",
                "metadata": {"name": name, "uid": f"0000-{index:04d}", "generation": 1},
                "spec": spec | {"replicas": replicas},
            }
        )
    return bodies


def build_workload(nodes: int, policies: int) -> Workload:
    added, beats, there, back = [], [], [], []
    for index in range(nodes):
        node = node_body(index)
        version = 1_000 + 4 * index
        added.append(watch_event_line("ADDED", node, resource_version=str(version)))
        beat = heartbeat(node, at=HEARTBEAT_AT)
        beats.append(watch_event_line("MODIFIED", beat, resource_version=str(version + 1)))
        moved = relabel(node, gfd_refresh(node))
        there.append(watch_event_line("MODIFIED", moved, resource_version=str(version + 2)))
        back.append(watch_event_line("MODIFIED", node, resource_version=str(version + 3)))
    # Widen the pool-wide inference policy to the batch pool: 1 in 5 nodes changes its match.
    widened = {"matchExpressions": [_req("pool", "In", "inference", "batch")]}
    return Workload(added, beats, there + back, policy_bodies(policies), widened)


def build_mig_workload(nodes: int, policies: int) -> Workload:
    """The MIG pool's lines: ADDED, heartbeats, and GFD's timestamp refresh there and back.

    The same policies as the main cluster, plus the MIG policy that governs the pool, so that
    every MIG node is matched and indexed, as it is in production.
    """
    added, beats, there, back = [], [], [], []
    for index in range(nodes):
        node = mignodes.mig_node(index)
        version = 500_000 + 4 * index
        added.append(watch_event_line("ADDED", node, resource_version=str(version)))
        beat = heartbeat(node, at=HEARTBEAT_AT)
        beats.append(watch_event_line("MODIFIED", beat, resource_version=str(version + 1)))
        stamp = int(node["metadata"]["labels"]["nvidia.com/gfd.timestamp"]) + 3_600
        moved = relabel(node, {"nvidia.com/gfd.timestamp": str(stamp)})
        there.append(watch_event_line("MODIFIED", moved, resource_version=str(version + 2)))
        back.append(watch_event_line("MODIFIED", node, resource_version=str(version + 3)))
    bodies = [*policy_bodies(policies), mignodes.mig_policy_body()]
    return Workload(added, beats, there + back, bodies, {})


# -- the two implementations --------------------------------------------------------------------


def ours(policies: Sequence[Body]) -> tuple[ClusterCache, Handler]:
    """A fresh ClusterCache holding the policies, and the informers' real line handler into it."""
    cache = ClusterCache()
    for body in policies:
        cache.upsert_policy(body)
    invalid = [p.name for p in cache.policies.values() if not p.valid]
    if invalid:
        raise RuntimeError(f"benchmark policies do not compile: {invalid}")
    drain(cache)
    reader = Reader(
        api=cast(Any, None),  # _handle_line never touches the API
        collection=Collection(path="/api/v1/nodes", kind="Node"),
        sink=NodeSink(cache),
    )
    return cache, reader._handle_line


def naive(policies: Sequence[Body]) -> NaiveController:
    controller = NaiveController()
    for body in policies:
        controller.upsert_policy(body)
    return controller


def drain(cache: ClusterCache) -> None:
    """What the write loop does with its queue, minus the writes."""
    writepath.drain(cache.queue)


def our_mapping(cache: ClusterCache) -> dict[str, frozenset[str]]:
    index = cache.index
    return {name: index.policies_of(name) for name in cache.nodes if index.policies_of(name)}


def check_agreement(cache: ClusterCache, controller: NaiveController, *, when: str) -> int:
    """Raise unless both implementations map every node to the same policies."""
    mine, theirs = our_mapping(cache), controller.mapping()
    if mine != theirs:
        wrong = sorted(n for n in mine.keys() | theirs.keys() if mine.get(n) != theirs.get(n))
        sample = {n: (sorted(mine.get(n, ())), sorted(theirs.get(n, ()))) for n in wrong[:3]}
        raise RuntimeError(f"{when}: ours and naive disagree on {len(wrong)} nodes, e.g. {sample}")
    return len(mine)


# -- measuring ----------------------------------------------------------------------------------


def timed(action: Callable[[], T]) -> tuple[int, T]:
    """Nanoseconds for one call and its result, with the cyclic GC collected before, off during."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        result = action()
        return time.perf_counter_ns() - start, result
    finally:
        gc.enable()


def per_event(handle: Handler, lines: Sequence[bytes]) -> float:
    """Mean ns per line of one pass over ``lines``."""

    def run() -> None:
        for line in lines:
            handle(line)

    return timed(run)[0] / len(lines)


def traced_bytes(ingest: Handler, lines: Sequence[bytes]) -> tuple[int, int]:
    """Bytes still allocated after ingesting ``lines``, and the peak on the way."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for line in lines:
            ingest(line)
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before, peak - before


def scheduled_writes(planner: Planner) -> tuple[int, int]:
    """(dirty objects, node writes the planner would make for them); then drain, as the writer."""
    cache = planner.cache
    dirty = len(cache.queue)
    planned = sum(planner.plan_node(name).writes for name in list(cache.queue.nodes))
    drain(cache)
    return dirty, planned


@dataclass
class EventRounds:
    """Per-round samples for one kind of event (ns per event, and writes per pass)."""

    events: int
    naive_events: int
    ns: dict[str, list[float]] = field(default_factory=dict)
    dirty: list[int] = field(default_factory=list)
    planned: list[int] = field(default_factory=list)

    def add(self, name: str, value: float) -> None:
        self.ns.setdefault(name, []).append(value)

    def ratio(self, top: str, bottom: str) -> float:
        """Median of the per-round ratios: each round's pair saw the same noise."""
        return statistics.median(a / b for a, b in zip(self.ns[top], self.ns[bottom], strict=True))

    def summary(self) -> dict[str, Any]:
        medians = {f"{k}_ns_per_event": round(statistics.median(v)) for k, v in self.ns.items()}
        return {
            "events_per_pass": self.events,
            "naive_events_per_pass": self.naive_events,
            **medians,
            "ours_over_json_loads": round(self.ratio("ours", "json_loads"), 3),
            "ours_over_orjson_loads": round(self.ratio("ours", "orjson_loads"), 3),
            "naive_over_ours": round(self.ratio("naive", "ours"), 1),
            "dirty_objects_per_event": sum(self.dirty) / (self.events * len(self.dirty)),
            "planned_node_writes_per_event": sum(self.planned) / (self.events * len(self.planned)),
            "samples_ns_per_event": {k: [round(x) for x in v] for k, v in self.ns.items()},
        }


def measure_events(
    lines: list[bytes],
    naive_lines: list[bytes],
    handlers: tuple[Handler, NaiveController],
    planner: Planner,
    rounds: int,
) -> EventRounds:
    """Interleave json.loads, orjson.loads, ours and naive on the same lines, round by round.

    The order rotates each round so that no contender always holds the same slot (first after
    the write accounting, right after the naive pass's megabytes of garbage, ...).
    """
    handle, controller = handlers
    result = EventRounds(events=len(lines), naive_events=len(naive_lines))
    passes: list[tuple[str, Handler, list[bytes]]] = [
        ("json_loads", json.loads, lines),
        ("orjson_loads", orjson.loads, lines),
        ("ours", handle, lines),
        ("naive", controller.handle_line, naive_lines),
    ]
    for round_ in range(rounds):
        shift = round_ % len(passes)
        for name, handler, batch in passes[shift:] + passes[:shift]:
            result.add(name, per_event(handler, batch))
            if name == "ours":
                dirty, planned = scheduled_writes(planner)
                result.dirty.append(dirty)
                result.planned.append(planned)
    return result


def measure_reevaluation(
    cache: ClusterCache, controller: NaiveController, work: Workload, rounds: int
) -> dict[str, Any]:
    """One policy's selector changes back and forth: the index alone, then the full path.

    Every timed call is a real change (new, old, new, ...); the index rounds end where they
    began, and the full path ends on the new selector, which the naive baseline then gets too.
    """
    old_body = work.policies[0]
    meta, old_spec = old_body["metadata"], old_body["spec"]
    new_spec = old_spec | {"nodeSelector": work.changed_selector}
    old = cache.policies[meta["name"]]
    new = compile_policy(name=old.name, uid=old.uid, generation=old.generation + 1, spec=new_spec)
    changed: list[int] = []
    index_ns: list[int] = []
    for policy in (new, old) * rounds:
        ns, nodes = timed(functools.partial(cache.index.update_policy, policy, cache.nodes))
        index_ns.append(ns)
        changed.append(len(nodes))
    upsert_ns: list[int] = []
    body = old_body
    for generation, spec in enumerate([new_spec, old_spec] * rounds + [new_spec], start=2):
        body = old_body | {"metadata": meta | {"generation": generation}, "spec": spec}
        drain(cache)
        upsert_ns.append(timed(functools.partial(cache.upsert_policy, body))[0])
    drain(cache)
    naive_ns = timed(functools.partial(controller.upsert_policy, body))[0]
    return {
        "policy": old.name,
        "nodes": len(cache.nodes),
        "nodes_whose_match_changed": statistics.median(changed),
        "update_policy_ms": statistics.median(index_ns) / MS,
        "upsert_policy_ms": statistics.median(upsert_ns) / MS,
        "naive_ms": naive_ns / MS,
        "samples_ms": {
            "update_policy": [round(ns / MS, 3) for ns in index_ns],
            "upsert_policy": [round(ns / MS, 3) for ns in upsert_ns],
        },
    }


# -- the run ------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


@dataclass
class Caches:
    """Both implementations after the ADDED lines, and what holding them costs."""

    cache: ClusterCache
    handle: Handler
    controller: NaiveController
    memory: dict[str, Any]


def cache_both(work: Workload, config: Config) -> Caches:
    """Ingest every ADDED line into both, tracing ours in full and the naive one on a sample.

    The naive sample is its first ``naive_events`` nodes (every pool is in it): tracing adds
    to the milliseconds each of its events already costs, and its per-node cost is flat.
    """
    cache, handle = ours(work.policies)
    kept, peak = traced_bytes(handle, work.added)
    drain(cache)
    controller = naive(work.policies)
    traced = min(len(work.added), max(1, config.naive_events))
    naive_kept, _ = traced_bytes(controller.handle_line, work.added[:traced])
    for line in work.added[traced:]:
        controller.handle_line(line)
    memory = {
        "ours_bytes_per_node": kept / len(work.added),
        "ours_peak_bytes_while_ingesting": peak,
        "naive_bytes_per_node": naive_kept / traced,
        "naive_nodes_traced": traced,
    }
    return Caches(cache, handle, controller, memory)


def time_events(caches: Caches, work: Workload, config: Config) -> dict[str, Any]:
    timings = Timings(propagation_delay=75, key_grace_period=300, mismatch_timeout=60)
    reconciler = Reconciler(
        caches.cache, timings=timings, max_unavailable="10%", wallclock=lambda: HEARTBEAT_AT
    )
    planner = reconciler.planner
    handlers = (caches.handle, caches.controller)
    kinds = (("heartbeat", work.heartbeats, False), ("label_change", work.label_changes, True))
    return {
        kind: measure_events(
            lines,
            sample(lines, config.naive_events, paired=paired),
            handlers,
            planner,
            config.rounds,
        ).summary()
        for kind, lines, paired in kinds
    }


def run(config: Config) -> dict[str, Any]:
    """The whole benchmark; writes ``config.out`` and returns what it wrote."""
    started = time.perf_counter()
    work = build_workload(config.nodes, config.policies)
    mean_line = statistics.fmean(map(len, work.added))
    log(f"built {config.nodes} nodes ({mean_line / 1024:.1f} KiB per line); caching")
    caches = cache_both(work, config)
    matched = check_agreement(caches.cache, caches.controller, when="after ADDED")
    log(f"{matched} nodes matched by a policy; timing events")
    # The caches are long-lived: freezing them keeps the untimed collections between passes
    # from walking the naive cache's millions of objects (0.3 s each) without changing a timing.
    gc.freeze()
    try:
        events = time_events(caches, work, config)
        log("timing selector re-evaluation")
        reevaluation = measure_reevaluation(caches.cache, caches.controller, work, config.rounds)
    finally:
        gc.unfreeze()
    matched = check_agreement(caches.cache, caches.controller, when="after the selector change")
    memory = caches.memory
    del caches  # the MIG rows run on their own caches, these freed
    mig = run_mig(config) if config.mig_nodes else None
    report: dict[str, Any] = {
        "benchmark": "ingest",
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(config).items()},
        "workload": {"mean_line_bytes": round(mean_line), "policies": len(work.policies)},
        "events": events,
        "memory": memory,
        "reevaluation": reevaluation,
        "agreement": {"equal": True, "nodes_matched": matched},
        "mig": mig,
        "seconds": round(time.perf_counter() - started, 1),
    }
    report["budgets"] = budgets(report)
    config.out.parent.mkdir(parents=True, exist_ok=True)
    config.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    return report


def run_mig(config: Config) -> dict[str, Any]:
    """The MIG rows: the same caching and event passes, on the MIG pool alone.

    Its own caches, so that bytes per node are the MIG nodes' (as the main rows are the plain
    nodes'), and the main caches are freed first: neither run's heap shapes the other's.
    """
    work = build_mig_workload(config.mig_nodes, config.policies)
    mean_line = statistics.fmean(map(len, work.added))
    log(f"built {config.mig_nodes} MIG nodes ({mean_line / 1024:.1f} KiB per line); caching")
    gc.collect()
    caches = cache_both(work, config)
    matched = check_agreement(caches.cache, caches.controller, when="after MIG ADDED")
    labels = orjson.loads(work.added[0])["object"]["metadata"]["labels"]
    log(f"{matched} MIG nodes matched by a policy; timing their events")
    gc.freeze()
    try:
        events = time_events(caches, work, config)
    finally:
        gc.unfreeze()
    return {
        "nodes": config.mig_nodes,
        "nodes_matched": matched,
        "mean_line_bytes": round(mean_line),
        "labels_per_node": len(labels),
        "mig_resource_labels_per_node": sum(k.startswith("nvidia.com/mig-") for k in labels),
        "profiles": list(mignodes.DEVICES),
        "events": events,
        "memory": caches.memory,
    }


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "orjson": orjson.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


# -- budgets and the table ----------------------------------------------------------------------

TIMES = "\N{MULTIPLICATION SIGN}"


def _row(
    measure: str, unit: str, values: tuple[float, float | None], budget: float, *, at_least: bool
) -> dict[str, Any]:
    ours_value, naive_value = values
    ok = ours_value >= budget if at_least else ours_value <= budget
    return {
        "measure": measure,
        "unit": unit,
        "ours": ours_value,
        "naive": naive_value,
        "budget": budget,
        "at_least": at_least,
        "pass": ok,
    }


def budgets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's budgets; ``naive`` is the baseline's figure for the same measure."""
    beat, label = report["events"]["heartbeat"], report["events"]["label_change"]
    memory, reeval = report["memory"], report["reevaluation"]
    naive_beat = beat["naive_ns_per_event"] / beat["json_loads_ns_per_event"]
    naive_label = label["naive_ns_per_event"] / label["json_loads_ns_per_event"]
    naive_memory = memory["naive_bytes_per_node"]
    return [
        _row("heartbeat ÷ json.loads", "x", (beat["ours_over_json_loads"], naive_beat), 1.0,
             at_least=False),
        _row("label change ÷ json.loads", "x", (label["ours_over_json_loads"], naive_label), 1.5,
             at_least=False),
        _row("memory per cached node", "B", (memory["ours_bytes_per_node"], naive_memory), 2048,
             at_least=False),
        _row(f"re-evaluate {reeval['nodes']:,} nodes after a selector change", "ms",
             (reeval["upsert_policy_ms"], reeval["naive_ms"]), 50, at_least=False),
        _row("writes scheduled per heartbeat", "", (beat["dirty_objects_per_event"], None), 0,
             at_least=False),
        _row("naive ÷ gpushare, per heartbeat", "x", (beat["naive_over_ours"], None), 5,
             at_least=True),
        *_mig_budgets(report.get("mig")),
    ]  # fmt: skip


def _mig_budgets(mig: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Issue #24's rows for MIG nodes (H100, mixed, 3 profiles), when they were measured."""
    if not mig:
        return []
    beat, memory = mig["events"]["heartbeat"], mig["memory"]
    naive_beat = beat["naive_ns_per_event"] / beat["json_loads_ns_per_event"]
    return [
        _row("MIG node: heartbeat ÷ json.loads", "x", (beat["ours_over_json_loads"], naive_beat),
             1.0, at_least=False),
        _row("memory per cached MIG node", "B",
             (memory["ours_bytes_per_node"], memory["naive_bytes_per_node"]), 2048,
             at_least=False),
        _row("writes scheduled per MIG heartbeat", "", (beat["dirty_objects_per_event"], None), 0,
             at_least=False),
    ]  # fmt: skip


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "B":
        return f"{value / 1024:,.2f} KiB"
    if unit == "x":
        return f"{value:,.2f}{TIMES}"
    if unit == "ms":
        return f"{value:,.1f} ms" if value >= 10 else f"{value:,.2f} ms"
    return f"{value:g}"


def table(report: dict[str, Any]) -> str:
    """The budget table in markdown, plus the facts a reader needs to trust it."""
    lines = [
        "| Measure | gpushare | naive baseline | Budget | Result |",
        "|---|---|---|---|---|",
    ]
    for row in report["budgets"]:
        unit = row["unit"]
        sign = "≥" if row["at_least"] else ("=" if row["budget"] == 0 else "≤")
        verdict = "PASS" if row["pass"] else "**MISS**"
        lines.append(
            f"| {row['measure']} | {_number(row['ours'], unit)} | {_number(row['naive'], unit)}"
            f" | {sign} {_number(row['budget'], unit)} | {verdict} |"
        )
    return "\n".join(lines) + "\n\n" + _footnote(report)


def _footnote(report: dict[str, Any]) -> str:
    beat, label = report["events"]["heartbeat"], report["events"]["label_change"]
    reeval, config, work = report["reevaluation"], report["config"], report["workload"]
    return (
        f"{config['nodes']:,} GPU nodes ({work['mean_line_bytes']:,} B per watch line),"
        f" {work['policies']} policies, median of {config['rounds']} rounds."
        f" Per event, json.loads / orjson.loads / gpushare: heartbeat {_micros(beat)},"
        f" label change {_micros(label)}. Selector change ({reeval['policy']},"
        f" {reeval['nodes_whose_match_changed']:,.0f} nodes change match): MatchIndex.update_policy"
        f" {reeval['update_policy_ms']:.2f} ms, ClusterCache.upsert_policy"
        f" {reeval['upsert_policy_ms']:.2f} ms. Naive per-event figures from"
        f" {beat['naive_events_per_pass']} sampled events per pass, naive memory from"
        f" {report['memory']['naive_nodes_traced']} nodes. Dirty objects per label change:"
        f" {label['dirty_objects_per_event']:.2f}." + _mig_footnote(report.get("mig"))
    )


def _mig_footnote(mig: dict[str, Any] | None) -> str:
    if not mig:
        return ""
    beat = mig["events"]["heartbeat"]
    return (
        f" MIG rows: {mig['nodes']:,} H100 nodes on a mixed layout ({', '.join(mig['profiles'])}"
        f" per GPU; {mig['mig_resource_labels_per_node']} MIG resource labels,"
        f" {mig['labels_per_node']} labels in all, {mig['mean_line_bytes']:,} B per watch line),"
        f" cached apart; per heartbeat {_micros(beat)}."
    )


def _micros(events: dict[str, Any]) -> str:
    names = ("json_loads", "orjson_loads", "ours")
    return " / ".join(f"{events[f'{n}_ns_per_event'] / 1000:.0f}" for n in names) + " µs"


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ingest", description=__doc__)
    defaults = Config()
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--policies", type=int, default=defaults.policies)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument(
        "--naive-events", type=int, default=defaults.naive_events, help="sampled per pass"
    )
    parser.add_argument(
        "--mig-nodes", type=int, default=defaults.mig_nodes, help="MIG rows' nodes (0: none)"
    )
    parser.add_argument("--out", type=Path, default=defaults.out)
    args = parser.parse_args(argv)
    return Config(
        args.nodes, args.policies, args.rounds, args.naive_events, args.mig_nodes, args.out
    )


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

"""The memory-request webhook's admission latency, as the API server measures it.

The budget (from the issue): ``apiserver_admission_webhook_admission_duration_seconds`` p99 at
most 10 ms with 5,000 nodes cached, at 100 pod creations per second for 60 s.  This phase runs
on a control plane of its own (as the MIG re-layout does: the comparison rows' cluster carries
50,000 bound pods and 20 policies whose writes and heartbeats would be measured too), with the
scale benchmark's API server flags and **no kube-scheduler**: what is measured is admission,
and placing 12,000 pods on 2 shared cores would measure the scheduler (and its informers) beside
it.  The pods stay Pending; nothing here needs them placed.

Setup, not measured:

1. ``--nodes`` realistic GPU Nodes (``cluster.node_body``: 8 H100s each, GFD's labels, ~15 KB)
   over the five pools, one policy per pool (``POLICIES``): MPS at 8, 4 and 2 replicas,
   Exclusive, and time-slicing (which promises no memory: its nodes offer nothing);
2. *primed*, not pre-labelled: a primer (our operator under its own user, at 5,000 writes/s, its
   webhook off) and the scale benchmark's GFD responder (``gfd.py``, catching up: it confirms at
   once whatever config a node's label names) bring every node to ``Verified``, so that the
   nodes carry exactly the labels the operator writes (config, policy, and the three
   ``gpushare.dev/slot-*`` labels), GFD's replicas/strategy labels and the allocatable the
   device plugin leaves, rather than a copy of what we think it writes;
3. the configuration as the chart makes it (``gpushare_testing.webhooks``), pointed at
   ``https://127.0.0.1:<port>/gpu-memory``, then the measured operator: a fresh process at its
   own defaults but for the webhook flags (``--webhook-hosts 127.0.0.1,localhost``), starting
   into a steady cluster; it becomes the leader (the primer handed the Lease back), makes the
   serving certificate and publishes the caBundle.  Checked before any load: its caches hold
   every node (``gpushare_cache_objects{kind="Node"}``), the caBundle is published, and one
   probe pod of each size is mutated into the class the policies predict (``expected_class``).

The load, from this process (a client of its own, never the operator's stack), paced at
``--rate`` creates per second (each create sent at its due time whatever the answers before it,
not in bursts; at most 128 in flight over 4 connection pools), for ``--seconds`` each:

- *baseline*: the same realistic pods (``podbodies.plain_pod``: ~3.5 KB, unbound) without the
  label, which the configuration's objectSelector keeps away from the webhook;
- *webhook*: the same pods with ``gpushare.dev/gpu-memory`` cycling through ``SIZES`` (every
  enforced class is chosen); every answer is checked: created, and placed in the class
  predicted.  Refused or failed creations are counted (there are none on purpose).

The figures:

- the API server's own histogram of the webhook (``...admission_duration_seconds_bucket``, all
  series of ``name="gpu-memory.gpushare.dev"``: labels name, type, operation, rejected), the
  delta of two scrapes of its ``/metrics`` around the webhook window; p50/p99 as PromQL's
  ``histogram_quantile`` computes them (linear within a bucket, from 0 in the first).  Its
  buckets are coarse (5, 25, 100, 500 ms, 1, 2.5, 10, 25 s), so the share of admissions under
  each edge is reported too, and the verdict says whether the buckets *prove* it (99% at or
  under the 5 ms edge) or it rests on interpolation within the 5-25 ms bucket;
- the operator's own ``gpushare_webhook_admission_seconds`` (finer buckets; its server alone,
  without the API server's marshalling, the network and TLS);
- the pod-create latency with and without the webhook: the loader's own timing of each create
  (exact percentiles) and the API server's ``apiserver_request_duration_seconds`` for
  ``POST pods`` (bucketed), each window against the other as a ratio;
- CPU of the operator, the API server, etcd and this loader over each window, and how busy the
  machine was (``/proc/stat``) with the share of it taken by processes outside this phase.

``--webhook-profile PATH`` records the operator with py-spy (native frames, 100 Hz) over the
webhook window, as raw collapsed stacks; py-spy pauses it for each sample, so a profiled run's
figures are not the ones to quote.  Each window also samples the operator's own event-loop lag
(``gpushare_event_loop_lag_seconds``, its worst timer lateness over 10 s) every 2 s.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from benchmarks.scale import cluster, gfd, run, stats, webhookbudgets
from benchmarks.scale.webhookbudgets import latency_summary, ratio
from gpushare_operator.app import settings
from gpushare_operator.core import quantities
from gpushare_operator.core.slots import slotclasses
from gpushare_testing import podbodies
from gpushare_testing import webhooks as wh
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.rawclient import ApiError, RawClient

USER: Final = "bench-gpushare-webhook"
PRIMER_USER: Final = "bench-webhook-primer"
POD_NAMESPACE: Final = "bench-webhook"
CONFIGURATION: Final = "gpushare-operator"  # the operator's default --webhook-configuration
SECRET: Final = "gpushare-webhook-tls"
GPU_MIB: Final = 81559  # GFD's nvidia.com/gpu.memory of the bench nodes' H100s
GPU_RESOURCE: Final = "nvidia.com/gpu"
BUDGET_S: Final = 0.010
QUANTILES: Final = (0.5, 0.99)
# Creates in flight at most: 100/s answered in up to 1 s.  Spread over LOADER_CLIENTS clients
# (RawClient pools 32 connections each).
CONCURRENCY: Final = 128
LOADER_CLIENTS: Final = 4
# The budget's conditions; a run below them (--quick) reports the verdict as indicative only.
BUDGET_NODES: Final = 5000
BUDGET_RATE: Final = 100.0
BUDGET_SECONDS: Final = 60.0
# One policy per pool of ``cluster.POOLS``: (strategy, replicas; None for Exclusive).
POLICIES: Final[Mapping[str, tuple[str, int | None]]] = {
    "inference": ("MPS", 4),
    "training": ("Exclusive", None),
    "batch": ("MPS", 2),
    "research": ("MPS", 8),
    "dev": ("TimeSlicing", 4),
}
# The requests the load cycles through: each lands in another class (see ``expected_class``).
SIZES: Final = ("8Gi", "10Gi", "20Gi", "32Gi", "64Gi")
ADMISSION_METRIC: Final = "apiserver_admission_webhook_admission_duration_seconds"
REQUEST_METRIC: Final = "apiserver_request_duration_seconds"
OPERATOR_METRIC: Final = "gpushare_webhook_admission_seconds"
RECEIVE_METRIC: Final = "gpushare_webhook_review_receive_seconds"
WAIT_METRIC: Final = "gpushare_webhook_write_wait_seconds"
# Nothing is audited: the operator's writes are counted from its own metrics, and a blocking
# audit log of 12,000 pod creates would slow the API server being measured.
AUDIT_POLICY: Final = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "None"}],
}
DEFAULTS: Final = settings.parse_settings([], env={})


# -- what the cluster offers, and what each pod should get --------------------------------------


def policy_name(pool: str) -> str:
    return f"wh-{pool}"


def policy_body(pool: str) -> dict[str, Any]:
    strategy, replicas = POLICIES[pool]
    spec: dict[str, Any] = {
        "nodeSelector": {"matchLabels": {"pool": pool}},
        "strategy": strategy,
        # Every node at once: the primer converges a fresh cluster; nothing rolls out later.
        "rollout": dict(cluster.UNPACED),
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": policy_name(pool)},
        "spec": spec,
    }


def offered_mib(strategy: str, replicas: int | None, *, gpu_mib: int = GPU_MIB) -> int | None:
    """The memory a pool's slot enforces: MPS the daemon's floor(memory / replicas), Exclusive
    the whole GPU, time-slicing nothing."""
    if strategy == "MPS" and replicas:
        return gpu_mib // replicas
    if strategy == "Exclusive":
        return gpu_mib
    return None


def offers(policies: Mapping[str, tuple[str, int | None]] = POLICIES) -> list[int]:
    """Every enforced class (MiB of ``nvidia.com/gpu``) the pools offer, smallest first."""
    found = {offered_mib(strategy, replicas) for strategy, replicas in policies.values()}
    return sorted(m for m in found if m is not None)


def expected_class(size: str, classes: Sequence[int]) -> int | None:
    """The smallest class that holds ``size`` (the webhook's rule); None: it is refused."""
    wanted = quantities.parse_mib(size)
    return next((m for m in classes if m >= wanted), None)


def placed_class(pod: Mapping[str, Any]) -> int | None:
    """The class the webhook chose for ``pod`` (as the API server answered the create): the
    memory of its preferred ``slot-memory-mib < class + 1`` term, if it asks for one GPU slot."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or [{}]
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    if limits.get(GPU_RESOURCE) != "1":
        return None
    node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    for term in node.get("preferredDuringSchedulingIgnoredDuringExecution") or ():
        for expression in (term.get("preference") or {}).get("matchExpressions") or ():
            if expression.get("key") == slotclasses.MEMORY_LABEL and expression["operator"] == "Lt":
                return int(expression["values"][0]) - 1
    return None


def expected_policies(nodes: int) -> dict[str, str]:
    """Which policy governs each node (``Published.verified`` compares its GNS with it)."""
    return {
        cluster.node_name(i): policy_name(cluster.POOLS[i % len(cluster.POOLS)])
        for i in range(nodes)
    }


def pod_body(name: str, *, size: str | None) -> dict[str, Any]:
    """A realistic unbound pod (a ReplicaSet's, without its owner: nothing here owns it), with
    the memory-request label when ``size`` is given."""
    body = podbodies.plain_pod(
        name=name, node=None, namespace=POD_NAMESPACE, phase="Pending", managed_fields=False
    )
    metadata = body["metadata"]
    for key in ("uid", "creationTimestamp", "generateName", "ownerReferences"):
        metadata.pop(key, None)
    body.pop("status", None)
    if size is not None:
        metadata["labels"][wh.REQUEST_LABEL] = size
    return body


# -- histograms: two scrapes, their delta, and histogram_quantile ------------------------------

Buckets = dict[float, float]  # upper bound (le) -> cumulative count; +Inf included


def relevant(text: str, names: Iterable[str]) -> list[tuple[str, dict[str, str], float]]:
    """The samples of ``names`` (and their _bucket/_sum/_count) in a metrics text; the API
    server's is megabytes, so other lines are skipped before parsing."""
    prefixes = tuple(names)
    lines = [line for line in text.splitlines() if line.startswith(prefixes)]
    return stats.parse_metrics("\n".join(lines))


def histogram(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
    name: str,
    match: Callable[[Mapping[str, str]], bool] = lambda _: True,
) -> Buckets:
    """``name``'s buckets, summed over every series whose labels ``match`` (as
    ``sum by (le)`` does)."""
    out: Buckets = {}
    for sample, labels, value in samples:
        if sample != f"{name}_bucket" or "le" not in labels or not match(labels):
            continue
        le = float(labels["le"])
        out[le] = out.get(le, 0.0) + value
    return out


def series(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
    name: str,
    keys: Sequence[str],
    match: Callable[[Mapping[str, str]], bool] = lambda _: True,
) -> dict[str, float]:
    """A counter's samples by the values of ``keys`` (joined with ','), summed."""
    out: dict[str, float] = {}
    for sample, labels, value in samples:
        if sample == name and match(labels):
            key = ",".join(f"{k}={labels.get(k, '')}" for k in keys)
            out[key] = out.get(key, 0.0) + value
    return out


def delta(before: Mapping[Any, float], after: Mapping[Any, float]) -> dict[Any, float]:
    """What was counted between two scrapes, per key.  A key absent before counts from 0 (a
    series appears with its first observation); one lower after than before was reset (its
    process restarted), so all of it is new, as Prometheus' ``increase`` takes it."""
    out: dict[Any, float] = {}
    for key, now in after.items():
        was = before.get(key, 0.0)
        out[key] = now if now < was else now - was
    return out


def _sorted_buckets(buckets: Mapping[float, float]) -> list[tuple[float, float]]:
    """Sorted by bound, each count at least the previous one (PromQL forces monotonicity)."""
    ordered = sorted(buckets.items())
    out: list[tuple[float, float]] = []
    highest = 0.0
    for bound, count in ordered:
        highest = max(highest, count)
        out.append((bound, highest))
    return out


def quantile(q: float, buckets: Mapping[float, float]) -> float:
    """PromQL's ``histogram_quantile(q, ...)`` of cumulative ``buckets``: the rank ``q * total``
    is found in the first bucket whose count reaches it and interpolated linearly within it,
    from 0 in the lowest bucket (when its bound is above 0); a rank in the +Inf bucket gives the
    highest finite bound.  NaN without observations or without a +Inf bucket."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = _sorted_buckets(buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return math.nan
    total = ordered[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    # The +Inf bucket holds every observation, so some bucket reaches the rank.
    index = next(i for i, (_, count) in enumerate(ordered) if count >= rank)
    if index == len(ordered) - 1:
        return ordered[-2][0]
    bound, count = ordered[index]
    if index == 0 and bound <= 0:
        return bound
    start, below = (0.0, 0.0) if index == 0 else ordered[index - 1]
    if count == below:  # q = 0 and an empty lowest bucket: PromQL's 0/0
        return math.nan
    return start + (bound - start) * (rank - below) / (count - below)


def fractions(buckets: Mapping[float, float]) -> list[tuple[float, float]]:
    """(edge, share of the observations at or under it) for every finite edge."""
    ordered = _sorted_buckets(buckets)
    total = ordered[-1][1] if ordered else 0.0
    return [(bound, count / total if total else math.nan) for bound, count in ordered[:-1]]


def share_within(buckets: Mapping[float, float], edge: float) -> float:
    """The share of observations at or under ``edge`` (a bucket bound), NaN if it is none."""
    return next((share for bound, share in fractions(buckets) if bound == edge), math.nan)


def _wait(window: Mapping[str, Any]) -> str:
    """The write's wait for the core: its p99 and the share of writes over 0.5 ms."""
    waited = window.get("operator_write_wait") or {"p99_ms": None, "under_ms": []}
    within = webhookbudgets.share_within(waited, 0.5)
    over = "—" if within is None else f"{100 * (1 - within):.1f}%"
    return f"{_fmt(waited['p99_ms'])}, {over}"


def summarize(buckets: Mapping[float, float]) -> dict[str, Any]:
    """Count, p50/p99 (ms) and the share under each edge (ms) of a bucket delta."""
    ordered = _sorted_buckets(buckets)
    total = ordered[-1][1] if ordered else 0.0
    return {
        "count": int(total),
        **{f"p{round(q * 100)}_ms": _ms(quantile(q, buckets)) for q in QUANTILES},
        "under_ms": [[_edge_ms(bound), round(share, 5)] for bound, share in fractions(buckets)],
    }


def budget_verdict(buckets: Mapping[float, float], *, limit: float = BUDGET_S) -> dict[str, Any]:
    """PASS/FAIL of the interpolated p99 against ``limit``, and what the buckets alone prove:
    99% at or under an edge no higher than the limit proves a pass; under 99% at or under an
    edge no lower than it proves a fail; otherwise the p99 lies in the bucket across the limit
    and the verdict rests on the interpolation."""
    p99 = quantile(0.99, buckets)
    shares = fractions(buckets)
    lower = [(bound, share) for bound, share in shares if bound <= limit]
    upper = [(bound, share) for bound, share in shares if bound >= limit]
    if math.isnan(p99):
        return {"verdict": "n/a", "p99_ms": None, "limit_ms": _ms(limit), "evidence": "no data"}
    if lower and lower[-1][1] >= 0.99:
        edge, share = lower[-1]
        evidence = f"proven by the buckets: {100 * share:.2f}% at or under {_edge_ms(edge):g} ms"
    elif upper and upper[0][1] < 0.99:
        edge, share = upper[0]
        evidence = (
            f"proven by the buckets: only {100 * share:.2f}% at or under {_edge_ms(upper[0][0]):g}"
            " ms"
        )
    else:
        low = _edge_ms(lower[-1][0]) if lower else 0
        high = _edge_ms(upper[0][0]) if upper else math.inf
        evidence = f"interpolated: the p99 lies in the {low:g}-{high:g} ms bucket"
    return {
        "verdict": "PASS" if p99 <= limit else "FAIL",
        "p99_ms": _ms(p99),
        "limit_ms": _ms(limit),
        "evidence": evidence,
    }


def _ms(seconds: float) -> float | None:
    return None if math.isnan(seconds) else round(seconds * 1000, 3)


def _edge_ms(bound: float) -> float:
    return round(bound * 1000, 3)


def writes(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> dict[str, int]:
    """The operator's writes so far, by kind and outcome (its ``gpushare_writes_total``)."""
    counted = series(samples, "gpushare_writes_total", ("kind", "outcome"))
    return {key: int(value) for key, value in counted.items() if value}


def is_webhook(labels: Mapping[str, str]) -> bool:
    return labels.get("name") == wh.WEBHOOK_NAME


def is_pod_create(labels: Mapping[str, str]) -> bool:
    return (
        labels.get("verb") == "POST"
        and labels.get("resource") == "pods"
        and not labels.get("subresource")
    )


# -- the load -----------------------------------------------------------------------------------


@dataclass
class Load:
    """One window of paced creates, as the loader saw them."""

    sent: int = 0
    created: int = 0
    placed_as_expected: int = 0
    misplaced: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # HTTP status (or error) -> count
    latencies: list[float] = field(default_factory=list)  # seconds, of the 201s
    # The same, by kind of pod: "labelled" (sent to the webhook) or "unlabelled".
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    late_max: float = 0.0  # the latest a create went out after its due time (s)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "created": self.created,
            "placed_as_expected": self.placed_as_expected,
            "misplaced": self.misplaced,
            "failed": dict(sorted(self.failed.items())),
            "seconds": round(self.seconds, 1),
            "achieved_per_s": round(self.sent / self.seconds, 1) if self.seconds else None,
            "late_max_ms": round(self.late_max * 1000, 1),
            "client_latency": latency_summary(self.latencies),
        }


async def paced_creates(
    clients: Sequence[RawClient],
    *,
    prefix: str,
    rate: float,
    seconds: float,
    size_of: Callable[[int], str | None],
    classes: Sequence[int],
    concurrency: int = CONCURRENCY,
) -> Load:
    """``rate`` creates per second for ``seconds``, each sent at its due time whatever the
    answers before it (open loop), over ``clients`` in turn; at most ``concurrency`` in flight
    (a create waiting for a slot shows as lateness, and as a lower achieved rate)."""
    load = Load()
    gate = asyncio.Semaphore(concurrency)
    path = f"/api/v1/namespaces/{POD_NAMESPACE}/pods"
    tasks: set[asyncio.Task[None]] = set()
    total = int(rate * seconds)
    bodies = [pod_body(f"{prefix}-{i:05d}", size=size_of(i)) for i in range(total)]
    started = time.monotonic()

    async def one(index: int, due: float) -> None:
        size = size_of(index)
        async with gate:
            load.late_max = max(load.late_max, time.monotonic() - due)
            t0 = time.perf_counter()
            try:
                status, answer = await clients[index % len(clients)].post(path, bodies[index])
            except (aiohttp.ClientError, TimeoutError) as exc:
                load.failed[type(exc).__name__] = load.failed.get(type(exc).__name__, 0) + 1
                return
            took = time.perf_counter() - t0
        if status != 201:
            load.failed[str(status)] = load.failed.get(str(status), 0) + 1
            return
        load.created += 1
        load.latencies.append(took)
        load.by_kind.setdefault("unlabelled" if size is None else "labelled", []).append(took)
        if size is not None:
            if placed_class(answer) == expected_class(size, classes):
                load.placed_as_expected += 1
            else:
                load.misplaced += 1

    for index in range(total):
        due = started + index / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        load.sent += 1
        task = asyncio.create_task(one(index, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    load.seconds = time.monotonic() - started
    return load


def sized(index: int) -> str:
    return SIZES[index % len(SIZES)]


def alternate(index: int) -> str | None:
    """Every other pod labelled (the sizes in turn), the rest not: both kinds in one window."""
    return None if index % 2 else sized(index // 2)


# -- processes, CPU and the machine -------------------------------------------------------------


def _proc_cpu(pid: int) -> float:
    try:
        return stats.parse_proc_stat_cpu(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return math.nan


def machine_busy() -> float:
    """CPU seconds every core of the machine spent busy since boot (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / stats.CLK_TCK


@dataclass
class CpuWindow:
    """CPU of some processes and of the whole machine over one window."""

    pids: dict[str, int]
    started: float = field(default_factory=time.monotonic)
    cpu0: dict[str, float] = field(default_factory=dict)
    busy0: float = 0.0
    load0: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        self.cpu0 = {name: _proc_cpu(pid) for name, pid in self.pids.items()}
        self.busy0 = machine_busy()
        self.load0 = os.getloadavg()

    def result(self) -> dict[str, Any]:
        wall = time.monotonic() - self.started
        cores = os.cpu_count() or 1
        spent = {name: _proc_cpu(pid) - self.cpu0[name] for name, pid in self.pids.items()}
        busy = machine_busy() - self.busy0
        ours = sum(v for v in spent.values() if not math.isnan(v))
        return {
            "wall_s": round(wall, 1),
            "cpu_s": {name: round(v, 2) for name, v in spent.items()},
            "machine_busy_share": round(stats.cpu_share(busy, wall, cores=cores), 3),
            # What processes outside this phase (other tests, builds) took of both cores.
            "others_share": round(stats.cpu_share(max(0.0, busy - ours), wall, cores=cores), 3),
            "loadavg_start": [round(v, 2) for v in self.load0],
            "loadavg_end": [round(v, 2) for v in os.getloadavg()],
        }


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy over the block, if asked, with native frames (CPython's garbage collector, TLS,
    the loop): it pauses the operator for each sample, so a profiled run's latencies are not
    the ones to quote."""
    if out is None:
        yield
        return
    beside = Path(sys.executable).parent / "py-spy"
    spy_bin = str(beside) if beside.exists() else "py-spy"
    command = [spy_bin, "record", "--pid", str(pid), "--rate", "100", "--format", "raw"]
    spy = subprocess.Popen(
        [*command, "--native", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


# -- the phase ----------------------------------------------------------------------------------


async def _scrape(admin: RawClient, session: aiohttp.ClientSession, port: int) -> dict[str, Any]:
    """The API server's and the operator's samples of interest, now."""
    status, text = await admin.get("/metrics")
    if status != 200 or not isinstance(text, str):
        raise ApiError(method="GET", path="/metrics", status=status, body=text)
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        ours = await response.text()
    server = relevant(
        text,
        (
            ADMISSION_METRIC,
            REQUEST_METRIC + "_bucket",
            "apiserver_admission_webhook_request_total",
            "apiserver_admission_webhook_rejection_count",
        ),
    )
    operator = relevant(
        ours,
        (
            OPERATOR_METRIC,
            RECEIVE_METRIC,
            WAIT_METRIC,
            "gpushare_webhook_admissions",
            "gpushare_writes",
            "python_gc_collections_total",
        ),
    )
    return {"server": server, "operator": operator}


def _window(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The histograms and counters of one window (two scrapes)."""
    server0, server1 = before["server"], after["server"]
    ours0, ours1 = before["operator"], after["operator"]
    request = delta(
        histogram(server0, REQUEST_METRIC, is_pod_create),
        histogram(server1, REQUEST_METRIC, is_pod_create),
    )
    admission = delta(
        histogram(server0, ADMISSION_METRIC, is_webhook),
        histogram(server1, ADMISSION_METRIC, is_webhook),
    )
    label_sets = ("name", "type", "operation", "rejected")
    own = delta(histogram(ours0, OPERATOR_METRIC), histogram(ours1, OPERATOR_METRIC))
    receive = delta(histogram(ours0, RECEIVE_METRIC), histogram(ours1, RECEIVE_METRIC))
    wait = delta(histogram(ours0, WAIT_METRIC), histogram(ours1, WAIT_METRIC))

    def counter(samples: Sequence[Any], name: str, keys: Sequence[str], webhook: bool) -> Any:
        return series(samples, name, keys, is_webhook if webhook else (lambda _: True))

    def changed(name: str, keys: Sequence[str], *, side: str, webhook: bool = False) -> Any:
        was = counter(before[side], name, keys, webhook)
        now = counter(after[side], name, keys, webhook)
        return {k: int(v) for k, v in delta(was, now).items() if v}

    return {
        "pod_create_server": summarize(request),
        "admission": summarize(admission) | {"budget": budget_verdict(admission)},
        "admission_series": changed(
            f"{ADMISSION_METRIC}_count", label_sets, side="server", webhook=True
        ),
        "webhook_requests": changed(
            "apiserver_admission_webhook_request_total",
            ("code", "rejected"),
            side="server",
            webhook=True,
        ),
        "webhook_rejections": changed(
            "apiserver_admission_webhook_rejection_count",
            ("error_type", "rejection_code"),
            side="server",
            webhook=True,
        ),
        "operator_admission": summarize(own),
        "operator_receive": summarize(receive),
        "operator_write_wait": summarize(wait),
        "operator_outcomes": changed(
            "gpushare_webhook_admissions_total", ("outcome",), side="operator"
        ),
        "operator_writes": changed("gpushare_writes_total", ("kind", "outcome"), side="operator"),
        "full_collections": int(
            stats.metric_sum(ours1, "python_gc_collections_total", generation="2")
            - stats.metric_sum(ours0, "python_gc_collections_total", generation="2")
        ),
        # Every generation's, reported: a young collection runs on whichever thread allocates.
        "collections": {
            generation: int(
                stats.metric_sum(ours1, "python_gc_collections_total", generation=generation)
                - stats.metric_sum(ours0, "python_gc_collections_total", generation=generation)
            )
            for generation in ("0", "1", "2")
        },
    }


LOOPS: Final = {
    "main": "gpushare_event_loop_lag_seconds",
    "webhook": "gpushare_webhook_loop_lag_seconds",
}


async def sample_loop_lag(
    session: aiohttp.ClientSession,
    port: int,
    into: dict[str, list[float]],
    *,
    every: float = 2.0,
) -> None:
    """The operator's loop lags (the worst timer lateness of the last 10 s) every ``every``
    seconds: its main loop's (informers, writes) and its webhook server's own (which waits for
    the GIL while the main loop holds it)."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            samples = relevant(text, tuple(LOOPS.values()))
            for loop, name in LOOPS.items():
                if any(sample == name for sample, _, _ in samples):
                    into.setdefault(loop, []).append(stats.metric_sum(samples, name))
        await asyncio.sleep(every)


def lag_summary(lags: Sequence[float]) -> dict[str, float | None]:
    """The worst and the median of the sampled 10-s worsts, in ms."""
    if not lags:
        return {"max_ms": None, "median_ms": None, "samples": 0}
    return {
        "max_ms": round(max(lags) * 1000, 1),
        "median_ms": round(stats.percentile(lags, 50) * 1000, 1),
        "samples": len(lags),
    }


async def _configuration_ca(admin: RawClient) -> str:
    status, body = await admin.get(f"{wh.CONFIGURATIONS}/{CONFIGURATION}")
    if status != 200:
        return ""
    encoded = (body["webhooks"][0].get("clientConfig") or {}).get("caBundle") or ""
    return base64.b64decode(encoded).decode()


async def _prime(
    bench: run.Bench,
    primer: run.Variant,
    responder: gfd.Responder,
    expected: dict[str, str],
    *,
    timeout: float = 3600,
) -> float:
    """The primer and the responder until every node is Verified and nothing is left to do."""
    started = last_log = time.monotonic()
    async with run.launched(bench, primer) as (_, session):
        while time.monotonic() - started < timeout:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                quiet = responder.idle() and bench.published.verified(expected)
                if quiet and (await primer.probe(session)).get("dirty") == 0:
                    await asyncio.sleep(2.0)  # an empty queue between two drains: confirm it
                    if (await primer.probe(session)).get("dirty") == 0:
                        return time.monotonic() - started
            if time.monotonic() - last_log > 15:
                last_log = time.monotonic()
                missing = bench.published.missing(expected, phase="Verified")
                bench.log(
                    f"  [webhook] priming: {missing} nodes not Verified; responder"
                    f" {len(responder.working)} under way, {responder.writes} writes"
                )
            await asyncio.sleep(0.5)
    raise TimeoutError(f"the cluster was not Verified everywhere in {timeout:.0f} s")


async def _ready(
    bench: run.Bench,
    ours: run.Variant,
    session: aiohttp.ClientSession,
    *,
    nodes: int,
    timeout: float = 600,
) -> dict[str, float]:
    """Caches synced with every node, nothing dirty, and the caBundle published."""
    started = last_log = time.monotonic()
    synced_at = None
    while time.monotonic() - started < timeout:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            probe = await ours.probe(session)
            if synced_at is None and probe.get("synced") and probe.get("nodes") == nodes:
                synced_at = time.monotonic()
            settled = synced_at is not None and probe.get("dirty") == 0
            if settled and synced_at is not None and await _configuration_ca(bench.admin):
                return {
                    "synced_s": round(synced_at - started, 2),
                    "ready_s": round(time.monotonic() - started, 2),
                }
            if time.monotonic() - last_log > 15:
                last_log = time.monotonic()
                bench.log(f"  [webhook] waiting for the operator: {probe}")
        await asyncio.sleep(0.25)
    raise TimeoutError(f"the operator did not become ready in {timeout:.0f} s")


async def _probe_pods(admin: RawClient, classes: Sequence[int]) -> dict[str, int | None]:
    """One labelled pod of each size, each placed as predicted, or the phase stops."""
    placed: dict[str, int | None] = {}
    for size in SIZES:
        body = pod_body(f"probe-{size.lower()}", size=size)
        status, answer = await admin.post(f"/api/v1/namespaces/{POD_NAMESPACE}/pods", body)
        if status != 201:
            raise ApiError(method="POST", path="probe pod", status=status, body=answer)
        placed[size] = placed_class(answer)
        if placed[size] != expected_class(size, classes):
            raise AssertionError(
                f"a {size} pod got class {placed[size]}, not {expected_class(size, classes)}"
            )
    return placed


async def measure(
    plane: ControlPlane,
    *,
    nodes: int,
    rate: float,
    seconds: float,
    out_dir: Path,
    log: Callable[[str], None],
    profile: Path | None = None,
) -> dict[str, Any]:
    kubeconfigs = {
        user: plane.kubeconfig_for_user(user, groups=("system:masters",))
        for user in (USER, PRIMER_USER)
    }
    classes = offers()
    expected = expected_policies(nodes)
    timings: dict[str, float] = {}
    pids = plane.pids()
    async with RawClient(kubeconfig=plane.admin_kubeconfig) as admin:
        t = time.monotonic()
        await cluster.apply_crds(admin)
        for name in (cluster.DEVICE_PLUGIN_NAMESPACE, cluster.OPERATOR_NAMESPACE, POD_NAMESPACE):
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            await cluster.create(admin, "/api/v1/namespaces", body)
        await cluster.create_nodes(admin, nodes, log=log)
        await cluster.create_policies(admin, [policy_body(pool) for pool in cluster.POOLS])
        timings["nodes_s"] = round(time.monotonic() - t, 1)
        log(f"  [webhook] {nodes:,} nodes and {len(POLICIES)} policies in {timings['nodes_s']} s")
        bench = run.Bench(
            admin=admin,
            audit=cluster.AuditTail(plane.audit_log_path, []),
            published=cluster.Published(),
            kubeconfig_for=lambda user: kubeconfigs[user],
            nodes=nodes,
            pods=0,
            out_dir=out_dir,
            system_pids={},
            log=log,
        )
        primer = run.ours(
            user=PRIMER_USER,
            port=free_port(),
            qps=5000,
            burst=5000,
            identity="bench-webhook-primer",
            extra=["--webhook-port", "0"],
        )
        responder = gfd.Responder(
            admin,
            configmap_path=(
                f"/api/v1/namespaces/{cluster.DEVICE_PLUGIN_NAMESPACE}"
                f"/configmaps/{cluster.CONFIGMAP}"
            ),
            log=log,
        )
        async with (
            cluster.background(cluster.watch_published(admin, bench.published)),
            cluster.background(responder.run()),
        ):
            log("  [webhook] priming: every node to Verified (primer and GFD responder)")
            timings["prime_s"] = round(await _prime(bench, primer, responder, expected), 1)
            log(f"  [webhook] every node Verified in {timings['prime_s']} s")
            responder_writes = responder.writes
        webhook_port = free_port()
        flags = wh.WebhookFlags(configuration=CONFIGURATION, secret=SECRET)
        await cluster.create(
            admin, wh.CONFIGURATIONS, wh.configuration(CONFIGURATION, port=webhook_port)
        )
        ours = run.ours(
            user=USER,
            port=free_port(),
            qps=DEFAULTS.write_qps,
            burst=DEFAULTS.write_burst,
            identity="bench-gpushare-webhook",
            propagation_delay=DEFAULTS.config_propagation_delay,
            max_unavailable=None,
            mismatch_timeout=None,
            extra=flags.args(port=webhook_port),
        )
        metrics_port = int(ours.command[ours.command.index("--metrics-port") + 1])
        async with (
            run.launched(bench, ours) as (proc, session),
            contextlib.AsyncExitStack() as stack,
        ):
            loader = [
                await stack.enter_async_context(RawClient(kubeconfig=plane.admin_kubeconfig))
                for _ in range(LOADER_CLIENTS)
            ]
            cold = await _ready(bench, ours, session, nodes=nodes)
            log(f"  [webhook] operator ready: {cold}")
            placed = await _probe_pods(admin, classes)
            log(f"  [webhook] probe pods placed: {placed}")
            # Warm-up (not measured): the API server's connections to the webhook, the
            # loader's to the API server.
            for prefix, size_of in (("warm-mem", sized), ("warm-base", _unlabelled)):
                await paced_creates(
                    loader,
                    prefix=prefix,
                    rate=rate,
                    seconds=2,
                    size_of=size_of,
                    classes=classes,
                )
            cold_writes = writes((await _scrape(admin, session, metrics_port))["operator"])
            watched = {
                "gpushare": proc.pid,
                "kube-apiserver": pids["kube-apiserver"],
                "etcd": pids["etcd"],
                "kube-controller-manager": pids["kube-controller-manager"],
                "loader": os.getpid(),
            }
            windows: dict[str, dict[str, Any]] = {}
            for name, prefix, sizes, storm in WINDOWS:
                what = "with every node's heartbeat storming" if storm else ""
                log(f"  [webhook] {name}: {rate:g} pod creates/s for {seconds:g} s {what}")
                before = await _scrape(admin, session, metrics_port)
                cpu = CpuWindow(watched)
                lags: dict[str, list[float]] = {}
                with profiled(proc.pid, profile if name == "webhook" else None):
                    async with cluster.background(sample_loop_lag(session, metrics_port, lags)):
                        creates = paced_creates(
                            loader,
                            prefix=prefix,
                            rate=rate,
                            seconds=seconds,
                            size_of=sizes,
                            classes=classes,
                        )
                        if storm:
                            load, beats = await asyncio.gather(
                                creates,
                                cluster.heartbeat_storm(admin, nodes, duration=seconds),
                            )
                        else:
                            load, beats = await creates, None
                used = cpu.result()
                after = await _scrape(admin, session, metrics_port)
                windows[name] = {
                    "load": load.summary(),
                    "cpu": used,
                    "operator_loop_lag": lag_summary(lags.get("main", [])),
                    "webhook_loop_lag": lag_summary(lags.get("webhook", [])),
                    "heartbeats": beats,
                } | _window(before, after)
                if name == "interleaved":
                    windows[name]["interleaved"] = webhookbudgets.interleaved(load.by_kind)
                log(f"  [webhook] {name}: {_brief(windows[name])}")
            peak_rss = _peak_rss_mib(proc.pid)
    return {
        "nodes": nodes,
        "rate_per_s": rate,
        "seconds": seconds,
        "budget_conditions": nodes >= BUDGET_NODES
        and rate >= BUDGET_RATE
        and seconds >= BUDGET_SECONDS,
        "policies": {
            policy_name(p): {"strategy": s, "replicas": r} for p, (s, r) in POLICIES.items()
        },
        "classes_mib": classes,
        "sizes": {size: expected_class(size, classes) for size in SIZES},
        "probe_pods": placed,
        "setup": timings | {"responder_writes": responder_writes},
        "cold_start": cold | {"writes": cold_writes},
        "operator_peak_rss_mib": peak_rss,
        **windows,
        "ratios": ratios(windows["baseline"], windows["webhook"]),
        "budget": windows["webhook"]["admission"]["budget"],
        "budgets": webhookbudgets.budgets(windows),
        "cores": os.cpu_count(),
        "profile": None if profile is None else str(profile),
    }


def _unlabelled(_: int) -> str | None:
    return None


# The windows, in order: (name, pod name prefix, each pod's size or None, heartbeat storm).
# The unlabelled one first: it is the idle rate the labelled ones' CPU is measured against.
WINDOWS: Final[tuple[tuple[str, str, Callable[[int], str | None], bool], ...]] = (
    ("baseline", "base", _unlabelled, False),
    ("webhook", "mem", sized, False),
    ("storm", "storm", sized, True),
    ("interleaved", "mix", alternate, False),
)


def _peak_rss_mib(pid: int) -> float | None:
    try:
        status = stats.parse_proc_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None
    return round(status.get("VmHWM", 0) / stats.MIB, 1)


def ratios(baseline: Mapping[str, Any], webhook: Mapping[str, Any]) -> dict[str, float | None]:
    """Pod-create latency with the webhook over without, at p50 and p99: the loader's exact
    figures and the API server's bucketed ones."""
    client0, client1 = baseline["load"]["client_latency"], webhook["load"]["client_latency"]
    server0, server1 = baseline["pod_create_server"], webhook["pod_create_server"]
    return {
        "client_p50": ratio(client1["p50_ms"], client0["p50_ms"]),
        "client_p99": ratio(client1["p99_ms"], client0["p99_ms"]),
        "server_p50": ratio(server1["p50_ms"], server0["p50_ms"]),
        "server_p99": ratio(server1["p99_ms"], server0["p99_ms"]),
    }


def _brief(window: Mapping[str, Any]) -> dict[str, Any]:
    load = window["load"]
    return {
        "created": load["created"],
        "failed": load["failed"],
        "misplaced": load["misplaced"],
        "client": load["client_latency"],
        "admission_p99_ms": window["admission"]["p99_ms"],
        "cpu": window["cpu"]["cpu_s"],
        "machine_busy": window["cpu"]["machine_busy_share"],
        "loop_lag": window["operator_loop_lag"],
        "webhook_loop_lag": window["webhook_loop_lag"],
        "own_p99_ms": window["operator_admission"]["p99_ms"],
        "full_collections": window["full_collections"],
    }


def run_alone(
    *,
    nodes: int,
    rate: float,
    seconds: float,
    out_dir: Path,
    log: Callable[[str], None],
    apiserver_args: Sequence[str] = (),
    profile: Path | None = None,
) -> dict[str, Any]:
    """The phase on a fresh control plane of its own (no scheduler), stopped afterwards."""
    started = time.monotonic()
    plane = ControlPlane(
        extra_apiserver_args=tuple(apiserver_args), audit_policy=AUDIT_POLICY, scheduler=False
    )
    plane.start()
    control_plane_s = round(time.monotonic() - started, 1)
    try:
        result = asyncio.run(
            measure(
                plane,
                nodes=nodes,
                rate=rate,
                seconds=seconds,
                out_dir=out_dir,
                log=log,
                profile=profile,
            )
        )
    finally:
        plane.stop()
    result["setup"]["control_plane_s"] = control_plane_s
    result["setup"]["total_s"] = round(time.monotonic() - started, 1)
    return result


# -- the report ---------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{stats.fmt(value, 2)}{unit}"


def _under(summary: Mapping[str, Any], edge_ms: float) -> str:
    share = next((s for e, s in summary["under_ms"] if e == edge_ms), None)
    return "n/a" if share is None else f"{100 * share:.2f}%"


def render(result: Mapping[str, Any]) -> str:
    """The budgets first, then what is reported beside them, in Markdown."""
    hook, base, storm = result["webhook"], result["baseline"], result["storm"]
    mixed = result["interleaved"]["interleaved"]
    admission, own = hook["admission"], hook["operator_admission"]
    judged = result["budgets"]
    indicative = "" if result["budget_conditions"] else " (below the budget's conditions)"
    load = hook["load"]
    failed = sum(sum(result[name]["load"]["failed"].values()) for name, _, _, _ in WINDOWS)
    misplaced = sum(result[name]["load"]["misplaced"] for name, _, _, _ in WINDOWS)
    conditions = (
        f"{result['nodes']:,} nodes, {result['rate_per_s']:g} pod creates/s for"
        f" {result['seconds']:g} s"
    )
    cpu = judged["cpu_per_admission_ms"]
    p99, p99_storm = judged["own_p99"], judged["own_p99_storm"]
    gcs = judged["full_collections"]

    def within(verdict: Mapping[str, Any]) -> str:
        share = verdict["share_within"]
        shown = "n/a" if share is None else f"{100 * share:.2f}%"
        return f"{_fmt(verdict['p99_ms'])} ({shown} within {verdict['limit_ms']:g} ms)"

    edges = ", ".join(f"{e:g}" for e, _ in admission["under_ms"])
    lines = [
        f"Budgets ({conditions}){indicative}:",
        "",
        "| measure | result | budget | |",
        "|---|---:|---|---|",
        f"| operator CPU per admission, idle rate taken out (ms) | {_fmt(cpu['value'])}"
        f" over {cpu['admissions']:,} | ≤ {cpu['limit']:g} | {cpu['verdict']} |",
        f"| operator's own p99 (ms) | {within(p99)} | ≤ {p99['limit_ms']:g} | {p99['verdict']} |",
        f"| operator's own p99 while {result['nodes']:,} nodes' heartbeats storm (ms) |"
        f" {within(p99_storm)} | ≤ {p99_storm['limit_ms']:g} | {p99_storm['verdict']} |",
        f"| full collections in the operator, all windows | {gcs['value']} | = 0 |"
        f" {gcs['verdict']} |",
        f"| creates refused or failed; labelled pods not placed as predicted |"
        f" {failed}; {misplaced} | 0 | {'PASS' if failed + misplaced == 0 else 'FAIL'} |",
        "",
        "Reported, not judged:",
        "",
        "| measure | result |",
        "|---|---:|",
        f"| pod create p50 / p99, loader's timing, interleaved in one window (ms): unlabelled →"
        f" labelled | {_fmt(mixed['unlabelled']['p50_ms'])} /"
        f" {_fmt(mixed['unlabelled']['p99_ms'])} → {_fmt(mixed['labelled']['p50_ms'])} /"
        f" {_fmt(mixed['labelled']['p99_ms'])} (x{_fmt(mixed['p50_ratio'])} /"
        f" x{_fmt(mixed['p99_ratio'])}) |",
        f"| admissions within 5 / 25 ms, API server's histogram: labelled window; storm |"
        f" {_under(admission, 5)} / {_under(admission, 25)} of {admission['count']:,};"
        f" {_under(storm['admission'], 5)} / {_under(storm['admission'], 25)} |",
        f"| admission p50 / p99, API server's histogram, interpolated (ms) |"
        f" {_fmt(admission['p50_ms'])} / {_fmt(admission['p99_ms'])} |",
        f"| operator's own p50 (ms): labelled; storm |"
        f" {_fmt(own['p50_ms'])}; {_fmt(storm['operator_admission']['p50_ms'])} |",
        f"| a review's delivery, its first byte to its last as the operator reads them, p50 /"
        f" p99 (ms): labelled; storm | {_fmt(hook['operator_receive']['p50_ms'])} /"
        f" {_fmt(hook['operator_receive']['p99_ms'])};"
        f" {_fmt(storm['operator_receive']['p50_ms'])} /"
        f" {_fmt(storm['operator_receive']['p99_ms'])} |",
        f"| the wait for the core an answer's write caused, beyond the write's own CPU (the"
        f" answer was the API server's by then), p99 (ms) and share over 0.5 ms: labelled;"
        f" storm; interleaved | {_wait(hook)}; {_wait(storm)}; {_wait(result['interleaved'])} |",
        f"| pod create p50 / p99, loader's timing (ms): unlabelled window → labelled window |"
        f" {_fmt(base['load']['client_latency']['p50_ms'])} /"
        f" {_fmt(base['load']['client_latency']['p99_ms'])} →"
        f" {_fmt(load['client_latency']['p50_ms'])} /"
        f" {_fmt(load['client_latency']['p99_ms'])} |",
        f"| main loop lag, worst / median of 10-s worsts (ms): unlabelled → labelled → storm |"
        f" {_lag(base['operator_loop_lag'])} → {_lag(hook['operator_loop_lag'])} →"
        f" {_lag(storm['operator_loop_lag'])} |",
        f"| webhook loop lag, same (ms): unlabelled → labelled → storm |"
        f" {_lag(base['webhook_loop_lag'])} → {_lag(hook['webhook_loop_lag'])} →"
        f" {_lag(storm['webhook_loop_lag'])} |",
        f"| creates sent per second, achieved (asked {result['rate_per_s']:g}): unlabelled /"
        f" labelled / storm | {_fmt(base['load']['achieved_per_s'])} /"
        f" {_fmt(load['achieved_per_s'])} / {_fmt(storm['load']['achieved_per_s'])} |",
        f"| heartbeats in the storm window (patches, achieved per s) | {storm['heartbeats']} |",
        "",
        f"API server's webhook buckets (ms): {edges}; {result['budget']['evidence']}.",
        f"Operator outcomes (labelled window): {hook['operator_outcomes']}; operator writes:"
        f" {hook['operator_writes']}.",
        f"CPU (s) over the labelled window: {hook['cpu']['cpu_s']}; unlabelled:"
        f" {base['cpu']['cpu_s']}; storm: {storm['cpu']['cpu_s']}; machine busy"
        f" {100 * hook['cpu']['machine_busy_share']:.0f}% of {result['cores']} cores, others"
        f" {100 * hook['cpu']['others_share']:.0f}%.",
    ]
    return "\n".join(lines)


def _lag(summary: Mapping[str, Any]) -> str:
    return f"{_fmt(summary['max_ms'])} / {_fmt(summary['median_ms'])}"

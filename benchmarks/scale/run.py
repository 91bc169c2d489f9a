"""Running one variant through the phases: cold start, idle, heartbeat storm, rollout, churn.

Each variant is a separate process under its own API user, so the audit log attributes every
write, and its RSS and CPU come from ``/proc/<pid>`` sampled once a second (the API server's and
etcd's too: on a 2-core machine they compete for the same cores, and the report says how busy
they were).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.scale import cluster, stats
from gpushare_testing.controlplane import free_port
from gpushare_testing.rawclient import RawClient

# Writes that are the operator's output; Lease renewals and Events are reported apart.
OUTPUT_RESOURCES = ("nodes", "gpunodestates", "gpusharingpolicies", "configmaps")


@dataclass
class ProcSample:
    t: float  # seconds since the sampler started
    rss: int  # bytes
    cpu: float  # cumulative CPU seconds


@dataclass
class Sampler:
    """Samples RSS and cumulative CPU of some pids every ``interval`` seconds."""

    pids: dict[str, int]
    interval: float = 1.0
    started: float = field(default_factory=time.monotonic)
    samples: dict[str, list[ProcSample]] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    marks: list[tuple[float, str]] = field(default_factory=list)

    def sample(self) -> None:
        now = time.monotonic() - self.started
        for name, pid in self.pids.items():
            try:
                status = stats.parse_proc_status(Path(f"/proc/{pid}/status").read_text())
                cpu = stats.parse_proc_stat_cpu(Path(f"/proc/{pid}/stat").read_text())
            except (OSError, ValueError, IndexError):
                continue
            self.samples.setdefault(name, []).append(ProcSample(now, status.get("VmRSS", 0), cpu))
            self.peak[name] = max(self.peak.get(name, 0), status.get("VmHWM", 0))

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic() - self.started, what))

    def cpu(self, name: str) -> float:
        """Current cumulative CPU seconds of ``name`` (read now, not from the last sample)."""
        try:
            return stats.parse_proc_stat_cpu(Path(f"/proc/{self.pids[name]}/stat").read_text())
        except (OSError, KeyError):
            return math.nan

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def series(self) -> dict[str, list[list[float]]]:
        return {
            name: [[round(s.t, 1), round(s.rss / stats.MIB, 1), round(s.cpu, 2)] for s in rows]
            for name, rows in self.samples.items()
        }


@dataclass
class Variant:
    name: str  # "gpushare" or "kopf-native"
    user: str
    command: list[str]
    port: int
    probe: Callable[[aiohttp.ClientSession], Awaitable[dict[str, Any]]]


async def probe_ours(
    session: aiohttp.ClientSession, port: int, metrics_port: int
) -> dict[str, Any]:
    async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
        ready = response.status == 200
    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
        samples = stats.parse_metrics(await response.text())
    return {
        "synced": ready,
        "nodes": stats.metric_sum(samples, "gpushare_cache_objects", kind="Node"),
        "pods": stats.metric_sum(samples, "gpushare_cache_objects", kind="Pod"),
        "dirty": stats.metric_sum(samples, "gpushare_write_queue_depth"),
        "writes": stats.metric_sum(samples, "gpushare_writes_total", outcome="ok"),
    }


async def probe_kopf(session: aiohttp.ClientSession, port: int) -> dict[str, Any]:
    async with session.get(f"http://127.0.0.1:{port}/stats") as response:
        return dict(await response.json())


def ours(
    *,
    user: str,
    port: int,
    qps: float,
    burst: int,
    identity: str,
    python: str = sys.executable,
    propagation_delay: float = 1,
    max_unavailable: str | None = cluster.UNPACED_CLUSTER,
    mismatch_timeout: float | None = 100000,
    extra: Sequence[str] = (),
) -> Variant:
    """Our operator; ``None`` for ``max_unavailable`` or ``mismatch_timeout``: its default.

    The comparison rows run unpaced (``--max-unavailable 100%``, see ``cluster.UNPACED``) and
    with a huge mismatch timeout: GFD is not simulated there, so nodes stay Applied rather than
    turning Mismatch mid-run.
    """
    metrics_port = free_port()
    command = [
        python,
        "-m",
        "gpushare_operator",
        "run",
        "--device-plugin-namespace",
        cluster.DEVICE_PLUGIN_NAMESPACE,
        "--namespace",
        cluster.OPERATOR_NAMESPACE,
        "--write-qps",
        str(qps),
        "--write-burst",
        str(burst),
        "--config-propagation-delay",
        f"{propagation_delay:g}",
        *(() if mismatch_timeout is None else ("--mismatch-timeout", f"{mismatch_timeout:g}")),
        *(() if max_unavailable is None else ("--max-unavailable", max_unavailable)),
        "--http-port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--metrics-insecure",  # the bench scrapes without a token, on loopback
        "--identity",
        identity,
        "--log-format",
        "json",
        # The rows compare the operator's own work; the webhook (its Secret, its CA bundle, a
        # server) has a row of its own (webhook.py), whose ``extra`` turns it back on.
        "--webhook-port",
        "0",
        *extra,
    ]

    async def probe(session: aiohttp.ClientSession) -> dict[str, Any]:
        return await probe_ours(session, port, metrics_port)

    return Variant("gpushare", user, command, port, probe)


def kopf_native(*, user: str, port: int, qps: float, burst: int) -> Variant:
    command = [
        sys.executable,
        "-m",
        "benchmarks.scale.kopfnative",
        "--device-plugin-namespace",
        cluster.DEVICE_PLUGIN_NAMESPACE,
        "--write-qps",
        str(qps),
        "--write-burst",
        str(burst),
        "--config-propagation-delay",
        "1",
        "--mismatch-timeout",
        "100000",
        "--max-unavailable",  # unpaced, as ours in these rows: the planner is the same
        cluster.UNPACED_CLUSTER,
        "--http-port",
        str(port),
    ]

    async def probe(session: aiohttp.ClientSession) -> dict[str, Any]:
        return await probe_kopf(session, port)

    return Variant("kopf-native", user, command, port, probe)


@dataclass
class Bench:
    """What every phase needs: the admin client, the audit tail, the published-status watch."""

    admin: RawClient
    audit: cluster.AuditTail
    published: cluster.Published
    kubeconfig_for: Callable[[str], Path]
    nodes: int
    pods: int
    out_dir: Path
    system_pids: dict[str, int]
    log: Callable[[str], None]

    def expected(self, *, rollout: bool) -> dict[str, str]:
        return {
            cluster.node_name(i): cluster.expected_policy(i, rollout=rollout)
            for i in range(self.nodes)
        }

    def output_writes(self, user: str, start: float, end: float) -> list[tuple[float, str]]:
        return [
            w
            for w in self.audit.between(user, start, end)
            if w[1].split(" ", 1)[1].split("/")[0] in OUTPUT_RESOURCES
        ]

    def other_writes(self, user: str, start: float, end: float) -> dict[str, int]:
        return cluster.summarize_writes(
            w
            for w in self.audit.between(user, start, end)
            if w[1].split(" ", 1)[1].split("/")[0] not in OUTPUT_RESOURCES
        )


async def wait_for(
    probe: Callable[[], Awaitable[bool]], *, timeout: float, every: float = 0.2
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            if await probe():
                return True
        await asyncio.sleep(every)
    return False


@contextlib.asynccontextmanager
async def launched(
    bench: Bench, variant: Variant
) -> Any:  # AsyncIterator[tuple[subprocess.Popen[bytes], aiohttp.ClientSession]]
    env = dict(os.environ, KUBECONFIG=str(bench.kubeconfig_for(variant.user)))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(cluster.REPO), env.get("PYTHONPATH", "")) if p
    )
    log_path = bench.out_dir / f"scale-{variant.user}.log"
    with log_path.open("ab") as log_file:
        proc = await asyncio.to_thread(
            subprocess.Popen,
            variant.command,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cluster.REPO,
        )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            yield proc, session
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)


async def converge(
    bench: Bench,
    variant: Variant,
    session: aiohttp.ClientSession,
    *,
    rollout: bool,
    timeout: float,
) -> dict[str, float]:
    """Wait for caches synced, then for every node published as expected and no dirty object."""
    started = time.monotonic()
    synced_at = None
    expected = bench.expected(rollout=rollout)
    last_log = 0.0
    while time.monotonic() - started < timeout:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            probe = await variant.probe(session)
            if synced_at is None and probe.get("synced"):
                synced_at = time.monotonic()
            if (
                synced_at is not None
                and probe.get("dirty") == 0
                and bench.published.converged(expected)
            ):
                # Settle: a dirty queue may be empty between two drains; confirm it stays so.
                await asyncio.sleep(1.0)
                again = await variant.probe(session)
                if again.get("dirty") == 0 and again.get("writes") == probe.get("writes"):
                    done = time.monotonic()
                    return {
                        "synced_s": round(synced_at - started, 2),
                        "converged_s": round(done - started - 1.0, 2),
                    }
            if time.monotonic() - last_log > 15:
                last_log = time.monotonic()
                bench.log(
                    f"  [{variant.name}] {time.monotonic() - started:.0f} s: {probe};"
                    f" {bench.published.missing(expected)} nodes not yet published as expected"
                )
        await asyncio.sleep(0.25)
    raise TimeoutError(f"{variant.name} did not converge in {timeout} s")


async def run_variant(bench: Bench, variant: Variant, *, churn_rate: float) -> dict[str, Any]:
    """All phases for one variant; returns its result dict (and its RSS/CPU series)."""
    result: dict[str, Any] = {"user": variant.user, "command": variant.command[1:]}
    async with launched(bench, variant) as (proc, session):
        sampler = Sampler({variant.name: proc.pid, **bench.system_pids})
        async with cluster.background(sampler.run()):
            epoch0 = time.time()
            sampler.mark("start")
            timings = await converge(bench, variant, session, rollout=False, timeout=900)
            result["cold_start"] = timings | {
                "writes": len(bench.output_writes(variant.user, epoch0, time.time()))
            }
            bench.log(f"  [{variant.name}] cold start {timings}")
            sampler.mark("converged")

            # Steady: ten idle seconds after convergence.
            idle_from = len(sampler.samples.get(variant.name, []))
            idle_cpu0 = sampler.cpu(variant.name)
            await asyncio.sleep(10)
            idle = sampler.samples.get(variant.name, [])[idle_from:]
            steady = sum(s.rss for s in idle) / max(len(idle), 1) / stats.MIB
            # What it burns doing nothing (lease renewals, bookmarks): the storm's baseline.
            result["idle_cpu_s_per_10s"] = round(sampler.cpu(variant.name) - idle_cpu0, 2)

            result["heartbeat_storm"] = await storm(bench, variant, sampler)
            bench.log(f"  [{variant.name}] heartbeat storm {result['heartbeat_storm']}")
            result["rollout"] = await rollout(bench, variant, session, sampler)
            bench.log(f"  [{variant.name}] rollout {result['rollout']}")
            result["pod_churn"] = await churn(bench, variant, sampler, rate=churn_rate)
            bench.log(f"  [{variant.name}] pod churn {result['pod_churn']}")
            sampler.sample()
            rows = sampler.samples.get(variant.name, [])
            result["rss"] = {
                "peak_mib": round(sampler.peak.get(variant.name, 0) / stats.MIB, 1),
                "steady_mib": round(steady, 1),
            }
            result["cpu"] = {"total_s": round(rows[-1].cpu if rows else 0.0, 1)}
            wall = rows[-1].t if rows else 0.0
            result["system_cpu_share"] = {
                name: round(
                    stats.cpu_share(
                        samples[-1].cpu - samples[0].cpu, wall, cores=os.cpu_count() or 1
                    ),
                    3,
                )
                for name, samples in sampler.samples.items()
                if samples
            }
            result["series"] = sampler.series()
            result["marks"] = [[round(t, 1), what] for t, what in sampler.marks]
            result["other_writes"] = bench.other_writes(variant.user, epoch0, time.time())
    return result


async def storm(bench: Bench, variant: Variant, sampler: Sampler) -> dict[str, Any]:
    sampler.mark("heartbeat storm")
    epoch0 = time.time()
    cpu0 = sampler.cpu(variant.name)
    system0 = {name: sampler.cpu(name) for name in bench.system_pids}
    wall0 = time.monotonic()
    load = await cluster.heartbeat_storm(bench.admin, bench.nodes)
    await asyncio.sleep(5)  # the last events drain through the variant
    wall = time.monotonic() - wall0
    cores = os.cpu_count() or 1
    writes = bench.output_writes(variant.user, epoch0, time.time())
    return {
        "cpu_s": round(sampler.cpu(variant.name) - cpu0, 2),
        "writes": len(writes),
        "writes_by_kind": cluster.summarize_writes(writes),
        "load": load,
        "window_s": round(wall, 1),
        "system_cpu_share": {
            name: round(stats.cpu_share(sampler.cpu(name) - cpu, wall, cores=cores), 3)
            for name, cpu in system0.items()
        },
    }


async def rollout(
    bench: Bench, variant: Variant, session: aiohttp.ClientSession, sampler: Sampler
) -> dict[str, Any]:
    sampler.mark("rollout")
    before = await cluster.policy_statuses(bench.admin)
    said0 = dict(bench.published.said)
    epoch0 = time.time()
    started = time.monotonic()
    await cluster.create_policies(bench.admin, [cluster.rollout_policy()])
    expected = bench.expected(rollout=True)
    nodes = sum(1 for p in expected.values() if p == cluster.ROLLOUT_POLICY)
    applied_at = None
    deadline = started + 600  # the time box: a rollout this slow is reported unfinished
    while time.monotonic() < deadline:
        if applied_at is None and bench.published.converged(expected):
            applied_at = time.monotonic()
        if applied_at is not None:
            probe = await variant.probe(session)
            if probe.get("dirty") == 0:
                await asyncio.sleep(2)  # policy statuses after the last node
                if (await variant.probe(session)).get("dirty") == 0:
                    break
        await asyncio.sleep(0.2)
    done = time.time()
    after = await cluster.policy_statuses(bench.admin)
    changed = sorted(name for name in after if before.get(name) != after[name])
    writes = bench.output_writes(variant.user, epoch0, done)
    # The ConfigMap; our finalizer on the new policy (on every policy, so that deleting one
    # releases its nodes first); per node a label and a status write; each changed status.
    minimum = 1 + 1 + 2 * nodes + len(changed)
    return {
        "nodes": nodes,
        "seconds": None if applied_at is None else round(applied_at - started, 1),
        "writes": len(writes),
        "writes_by_kind": cluster.summarize_writes(writes),
        "minimum_writes": minimum,
        "policies_changed": len(changed),
        # What the node status writes said (GNS watch): where writes above the minimum went.
        "statuses_said": bench.published.said_since(said0),
    }


async def churn(bench: Bench, variant: Variant, sampler: Sampler, *, rate: float) -> dict[str, Any]:
    sampler.mark("pod churn")
    epoch0 = time.time()
    cpu0 = sampler.cpu(variant.name)
    base = dict(bench.published.pods)
    load = await cluster.pod_churn(bench.admin, nodes=bench.nodes, base_pods=base, rate=rate)
    # Give the writer up to 60 s to publish the last changes; what is still missing then is
    # reported as missing (a writer that fell behind), not folded into the percentiles.
    expectations = load.expectations

    async def all_seen() -> bool:
        _, missing = cluster.churn_lags(
            expectations, bench.published.pod_seen, deadline=time.monotonic()
        )
        return missing == 0

    await wait_for(all_seen, timeout=60, every=0.5)
    lags, missing = cluster.churn_lags(
        expectations, bench.published.pod_seen, deadline=time.monotonic()
    )
    writes = bench.output_writes(variant.user, epoch0, time.time())
    return {
        "rate_per_s": 2 * rate,
        "creates": load.creates,
        "deletes": load.deletes,
        "failed": load.failed,
        "shared_changes": len(expectations),
        "published": len(lags),
        "missing": missing,
        "lag_p50_s": round(stats.percentile(lags, 50), 3) if lags else None,
        "lag_p99_s": round(stats.percentile(lags, 99), 3) if lags else None,
        "lag_max_s": round(max(lags), 3) if lags else None,
        "cpu_s": round(sampler.cpu(variant.name) - cpu0, 2),
        "writes": len(writes),
        "writes_by_kind": cluster.summarize_writes(writes),
        "seconds": round(load.seconds, 1),
    }


async def reset(bench: Bench, primer: Variant, *, timeout: float = 1800) -> float:
    """Back to the converged starting point: rollout policy gone, a fast primer re-converges."""
    started = time.monotonic()
    await cluster.delete(bench.admin, f"{cluster.POLICIES_PATH}/{cluster.ROLLOUT_POLICY}")
    async with launched(bench, primer) as (_, session):
        await converge(bench, primer, session, rollout=False, timeout=timeout)
    # The primer keeps the rollout's config key for its grace period; the next variant must meet
    # the ConfigMap the first one met (no such key), or its rollout would skip the propagation
    # wait and the ConfigMap write.
    await cluster.drop_config_keys(bench.admin, prefix=f"{cluster.ROLLOUT_POLICY}-")
    return time.monotonic() - started


def summary_cpu(result: Mapping[str, Any]) -> str:
    shares = result.get("system_cpu_share") or {}
    return ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items())

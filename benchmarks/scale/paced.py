"""The paced rollout: a replicas change of the rollout policy's nodes, in budgeted batches.

The comparison rows roll out unpaced (``cluster.UNPACED``), because nothing confirms a config
on the bench's GPU-less nodes.  Here a GFD responder (``gfd.py``) plays NVIDIA's agents, so nodes
become ``Verified`` and the operator's budget, canary and admissions run as in production:

1. the rollout policy (half the nodes: 2,500 of 5,000; 250 of 500 with ``--quick``) gets
   ``rollout: {maxUnavailable: "10%", canary: 1}`` (the API's defaults, written out);
2. the responder confirms what every node already runs (a primed bench cluster has none
   confirmed) and the primer publishes every node ``Verified``;
3. gpushare starts with the operator's defaults (``--config-propagation-delay`` 75 s,
   ``--max-unavailable`` 10% of GPU nodes, ``--mismatch-timeout`` 300 s, write QPS 100 and
   burst 200), and converges (a primed cluster: no writes); the responder turns realistic
   (2-4 s from a label change to the confirmation, see ``gfd.REALISTIC``);
4. the rollout policy's replicas change (a new config key for its nodes); done when every one of
   them names the new key and is ``Verified`` in its GNS, and nothing is left dirty.

Figures: the time from the edit to the last node ``Verified`` per its GNS, and per the node
itself (the responder's watch: label and confirmation, see ``gfd.Meter``); the largest number
of unavailable nodes at any moment, from that node watch, against the policy's budget (10% of
its nodes, below the cluster's 10% of all GPU nodes); the writes the operator issued (audit
log) against the minimum; the leader's CPU over the rollout.

Minimum writes, per rollout node (N of them, C canaries):

- two label writes: the config label, with the policy label, in one apply (which also takes the
  node's slot labels away: they spoke for the old config); and once the node is Verified, its
  slot labels (``gpushare.dev/slot-*``: what a slot of the new config enforces);
- the status writes it must pass through, each a state that lasts and that the node's status
  must say: ``Pending`` with ``configReadyAt`` (the propagation wait, said once, as the time it
  ends); ``Pending/RolloutWaiting`` once the wait is over and its turn has not come within
  5 s (a shorter wait is not published), which is at most every node but the C canaries (the
  rest waits until they are Verified); ``Applied`` once its label is written (the agents take
  seconds to confirm it); ``Verified``.  So at most 4N - C, at least 3N;

and per policy: one ConfigMap write (the new key), and for the rolled policy's status one write
for the new generation (its rollout starts), one at completion (``Complete``, its counts), and
in between one progress report per full ``--policy-status-max-delay`` (60 s) that its nodes
spend changing: a policy status waits for its nodes to settle at most that long, the promise
that keeps ``kubectl get gsp``'s Rollout column live during a long rollout.  No other policy's
status changes.  The operator runs with ``--config-key-grace-period 3600``, as in the delayed
rollout: the old key's removal is a later, separate write that must not land inside the window.

Time budget: the propagation delay, plus the writes after it at the write QPS (label, Applied,
slot labels and Verified per node, RolloutWaiting for all but the canaries), plus one responder
answer (``gfd.REALISTIC``'s 4 s at most, and 1 s of watch round trips) per batch: the canaries, then
ceil((N - C) / budget) batches.  The writer and the agents overlap in practice, so a healthy
rollout stays well inside the sum.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any, Final

from benchmarks.scale import cluster, delayed, gfd, run, stats
from gpushare_operator.app import settings
from gpushare_operator.core.rollout import rollouts

PACED: Final[dict[str, Any]] = {"maxUnavailable": "10%", "canary": 1}
GRACE_PERIOD: Final = 3600.0
DEFAULTS: Final = settings.parse_settings([], env={})
CONFIGMAP_PATH: Final = (
    f"/api/v1/namespaces/{cluster.DEVICE_PLUGIN_NAMESPACE}/configmaps/{cluster.CONFIGMAP}"
)


def variant(*, user: str, port: int, qps: float, burst: int) -> run.Variant:
    """Ours at the operator's defaults, but for the write rate (the bench's) and the key grace."""
    return run.ours(
        user=user,
        port=port,
        qps=qps,
        burst=burst,
        identity="bench-gpushare",
        propagation_delay=DEFAULTS.config_propagation_delay,
        max_unavailable=None,
        mismatch_timeout=None,
        extra=["--config-key-grace-period", f"{GRACE_PERIOD:g}"],
    )


def budget(nodes: int, *, total_nodes: int) -> int:
    """The unavailable nodes allowed: the policy's 10% of its nodes, within the cluster's."""
    own = rollouts.max_unavailable(PACED["maxUnavailable"], total=nodes)
    return min(own, rollouts.max_unavailable(DEFAULTS.max_unavailable, total=total_nodes))


def minimum_writes(*, nodes: int, canary: int, changing_s: float) -> dict[str, int]:
    """The module docstring's minimum, by audit kind."""
    reports = int(max(0.0, changing_s) // DEFAULTS.policy_status_max_delay)
    return {
        "patch configmaps": 1,
        "patch gpunodestates/status": 4 * nodes - min(canary, nodes),
        "patch gpusharingpolicies/status": 2 + reports,
        "patch nodes": 2 * nodes,
    }


def time_budget(*, nodes: int, canary: int, allowed: int, delay: float, qps: float) -> float:
    """The module docstring's time budget, in seconds."""
    canary = min(canary, nodes)
    after_wait = 4 * nodes + (nodes - canary)
    batches = (1 if canary else 0) + math.ceil((nodes - canary) / max(allowed, 1))
    return delay + after_wait / qps + batches * (gfd.REALISTIC[1] + 1.0)


async def _verified_everywhere(
    bench: run.Bench,
    primer: run.Variant,
    responder: gfd.Responder,
    expected: dict[str, str],
    *,
    timeout: float,
) -> float:
    started = time.monotonic()
    last_log = started
    async with run.launched(bench, primer) as (_, session):
        while time.monotonic() - started < timeout:
            if responder.idle() and bench.published.verified(expected):
                probe = await primer.probe(session)
                if probe.get("dirty") == 0:
                    return time.monotonic() - started
            if time.monotonic() - last_log > 15:
                last_log = time.monotonic()
                bench.log(
                    f"  [paced] catching up: {bench.published.missing(expected, phase='Verified')}"
                    f" nodes not Verified; responder {len(responder.working)} under way,"
                    f" {len(responder.meter.down)} unconfirmed, {responder.writes} writes"
                )
            await asyncio.sleep(0.5)
    raise TimeoutError(f"the cluster was not Verified everywhere in {timeout} s")


async def measure(
    bench: run.Bench, primer: run.Variant, ours: run.Variant, *, qps: float
) -> dict[str, Any]:
    delay = DEFAULTS.config_propagation_delay
    responder = gfd.Responder(bench.admin, configmap_path=CONFIGMAP_PATH, log=bench.log)
    async with cluster.background(responder.run()):
        await cluster.create_policies(bench.admin, [cluster.rollout_policy()])  # 409 is fine
        await delayed.patch_policy(bench, cluster.ROLLOUT_POLICY, {"rollout": dict(PACED)})
        expected = bench.expected(rollout=True)
        targets = sorted(n for n, p in expected.items() if p == cluster.ROLLOUT_POLICY)
        allowed = budget(len(targets), total_nodes=bench.nodes)
        catch_up_s = await _verified_everywhere(bench, primer, responder, expected, timeout=1800)
        bench.log(
            f"  [paced] every node Verified in {catch_up_s:.0f} s ({responder.writes} writes)"
        )
        responder.realistic()
        catch_up_writes = responder.writes
        async with run.launched(bench, ours) as (proc, session):
            cold = await run.converge(bench, ours, session, rollout=True, timeout=900)
            bench.log(f"  [paced] cold start {cold}")
            old_keys = {n: bench.published.keys.get(n) for n in targets}
            before = await cluster.policy_statuses(bench.admin)
            _, body = await bench.admin.get(f"{cluster.POLICIES_PATH}/{cluster.ROLLOUT_POLICY}")
            replicas = int(body["spec"]["replicas"])
            new_replicas = replicas + 1 if replicas < 16 else 2
            said0 = dict(bench.published.said)
            responder.meter.reset()
            cpu0 = _cpu(proc.pid)
            epoch0 = time.time()
            started = time.monotonic()
            await delayed.patch_policy(bench, cluster.ROLLOUT_POLICY, {"replicas": new_replicas})

            def moved() -> bool:
                return all(
                    bench.published.keys.get(n) not in (None, old_keys[n])
                    and (bench.published.phase.get(n) or (None, None))[1] == "Verified"
                    for n in targets
                )

            verified_at = None
            last_log = started
            deadline = started + delay + 1800  # the time box; a slower rollout is unfinished
            while time.monotonic() < deadline:
                if verified_at is None and moved():
                    verified_at = time.monotonic()
                if verified_at is not None and (await ours.probe(session)).get("dirty") == 0:
                    await asyncio.sleep(2)  # policy statuses after the last node
                    if (await ours.probe(session)).get("dirty") == 0:
                        break
                if time.monotonic() - last_log > 15:
                    last_log = time.monotonic()
                    done_now = sum(
                        1
                        for n in targets
                        if bench.published.keys.get(n) not in (None, old_keys[n])
                        and (bench.published.phase.get(n) or (None, None))[1] == "Verified"
                    )
                    bench.log(
                        f"  [paced] {last_log - started:.0f} s: {done_now}/{len(targets)}"
                        f" Verified; unavailable now {len(responder.meter.down)},"
                        f" peak {responder.meter.peak} (budget {allowed})"
                    )
                await asyncio.sleep(0.2)
            done = time.time()
            cpu = _cpu(proc.pid) - cpu0
    after = await cluster.policy_statuses(bench.admin)
    changed = sorted(name for name in after if before.get(name) != after[name])
    writes = bench.output_writes(ours.user, epoch0, done)
    by_kind = cluster.summarize_writes(writes)
    seconds = None if verified_at is None else verified_at - started
    meter = responder.meter
    confirmed = [meter.confirmed_at.get(n) for n in targets]
    api_done = None
    # The node's config label is its GNS's configKey: the same string.
    pairs = zip(targets, confirmed, strict=True)
    if all(c is not None and c[0] not in (None, old_keys[n]) for n, c in pairs):
        api_done = max(c[1] for c in confirmed if c is not None) - started
    canary = int(PACED["canary"])
    minimum_by_kind = minimum_writes(
        nodes=len(targets), canary=canary, changing_s=(seconds or 0.0) - delay
    )
    policy_times = await asyncio.to_thread(
        delayed.policy_status_times, bench.audit.path, ours.user, epoch0, done
    )
    said = bench.published.said_since(said0)
    return {
        "nodes": len(targets),
        "total_nodes": bench.nodes,
        "rollout": dict(PACED),
        "replicas": [replicas, new_replicas],
        "propagation_delay_s": delay,
        "max_unavailable_budget": allowed,
        "seconds": None if seconds is None else round(seconds, 1),
        "seconds_node_labels": None if api_done is None else round(api_done, 1),
        "time_budget_s": round(
            time_budget(nodes=len(targets), canary=canary, allowed=allowed, delay=delay, qps=qps),
            1,
        ),
        "max_unavailable": meter.peak,
        "max_unavailable_at_s": round(meter.peak_at, 1),
        "unavailable_spell_s": {
            "p50": round(stats.percentile(meter.durations, 50), 2) if meter.durations else None,
            "max": round(max(meter.durations), 2) if meter.durations else None,
        },
        "unavailable_series": _thin(meter.series),
        "writes": len(writes),
        "writes_by_kind": by_kind,
        "minimum_writes": sum(minimum_by_kind.values()),
        "minimum_by_kind": minimum_by_kind,
        "statuses_said": said,
        "policy_status_writes": {k: len(v) for k, v in policy_times.items()},
        # Seconds after the edit: which of them were progress reports between batches.
        "policy_status_times_s": policy_times,
        "policies_changed": changed,
        "leader_cpu_s": round(cpu, 2),
        "cold_start": cold,
        "responder": {
            "catch_up_s": round(catch_up_s, 1),
            "catch_up_writes": catch_up_writes,
            "writes": responder.writes - catch_up_writes,
            "failed": responder.failed,
            "delay_s": list(gfd.REALISTIC),
        },
        "cores": os.cpu_count(),
    }


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        return stats.parse_proc_stat_cpu(handle.read())


def _thin(series: list[tuple[float, int]], *, points: int = 400) -> list[list[float]]:
    """At most ``points`` (t, count) pairs, the peak kept: enough to plot, small in the JSON."""
    if len(series) <= points:
        return [[t, c] for t, c in series]
    step = len(series) / points
    kept = {int(i * step) for i in range(points)}
    peak = max(range(len(series)), key=lambda i: series[i][1])
    return [[series[i][0], series[i][1]] for i in sorted(kept | {peak, len(series) - 1})]

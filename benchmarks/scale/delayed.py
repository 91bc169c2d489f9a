"""The rollout at the operator's default propagation delay, with policy edits during the wait.

Unpaced, as the other comparison rows (``cluster.UNPACED``: the rollout policy has
``maxUnavailable: 100%`` and no canary, the operator ``--max-unavailable 100%``): what is
measured is the propagation wait's writes, not the pacing, which ``paced.py`` measures.

The main rollout row runs with ``--config-propagation-delay 1``; in production nodes wait the
kubelet's ConfigMap refresh (75 s) before their label may name the new key, and policies keep
being edited meanwhile.  A node's status publishes that wait once, as ``status.configReadyAt``,
so re-plans during the wait must not write it again.  This phase checks that on the audit log:

1. the primer converges the cluster with the rollout policy (half the nodes) in place;
2. gpushare starts with the default delay and converges (a primed cluster: no writes);
3. the rollout policy's replicas change (a new config key for its nodes): the rollout starts;
4. during the wait, the ``dev-wide`` policy (it governs no node: it loses them all to
   ``dev-base``) is edited 3 times, each a new key, so each a ConfigMap write;
5. done when every rollout node names the new key, Applied, and nothing is left dirty.

Minimum writes: one ConfigMap write for the new rollout key and one per edit; per node one
label write and two status writes (Pending, with the absolute time its wait ends, then
Applied: the wait is the one thing the node's status must say before its label changes); per
policy, one status write per new generation (the edited policy: one per edit) and one more for
the rollout policy once its nodes are Applied.  The key
grace period is raised to an hour so that an old key's removal (300 s after it was last used,
a later, separate write) does not land inside the 5,000-node run's window.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.scale import cluster, run
from gpushare_testing.rawclient import ApiError

EDITED_POLICY = "dev-wide"
EDITS = 3
ROLLOUT_REPLICAS = 5  # the rollout policy is created with 3


def variant(*, user: str, port: int, qps: float, burst: int, delay: float) -> run.Variant:
    return run.ours(
        user=user,
        port=port,
        qps=qps,
        burst=burst,
        identity="bench-gpushare",
        propagation_delay=delay,
        extra=["--config-key-grace-period", "3600"],
    )


async def patch_policy(bench: run.Bench, name: str, spec: dict[str, Any]) -> None:
    path = f"{cluster.POLICIES_PATH}/{name}"
    status, body = await bench.admin.patch(path, {"spec": spec})
    if status != 200:
        raise ApiError(method="PATCH", path=path, status=status, body=body)


async def measure(
    bench: run.Bench, primer: run.Variant, ours: run.Variant, *, delay: float
) -> dict[str, Any]:
    await cluster.create_policies(bench.admin, [cluster.rollout_policy()])  # 409 is fine
    async with run.launched(bench, primer) as (_, session):
        await run.converge(bench, primer, session, rollout=True, timeout=1800)
    expected = bench.expected(rollout=True)
    targets = sorted(n for n, p in expected.items() if p == cluster.ROLLOUT_POLICY)
    async with run.launched(bench, ours) as (_, session):
        cold = await run.converge(bench, ours, session, rollout=True, timeout=900)
        bench.log(f"  [delayed] cold start {cold}")
        old_keys = {n: bench.published.keys.get(n) for n in targets}
        before = await cluster.policy_statuses(bench.admin)
        _, edited = await bench.admin.get(f"{cluster.POLICIES_PATH}/{EDITED_POLICY}")
        replicas = int(edited["spec"]["replicas"])
        said0 = dict(bench.published.said)
        epoch0 = time.time()
        started = time.monotonic()
        await patch_policy(bench, cluster.ROLLOUT_POLICY, {"replicas": ROLLOUT_REPLICAS})
        # Spread over the first half of the wait: every edit lands while nodes are Pending.
        for i in range(EDITS):
            await asyncio.sleep(delay / (2 * EDITS))
            await patch_policy(bench, EDITED_POLICY, {"replicas": replicas + 1 + i})

        def moved() -> bool:
            return all(
                bench.published.keys.get(n) not in (None, old_keys[n])
                and (bench.published.phase.get(n) or (None, None))[1] in ("Applied", "Verified")
                for n in targets
            )

        applied_at = None
        deadline = started + delay + 900  # the time box; a slower rollout is reported unfinished
        while time.monotonic() < deadline:
            if applied_at is None and moved():
                applied_at = time.monotonic()
            if applied_at is not None and (await ours.probe(session)).get("dirty") == 0:
                await asyncio.sleep(2)  # policy statuses after the last node
                if (await ours.probe(session)).get("dirty") == 0:
                    break
            await asyncio.sleep(0.2)
        done = time.time()
    after = await cluster.policy_statuses(bench.admin)
    changed = sorted(name for name in after if before.get(name) != after[name])
    writes = bench.output_writes(ours.user, epoch0, done)
    by_kind = cluster.summarize_writes(writes)
    # ConfigMap: the new rollout key, then one per edit; per node one label and two statuses
    # (Pending with its configReadyAt, then Applied); policies: one per generation, and the
    # rollout policy's counts once its nodes are Applied.
    minimum_by_kind = {
        "patch configmaps": 1 + EDITS,
        "patch gpunodestates/status": 2 * len(targets),
        "patch gpusharingpolicies/status": EDITS + 2 if changed else 0,
        "patch nodes": len(targets),
    }
    minimum = sum(minimum_by_kind.values())
    return {
        "nodes": len(targets),
        "propagation_delay_s": delay,
        "edits": EDITS,
        "edited_policy": EDITED_POLICY,
        "seconds": None if applied_at is None else round(applied_at - started, 1),
        "writes": len(writes),
        "writes_by_kind": by_kind,
        "minimum_writes": minimum,
        "minimum_by_kind": minimum_by_kind,
        # Where policy status writes went: the audit tail keeps no names, the log does.
        "policy_status_writes": await asyncio.to_thread(
            policy_status_writes, bench.audit.path, ours.user, epoch0, done
        ),
        "policies_changed": changed,
        "statuses_said": bench.published.said_since(said0),
        "cold_start": cold,
    }


def policy_status_writes(path: Path, user: str, start: float, end: float) -> dict[str, int]:
    """Policy status writes by ``user`` in [start, end] per policy name, from the audit log.

    Only the current file is read: the phase lasts minutes, and the log rotates at ~100 MB.
    """
    return {name: len(times) for name, times in policy_status_times(path, user, start, end).items()}


def policy_status_times(path: Path, user: str, start: float, end: float) -> dict[str, list[float]]:
    """When each policy's status was written by ``user`` in [start, end], in seconds after
    ``start``, from the audit log (the current file only, as ``policy_status_writes``)."""
    needle, resource = f'"username":"{user}"'.encode(), b'"gpusharingpolicies"'
    times: dict[str, list[float]] = {}
    with path.open("rb") as handle:
        for line in handle:
            if needle not in line or resource not in line:
                continue
            event = orjson.loads(line)
            ref = event.get("objectRef") or {}
            if event.get("stage") != "ResponseComplete" or ref.get("subresource") != "status":
                continue
            at = cluster.epoch(str(event.get("stageTimestamp", "")))
            if start <= at <= end:
                times.setdefault(str(ref.get("name")), []).append(round(at - start, 1))
    return {name: sorted(times[name]) for name in sorted(times)}

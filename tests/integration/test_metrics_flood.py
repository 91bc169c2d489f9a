"""A flood of made-up tokens on /metrics does not slow a running rollout or the Lease renewals.

Anyone who reaches the metrics port can send a new bearer token with every request.  Here an
operator (secure /metrics, Lease retry period 1 s) runs a paced rollout over simulated GPU
nodes; after a baseline (BASELINE_LABELS label writes, once every node has published its status
for the new config), another process sends FLOOD_REQUESTS requests with distinct tokens over
FLOOD_SECONDS (``gpushare_testing.tokenflood``).  From the API server's audit log, never from
the operator's own account:

- the operator's write rate (all its writes but the Lease and the reviews; and its node label
  writes, the rollout's own progress) during the flood is not below the baseline's, within
  RATE_TOLERANCE;
- its Lease renewals keep their period during the flood;
- the TokenReviews it sent during the flood are within the rate limit (kube/access.py), and
  all its review calls within what docs/operations.md promises, where every distinct token
  used to be one;
- every review came from the reviews' own client (its user agent), and nothing else did;
- a scraper whose answer is cached keeps getting its metrics, and the flood gets 401s (the
  reviews) and 429s (refused without one), nothing else.

Without the guard (every token reviewed, on the operator's main client), this machine's writer
kept its pace all the same at this rate: the review counts and the user agent are what fail.

The issue's case is 10,000 requests in 60 s (~170 a second), which this 2-core machine sustains
next to the control plane, the simulator and the operator.  ``make test`` floods at that rate
for 30 s (5,000 requests: every bound above scales with the flood's length); ``make soak``
(``GPUSHARE_SOAK=1``) for the whole 60 s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import math
import os
import sys
import time
from collections.abc import Collection, Iterable
from typing import Any

import pytest

from gpushare_operator.kube import access
from gpushare_testing import apiobjects as h
from gpushare_testing import auditlog
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory, RunningOperator
from gpushare_testing.replicas import RETRY_PERIOD, TIMING_FLAGS, report
from gpushare_testing.rolloutstate import settled_key
from gpushare_testing.scraping import Scraper, fetch
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.tokenflood import FloodResult, parse
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

SOAK = os.environ.get("GPUSHARE_SOAK") == "1"
FLOOD_REQUESTS, FLOOD_SECONDS = (10_000, 60.0) if SOAK else (5_000, 30.0)  # the same rate
FLOOD_CONCURRENCY = 32
# A rollout that outlasts the warm-up, the baseline and the flood: two nodes at a time, each
# ~3 s from its label to GFD's confirmation (the simulator's plugin restart window is 2 s).
NODES, MAX_UNAVAILABLE = 80, 2
# The baseline: the rollout's label writes without a flood (~30 s at its pace), once its first
# statuses are out.  Each
# window is measured from a label write to a label write, so that its edges do not cut through
# pairs of nodes in flight; this machine is shared, and windows of the same rollout without any
# flood differ by up to ~10%.
BASELINE_LABELS = 20
RATE_TOLERANCE = 0.2
REVIEWS = ("tokenreviews", "subjectaccessreviews")
# What docs/operations.md promises, stated here rather than read from kube/access.py, so that a
# limit raised there fails here: 5 reviews a second in bursts of 20, each at most 2 API calls.
CALLS_PER_SECOND, CALLS_BURST = 10.0, 40
SCRAPE_EVERY = 5.0


def ours(plane: ControlPlane, user: str) -> list[auditlog.AuditEvent]:
    return [e for e in plane.audit_events() if e["user"]["username"] == user]


def within(times: Iterable[float], start: float, end: float) -> list[float]:
    return sorted(t for t in times if start <= t < end)


def rate(times: Iterable[float], start: float, end: float) -> float:
    return len(within(times, start, end)) / (end - start)


def span(labels: list[float], start: float, end: float) -> tuple[float, float]:
    """From the first label write in [start, end) to the last: a window of the rollout's pace."""
    inside = within(labels, start, end)
    assert len(inside) >= 2, f"{len(inside)} label writes between {start} and {end}"
    return inside[0], inside[-1]


def writes(events: Iterable[auditlog.AuditEvent]) -> list[float]:
    """When each of the operator's writes was received: not the Lease, not the reviews."""
    return [
        auditlog.received(e).timestamp()
        for e in events
        if not auditlog.is_lease(e) and e["objectRef"].get("resource") not in REVIEWS
    ]


def kinds_of_writes(
    events: Iterable[auditlog.AuditEvent], start: float, end: float
) -> dict[str, int]:
    """The operator's writes in [start, end) by verb and resource, for the report."""
    counted: collections.Counter[str] = collections.Counter()
    for e in events:
        ref = e["objectRef"]
        if ref.get("resource") in REVIEWS or auditlog.is_lease(e):
            continue
        if start <= auditlog.received(e).timestamp() < end:
            what = "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))
            counted[f"{e['verb']} {what}"] += 1
    return dict(counted.most_common())


def renewals(events: Iterable[auditlog.AuditEvent]) -> list[float]:
    return [
        auditlog.received(e).timestamp()
        for e in events
        if auditlog.is_lease(e) and e["verb"] == "update" and auditlog.succeeded(e)
    ]


def token_reviews(events: Iterable[auditlog.AuditEvent]) -> list[float]:
    return [
        auditlog.received(e).timestamp()
        for e in events
        if e["objectRef"].get("resource") == "tokenreviews"
    ]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def published(
    sim: GpuClusterSimulator, nodes: Collection[str], key: str, *, phase: str | None = None
) -> set[str]:
    """The nodes whose GPUNodeState is about config ``key`` (and in ``phase``, if given)."""
    body = await h.ok(sim.client, "GET", f"{h.API}/gpunodestates")
    return {
        item["metadata"]["name"]
        for item in body["items"]
        if item["metadata"]["name"] in nodes
        and (item.get("status") or {}).get("configKey") == key
        and phase in (None, item["status"].get("phase"))
    }


async def run_flood(port: int) -> FloodResult:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpushare_testing.tokenflood",
        f"--port={port}",
        f"--count={FLOOD_REQUESTS}",
        f"--seconds={FLOOD_SECONDS:g}",
        f"--concurrency={FLOOD_CONCURRENCY}",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=3 * FLOOD_SECONDS)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, proc.returncode
    return parse(out.decode())


async def scrape_meanwhile(
    operator: RunningOperator, reader: Scraper, done: asyncio.Event
) -> list[int]:
    """A scraper whose answer is cached, every SCRAPE_EVERY s until ``done``: its statuses."""
    statuses = []
    while not done.is_set():
        statuses.append((await fetch(operator.metrics_port, "/metrics", token=reader.token))[0])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=SCRAPE_EVERY)
    return statuses


async def test_a_flood_of_made_up_tokens_slows_neither_a_rollout_nor_the_lease(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    metrics_reader: Scraper,
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("flood")
    nodes = await sim.create_gpu_nodes(pool=pool, count=NODES, gpus=1)
    name = h.unique("flood")
    await h.add_policy(sim, policies, h.policy(name, pool=pool))  # every node at once
    operator = await start_operator(
        "--device-plugin-namespace", namespace, "--no-metrics-insecure", *TIMING_FLAGS
    )
    first = await settled_key(sim, name)
    await eventually(
        lambda: published(sim, nodes, first, phase="Verified"),
        until=lambda done: len(done) == NODES,
        timeout=180,
        interval=0.5,
        what=f"{NODES} nodes Verified on {first}",
    )

    since = time.time()
    paced: dict[str, Any] = {"maxUnavailable": MAX_UNAVAILABLE, "canary": 0}
    await h.patch_policy(sim.client, name, {"replicas": 2, "rollout": paced})

    async def label_writes() -> list[float]:
        return [t for t, _, _ in audit.label_writes(control_plane, nodes, since=since)]

    # The rollout's first statuses: every node waiting for its turn says so (once, after the
    # planner's quiet period), a burst of writes that is no part of the rollout's pace.
    second = await settled_key(sim, name)
    await eventually(
        lambda: published(sim, nodes, second),
        until=lambda about: len(about) == NODES,
        timeout=60,
        interval=0.5,
        what=f"every node's GPUNodeState about {second}",
    )
    settled = time.time()

    async def baseline() -> list[float]:
        return within(await label_writes(), settled, math.inf)

    written = await eventually(
        baseline,
        until=lambda written: len(written) > BASELINE_LABELS,
        timeout=120,
        interval=0.5,
        what=f"{BASELINE_LABELS} label writes after the first statuses, the baseline",
    )
    before = (written[0], written[BASELINE_LABELS])

    status, text = await fetch(operator.metrics_port, "/metrics", token=metrics_reader.token)
    assert status == 200, text  # its answer is cached from now on
    flood_start = time.time()
    done = asyncio.Event()
    scraping = asyncio.create_task(scrape_meanwhile(operator, metrics_reader, done))
    try:
        result = await run_flood(operator.metrics_port)
    finally:
        done.set()
        scraped = await scraping
    flood_end = result.ended

    labels = await label_writes()
    events = ours(control_plane, operator.user)
    during = span(labels, flood_start, flood_end)
    label_rates = [rate(labels, *window) for window in (before, during)]
    write_rates = [rate(writes(events), *window) for window in (before, during)]
    lease = renewals(events)
    lease_gaps = [gaps(within(lease, *window)) for window in (before, (flood_start, flood_end))]
    reviews = within(token_reviews(events), flood_start, flood_end + 5.0)
    calls = [
        auditlog.received(e).timestamp()
        for e in events
        if e["objectRef"].get("resource") in REVIEWS
    ]
    calls = within(calls, flood_start, flood_end + 5.0)
    promised = CALLS_BURST + CALLS_PER_SECOND * (flood_end - flood_start)
    # Every review on the reviews' own client, and nothing else of the operator's on it.
    review_agents = {
        e.get("userAgent") for e in events if e["objectRef"].get("resource") in REVIEWS
    }
    on_review_client = [
        f"{e['verb']} {e['requestURI']}"
        for e in events
        if e.get("userAgent") == access.USER_AGENT and e["objectRef"].get("resource") not in REVIEWS
    ]
    bound = access.REVIEW_BURST + access.REVIEW_QPS * (flood_end - flood_start)
    report(
        f"flood: {result.sent:,} requests with distinct tokens in {result.seconds:.1f} s "
        f"({result.sent / result.seconds:.0f}/s), answers {result.statuses}, "
        f"{result.errors} without one; TokenReviews sent {len(reviews)} (bound {bound:.0f}), "
        f"review API calls {len(calls)} (promised at most {promised:.0f}); "
        f"writes/s before {write_rates[0]:.2f}, during {write_rates[1]:.2f} "
        f"(windows {before[1] - before[0]:.1f} s, {during[1] - during[0]:.1f} s); "
        f"label writes/s before {label_rates[0]:.3f}, during {label_rates[1]:.3f}; "
        f"Lease renewal gaps max before {max(lease_gaps[0]):.2f} s, "
        f"during {max(lease_gaps[1]):.2f} s ({len(lease_gaps[1]) + 1} renewals); "
        f"cached scraper got {scraped}; writes before {kinds_of_writes(events, *before)}, "
        f"during {kinds_of_writes(events, *during)}"
    )

    assert len(labels) < NODES, "the rollout ended before the flood did: make it longer"
    assert result.sent == FLOOD_REQUESTS and result.errors == 0, result
    assert result.seconds <= FLOOD_SECONDS * 1.1, "the flood could not keep its pace"
    # Each review is a 401 here; everything else was refused without a review.
    assert set(result.statuses) <= {401, 429}, result.statuses
    assert result.statuses.get(429, 0) >= FLOOD_REQUESTS - bound, result.statuses
    assert access.REVIEW_BURST <= len(reviews) <= bound, len(reviews)
    assert len(calls) <= promised, len(calls)
    assert scraped and set(scraped) == {200}, scraped
    assert review_agents == {access.USER_AGENT}, review_agents
    assert on_review_client == [], on_review_client
    # The writer and the rollout kept their pace...
    assert write_rates[1] >= (1 - RATE_TOLERANCE) * write_rates[0], write_rates
    assert label_rates[1] >= (1 - RATE_TOLERANCE) * label_rates[0], label_rates
    # ...and the Lease its period: no renewal missed, none near the renew deadline.
    assert len(lease_gaps[1]) + 1 >= (flood_end - flood_start) / RETRY_PERIOD * 0.8
    assert max(lease_gaps[1]) <= 2 * RETRY_PERIOD, lease_gaps[1]

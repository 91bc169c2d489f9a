"""``python -m benchmarks.scale [--nodes N --pods M | --quick]``: the scale benchmark.

Setup (timed, reported): a local control plane; CRDs and namespaces; ``--nodes`` realistic GPU
Nodes (GFD labels, capacity, conditions, 40 images: ~15 KB each) over 5 pools; ``--pods`` Pods
bound round-robin to them (every 5th asks for a shared GPU slot); 20 policies over the 5 pools.
Then a *primer* (our operator under its own user, with a write rate high enough not to matter)
converges the cluster once: every node labelled, every GPUNodeState and policy status written.

Why prime: a cold start that has to write 3 objects per node for 5,000 nodes at 20 writes/s
measures the rate limiter for 12 minutes, not the operator.  A primed cluster is what an operator
restart meets (an upgrade, a failover, a crash), and a restart that needs no write must issue
none; that is what "cold start" measures here, from process start to caches synced and every
node published as expected with nothing left dirty.

Then each variant in turn (gpushare, then kopf-native), against the same objects, reset to the
same primed state in between (rollout policy deleted, primer re-converges), as its own process
and API user: cold start; 10 idle seconds (steady RSS); a heartbeat storm (every node's status
patched every 10 s for 60 s); a policy rollout (a new priority-1000 policy over half the nodes,
at the operator's default write QPS and burst); pod churn (100 creates/s for 60 s, each pod
deleted a few seconds later: 200 pod changes/s at steady state), measuring the lag from the API's
answer to the change until the GPUNodeState shows it.  Both variants run with
``--config-propagation-delay 1`` (default 75 s: the kubelet's ConfigMap refresh; here nothing
reads the volume) and a huge ``--mismatch-timeout`` (GFD is not simulated, so nodes stay
Applied rather than turning Mismatch mid-run).  They also run *unpaced*: the bench's policies
carry ``rollout: {maxUnavailable: "100%", canary: 0}`` and both variants (and the primer) get
``--max-unavailable 100%``, so these rows keep measuring how fast a change is written, as before
rollouts were paced; the kopf-native variant runs the same planner, unpaced too.  Paced, with
no node ever Verified, a rollout would stop after its first batch.

Three extra phases (``--skip relist,delayed,paced`` leaves them out).  After priming, a *re-list* of
every pod through the operator's real pod ``Informer``, once as a paged quorum list (before the
watch-cache change) and once as a streaming list (after), each in a fresh process
(``relist.py``).  After the variants, a *delayed rollout*, gpushare only: the operator at its
default propagation delay (``--delay``, 75 s), a replicas change on the rollout policy (half the
nodes), and 3 edits of another policy during the wait; its writes against the minimum
(``delayed.py``).  Last, a *paced rollout*, gpushare only, at the operator's defaults
(propagation delay 75 s, ``--max-unavailable`` 10%): a replicas change of the rollout policy
with ``rollout: {maxUnavailable: 10%, canary: 1}``, with a GFD responder that plays NVIDIA's
agents so that nodes become Verified; its time, the largest number of unavailable nodes seen
from the API side against the budget, its writes against the minimum, the leader's CPU
(``paced.py``, ``gfd.py``).

Last, on a control plane of its own, the *MIG re-layout* (``migrelayout.py``): ``--mig-nodes``
simulated H100s Verified on one mixed MIG layout under ``podPolicy: Evict`` and
``maxUnavailable: 10%``, some running GPU pods, moved to another layout; its time and writes
against the minimum.  ``--skip mig-relayout`` leaves it out; ``--only mig-relayout`` runs it
alone (results in ``.bench/scale-mig.json``).

And on yet another control plane, the *memory-request webhook* (``webhook.py``): its admission
latency as the API server measures it, with ``--webhook-nodes`` nodes Verified and offering slot
classes, at ``--webhook-rate`` labelled pod creates per second for ``--webhook-seconds``, against
the same pods unlabelled; ``--skip webhook`` leaves it out, ``--only webhook`` runs it alone
(results in ``.bench/scale-webhook.json``; with ``--quick``, 500 nodes for 20 s).

Results: ``.bench/scale.json`` (everything, with RSS/CPU series), ``.bench/scale.png`` and a
Markdown table on stdout.  Exits 0 when the run completed, whatever the budgets said.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks.scale import (
    cluster,
    delayed,
    migrelayout,
    paced,
    plot,
    relist,
    run,
    stats,
    webhook,
)
from gpushare_operator.app import settings
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.rawclient import RawClient

APISERVER_ARGS = (
    # 32-64 requests in flight from the loader, plus watches: the defaults (400/200) would do,
    # but a storm of 500 patches/s must queue in the server, not be refused with 429.
    "--max-requests-inflight=1000",
    "--max-mutating-requests-inflight=500",
)
USERS = {"gpushare": "bench-gpushare", "kopf-native": "bench-kopf-native", "primer": "bench-primer"}
# Only the variants' writes are counted, so only they are logged: the audit log is written in
# blocking mode, and logging the loader's 50,000 pod creates and 30,000 heartbeats too would
# slow the API server that both variants share.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Metadata", "users": sorted(USERS.values())},
        {"level": "None"},
    ],
}


RELIST_NOTE = (
    "Re-list: one full list of every pod through the operator's Informer (its pod Target and"
    " PodSink), each mode in a fresh process, direct (not forced by a 410 Gone: that re-list"
    " runs the same listing code); CPU of the lister, the API server and etcd over the listing."
    " On this 1.35 control plane ConsistentListFromCache is locked on, so the paged list too is"
    " served from the watch cache (etcd is asked only for its revision): the difference shown is"
    " the API server's and the lister's, not etcd's; against etcd it takes a server before 1.31."
)


def log(message: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"{stamp} {message}", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--quick", action="store_true", help="500 nodes and 5,000 pods")
    # The operator's own defaults: the rollout is measured "at the default write QPS".
    defaults = settings.parse_settings([], env={})
    parser.add_argument(
        "--write-qps", type=float, default=defaults.write_qps, help="both variants' QPS"
    )
    parser.add_argument("--write-burst", type=int, default=defaults.write_burst)
    parser.add_argument("--churn-rate", type=float, default=100.0, help="pod creates per second")
    parser.add_argument(
        "--variants", default="gpushare,kopf-native", help="comma-separated, in run order"
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=defaults.config_propagation_delay,
        help="propagation delay of the delayed-rollout row (the operator's default)",
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated extra phases to skip: relist,delayed,paced,mig-relayout,webhook",
    )
    parser.add_argument("--only", choices=["mig-relayout", "webhook"], help="run this phase alone")
    parser.add_argument("--mig-nodes", type=int, default=500, help="MIG re-layout's H100 nodes")
    parser.add_argument(
        "--mig-pod-every", type=int, default=5, help="a GPU pod on every N-th MIG node"
    )
    parser.add_argument(
        "--mig-apply-seconds", type=float, default=0.2, help="the simulated MIG manager's apply"
    )
    parser.add_argument(
        "--webhook-nodes", type=int, help="webhook phase's nodes (5,000; 500 with --quick)"
    )
    parser.add_argument(
        "--webhook-rate", type=float, default=100.0, help="webhook phase's pod creates per second"
    )
    parser.add_argument(
        "--webhook-seconds", type=float, help="each webhook window's length (60 s; 20 with --quick)"
    )
    parser.add_argument(
        "--webhook-profile", type=Path, help="py-spy's raw stacks of the operator, webhook window"
    )
    parser.add_argument("--out", type=Path, default=Path(".bench") / "scale.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods = 500, 5000
    if args.webhook_nodes is None:
        args.webhook_nodes = 500 if args.quick else webhook.BUDGET_NODES
    if args.webhook_seconds is None:
        args.webhook_seconds = 20.0 if args.quick else webhook.BUDGET_SECONDS
    return args


async def setup(
    plane: ControlPlane, args: argparse.Namespace, published: cluster.Published
) -> dict[str, float]:
    timings: dict[str, float] = {}
    async with RawClient(kubeconfig=plane.admin_kubeconfig) as admin:
        t = time.monotonic()
        await cluster.apply_crds(admin)
        await cluster.create_namespaces(admin)
        timings["crds_namespaces_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        await cluster.create_nodes(admin, args.nodes, log=log)
        timings["nodes_s"] = round(time.monotonic() - t, 1)
        log(f"{args.nodes:,} nodes in {timings['nodes_s']} s")
        t = time.monotonic()
        await cluster.create_pods(admin, args.pods, nodes=args.nodes, log=log)
        timings["pods_s"] = round(time.monotonic() - t, 1)
        log(f"{args.pods:,} pods in {timings['pods_s']} s")
        await cluster.create_policies(admin, cluster.policy_bodies())
    return timings


async def main_async(plane: ControlPlane, args: argparse.Namespace) -> dict[str, Any]:
    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    published = cluster.Published()
    setup_started = time.monotonic()
    timings = await setup(plane, args, published)
    kubeconfigs = {
        user: plane.kubeconfig_for_user(user, groups=("system:masters",)) for user in USERS.values()
    }
    pids = plane.pids()
    system_pids: dict[str, int] = {
        name: pids[name] for name in ("kube-apiserver", "etcd") if name in pids
    }
    async with RawClient(kubeconfig=plane.admin_kubeconfig) as admin:
        audit = cluster.AuditTail(plane.audit_log_path, USERS.values())
        bench = run.Bench(
            admin=admin,
            audit=audit,
            published=published,
            kubeconfig_for=lambda user: kubeconfigs[user],
            nodes=args.nodes,
            pods=args.pods,
            out_dir=out_dir,
            system_pids=system_pids,
            log=log,
        )
        primer = run.ours(
            user=USERS["primer"], port=18090, qps=5000, burst=5000, identity="bench-primer"
        )
        variants = {
            "gpushare": run.ours(
                user=USERS["gpushare"],
                port=18091,
                qps=args.write_qps,
                burst=args.write_burst,
                identity="bench-gpushare",
            ),
            "kopf-native": run.kopf_native(
                user=USERS["kopf-native"], port=18092, qps=args.write_qps, burst=args.write_burst
            ),
        }
        results: dict[str, Any] = {}
        async with cluster.background(cluster.watch_published(admin, published)):
            t = time.monotonic()
            log("priming: the primer converges the fresh cluster")
            async with run.launched(bench, primer) as (_, session):
                await run.converge(bench, primer, session, rollout=False, timeout=3600)
            timings["prime_s"] = round(time.monotonic() - t, 1)
            timings["total_s"] = round(time.monotonic() - setup_started, 1)
            log(f"setup done: {timings}")
            skip = set(args.skip.split(","))
            relisted: dict[str, Any] | None = None
            if "relist" not in skip:
                log(f"re-list of all {args.pods:,} pods, paged then streaming")
                relisted = await relist.run_both(
                    kubeconfig=kubeconfigs[USERS["primer"]], system_pids=system_pids, log=log
                )
            for index, name in enumerate(n for n in args.variants.split(",") if n):
                if index:
                    log("reset: rollout policy deleted, primer re-converges")
                    timings[f"reset_before_{name}_s"] = round(await run.reset(bench, primer), 1)
                log(f"== {name}")
                results[name] = await run.run_variant(
                    bench, variants[name], churn_rate=args.churn_rate
                )
            late: dict[str, Any] | None = None
            if "delayed" not in skip:
                log(f"== gpushare: rollout at the {args.delay:g} s propagation delay, edits")
                ours = delayed.variant(
                    user=USERS["gpushare"],
                    port=18093,
                    qps=args.write_qps,
                    burst=args.write_burst,
                    delay=args.delay,
                )
                late = await delayed.measure(bench, primer, ours, delay=args.delay)
                log(f"  [delayed] {late}")
            paced_rollout: dict[str, Any] | None = None
            if "paced" not in skip:
                log("== gpushare: paced rollout at the operator's defaults, GFD responder")
                ours = paced.variant(
                    user=USERS["gpushare"], port=18094, qps=args.write_qps, burst=args.write_burst
                )
                paced_rollout = await paced.measure(bench, primer, ours, qps=args.write_qps)
                log(f"  [paced] {_brief(paced_rollout)}")
    return {
        "setup": timings,
        "variants": results,
        "relist": relisted,
        "delayed_rollout": late,
        "paced_rollout": paced_rollout,
    }


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    """The result without its series, for the log line."""
    return {k: v for k, v in result.items() if k != "unavailable_series"}


def report(args: argparse.Namespace, outcome: dict[str, Any]) -> dict[str, Any]:
    variants = outcome["variants"]
    rows = stats.build_rows(
        variants.get("gpushare"),
        variants.get("kopf-native"),
        qps=args.write_qps,
        delayed=outcome.get("delayed_rollout"),
        paced=outcome.get("paced_rollout"),
    )
    table = stats.render_table(rows)
    relist_table = stats.render_relist(outcome.get("relist"))
    return {
        "benchmark": "scale",
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "sizes": {"nodes": args.nodes, "pods": args.pods, "policies": 20, "pools": 5},
        "settings": {
            "write_qps": args.write_qps,
            "write_burst": args.write_burst,
            "config_propagation_delay_s": 1,
            "churn_changes_per_s": 2 * args.churn_rate,
        },
        "setup": outcome["setup"],
        "variants": variants,
        "relist": outcome.get("relist"),
        "delayed_rollout": outcome.get("delayed_rollout"),
        "paced_rollout": outcome.get("paced_rollout"),
        "table": table,
        "relist_table": relist_table,
        "budgets": {row.label: stats.verdict(row.ok) for row in rows if row.ok is not None},
    }


def mig_relayout(args: argparse.Namespace) -> dict[str, Any]:
    log(f"== gpushare: MIG re-layout of {args.mig_nodes:,} H100 nodes, own control plane")
    result = migrelayout.run_alone(
        nodes=args.mig_nodes,
        pod_every=args.mig_pod_every,
        apply_seconds=args.mig_apply_seconds,
        out_dir=args.out.parent,
        log=log,
    )
    log(f"  [mig] {result}")
    return result


def main_mig_only(args: argparse.Namespace) -> int:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    row = mig_relayout(args)
    result = {"benchmark": "scale-mig", "mig_relayout": row}
    out = args.out.with_name("scale-mig.json")
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    print()
    print(migrelayout.render(row))
    print(f"results: {out}")
    return 0


def webhook_admission(args: argparse.Namespace) -> dict[str, Any]:
    log(
        f"== gpushare: memory-request webhook, {args.webhook_nodes:,} nodes,"
        f" {args.webhook_rate:g} pod creates/s for {args.webhook_seconds:g} s, own control plane"
    )
    result = webhook.run_alone(
        nodes=args.webhook_nodes,
        rate=args.webhook_rate,
        seconds=args.webhook_seconds,
        out_dir=args.out.parent,
        log=log,
        apiserver_args=APISERVER_ARGS,
        profile=args.webhook_profile,
    )
    log(f"  [webhook] budgets: {result['budgets']}")
    return result


def main_webhook_only(args: argparse.Namespace) -> int:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    row = webhook_admission(args)
    result = {
        "benchmark": "scale-webhook",
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "webhook": row,
    }
    out = args.out.with_name("scale-webhook.json")
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    print()
    print(webhook.render(row))
    print(f"results: {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.only == "mig-relayout":
        return main_mig_only(args)
    if args.only == "webhook":
        return main_webhook_only(args)
    log(f"scale benchmark: {args.nodes:,} nodes, {args.pods:,} pods, write QPS {args.write_qps}")
    started = time.monotonic()
    # No kube-scheduler: every pod here is created bound, and its informers (50,000 pods, every
    # node status write) would take CPU from the processes measured, on the same cores.
    plane = ControlPlane(
        extra_apiserver_args=APISERVER_ARGS, audit_policy=AUDIT_POLICY, scheduler=False
    )
    plane.start()
    control_plane_s = time.monotonic() - started
    try:
        outcome = asyncio.run(main_async(plane, args))
    finally:
        plane.stop()
    outcome["setup"]["control_plane_s"] = round(control_plane_s, 1)
    result = report(args, outcome)
    if "mig-relayout" not in set(args.skip.split(",")):
        result["mig_relayout"] = mig_relayout(args)
    if "webhook" not in set(args.skip.split(",")):
        result["webhook"] = webhook_admission(args)
    args.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    png = plot.draw(result["variants"], args.out.with_suffix(".png"))
    print()
    print(result["table"])
    print()
    if result["relist_table"]:
        print(result["relist_table"])
        print()
        print(RELIST_NOTE)
        print()
    late = result["delayed_rollout"]
    if late:
        # The table gives totals; which writes exceed the minimum is the useful part of a MISS.
        kinds = sorted(set(late["writes_by_kind"]) | set(late["minimum_by_kind"]))
        split = ", ".join(
            f"{k} {late['writes_by_kind'].get(k, 0)}/{late['minimum_by_kind'].get(k, 0)}"
            for k in kinds
        )
        print(f"delayed rollout, writes issued/minimum by kind: {split}")
        print(f"delayed rollout, policy status writes by policy: {late['policy_status_writes']}")
        print(f"delayed rollout, node statuses said (GNS watch): {late['statuses_said']}")
        print()
    paced_result = result["paced_rollout"]
    if paced_result:
        kinds = sorted(set(paced_result["writes_by_kind"]) | set(paced_result["minimum_by_kind"]))
        split = ", ".join(
            f"{k} {paced_result['writes_by_kind'].get(k, 0)}"
            f"/{paced_result['minimum_by_kind'].get(k, 0)}"
            for k in kinds
        )
        print(f"paced rollout, writes issued/minimum by kind: {split}")
        print(f"paced rollout, node statuses said (GNS watch): {paced_result['statuses_said']}")
        print(
            "paced rollout, policy status writes, s after the edit:"
            f" {paced_result['policy_status_times_s']}"
        )
        print()
    if result.get("mig_relayout"):
        print(migrelayout.render(result["mig_relayout"]))
        print()
    if result.get("webhook"):
        print(webhook.render(result["webhook"]))
        print()
    print(f"setup: {result['setup']}")
    for name, variant in result["variants"].items():
        print(f"{name}: API server/etcd CPU share over its run: {run.summary_cpu(variant)}")
        said = (variant.get("rollout") or {}).get("statuses_said")
        print(f"{name}: rollout, node statuses said (GNS watch): {said}")
    print(f"results: {args.out}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks.plugin_plan``: ``kubectl gpushare plan`` on the scale benchmark's cluster.

Builds the scale benchmark's cluster (``benchmarks.scale.cluster``: 5,000 realistic GPU nodes,
50,000 pods of which every fifth asks for a shared slot, 20 policies over 5 pools) on a local
control plane, lets the operator converge it, and plays GPU Feature Discovery and the device
plugin once so that every node is Verified, as in a cluster at rest.  Then it runs the plugin as
a user would, in a fresh process each time: ``plan -f`` an edit that adds a priority-1000
policy over half the nodes (2,500 nodes to roll) and changes a pool's replicas.  Wall time is
from process start to exit; peak RSS is the child's own maximum resident set (``wait4``).

The baseline, in the same run on the same cluster and as the same user: the control plane's own
kubectl reading what the plan reads, ``kubectl get nodes,pods,gpunodestates -A -o json`` with
its output thrown away, as many times, each run right after a plan run (plan, kubectl, plan,
kubectl, ...) so that the machine's load weighs on both alike.  Its discovery cache is warmed
once before (a user's kubectl has one), so that its runs time the reads, as the plan's do.

Results: ``.bench/plugin_plan.json`` and a Markdown table on stdout.  ``--quick``: 500 nodes,
5,000 pods.  Budgets: the plan's median wall time at most 1.0x kubectl's; within 15 s and under
300 MiB at full size (issue #16).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from benchmarks.scale import cluster
from benchmarks.scale.run import ours
from gpushare_testing.agents import (
    gfd_labels,
    parse_device_plugin_config,
    plugin_resources,
)
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.rawclient import RawClient

BUDGET_SECONDS = 15.0
BUDGET_RSS_MIB = 300.0
# The plan's median wall time over kubectl's reading the same objects (the budget).
BUDGET_RATIO = 1.0
KUBECTL_READ = ("get", "nodes,pods,gpunodestates", "-A", "-o", "json")
USER = "bench-primer"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
RUNS = 5
# Between the operator's last write and the first plan: the API server's own work after the
# converging burst (its watch cache, etcd compaction) is over, as in a cluster at rest.
SETTLE_SECONDS = 30.0
# Nothing here reads the audit log: log nothing, so 55,000 creates do not wait on it.
QUIET_AUDIT = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "None"}]}


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def environment(kubeconfig: Path) -> dict[str, str]:
    """This checkout's code first, whatever the venv has installed."""
    path = os.pathsep.join(
        [str(cluster.REPO / "operator"), str(cluster.REPO), os.environ.get("PYTHONPATH", "")]
    )
    return dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=path)


async def phases(client: RawClient) -> dict[str, list[str]]:
    """GPUNodeState names by phase."""
    out: dict[str, list[str]] = {}
    for item in await cluster.list_all(client, cluster.NODE_STATES_PATH):
        phase = str((item.get("status") or {}).get("phase"))
        out.setdefault(phase, []).append(item["metadata"]["name"])
    return out


async def settle_agents(client: RawClient, names: Sequence[str]) -> None:
    """What the device plugin and GFD do once a node's config is in force."""
    if not names:
        return
    status, configmap = await client.get(
        f"/api/v1/namespaces/{cluster.DEVICE_PLUGIN_NAMESPACE}/configmaps/{cluster.CONFIGMAP}"
    )
    data = (configmap.get("data") or {}) if status == 200 else {}

    async def one(index: int) -> None:
        path = f"/api/v1/nodes/{names[index]}"
        status, node = await client.get(path)
        labels = node["metadata"].get("labels") or {} if status == 200 else {}
        sharing = parse_device_plugin_config(data.get(labels.get(CONFIG_LABEL, ""), ""))
        if sharing is None:
            return
        gpus = int(labels.get("nvidia.com/gpu.count", "0"))
        resources = {k: v for k, v in plugin_resources(gpus=gpus, sharing=sharing).items() if v}
        body = {"status": {"capacity": resources, "allocatable": resources}}
        await client.patch(f"{path}/status", body)
        await client.patch(path, {"metadata": {"labels": gfd_labels(labels, sharing)}})

    await cluster.bounded(cluster.functools_partial(one, i) for i in range(len(names)))


async def verify_all(client: RawClient, nodes: int, *, timeout: float = 3600) -> None:
    """Play the agents on every Applied node until all are Verified: a rollout goes on only
    once its canary and batches are Verified."""
    started, last = time.monotonic(), 0.0
    while True:
        seen = await phases(client)
        if len(seen.get("Verified", ())) >= nodes:
            log(f"every node Verified after {time.monotonic() - started:.0f} s")
            return
        if time.monotonic() - last > 30:
            last = time.monotonic()
            log(f"  GPUNodeStates by phase: { {k: len(v) for k, v in seen.items()} }")
        if time.monotonic() - started > timeout:
            raise TimeoutError("nodes not Verified")
        await settle_agents(client, seen.get("Applied", []))
        await asyncio.sleep(2)


def operator_command() -> list[str]:
    """The scale bench's own operator command, writing as fast as the API server takes it."""
    variant = ours(user=USER, port=free_port(), qps=5000, burst=5000, identity="plugin-bench")
    return variant.command


async def converge(plane: ControlPlane, client: RawClient, nodes: int, out: Path) -> None:
    kubeconfig = plane.kubeconfig_for_user(USER, groups=("system:masters",))
    with (out / "plugin-plan-operator.log").open("ab") as log_file:
        operator = subprocess.Popen(  # noqa: ASYNC220 - returns at once; never waited here
            operator_command(),
            env=environment(kubeconfig),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=cluster.REPO,
        )
    try:
        await verify_all(client, nodes)
    finally:
        operator.terminate()
        await asyncio.to_thread(operator.wait, 60)


def edit(directory: Path) -> Path:
    """The planned change: the scale bench's rollout policy, and inference-base at 3 replicas."""
    policies = {p["metadata"]["name"]: p for p in cluster.policy_bodies()}
    base = policies["inference-base"]
    base["spec"]["replicas"] = 3
    path = directory / "edit.yaml"
    path.write_text(yaml.safe_dump_all([cluster.rollout_policy(), base]))
    return path


def run_plan(kubeconfig: Path, manifest: Path, *, fmt: str) -> dict[str, Any]:
    command = [
        *(sys.executable, "-m", "gpushare_operator.kubectl.cli"),
        *("plan", "-v", "-f", str(manifest)),
    ]
    with tempfile.TemporaryFile() as errors:
        started = time.monotonic()
        proc = subprocess.Popen(
            [*command, "-o", fmt],
            env=environment(kubeconfig),
            stdout=subprocess.PIPE,
            stderr=errors,
            cwd=cluster.REPO,
        )
        stdout = proc.stdout.read() if proc.stdout else b""
        # wait4, not Popen.wait: the child's own peak RSS and CPU, not the largest child's.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        trace = errors.read().decode()
        if proc.returncode not in (0, 2):
            raise RuntimeError(f"plan exited {proc.returncode}: {trace}")
    return measured(wall, usage) | {
        "exit": proc.returncode,
        "trace": trace.splitlines(),
        "stdout": stdout.decode(),
    }


def run_kubectl(kubectl: Path, kubeconfig: Path, cache_dir: Path) -> dict[str, Any]:
    """The baseline: kubectl reading what the plan reads, its output thrown away."""
    command = [
        *(str(kubectl), "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache_dir)),
        *KUBECTL_READ,
    ]
    with tempfile.TemporaryFile() as errors:
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            errors.seek(0)
            raise RuntimeError(f"kubectl exited {code}: {errors.read().decode()}")
    return measured(wall, usage)


def measured(wall: float, usage: Any) -> dict[str, Any]:
    """A child's run: its wall time, and its own peak RSS and CPU (``os.wait4``'s usage)."""
    return {
        "load_average_1m": round(os.getloadavg()[0], 2),
        "wall_s": round(wall, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
    }


def warm_kubectl(kubectl: Path, kubeconfig: Path, cache_dir: Path) -> None:
    """Discovery once, into ``cache_dir``: the timed runs then read objects, not the API list."""
    subprocess.run(
        [
            *(str(kubectl), "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache_dir)),
            *("api-resources", "-o", "name"),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def interleaved(
    plan: Callable[[int], dict[str, Any]], kubectl: Callable[[], dict[str, Any]], runs: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Plan, kubectl, plan, kubectl, ...: a noisy stretch of the machine hits both alike."""
    plans: list[dict[str, Any]] = []
    baselines: list[dict[str, Any]] = []
    for index in range(runs):
        plans.append(plan(index))
        baselines.append(kubectl())
        log(f"  run {index + 1}: plan {plans[-1]['wall_s']} s, kubectl {baselines[-1]['wall_s']} s")
    return plans, baselines


async def build(plane: ControlPlane, args: argparse.Namespace, out: Path) -> dict[str, float]:
    timings: dict[str, float] = {}
    async with RawClient(kubeconfig=plane.admin_kubeconfig) as admin:
        started = time.monotonic()
        await cluster.apply_crds(admin)
        await cluster.create_namespaces(admin)
        await cluster.create_nodes(admin, args.nodes, log=log)
        await cluster.create_pods(admin, args.pods, nodes=args.nodes, log=log)
        await cluster.create_policies(admin, cluster.policy_bodies())
        timings["objects_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        await converge(plane, admin, args.nodes, out)
        timings["converge_s"] = round(time.monotonic() - started, 1)
    return timings


def spread(runs: Sequence[dict[str, Any]], key: str = "wall_s") -> dict[str, float]:
    values = [float(r[key]) for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def versus(runs: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The plan's median wall time over kubectl's, and the issue's verdict on it."""
    ratio = spread(runs)["median"] / spread(baseline)["median"]
    return {
        "ratio": round(ratio, 3),
        "budget": BUDGET_RATIO,
        "verdict": verdict(ratio <= BUDGET_RATIO),
    }


def table(
    runs: Sequence[dict[str, Any]],
    nodes: int,
    pods: int,
    baseline: Sequence[dict[str, Any]] = (),
) -> str:
    wall = spread(runs)
    rss = max(r["peak_rss_mib"] for r in runs)
    rows = [
        "| measure | result | budget | |",
        "|---|---:|---|---|",
        f"| `plan` wall time, {nodes:,} nodes / {pods:,} pods (s, median of {len(runs)};"
        f" fastest-slowest) | {wall['median']:.1f} ({wall['min']:.1f}-{wall['max']:.1f})"
        f" | ≤ {BUDGET_SECONDS:g} | {verdict(wall['median'] <= BUDGET_SECONDS)} |",
    ]
    if baseline:
        base = spread(baseline)
        compared = versus(runs, baseline)
        rows += [
            f"| `kubectl {' '.join(KUBECTL_READ)}` wall time (s, median of {len(baseline)};"
            f" fastest-slowest) | {base['median']:.1f} ({base['min']:.1f}-{base['max']:.1f})"
            " | | |",
            f"| `plan` / `kubectl`, median wall times | {compared['ratio']:.2f}x"
            f" | ≤ {BUDGET_RATIO:.1f}x | {compared['verdict']} |",
        ]
    rows += [
        f"| `plan` peak RSS (MiB, worst run) | {rss:.0f} | < {BUDGET_RSS_MIB:g}"
        f" | {verdict(rss < BUDGET_RSS_MIB)} |",
        f"| `plan` CPU (s, median) | {statistics.median(r['cpu_s'] for r in runs):.1f} | | |",
    ]
    if baseline:
        rows += [
            f"| `kubectl` CPU (s, median) | {spread(baseline, 'cpu_s')['median']:.1f} | | |",
            f"| `kubectl` peak RSS (MiB, worst run)"
            f" | {max(r['peak_rss_mib'] for r in baseline):.0f} | | |",
        ]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plugin_plan", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--quick", action="store_true", help="500 nodes and 5,000 pods")
    parser.add_argument("--out", type=Path, default=Path(".bench") / "plugin_plan.json")
    parser.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep the cluster this long after the runs (its kubeconfig is printed), to profile",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods = 500, 5000
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(
        extra_apiserver_args=("--max-requests-inflight=1000",),
        audit_policy=QUIET_AUDIT,
        scheduler=False,
    )
    plane.start()
    try:
        timings = asyncio.run(build(plane, args, args.out.parent))
        time.sleep(SETTLE_SECONDS)
        kubeconfig = plane.kubeconfig_for_user("bench-plugin", groups=("system:masters",))
        with tempfile.TemporaryDirectory() as scratch:
            manifest = edit(Path(scratch))
            kubectl, cache_dir = plane.bin_dir / "kubectl", Path(scratch) / "kube-cache"
            warm_kubectl(kubectl, kubeconfig, cache_dir)
            runs, baseline = interleaved(
                lambda i: run_plan(kubeconfig, manifest, fmt="json" if i == 0 else "text"),
                lambda: run_kubectl(kubectl, kubeconfig, cache_dir),
                RUNS,
            )
            if args.hold:
                kept = args.out.parent / "plugin-plan-edit.yaml"
                kept.write_bytes(manifest.read_bytes())
                log(f"holding the cluster {args.hold:g} s: KUBECONFIG={kubeconfig}, edit {kept}")
                time.sleep(args.hold)
    finally:
        plane.stop()
    summary = orjson.loads(runs[0]["stdout"])
    result = {
        "nodes": args.nodes,
        "pods": args.pods,
        "setup": timings,
        "runs": [{k: v for k, v in r.items() if k != "stdout"} for r in runs],
        "kubectl": {"command": ["kubectl", *KUBECTL_READ], "runs": baseline},
        "wall_s": {"plan": spread(runs), "kubectl": spread(baseline)},
        "plan_over_kubectl": versus(runs, baseline),
        "plan": {"rollout": summary["rollout"], "changed_nodes": len(summary["nodes"])},
        "table": table(runs, args.nodes, args.pods, baseline),
    }
    args.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    print(runs[-1]["stdout"][:4000])
    print("\n".join(runs[-1]["trace"]))
    print(result["table"])
    print(f"setup: {timings}; plan: {result['plan']}; results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

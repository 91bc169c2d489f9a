"""The MIG re-layout row: ``--nodes`` simulated H100s moved from one mixed layout to another.

Its own control plane (the comparison rows' GPU-less nodes have no MIG manager to answer), with
the simulator (``gpushare_testing.simulator``) playing NVIDIA's MIG manager, GPU Feature
Discovery, device plugin and kubelet's pod admission, and gpushare at its defaults (cluster
``--max-unavailable`` 10%) but for a short propagation delay (``PROPAGATION_DELAY``: the
simulated kubelet syncs a ConfigMap in 1 s, and this row measures the MIG path, not the wait):

1. ``--nodes`` H100 nodes (8 GPUs, no MIG layout preset) and a MIG policy over them, layout
   ``BEFORE`` (``mixed``), ``rollout: {maxUnavailable: 10%, podPolicy: Evict}``; gpushare brings
   every node to ``Verified`` on it;
2. every ``--pod-every``-th node gets a running pod asking for one ``nvidia.com/mig-1g.10gb``;
3. the policy's layout becomes ``AFTER``; done when every node is ``Verified`` on the new key
   and the operator has nothing left to write.

Figures: the wall time of step 3, and gpushare's writes in it by kind, read from the API
server's audit log (its user alone is logged, with request bodies, to tell a label apply from a
taint patch), against the minimum: one label apply per node, one eviction per pod; the taint
(``gpushare.dev/reconfiguring``) is added and removed once per node; status writes have no
fixed minimum here (a node waiting for its pods, or for its batch, says so) and are reported per
node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from benchmarks.scale import cluster, run
from gpushare_operator.app import settings
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.records.nodes import MIG_CONFIG_LABEL, MIG_STATE_LABEL
from gpushare_testing import apiobjects as h
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create_pod
from gpushare_testing.rawclient import RawClient
from gpushare_testing.rolloutaudit import moment
from gpushare_testing.rolloutstate import verified_on
from gpushare_testing.simulator import GpuClusterSimulator

USER: Final = "bench-gpushare-mig"
POLICY: Final = "mig-relayout"
POOL: Final = "mig-bench"
POD_NAMESPACE: Final = "bench-mig"
H100: Final = "NVIDIA-H100-80GB-HBM3"
POD_RESOURCE: Final = "nvidia.com/mig-1g.10gb"
BEFORE: Final[Mapping[str, int]] = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}
AFTER: Final[Mapping[str, int]] = {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}
ROLLOUT: Final[Mapping[str, str]] = {"maxUnavailable": "10%", "podPolicy": "Evict"}
PROPAGATION_DELAY: Final = 2.0
TIMEOUT: Final = 1500.0
DEFAULTS: Final = settings.parse_settings([], env={})
AUDIT_POLICY: Final = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Request", "users": [USER]},
        {"level": "None"},
    ],
}
WRITE_VERBS: Final = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def policy_body(devices: Mapping[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": POOL}},
            "strategy": "MIG",
            "mig": {"devices": dict(devices), "migStrategy": "mixed"},
            "rollout": dict(ROLLOUT),
        },
    }


def devices_patch(old: Mapping[str, int], new: Mapping[str, int]) -> dict[str, int | None]:
    """The merge patch from ``old`` to ``new`` devices (a profile no longer there: null)."""
    return {**{profile: None for profile in old if profile not in new}, **new}


def write_kind(event: Mapping[str, Any]) -> str:
    """What one audited write of gpushare's was, in the row's terms."""
    ref = event.get("objectRef") or {}
    resource, sub = ref.get("resource", ""), ref.get("subresource", "")
    if resource == "nodes" and not sub:
        body = event.get("requestObject")
        return "taint patch" if isinstance(body, list) else "label apply"
    if resource == "pods" and sub == "eviction":
        return "eviction"
    if resource == "gpunodestates" and sub == "status":
        return "node status"
    if resource == "gpusharingpolicies" and sub == "status":
        return "policy status"
    return f"{event.get('verb')} {resource}" + (f"/{sub}" if sub else "")


def count_writes(
    events: Iterable[Mapping[str, Any]], *, user: str, since: float, until: float
) -> tuple[dict[str, int], dict[str, int]]:
    """(successful writes by kind, refused writes by kind) of ``user`` in [since, until]."""
    done: dict[str, int] = {}
    refused: dict[str, int] = {}
    for event in events:
        if event.get("user", {}).get("username") != user or event.get("verb") not in WRITE_VERBS:
            continue
        if not since <= moment(event) <= until:
            continue
        code = int((event.get("responseStatus") or {}).get("code", 0))
        into = done if 200 <= code < 300 else refused
        kind = write_kind(event)
        into[kind] = into.get(kind, 0) + 1
    return dict(sorted(done.items())), dict(sorted(refused.items()))


def most_changing(events: Iterable[Mapping[str, Any]], *, user: str, since: float) -> int:
    """The most nodes at once between their label apply and the next Verified status gpushare
    wrote for them, from the audit log (what maxUnavailable bounds, up to the moments between
    the cluster confirming a node and our status saying so)."""
    starts: list[tuple[float, str]] = []
    verified: dict[str, list[float]] = {}
    for event in events:
        if event.get("user", {}).get("username") != user or moment(event) < since:
            continue
        code = int((event.get("responseStatus") or {}).get("code", 0))
        if not 200 <= code < 300:
            continue
        name = str((event.get("objectRef") or {}).get("name"))
        kind = write_kind(event)
        if kind == "label apply":
            starts.append((moment(event), name))
        elif kind == "node status":
            for op in event.get("requestObject") or ():
                value = op.get("value") if isinstance(op, Mapping) else None
                if isinstance(value, Mapping) and value.get("phase") == "Verified":
                    verified.setdefault(name, []).append(moment(event))
    edges: list[tuple[float, int]] = []
    for start, name in starts:
        ends = [t for t in verified.get(name, ()) if t >= start]
        edges.append((start, 1))
        if ends:
            edges.append((min(ends), -1))
    most = now = 0
    for _, step in sorted(edges):
        now += step
        most = max(most, now)
    return most


def minimum_writes(*, nodes: int, pods: int) -> dict[str, int]:
    """The module docstring's minimum, by kind (status writes have none)."""
    return {"label apply": nodes, "eviction": pods, "taint patch": 2 * nodes}


def summary(
    writes: Mapping[str, int], minimum: Mapping[str, int], *, nodes: int
) -> dict[str, dict[str, Any]]:
    """Per kind: issued, minimum, and whether issued stays at the minimum."""
    rows: dict[str, dict[str, Any]] = {}
    for kind, least in minimum.items():
        issued = writes.get(kind, 0)
        rows[kind] = {"issued": issued, "minimum": least, "at_minimum": issued <= least}
    statuses = writes.get("node status", 0)
    rows["node status"] = {"issued": statuses, "per_node": round(statuses / max(nodes, 1), 2)}
    return rows


def layout_name(devices: Mapping[str, int]) -> str:
    """The mig-parted config name gpushare gives the policy's layout (the node label's value)."""
    return migconfigs.layout_name(
        policy_name=POLICY, layout=migconfigs.MigLayout.from_mapping(devices)
    )


async def _on_layout(sim: GpuClusterSimulator, layout: str) -> set[str]:
    """The nodes labelled with ``layout`` whose MIG manager says it succeeded."""
    selector = f"{MIG_CONFIG_LABEL}={layout},{MIG_STATE_LABEL}=success"
    status, body = await sim.client.get("/api/v1/nodes", params={"labelSelector": selector})
    assert status == 200, body
    return {item["metadata"]["name"] for item in body["items"]}


async def _settled_key(sim: GpuClusterSimulator, *, timeout: float) -> str:
    """The policy's config key once its status has seen its generation (a 500-node cold
    start takes longer than ``rolloutstate.settled_key``'s 30 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = await h.get_policy(sim.client, POLICY)
        status = body.get("status") or {}
        if status.get("observedGeneration") == body["metadata"]["generation"]:
            return str(status["configKey"])
        await asyncio.sleep(1.0)
    raise TimeoutError(f"{POLICY}'s status never saw its generation")


async def _verified(
    sim: GpuClusterSimulator,
    nodes: list[str],
    layout: str,
    *,
    log: Callable[[str], None],
    timeout: float = TIMEOUT,
) -> str:
    """Wait (logging every 15 s) until every node is Verified on the policy's current key
    and runs ``layout`` (the key alone can stay the same across a re-layout)."""
    key = await _settled_key(sim, timeout=timeout)
    started = last = time.monotonic()
    while time.monotonic() - started < timeout:
        done = await verified_on(sim, key) & await _on_layout(sim, layout)
        if set(nodes) <= done:
            return key
        if time.monotonic() - last > 15:
            last = time.monotonic()
            phases = await _phases(sim)
            log(f"  [mig] {last - started:.0f} s: {len(done)}/{len(nodes)} Verified; {phases}")
        await asyncio.sleep(1.0)
    raise TimeoutError(f"not every node Verified on {key} in {timeout:.0f} s")


async def _phases(sim: GpuClusterSimulator) -> dict[str, int]:
    """How many nodes are in each (phase, Ready reason): what a slow rollout waits for."""
    body = await h.ok(sim.client, "GET", f"{h.API}/gpunodestates")
    counts: dict[str, int] = {}
    for item in body["items"]:
        status = item.get("status") or {}
        ready = h.condition(status, "Ready")
        said = f"{status.get('phase')}/{ready.get('reason')}"
        if status.get("phase") != "Verified":
            said += f": {ready.get('message')}"
        counts[said] = counts.get(said, 0) + 1
    ready = h.condition((await h.get_policy(sim.client, POLICY)).get("status"), "Ready")
    counts[f"policy Ready: {ready.get('reason')}: {ready.get('message')}"] = 1
    return dict(sorted(counts.items()))


async def _quiet(variant: run.Variant, session: Any) -> None:
    """The operator has nothing dirty, twice 2 s apart (its policy status follows its nodes)."""
    for _ in range(600):
        if (await variant.probe(session)).get("dirty") == 0:
            await asyncio.sleep(2.0)
            if (await variant.probe(session)).get("dirty") == 0:
                return
        await asyncio.sleep(0.5)
    raise TimeoutError("the operator kept dirty objects")


async def _running_pods(sim: GpuClusterSimulator, nodes: list[str], every: int) -> int:
    names = nodes[::every]
    await asyncio.gather(
        *(
            create_pod(sim, POD_NAMESPACE, f"mig-{i:04d}", node, resource=POD_RESOURCE)
            for i, node in enumerate(names)
        )
    )

    async def running() -> bool:
        body = await h.ok(sim.client, "GET", f"/api/v1/namespaces/{POD_NAMESPACE}/pods")
        phases = [p["status"].get("phase") for p in body["items"]]
        return phases.count("Running") == len(names)

    deadline = time.monotonic() + 300
    while not await running():
        if time.monotonic() > deadline:
            raise TimeoutError("the MIG pods did not all run")
        await asyncio.sleep(1.0)
    return len(names)


async def _left_pods(sim: GpuClusterSimulator) -> int:
    body = await h.ok(sim.client, "GET", f"/api/v1/namespaces/{POD_NAMESPACE}/pods")
    return len(body["items"])


async def measure(
    plane: ControlPlane,
    *,
    nodes: int,
    pod_every: int,
    apply_seconds: float,
    out_dir: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    kubeconfig = plane.kubeconfig_for_user(USER, groups=("system:masters",))
    async with RawClient(kubeconfig=plane.admin_kubeconfig) as admin:
        await cluster.apply_crds(admin)
        for name in (cluster.DEVICE_PLUGIN_NAMESPACE, cluster.OPERATOR_NAMESPACE, POD_NAMESPACE):
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            await cluster.create(admin, "/api/v1/namespaces", body)
        bench = run.Bench(
            admin=admin,
            audit=cluster.AuditTail(plane.audit_log_path, [USER]),
            published=cluster.Published(),
            kubeconfig_for=lambda _: kubeconfig,
            nodes=nodes,
            pods=0,
            out_dir=out_dir,
            system_pids={},
            log=log,
        )
        ours = run.ours(
            user=USER,
            port=18095,
            qps=DEFAULTS.write_qps,
            burst=DEFAULTS.write_burst,
            identity="bench-gpushare-mig",
            propagation_delay=PROPAGATION_DELAY,
            max_unavailable=None,
            mismatch_timeout=None,
        )
        async with GpuClusterSimulator(
            kubeconfig=plane.admin_kubeconfig,
            namespace=cluster.DEVICE_PLUGIN_NAMESPACE,
            configmap=cluster.CONFIGMAP,
            mig_apply_seconds=apply_seconds,
            cleanup=False,
        ) as sim:
            t = time.monotonic()
            names = await sim.create_gpu_nodes(
                pool=POOL, count=nodes, prefix="h100", product=H100, gpus=8, mig_preset=False
            )
            await h.create_policy(admin, policy_body(BEFORE))
            log(f"  [mig] {nodes} H100 nodes in {time.monotonic() - t:.0f} s; priming")
            async with run.launched(bench, ours) as (_, session):
                t = time.monotonic()
                before_key = await _verified(sim, names, layout_name(BEFORE), log=log)
                prime_s = time.monotonic() - t
                pods = await _running_pods(sim, names, pod_every)
                await _quiet(ours, session)
                log(f"  [mig] Verified on {before_key} in {prime_s:.0f} s; {pods} pods running")
                since = time.time()
                started = time.monotonic()
                patch = {"mig": {"devices": devices_patch(BEFORE, AFTER)}}
                await h.patch_policy(admin, POLICY, patch)
                after_key = await _verified(sim, names, layout_name(AFTER), log=log)
                seconds = time.monotonic() - started
                await _quiet(ours, session)
                until = time.time()
            left = await _left_pods(sim)
            failures = dict(sim.mig.failures)
    events = await asyncio.to_thread(plane.audit_events)
    writes, refused = count_writes(events, user=USER, since=since, until=until)
    at_once = most_changing(events, user=USER, since=since)
    minimum = minimum_writes(nodes=nodes, pods=pods)
    return {
        "nodes": nodes,
        "gpus_per_node": 8,
        "layouts": [dict(BEFORE), dict(AFTER)],
        "keys": [before_key, after_key],
        "layout_names": [layout_name(BEFORE), layout_name(AFTER)],
        "rollout": dict(ROLLOUT),
        "cluster_max_unavailable": DEFAULTS.max_unavailable,
        "mig_apply_seconds": apply_seconds,
        "propagation_delay_s": PROPAGATION_DELAY,
        "pods": pods,
        "pods_left": left,
        "prime_s": round(prime_s, 1),
        "seconds": round(seconds, 1),
        "writes_by_kind": writes,
        "refused_by_kind": refused,
        "minimum_by_kind": minimum,
        "versus_minimum": summary(writes, minimum, nodes=nodes),
        "mig_manager_failures": len(failures),
        "most_changing_at_once": at_once,
        "budget_nodes": max(1, nodes * 10 // 100),
    }


def run_alone(
    *, nodes: int, pod_every: int, apply_seconds: float, out_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The row on a fresh control plane of its own, stopped afterwards."""
    plane = ControlPlane(audit_policy=AUDIT_POLICY, scheduler=False)
    plane.start()
    try:
        return asyncio.run(
            measure(
                plane,
                nodes=nodes,
                pod_every=pod_every,
                apply_seconds=apply_seconds,
                out_dir=out_dir,
                log=log,
            )
        )
    finally:
        plane.stop()


def render(result: Mapping[str, Any]) -> str:
    """The row's table in Markdown: time, then writes against the minimum by kind."""
    lines = [
        f"MIG re-layout of {result['nodes']:,} H100 nodes ({_layout(result['layouts'][0])} →"
        f" {_layout(result['layouts'][1])}, rollout {result['rollout']},"
        f" {result['pods']} GPU pods): {result['seconds']:.1f} s",
        "",
        "| Writes | Issued | Minimum | Result |",
        "|---|---|---|---|",
    ]
    for kind, row in result["versus_minimum"].items():
        if "minimum" in row:
            verdict = "PASS" if row["at_minimum"] else "MISS"
            lines.append(f"| {kind} | {row['issued']:,} | {row['minimum']:,} | {verdict} |")
        else:
            lines.append(f"| {kind} | {row['issued']:,} ({row['per_node']} per node) | — | — |")
    others = {
        k: v for k, v in result["writes_by_kind"].items() if k not in result["versus_minimum"]
    }
    lines += ["", f"other writes: {others}; refused: {result['refused_by_kind']}"]
    if "most_changing_at_once" in result:
        lines.append(
            f"most nodes changing at once (audit log): {result['most_changing_at_once']}"
            f" (maxUnavailable 10%: {result['budget_nodes']})"
        )
    return "\n".join(lines)


def _layout(devices: Mapping[str, int]) -> str:
    return "+".join(f"{n}x{p}" if n > 1 else p for p, n in devices.items())

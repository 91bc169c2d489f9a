"""A MIG layout changes only GPUs nothing can be bound to: the real control plane, the simulated
MIG manager, and the API server's audit log as the judge of every order claimed.

The layout label goes out only once our taint is in the operator's node cache and a pod list
taken after it shows the node idle; a node that registers with our taint keeps it until its
layout is Verified; a joiner without it is tainted and found idle before it is labelled.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Collection, Mapping
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.kube.events import EventRecorder
from gpushare_operator.kube.patching import Patches
from gpushare_operator.kube.sending import FIELD_MANAGER, Sender, Tokens
from gpushare_operator.reconcile.outcomes import Done, Retry
from gpushare_operator.reconcile.plans import NodeFacts, NodePlan
from gpushare_testing import apiobjects as h
from gpushare_testing import bodies
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import bind, create, delete_pod, read, small_pod
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.rolloutstate import all_verified
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

H100 = "NVIDIA-H100-80GB-HBM3"
MIG_LABEL = "nvidia.com/mig.config"
TAINT = "gpushare.dev/reconfiguring"
OUR_TAINT = {"key": TAINT, "effect": "NoSchedule"}
# A scheduler that chose the node before our taint and binds after it: no real scheduler
# serves this name, so the pod waits, unbound, until the test binds it as that one would.
FROZEN_SCHEDULER = "gpushare-test-frozen"
# One write every 4 s, one at a time: the operator's requests are far apart, so that the test
# binds its pod between our taint and whatever the operator sends next.
SLOW_WRITES = ("--write-qps", "0.25", "--write-burst", "1")


def mig_policy(name: str, *, pool: str, profile: str = "3g.40gb") -> dict[str, Any]:
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": pool}},
            "strategy": "MIG",
            "mig": {"profile": profile},
            "rollout": {"maxUnavailable": "100%", "canary": 0},
        },
    }


def layout_applies(
    plane: ControlPlane, node: str, *, since: float, users: Collection[str] = audit.USERS
) -> list[float]:
    """When each label apply of ``users`` that set the node's ``nvidia.com/mig.config`` landed."""
    ours = [
        e
        for e in plane.audit_events()
        if e["user"]["username"] in users and audit.moment(e) >= since and audit_ok(e)
    ]
    return [
        audit.moment(e)
        for e in audit.config_applies(ours, [node])
        if ((e["requestObject"].get("metadata") or {}).get("labels") or {}).get(MIG_LABEL)
    ]


def received(event: Mapping[str, Any]) -> float:
    stamp = str(event["requestReceivedTimestamp"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def mig_success(plane: ControlPlane, node: str, *, since: float) -> list[float]:
    """When the MIG manager (never the operator) reported success on ``node``."""
    return [
        audit.moment(e)
        for e in plane.audit_events()
        if e["objectRef"].get("resource") == "nodes"
        and e["objectRef"].get("name") == node
        and e["user"]["username"] != h.OPERATOR_USER
        and '"nvidia.com/mig.config.state":"success"'
        in json.dumps(e.get("requestObject"), separators=(",", ":"))
        and audit.moment(e) >= since
    ]


def audit_ok(event: Mapping[str, Any]) -> bool:
    return 200 <= int((event.get("responseStatus") or {}).get("code", 0)) < 300


def taint_patches(
    plane: ControlPlane, node: str, *, since: float, users: Collection[str] = audit.USERS
) -> list[tuple[float, str]]:
    """(when, "add" or "remove") of each patch of ours to the node's taints."""
    found = []
    for when, _, patch in audit.taint_writes(plane, [node], since=since, users=users):
        ops = {op.get("op") for op in patch}
        found.append((when, "add" if "add" in ops and TAINT in str(patch) else "remove"))
    return found


def pod_moments(plane: ControlPlane, namespace: str, pod: str) -> dict[str, float]:
    """When the pod was bound (its binding) and removed (its delete), from the audit log."""
    found: dict[str, float] = {}
    for event in plane.audit_events():
        ref = event["objectRef"]
        if ref.get("resource") != "pods" or ref.get("name") != pod or not audit_ok(event):
            continue
        if ref.get("namespace") != namespace:
            continue
        if ref.get("subresource") == "binding":
            found["bound"] = audit.moment(event)
        elif event["verb"] == "delete" and not ref.get("subresource"):
            found["deleted"] = audit.moment(event)
    return found


def node_pod_lists(plane: ControlPlane, user: str, node: str) -> list[float]:
    """When ``user`` asked for a list of the pods bound to ``node`` (the moment the API server
    received it: what the list shows was read after that)."""
    return [
        received(e)
        for e in plane.audit_events()
        if e["user"]["username"] == user
        and e["verb"] == "list"
        and (e.get("objectRef") or {}).get("resource") == "pods"
        and e.get("stage") == "ResponseComplete"
        and audit_ok(e)
        and f"spec.nodeName%3D{node}" in str(e.get("requestURI"))
    ]


async def status_of(sim: GpuClusterSimulator, node: str) -> dict[str, Any]:
    return dict(((await h.node_state(sim.client, node)) or {}).get("status") or {})


async def tainted(sim: GpuClusterSimulator, node: str) -> bool:
    taints = (await h.node(sim.client, node))["spec"].get("taints") or ()
    return any(t["key"] == TAINT for t in taints)


async def untainted(sim: GpuClusterSimulator, node: str) -> None:
    await eventually(
        lambda: tainted(sim, node), until=lambda t: not t, timeout=60, what=f"{node} untainted"
    )


async def reason_reached(sim: GpuClusterSimulator, node: str, reason: str) -> dict[str, Any]:
    return await eventually(
        lambda: status_of(sim, node),
        until=lambda st: h.condition(st, "Ready").get("reason") == reason,
        timeout=120,
        what=f"{node} {reason}",
    )


async def test_a_pod_bound_between_our_taint_and_our_label_holds_the_layout(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    """A scheduler that chose the node before our taint binds its pod after it (the test binds
    it through pods/binding the moment the taint shows): the layout label never goes out
    while that pod is on the node, the node waits for it, tainted, and changes once it is
    gone; the MIG manager never meets a busy GPU."""
    pool = h.unique("migrace")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, product=H100, gpus=1, mig_preset=False)
    pod = h.unique("late")
    body = small_pod(pod, gpus=1, selector={"pool": pool})
    body["spec"]["schedulerName"] = FROZEN_SCHEDULER
    await create(sim, pods_ns, body)
    since = time.time()
    name = h.unique("migrace")
    await h.add_policy(sim, policies, mig_policy(name, pool=pool))
    await start_operator("--device-plugin-namespace", namespace, *SLOW_WRITES)
    await eventually(lambda: tainted(sim, node), timeout=120, interval=0.02, what=f"{node} tainted")
    await bind(sim, pods_ns, pod, node)

    async def layout_or_wait() -> tuple[list[float], dict[str, Any]]:
        return layout_applies(control_plane, node, since=since), await status_of(sim, node)

    applied, held = await eventually(
        layout_or_wait,
        until=lambda seen: (
            bool(seen[0]) or h.condition(seen[1], "Ready").get("reason") == "WaitingForPods"
        ),
        timeout=120,
        what=f"{node} labelled, or waiting for the pod",
    )
    assert applied == [], "the layout label went out while the pod was bound"
    assert held["phase"] == "Pending" and held["idleWait"]["policy"] == name
    assert "1 GPU pod(s) on the node" in h.condition(held, "Ready")["message"]
    assert await tainted(sim, node)  # it waits tainted

    await delete_pod(sim, pods_ns, pod)
    await all_verified(sim, [node], name)
    await untainted(sim, node)
    moments = pod_moments(control_plane, pods_ns, pod)
    patches = taint_patches(control_plane, node, since=since)
    assert [op for _, op in patches] == ["add", "remove"]  # on until Verified, never lifted
    layouts = layout_applies(control_plane, node, since=since)
    # The window was there (the pod bound after our taint), and no layout went into it.
    taint_at = patches[0][0]
    assert taint_at < moments["bound"] < moments["deleted"] < min(layouts), (moments, layouts)
    assert sim.mig.failures.get(node) is None, sim.mig.failures
    assert [state for _, state in sim.mig.runs[node]] == ["success"]


async def test_a_node_registered_with_our_taint_keeps_it_until_its_layout_is_verified(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    """An autoscaled node joins a MIG pool with our taint as its registration taint (or
    Karpenter's startupTaints), while the pool's policy is paused: it keeps the taint while it
    waits, is labelled once resumed, and loses the taint only once Verified; the pod that
    asked for it binds after that, onto the new layout."""
    pool = h.unique("migjoin")
    [first] = await sim.create_gpu_nodes(
        pool=pool, count=1, prefix=f"{pool}-a", product=H100, gpus=1, mig_preset=False
    )
    name = h.unique("migjoin")
    await h.add_policy(sim, policies, mig_policy(name, pool=pool))
    await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, [first], name)
    await h.patch_policy(sim.client, name, {"paused": True})
    await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: h.condition(b.get("status"), "Paused").get("status") == "True",
        what=f"{name} paused",
    )

    joiner = f"{pool}-b-0000"
    pod = h.unique("wants-new")
    await create(sim, pods_ns, small_pod(pod, gpus=1, selector={"kubernetes.io/hostname": joiner}))
    since = time.time()
    node = bodies.gpu_node(name=joiner, pool=pool, product=H100, gpus=1, mig_preset=False)
    node["spec"]["taints"] = [dict(OUR_TAINT)]
    await sim.create_node(node)
    held = await reason_reached(sim, joiner, "Paused")
    assert held["phase"] == "Pending"
    assert taint_patches(control_plane, joiner, since=since) == []  # left on while paused
    assert await tainted(sim, joiner)
    assert (await read(sim, pods_ns, pod))["spec"].get("nodeName") is None

    await h.patch_policy(sim.client, name, {"paused": False})
    await all_verified(sim, [joiner], name)
    await untainted(sim, joiner)
    running = await eventually(
        lambda: read(sim, pods_ns, pod),
        until=lambda p: p["status"].get("phase") == "Running",
        what=f"{pod} running on {joiner}",
    )
    assert running["spec"]["nodeName"] == joiner
    [layout_at] = layout_applies(control_plane, joiner, since=since)
    patches = taint_patches(control_plane, joiner, since=since)
    assert [op for _, op in patches] == ["remove"]  # never added: it came with the node
    lifted_at = patches[0][0]
    confirmed_at = min(mig_success(control_plane, joiner, since=layout_at))
    bound_at = pod_moments(control_plane, pods_ns, pod)["bound"]
    # Lifted in the job that publishes Verified (the taint first, then the status).
    assert layout_at < confirmed_at < lifted_at < bound_at
    assert sim.mig.failures.get(joiner) is None, sim.mig.failures


async def test_a_joiner_without_our_taint_is_tainted_and_found_idle_before_its_layout(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    """A node joining an established MIG pool without our taint is configured at once, but in
    order, from the audit log (lists of pods are logged too): our taint, a list of the pods
    bound to the node asked for after it, then the layout label; the taint goes once the MIG
    manager reported success."""
    pool = h.unique("migjoin")
    [first] = await sim.create_gpu_nodes(
        pool=pool, count=1, prefix=f"{pool}-a", product=H100, gpus=1, mig_preset=False
    )
    name = h.unique("migjoin")
    await h.add_policy(sim, policies, mig_policy(name, pool=pool))
    await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, [first], name)

    since = time.time()
    [joiner] = await sim.create_gpu_nodes(
        pool=pool, count=1, prefix=f"{pool}-b", product=H100, gpus=1, mig_preset=False
    )
    await all_verified(sim, [joiner], name)
    await untainted(sim, joiner)
    patches = taint_patches(control_plane, joiner, since=since)
    assert [op for _, op in patches] == ["add", "remove"]
    (tainted_at, _), (lifted_at, _) = patches
    [layout_at] = layout_applies(control_plane, joiner, since=since)
    listed = [t for t in node_pod_lists(control_plane, h.OPERATOR_USER, joiner) if t > since]
    assert listed, "the operator never listed the joiner's pods"
    assert tainted_at < min(listed) < layout_at < lifted_at, (tainted_at, listed, layout_at)
    confirmed_at = min(mig_success(control_plane, joiner, since=layout_at))
    assert confirmed_at < lifted_at
    assert sim.mig.failures.get(joiner) is None, sim.mig.failures


class Leading:
    """The write loop's permit, for the kube layer driven alone: we lead, tokens are free."""

    def may_write(self) -> bool:
        return True

    def time_left(self) -> float:
        return 30.0

    async def token(self) -> bool:
        return True


def our_layout_applies(plane: ControlPlane, node: str, *, since: float) -> list[float]:
    """Label applies under our field manager that carried a MIG layout for ``node``."""
    return [
        audit.moment(e)
        for e in plane.audit_events()
        if (e.get("objectRef") or {}).get("name") == node
        and e["objectRef"].get("resource") == "nodes"
        and f"fieldManager={FIELD_MANAGER}" in str(e.get("requestURI"))
        and MIG_LABEL in str(e.get("requestObject"))
        and audit.moment(e) >= since
    ]


async def test_the_idle_check_sees_a_pod_the_node_cache_has_not(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    kube_api: client.ApiClient,
    pods_ns: str,
) -> None:
    """The kube layer alone against the real API server: a plan whose layout label waits on
    the idle check, from a cache that never saw the pod bound to the node.  The list finds it:
    no label goes out (audit log), the pod comes back as data and the job is to be retried;
    with the pod gone, the same plan labels the node."""
    pool = h.unique("migcheck")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, product=H100, gpus=1, mig_preset=False)
    pod = h.unique("unseen")
    await create(sim, pods_ns, small_pod(pod, gpus=1, node=node))
    cache = ClusterCache()
    cache.upsert_node(await h.node(sim.client, node))
    assert not cache.usage.node_pods(node)  # the cache has no pod there
    uid = cache.nodes[node].uid
    plan = NodePlan(
        node,
        uid,
        NodeFacts(None, None, None, None),
        labels={MIG_LABEL: "all-disabled"},
        idle_check=True,
    )
    leading = Leading()
    patches = Patches(
        sender=Sender(api=kube_api, permit=leading, recorder=EventRecorder(api=kube_api)),
        cache=cache,
    )
    since = time.time()
    busy = await patches.write(plan, tokens=Tokens(leading, prepaid=True))
    assert busy is not None and isinstance(busy.outcome, Retry), busy
    assert busy.busy == (f"{pods_ns}/{pod}",) and busy.labels is None
    assert our_layout_applies(control_plane, node, since=since) == []

    await delete_pod(sim, pods_ns, pod)
    idle = await patches.write(plan, tokens=Tokens(leading, prepaid=True))
    assert idle is not None and isinstance(idle.outcome, Done), idle
    assert idle.busy == () and idle.labels == plan.labels
    assert len(our_layout_applies(control_plane, node, since=since)) == 1
    labels = (await h.node(sim.client, node))["metadata"]["labels"]
    assert labels[MIG_LABEL] == "all-disabled"

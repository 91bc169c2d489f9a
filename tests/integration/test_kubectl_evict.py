"""``kubectl gpushare plan`` under ``podPolicy: Evict``, on the real control plane, run as users
run it (a child process).

What the plan says a change would evict is what the operator then evicts, and the
PodDisruptionBudget it names as refusing now is the one the API server's 429 names; an eviction
does not make the plan exit 2 (the same change under WaitForPods does); PodDisruptionBudgets
are read only when a policy as planned may evict (the victims are chosen by them, as the
operator chooses), and a user who may not list them gets the plugin's MissingPermission.
``status`` and ``explain node`` then show the node Evicting, and once the timeout passed,
EvictionBlocked.

The budgets' status is kube-controller-manager's disruption controller's, from the pods the
simulated kubelet runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpushare_testing import apiobjects as h
from gpushare_testing.components import READS_AUDITED
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import pod_manifest, wait_node_usage
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.pluginruns import PLUGIN_ROLE, plugin
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

RBAC = "/apis/rbac.authorization.k8s.io/v1"
PDBS = "/apis/policy/v1"
TIMEOUT = "20s"  # long enough to see the node Evicting, short enough to see it given up


async def gpu_pod(sim: GpuClusterSimulator, namespace: str, name: str, node: str) -> None:
    """A pod holding 2 slots on ``node``, labelled ``app: NAME`` so that a budget picks it."""
    body = pod_manifest(name, namespace=namespace, node=node, count=2)
    body["metadata"]["labels"] = {"app": name}
    await h.ok(sim.client, "POST", f"/api/v1/namespaces/{namespace}/pods", body)


async def budget(
    sim: GpuClusterSimulator, namespace: str, name: str, apps: list[str], allowed: int
) -> None:
    """A PodDisruptionBudget over the pods of ``apps`` allowing ``allowed`` disruptions, once
    the disruption controller says so."""
    selector = {"matchExpressions": [{"key": "app", "operator": "In", "values": apps}]}
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        # minAvailable, not maxUnavailable: a bare pod has no controller whose scale the
        # disruption controller could read (it would say InsufficientPods).
        "spec": {"minAvailable": len(apps) - allowed, "selector": selector},
    }
    path = f"{PDBS}/namespaces/{namespace}/poddisruptionbudgets"
    created = await h.ok(sim.client, "POST", path, body)
    generation = created["metadata"]["generation"]
    await eventually(  # kube-controller-manager's disruption controller has counted the pod
        lambda: h.ok(sim.client, "GET", f"{path}/{name}"),
        until=lambda pdb: (
            (pdb.get("status") or {}).get("observedGeneration") == generation
            and pdb["status"].get("disruptionsAllowed") == allowed
            and pdb["status"].get("currentHealthy") == len(apps)
        ),
        what=f"the disruption controller's status of {name}",
    )


def budget_reads(plane: ControlPlane, user: str) -> list[str]:
    return [
        e["requestURI"]
        for e in plane.audit_events()
        if e["user"]["username"] == user and "poddisruptionbudgets" in e["requestURI"]
    ]


async def logged(plane: ControlPlane, user: str) -> None:
    """Until the user's node list is in the audit log (the plan reads the budgets before it)."""

    async def lists() -> list[str]:
        return [
            e["requestURI"]
            for e in plane.audit_events()
            if e["user"]["username"] == user and e["requestURI"].startswith("/api/v1/nodes")
        ]

    await eventually(lists, until=bool, what=f"the requests of {user} in the audit log")


@dataclass
class Users:
    planner: str  # may do anything; its reads are audited
    waiter: str  # the same, for the plan under WaitForPods
    reader: str  # the plugin's least role: no PodDisruptionBudgets


def subject(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


@pytest.fixture
async def users(sim: GpuClusterSimulator) -> AsyncIterator[Users]:
    role, admins = h.unique("plugin-reader"), h.unique("evict-admins")
    found = Users(h.unique("planner"), h.unique("waiter"), h.unique("reader"))
    await h.ok(
        sim.client, "POST", f"{RBAC}/clusterroles", {**PLUGIN_ROLE, "metadata": {"name": role}}
    )
    bindings = {
        role: ([subject("User", found.reader)], role),
        admins: ([subject("User", found.planner), subject("User", found.waiter)], "cluster-admin"),
    }
    for name, (subjects, granted) in bindings.items():
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": granted,
            },
            "subjects": subjects,
        }
        await h.ok(sim.client, "POST", f"{RBAC}/clusterrolebindings", binding)
    try:
        yield found
    finally:
        await sim.client.delete(f"{RBAC}/clusterrolebindings/{admins}")
        for kind in ("clusterrolebindings", "clusterroles"):
            await sim.client.delete(f"{RBAC}/{kind}/{role}")


async def test_plan_names_the_pods_the_operator_evicts_and_the_budget_that_refuses_them(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    users: Users,
    tmp_path: Path,
) -> None:
    pool = h.unique("evict")
    [node, idle] = await sim.create_gpu_nodes(pool=pool, count=2, gpus=2)
    name = h.unique("evict")
    rollout = {**h.UNPACED, "podPolicy": "Evict", "eviction": {"timeout": TIMEOUT}}
    body = h.policy(name, pool=pool, replicas=4, rollout=rollout)  # 8 slots a node
    await h.add_policy(sim, policies, body)
    await start_operator("--device-plugin-namespace", namespace)
    for each in (node, idle):
        await h.wait_phase(sim, each, "Verified")
    for index in range(3):  # 6 slots, one pod after the other: worker-2 is the youngest
        await gpu_pod(sim, pods_ns, f"worker-{index}", node)
    await wait_node_usage(sim, node, 6, 3)
    # Every worker under a budget that allows nothing, so that the operator (kube-scheduler's
    # choice: pods no budget holds back go first) has no pod to evict but one it refuses.
    workers = [f"worker-{index}" for index in range(3)]
    await budget(sim, pods_ns, "guard", workers, 0)  # refuses: no disruption allowed
    await budget(sim, pods_ns, "loose", ["worker-1"], 1)

    body["spec"]["replicas"] = 2  # 4 slots: one pod of three must go
    manifest = tmp_path / "lower.yaml"
    manifest.write_text(yaml.safe_dump(body))
    common = ("--device-plugin-namespace", namespace)
    kubeconfig = control_plane.kubeconfig_for_user(users.planner, groups=(READS_AUDITED,))
    run = await plugin(kubeconfig, "plan", "-f", str(manifest), "-o", "json", *common)
    assert run.code == 0, run.stderr  # an eviction is no overcommit
    report = run.json()
    assert report["problems"] == [] and report["overcommitted"] == []
    evictions = {n["name"]: n["evictions"] for n in report["nodes"]}
    assert evictions == {
        node: [
            {
                "namespace": pods_ns,
                "name": "worker-2",
                "requests": {"nvidia.com/gpu": 2},
                "priority": 0,
                "blockedBy": [f"{pods_ns}/guard"],
            }
        ],
        idle: [],
    }
    assert report["rollout"]["evictions"] == 1
    await logged(control_plane, users.planner)
    assert budget_reads(control_plane, users.planner), "read when a policy may evict"
    text = await plugin(kubeconfig, "plan", "-f", str(manifest), *common)
    assert text.code == 0, text.stderr
    assert "Pods evicted before their node changes (podPolicy Evict):" in text.stdout
    assert f"{pods_ns}/worker-2" in text.stdout and "Result: clean (exit 0)." in text.stdout

    # The same change under WaitForPods: an overcommit (exit 2), and no budget read.
    waiting = {**body, "spec": {**body["spec"], "rollout": {**rollout, "podPolicy": "WaitForPods"}}}
    (tmp_path / "wait.yaml").write_text(yaml.safe_dump(waiting))
    quiet = control_plane.kubeconfig_for_user(users.waiter, groups=(READS_AUDITED,))
    wait = await plugin(quiet, "plan", "-f", str(tmp_path / "wait.yaml"), "-o", "json", *common)
    assert wait.code == 2, wait.stderr
    assert all(n["evictions"] == [] for n in wait.json()["nodes"])
    # A user who may do all a plan needs but list PodDisruptionBudgets: told which permission.
    denied = await plugin(
        control_plane.kubeconfig_for_user(users.reader), "plan", "-f", str(manifest), *common
    )
    assert denied.code == 1
    assert denied.stderr.startswith(
        "error: missing permission: list poddisruptionbudgets.policy in every namespace"
    ), denied.stderr
    assert "kubectl auth can-i list poddisruptionbudgets.policy --all-namespaces" in denied.stderr
    await logged(control_plane, users.waiter)
    assert budget_reads(control_plane, users.waiter) == []

    # Applied: the operator evicts what the plan said, and is refused by the budget it named.
    current = await h.get_policy(sim.client, name)
    current["spec"] = body["spec"]
    status, answer = await sim.client.request("PUT", f"{h.API}/gpusharingpolicies/{name}", current)
    assert status == 200, answer
    state = await eventually(
        lambda: h.node_state(sim.client, node),
        until=lambda s: bool(((s or {}).get("status") or {}).get("eviction", {}).get("blockedBy")),
        what="the operator's eviction refused by the budget",
    )
    eviction = state["status"]["eviction"]
    assert state["status"]["phase"] == "Evicting"
    assert eviction["pods"] == [f"{pods_ns}/worker-2"]
    assert eviction["blockedBy"] == [f"{pods_ns}/guard"]

    shown = await plugin(kubeconfig, "status", "--policy", name, "-o", "json", *common)
    assert shown.code == 0, shown.stderr
    rows = {n["name"]: n for n in shown.json()["nodes"]}
    assert rows[node]["phase"] == "Evicting"
    assert rows[node]["eviction"]["pods"] == [f"{pods_ns}/worker-2"]
    assert rows[node]["eviction"]["blocked"] is False
    table = await plugin(kubeconfig, "status", "--policy", name, *common)
    assert f"{node}: evicting {pods_ns}/worker-2; refused by PodDisruptionBudget(s)" in table.stdout
    explained = await plugin(kubeconfig, "explain", "node", node, *common)
    assert "Phase: Evicting" in explained.stdout, explained.stdout
    assert "once its pods are gone:" in explained.stdout

    # Given up after the timeout: EvictionBlocked, the node on its old config.
    await eventually(
        lambda: h.node_state(sim.client, node),
        until=lambda s: (
            h.condition((s or {}).get("status"), "EvictionBlocked").get("status") == "True"
        ),
        timeout=60,
        what="the node given up after eviction.timeout",
    )
    explained = await plugin(kubeconfig, "explain", "node", node, "-o", "json", *common)
    assert explained.code == 0, explained.stderr
    phase = explained.json()["phase"]
    blocked = [c for c in phase["conditions"] if c["type"] == "EvictionBlocked"]
    assert blocked and blocked[0]["reason"] == "EvictionTimedOut"
    assert phase["eviction"]["blocked"] and phase["eviction"]["blockedBy"] == [f"{pods_ns}/guard"]
    text = await plugin(kubeconfig, "explain", "node", node, *common)
    assert "eviction given up (EvictionTimedOut)" in text.stdout

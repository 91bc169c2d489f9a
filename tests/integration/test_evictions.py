"""podPolicy Evict on the real control plane: kube-controller-manager's ReplicaSet and disruption
controllers keep the Deployments and PodDisruptionBudgets, kube-scheduler places the
replacements, the simulated kubelet runs and terminates the pods.  Every claim about what
gpushare asked for, and when, is read from the API server's audit log.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_testing import apiobjects as h
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import create_until_accepted, install_crds
from gpushare_testing.gpupods import create, small_pod
from gpushare_testing.operators import OperatorFactory, RunningOperator
from gpushare_testing.pluginruns import plugin
from gpushare_testing.replicas import USERS, Replicas
from gpushare_testing.rolloutstate import all_verified, paced, rollout_state
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

GPU = "nvidia.com/gpu"
TAINT = "gpushare.dev/reconfiguring"
RUN = "example.com/test-run"


def deployment(name: str, *, replicas: int, run: str) -> dict[str, Any]:
    """GPU pods asking for one time-sliced nvidia.com/gpu each, quick to stop (1 s grace), on
    this test's nodes only (labelled ``run``)."""
    pod = small_pod(name, gpus=1, selector={RUN: run})
    spec = pod["spec"] | {"terminationGracePeriodSeconds": 1}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def budget(name: str, **rule: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}}, **rule},
    }


async def apply(sim: GpuClusterSimulator, namespace: str, body: dict[str, Any]) -> None:
    group = "apis/apps/v1" if body["kind"] in ("Deployment", "DaemonSet") else "apis/policy/v1"
    plural = {"Deployment": "deployments", "DaemonSet": "daemonsets"}.get(
        body["kind"], "poddisruptionbudgets"
    )
    await h.ok(sim.client, "POST", f"/{group}/namespaces/{namespace}/{plural}", body)


async def pods_of(sim: GpuClusterSimulator, namespace: str, app: str) -> list[dict[str, Any]]:
    _, body = await sim.client.get(
        f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": f"app={app}"}
    )
    return list(body["items"])


def running(pods: list[dict[str, Any]]) -> dict[str, str]:
    """name -> node of the pods that run and are not on their way out."""
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


async def settled(
    sim: GpuClusterSimulator, namespace: str, app: str, replicas: int
) -> dict[str, str]:
    """name -> node of ``replicas`` running pods of ``app``, once no other is left."""
    pods = await eventually(
        lambda: pods_of(sim, namespace, app),
        until=lambda pods: len(running(pods)) == replicas == len(pods),
        timeout=120,
        what=f"{replicas} pods of {app} running",
    )
    return running(pods)


async def pod_events(sim: GpuClusterSimulator, namespace: str, pod: str) -> list[dict[str, Any]]:
    body = await h.ok(sim.client, "GET", f"/api/v1/namespaces/{namespace}/events")
    return [e for e in body["items"] if e["involvedObject"].get("name") == pod]


async def evictions_counted(operator: RunningOperator) -> dict[str, float]:
    """``gpushare_evictions_total`` by result, from the operator's /metrics."""
    prefix = "gpushare_evictions_total{result="
    return {
        name[len(prefix) : -1]: value
        for name, value in (await operator.metrics()).items()
        if name.startswith(prefix)
    }


def evictions(
    plane: ControlPlane, *, since: float, users: Collection[str] = (h.OPERATOR_USER,)
) -> list[tuple[float, str, int]]:
    """(when, pod, HTTP code) of each eviction gpushare (as ``users``) asked for."""
    found = []
    for event in plane.audit_events():
        ref = event["objectRef"]
        if event["user"]["username"] not in users or ref.get("resource") != "pods":
            continue
        if ref.get("subresource") == "eviction" and event["verb"] == "create":
            code = int((event.get("responseStatus") or {}).get("code", 0))
            if audit.moment(event) >= since:
                found.append((audit.moment(event), str(ref["name"]), code))
    return sorted(found)


def eviction_options(plane: ControlPlane, *, since: float) -> dict[str, dict[str, Any]]:
    """pod -> the deleteOptions of the last eviction gpushare asked for (the audit log keeps
    eviction bodies)."""
    found: dict[str, dict[str, Any]] = {}
    for event in plane.audit_events():
        ref = event["objectRef"]
        if event["user"]["username"] != h.OPERATOR_USER or ref.get("subresource") != "eviction":
            continue
        if event["verb"] == "create" and audit.moment(event) >= since:
            body = event.get("requestObject") or {}
            found[str(ref["name"])] = dict(body.get("deleteOptions") or {})
    return found


def pod_writes_by_us(plane: ControlPlane, *, since: float) -> list[Mapping[str, Any]]:
    """Every request gpushare made on pods since the test began that was not an eviction
    (there must be none).  The log is the session's: an earlier test's MIG change lists a
    node's pods (the idle check), and that is not this test's doing."""
    return [
        e
        for e in plane.audit_events()
        if e["user"]["username"] == h.OPERATOR_USER
        and audit.moment(e) >= since
        and e["objectRef"].get("resource") == "pods"
        and e["objectRef"].get("subresource") != "eviction"
    ]


def gone_at(plane: ControlPlane, pod: str) -> float:
    """When the pod was finally deleted (kubelet's delete with grace 0, once it stopped)."""
    deletes = [
        audit.moment(e)
        for e in plane.audit_events()
        if e["objectRef"].get("resource") == "pods"
        and e["objectRef"].get("name") == pod
        and not e["objectRef"].get("subresource")
        and e["verb"] == "delete"
        and 200 <= int((e.get("responseStatus") or {}).get("code", 0)) < 300
    ]
    return max(deletes, default=float("inf"))


def tainted_between(plane: ControlPlane, node: str, *, since: float) -> list[tuple[float, float]]:
    """(from, to) of each time our taint was on ``node``, from our taint patches."""
    spans, start = [], None
    for when, _, patch in audit.taint_writes(plane, [node], since=since):
        adds = any(op.get("op") == "add" and TAINT in str(op.get("value")) for op in patch)
        if adds and start is None:
            start = when
        elif not adds and start is not None:
            spans.append((start, when))
            start = None
    if start is not None:
        spans.append((start, float("inf")))
    return spans


async def test_evict_drains_under_the_budget_and_replacements_land_elsewhere(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("evict")
    mine = {RUN: pool}
    changing = sorted(await sim.create_gpu_nodes(pool=pool, count=2, gpus=1, extra_labels=mine))
    name = h.unique("evict")
    rollout = {"maxUnavailable": 1, "canary": 0, "podPolicy": "Evict"}
    await h.add_policy(sim, policies, paced(name, pool=pool, replicas=4, **rollout))
    operator = await start_operator("--device-plugin-namespace", namespace)
    old = await all_verified(sim, changing, name)
    app = h.unique("web")
    await apply(sim, pods_ns, budget(app, maxUnavailable=1))
    await apply(sim, pods_ns, deployment(app, replicas=6, run=pool))
    first = await settled(sim, pods_ns, app, 6)  # 3 and 3: 6 of the pool's 8 slots
    assert sorted(set(first.values())) == changing
    # Room elsewhere for what must go: two plain GPU nodes no policy selects.
    spare = await sim.create_gpu_nodes(pool=h.unique("spare"), count=2, gpus=2, extra_labels=mine)

    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})  # 2 slots a node: 1 pod must go
    evicting = await eventually(
        lambda: h.node_state(sim.client, changing[0]),
        until=lambda s: (s or {}).get("status", {}).get("phase") == "Evicting",
        what=f"{changing[0]} Evicting",
    )
    assert evicting is not None
    assert evicting["status"]["eviction"]["policy"] == name
    assert evicting["status"]["eviction"]["pods"]  # the pods left, by name
    new = await all_verified(sim, changing, name, timeout=180)
    assert new != old
    after = await settled(sim, pods_ns, app, 6)

    # The API server's account: only evictions, never a delete, never anything else.
    assert pod_writes_by_us(control_plane, since=since) == []
    asked = evictions(control_plane, since=since)
    accepted = [(when, pod) for when, pod, code in asked if 200 <= code < 300]
    assert all(code in (201, 200, 429) for _, _, code in asked), asked
    moved = sorted(set(first) - set(after))
    assert sorted(pod for _, pod in accepted) == moved  # each evicted once; none else went
    assert len(moved) == 2  # the fewest: one per node (3 pods, 2 slots)
    # One at a time, as the budget allows: before the next eviction, the last evicted pod's
    # replacement was bound and running (every pod of the Deployment healthy again).
    binds = audit.bindings(control_plane, [*changing, *spare], since=since)
    for (earlier, _), (later, _) in itertools.pairwise(accepted):
        assert any(earlier < when < later for when, _ in binds), (earlier, later, binds)
    # Each node changed only once its evicted pod was gone; no replacement on a tainted node.
    changes = audit.label_writes(control_plane, changing, since=since, key=new)
    for _, pod in accepted:
        node = first[pod]
        changed_at = min(t for t, n, _ in changes if n == node)
        assert gone_at(control_plane, pod) < changed_at, (pod, node)
    for node in changing:
        spans = tainted_between(control_plane, node, since=since)
        assert spans, f"{node} was never tainted before its evictions"
        first_eviction = min(w for w, p in accepted if first[p] == node)
        assert any(start < first_eviction for start, _ in spans)
        for when, bound in binds:
            if bound == node:
                assert not any(start <= when <= end for start, end in spans), (node, when)
    # Seen from outside: an Event on each evicted pod, and counters.
    for _, pod in accepted:
        events = await pod_events(sim, pods_ns, pod)
        messages = [e["message"] for e in events if e["reason"] == "Evicted"]
        assert messages == [f"Evicted by gpushare: policy {name} changes node {first[pod]}"]
    counters = await evictions_counted(operator)
    assert counters["started"] == len(accepted)
    assert counters["done"] == len(accepted)


async def test_a_budget_that_allows_nothing_blocks_the_node_and_the_rest_goes_on(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("blocked")
    mine = {RUN: pool}
    [stuck] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=1, extra_labels=mine)
    name = h.unique("blocked")
    rollout = {
        "maxUnavailable": 1,
        "canary": 0,
        "podPolicy": "Evict",
        "eviction": {"timeout": "15s"},
    }
    await h.add_policy(sim, policies, paced(name, pool=pool, replicas=4, **rollout))
    operator = await start_operator("--device-plugin-namespace", namespace)
    old = await all_verified(sim, [stuck], name)
    app = h.unique("db")
    await apply(sim, pods_ns, budget(app, minAvailable=2))
    await apply(sim, pods_ns, deployment(app, replicas=2, run=pool))
    await settled(sim, pods_ns, app, 2)
    # Beside them: a DaemonSet's GPU pod and a pod that holds no GPU: never evicted.
    daemon = h.unique("dcgm")
    template = small_pod(daemon, gpus=1)
    template["metadata"] = {"labels": {"app": daemon}}
    template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": stuck}
    await apply(
        sim,
        pods_ns,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": daemon},
            "spec": {"selector": {"matchLabels": {"app": daemon}}, "template": template},
        },
    )
    await settled(sim, pods_ns, daemon, 1)
    cpu = small_pod(h.unique("cpu"), gpus=0, node=stuck)
    cpu["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    await create(sim, pods_ns, cpu)
    # 3 of the node's 4 slots held; 2 after the change: one Deployment pod must go.
    [other] = await sim.create_gpu_nodes(
        pool=pool, count=1, gpus=1, prefix=f"{pool}-b", extra_labels=mine
    )
    await all_verified(sim, [stuck, other], name)

    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})
    new = await all_verified(sim, [other], name)  # the rest goes on
    blocked = await eventually(
        lambda: h.node_state(sim.client, stuck),
        until=lambda s: (
            h.condition((s or {}).get("status"), "EvictionBlocked").get("status") == "True"
        ),
        timeout=60,
        what=f"{stuck} EvictionBlocked",
    )
    assert blocked is not None
    condition = h.condition(blocked["status"], "EvictionBlocked")
    assert condition["reason"] == "EvictionTimedOut"
    assert f"{pods_ns}/{app}" in condition["message"]  # the budget that refused, by name
    labels = (await h.node(sim.client, stuck))["metadata"]["labels"]
    assert labels[h.CONFIG_LABEL] == old != new  # unchanged
    assert blocked["status"]["phase"] == "Pending"
    node = await h.node(sim.client, stuck)
    assert not any(t["key"] == TAINT for t in node["spec"].get("taints") or ())  # given back
    # The rollout reports it: done but for the given-up node, named with why.
    rollout = await rollout_state(sim, name, "WaitingForPods")
    assert rollout["waitingOn"] == [stuck]
    assert "could not be evicted in time" in rollout["message"], rollout
    asked = evictions(control_plane, since=since)
    assert asked and all(code == 429 for _, _, code in asked), asked
    assert {pod for _, pod, _ in asked} <= set(running(await pods_of(sim, pods_ns, app)))
    assert pod_writes_by_us(control_plane, since=since) == []
    events = await eventually(
        lambda: h.events_about(sim.client, stuck),
        until=lambda es: any(e["reason"] == "EvictionBlocked" for e in es),
        what=f"an EvictionBlocked Event about {stuck}",
    )
    about = {(e["reason"], e["type"], e["involvedObject"]["kind"]) for e in events}
    assert ("EvictionBlocked", "Warning", "GPUNodeState") in about
    assert ("Evicting", "Normal", "GPUNodeState") in about
    counters = await evictions_counted(operator)
    assert counters["blocked"] >= 1 and counters["started"] == 0


async def test_a_new_leader_gives_the_drain_up_when_the_first_one_would_have(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    pods_ns: str,
    policies: list[str],
    start_replicas: Callable[[], Awaitable[Replicas]],
) -> None:
    """The eviction's deadline is in the GPUNodeState: a failover does not restart it."""
    pool = h.unique("handover")
    mine = {RUN: pool}
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=1, extra_labels=mine)
    name = h.unique("handover")
    timeout = 30
    rollout = {"canary": 0, "podPolicy": "Evict", "eviction": {"timeout": f"{timeout}s"}}
    await h.add_policy(sim, policies, paced(name, pool=pool, replicas=4, **rollout))
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    old = await all_verified(sim, [node], name)
    app = h.unique("db")
    await apply(sim, pods_ns, budget(app, minAvailable=3))  # allows no eviction at all
    await apply(sim, pods_ns, deployment(app, replicas=3, run=pool))
    await settled(sim, pods_ns, app, 3)

    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})  # 3 pods, 2 slots: one must go
    evicting = await eventually(
        lambda: h.node_state(sim.client, node),
        until=lambda s: (s or {}).get("status", {}).get("phase") == "Evicting",
        what=f"{node} Evicting",
    )
    assert evicting is not None
    started = evicting["status"]["eviction"]["startedAt"]
    dying = replicas.running[leader]
    dying.proc.send_signal(signal.SIGKILL)  # mid-drain: its refusals and back-off are lost
    assert await dying.exited() == -signal.SIGKILL
    blocked = await eventually(
        lambda: h.node_state(sim.client, node),
        until=lambda s: bool(((s or {}).get("status") or {}).get("eviction", {}).get("blockedAt")),
        timeout=90,
        what=f"{node} given up",
    )
    assert blocked is not None
    eviction = blocked["status"]["eviction"]
    assert eviction["startedAt"] == started  # the new leader read it, and kept it
    waited = audit.moment({"stageTimestamp": eviction["blockedAt"]}) - audit.moment(
        {"stageTimestamp": started}
    )
    # Given up at the first leader's deadline (stamps have whole seconds), not a timeout
    # after the new leader took over (at least a Lease duration after the kill).
    assert timeout - 1 <= waited <= timeout + 3, waited
    labels = (await h.node(sim.client, node))["metadata"]["labels"]
    assert labels[h.CONFIG_LABEL] == old
    by_new = evictions(control_plane, since=since, users=[USERS[follower]])
    assert by_new and all(code == 429 for _, _, code in by_new), "the new leader asked too"


async def test_a_grace_period_of_0_stored_under_an_older_crd_is_read_as_1_and_said_so(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    relaxed_crd: None,
    start_operator: OperatorFactory,
) -> None:
    """An eviction is never a deletion: ``gracePeriodSeconds: 0`` (which an older CRD let in,
    and CRD ratcheting keeps through later edits) is asked as 1, so that the API server waits
    for the kubelet, and the policy says so (a condition and an Event)."""
    pool = h.unique("grace")
    mine = {RUN: pool}
    [changing] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=1, extra_labels=mine)
    name = h.unique("grace")
    rollout = {"canary": 0, "podPolicy": "Evict", "eviction": {"gracePeriodSeconds": 0}}
    await create_until_accepted(sim.client, paced(name, pool=pool, replicas=4, **rollout))
    policies.append(name)
    install_crds(control_plane)  # the current CRDs again: the object stays as it was stored
    await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, [changing], name)
    adjusted = await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: h.condition(b.get("status"), "SpecAdjusted").get("status") == "True",
        what="SpecAdjusted on the policy",
    )
    condition = h.condition(adjusted["status"], "SpecAdjusted")
    assert condition["reason"] == "GracePeriodRaised"
    assert "gracePeriodSeconds is 0" in condition["message"]
    assert "evictions ask for 1 s instead" in condition["message"]
    events = await eventually(
        lambda: h.events_about(sim.client, name),
        until=lambda es: any(e["reason"] == "SpecAdjusted" for e in es),
        what=f"a SpecAdjusted Event about {name}",
    )
    [event] = [e for e in events if e["reason"] == "SpecAdjusted"]
    assert event["type"] == "Warning" and event["message"] == condition["message"]
    app = h.unique("web")
    await apply(sim, pods_ns, deployment(app, replicas=3, run=pool))
    first = await settled(sim, pods_ns, app, 3)
    await sim.create_gpu_nodes(pool=h.unique("spare"), count=1, gpus=1, extra_labels=mine)

    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})  # the 0 ratchets through the edit
    await all_verified(sim, [changing], name)
    asked = eviction_options(control_plane, since=since)
    assert sorted(asked) == sorted(set(first) - set(await settled(sim, pods_ns, app, 3)))
    assert len(asked) == 1, asked  # 3 pods, 2 slots: the fewest that must go
    [(pod, options)] = asked.items()
    assert options["gracePeriodSeconds"] == 1, options
    # The pod record outlived the eviction: deleted by its kubelet once it had stopped.
    [(evicted_at, _, code)] = evictions(control_plane, since=since)
    assert code == 201 and evicted_at < gone_at(control_plane, pod) < float("inf")
    assert pod_writes_by_us(control_plane, since=since) == []


async def guarded(sim: GpuClusterSimulator, namespace: str, app: str, *, allowed: int) -> None:
    """A PodDisruptionBudget over ``app``, once the disruption controller says it allows
    ``allowed`` disruptions."""
    await apply(sim, namespace, budget(app, minAvailable=1 - allowed))
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{app}"
    await eventually(
        lambda: h.ok(sim.client, "GET", path),
        until=lambda pdb: (
            (pdb.get("status") or {}).get("observedGeneration") == pdb["metadata"]["generation"]
            and pdb["status"].get("currentHealthy") == 1
            and pdb["status"].get("disruptionsAllowed") == allowed
        ),
        what=f"the disruption controller's status of {app}",
    )


async def test_the_pod_a_budget_protects_stays_and_an_unprotected_older_one_goes(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    tmp_path: Path,
) -> None:
    """kube-scheduler's choice of preemption victims: one slot to free, an older pod X no
    budget protects and a younger pod Y whose budget allows nothing.  By importance alone Y
    would go, its eviction refused (429) until the node is given up (EvictionTimedOut); as the
    scheduler chooses, X goes, the node changes, Y stays.  The plugin's plan says the same."""
    pool = h.unique("victims")
    mine = {RUN: pool}
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=1, extra_labels=mine)
    name = h.unique("victims")
    rollout = {"canary": 0, "podPolicy": "Evict", "eviction": {"timeout": "30s"}}
    body = paced(name, pool=pool, replicas=2, **rollout)  # 2 slots
    await h.add_policy(sim, policies, body)
    await start_operator("--device-plugin-namespace", namespace)
    old = await all_verified(sim, [node], name)
    x, y = h.unique("x"), h.unique("y")
    await apply(sim, pods_ns, deployment(x, replicas=1, run=pool))
    [older] = await settled(sim, pods_ns, x, 1)
    [x_pod] = await pods_of(sim, pods_ns, x)
    born = audit.moment({"stageTimestamp": x_pod["metadata"]["creationTimestamp"]})

    async def now() -> float:
        return time.time()

    # Creation times have whole seconds: Y is created in a later one, so X is the older.
    await eventually(now, until=lambda t: t >= born + 1.5, what="a second after X was created")
    await apply(sim, pods_ns, deployment(y, replicas=1, run=pool))
    [younger] = await settled(sim, pods_ns, y, 1)
    [y_pod] = await pods_of(sim, pods_ns, y)
    stamps = x_pod["metadata"]["creationTimestamp"], y_pod["metadata"]["creationTimestamp"]
    assert stamps[0] < stamps[1], stamps  # X is the more important by age
    await guarded(sim, pods_ns, y, allowed=0)

    # Exclusive: 1 slot on the node's one GPU; one of the two pods must go.
    body["spec"] = {k: v for k, v in body["spec"].items() if k != "replicas"}
    body["spec"]["strategy"] = "Exclusive"
    manifest = tmp_path / "exclusive.yaml"
    manifest.write_text(yaml.safe_dump(body))
    args = ("plan", "-f", str(manifest), "-o", "json", "--device-plugin-namespace", namespace)
    run = await plugin(control_plane.admin_kubeconfig, *args)
    assert run.code == 0, run.stderr
    [planned] = [n["evictions"] for n in run.json()["nodes"] if n["name"] == node]
    assert [(e["name"], e["blockedBy"]) for e in planned] == [(older, [])]

    await sim.create_gpu_nodes(pool=h.unique("spare"), count=1, gpus=1, extra_labels=mine)
    since = time.time()
    await h.patch_policy(sim.client, name, {"strategy": "Exclusive", "replicas": None})
    state = await eventually(
        lambda: h.node_state(sim.client, node),
        until=lambda s: (
            (h.phase_of(s) == "Verified" and s is not None and s["status"].get("configKey") != old)
            or h.condition((s or {}).get("status"), "EvictionBlocked").get("status") == "True"
        ),
        timeout=120,
        what=f"{node} changed, or given up",
    )
    assert state is not None
    blocked = h.condition(state["status"], "EvictionBlocked")
    assert blocked.get("status") != "True", blocked  # today's main: Y chosen, EvictionTimedOut
    assert state["status"]["phase"] == "Verified"
    asked = evictions(control_plane, since=since)
    assert [(pod, code) for _, pod, code in asked] == [(older, 201)], asked  # X alone, at once
    assert younger in running(await pods_of(sim, pods_ns, y))  # Y stays, on the node
    assert running(await pods_of(sim, pods_ns, y))[younger] == node
    assert pod_writes_by_us(control_plane, since=since) == []

"""Pods that go: evicted under a PodDisruptionBudget, stopped by the simulated kubelet, made again.

The control plane runs kube-controller-manager's Deployment, ReplicaSet, disruption and
DaemonSet controllers and kube-scheduler; the simulator plays kubelet (``podagent``,
``podtermination``): a deleted pod is stopped only after its whole grace period, written
``Failed`` and then deleted for good.  No operator runs here: these are the cluster's own
behaviours that ``podPolicy: Evict`` lives with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gpushare_testing import apiobjects as h
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create, read, small_pod
from gpushare_testing.podagent import KUBELET_USER_AGENT
from gpushare_testing.rawclient import RawClient
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

GPU = "nvidia.com/gpu"
GRACE = 2
CONTROLLER_MANAGER = "kube-controller-manager/"


def template(app: str, *, selector: dict[str, str]) -> dict[str, Any]:
    """A pod template of one container asking for one GPU, stopped within ``GRACE`` seconds."""
    container = {
        "name": "cuda",
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "resources": {"limits": {GPU: "1"}, "requests": {"cpu": "100m"}},
    }
    spec: dict[str, Any] = {"containers": [container], "nodeSelector": selector}
    spec["terminationGracePeriodSeconds"] = GRACE
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    running = (pod.get("status") or {}).get("phase") == "Running"
    return running and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


async def pods_of(client: RawClient, namespace: str, app: str) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{app}"
    return list((await h.ok(client, "GET", path))["items"])


async def budget(client: RawClient, namespace: str, name: str) -> dict[str, Any]:
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{name}"
    return dict(await h.ok(client, "GET", path))


def allowed(pdb: dict[str, Any]) -> int | None:
    """``disruptionsAllowed``, once the disruption controller has seen this generation."""
    status = pdb.get("status") or {}
    if status.get("observedGeneration") != pdb["metadata"]["generation"]:
        return None
    return int(status.get("disruptionsAllowed", 0))


async def evict(client: RawClient, namespace: str, name: str) -> tuple[int, Any]:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    return await client.post(f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)


async def last_state(client: RawClient, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as it was when it was deleted: the object of the watch's DELETED event."""
    params = {"fieldSelector": f"metadata.name={pod['metadata']['name']}"}
    params["resourceVersion"] = pod["metadata"]["resourceVersion"]
    async with contextlib.aclosing(
        client.watch(f"/api/v1/namespaces/{namespace}/pods", params=params)
    ) as events:
        async for event in events:
            if event["type"] == "DELETED":
                return dict(event["object"])
    raise AssertionError("the watch ended before the pod was deleted")


async def budget_course(client: RawClient, pdb: dict[str, Any]) -> list[int]:
    """``disruptionsAllowed`` in ``pdb`` and each version after it, without repeats, until it
    has gone down and come back up (from a watch: every write, the eviction's own included)."""
    metadata = pdb["metadata"]
    params = {"fieldSelector": f"metadata.name={metadata['name']}"}
    params["resourceVersion"] = metadata["resourceVersion"]
    path = f"/apis/policy/v1/namespaces/{metadata['namespace']}/poddisruptionbudgets"
    first = allowed(pdb)
    assert first is not None
    values = [first]
    async with contextlib.aclosing(client.watch(path, params=params)) as events:
        async for event in events:
            value = allowed(event["object"])
            if value is not None and values[-1] != value:
                values.append(value)
            if len(values) > 2 and values[-1] >= first:
                return values
    raise AssertionError(f"the watch ended at {values}")


def budget_writes(plane: ControlPlane, namespace: str, name: str) -> list[int]:
    """``disruptionsAllowed`` in each status write of the disruption controller, in order,
    without repeats (from the audit log's request bodies)."""
    values: list[int] = []
    for event in plane.audit_events():
        ref = event["objectRef"]
        if (ref.get("resource"), ref.get("subresource")) != ("poddisruptionbudgets", "status"):
            continue
        if (ref.get("namespace"), ref.get("name")) != (namespace, name):
            continue
        if not event.get("userAgent", "").startswith(CONTROLLER_MANAGER):
            continue
        value = int(event["requestObject"]["status"].get("disruptionsAllowed", 0))
        if not values or values[-1] != value:
            values.append(value)
    return values


async def delete_and_wait(client: RawClient, path: str) -> None:
    """Delete in the foreground (the dependents first, each stopped by the simulated kubelet)
    and wait until the object is gone."""
    body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
    status, answer = await client.request("DELETE", path, body)
    assert status in (200, 202, 404), answer

    async def gone() -> bool:
        return (await client.get(path))[0] == 404

    await eventually(gone, timeout=60, what=f"{path} to be gone")


async def test_an_evicted_deployment_pod_stops_after_its_grace_period_and_is_replaced(
    control_plane: ControlPlane, sim: GpuClusterSimulator, pods_ns: str
) -> None:
    pool = h.unique("evict")
    nodes = await sim.create_gpu_nodes(pool=pool, count=2, gpus=1)
    app, client = f"{pool}-app", sim.client
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": app}},
            "template": template(app, selector={"pool": pool}),
        },
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": app},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": app}}},
    }
    deployments = f"/apis/apps/v1/namespaces/{pods_ns}/deployments"
    await h.ok(client, "POST", f"/apis/policy/v1/namespaces/{pods_ns}/poddisruptionbudgets", pdb)
    await h.ok(client, "POST", deployments, deployment)
    try:
        running = await eventually(
            lambda: pods_of(client, pods_ns, app),
            until=lambda pods: len(pods) == 2 and all(ready(p) for p in pods),
            what="both replicas to run",
        )
        # One GPU per node: each replica has a node of its own, and a replacement can only
        # go where an evicted pod has gone from.
        assert sorted(p["spec"]["nodeName"] for p in running) == nodes
        spendable = await eventually(
            lambda: budget(client, pods_ns, app),
            until=lambda b: allowed(b) == 1,
            what="the budget to allow one disruption",
        )
        victim, other = running
        name = victim["metadata"]["name"]
        watching = asyncio.create_task(last_state(client, pods_ns, victim))
        course = asyncio.create_task(budget_course(client, spendable))
        try:
            started = time.monotonic()
            status, answer = await evict(client, pods_ns, name)
            assert status == 201, answer
            terminating = await h.ok(client, "GET", f"/api/v1/namespaces/{pods_ns}/pods/{name}")
            assert terminating["metadata"]["deletionTimestamp"]
            assert terminating["metadata"]["deletionGracePeriodSeconds"] == GRACE

            # The budget is spent until a replacement runs, which waits for the victim's GPU.
            status, refused = await evict(client, pods_ns, other["metadata"]["name"])
            assert status == 429, refused
            assert refused["reason"] == "TooManyRequests"
            [cause] = refused["details"]["causes"]
            assert cause["reason"] == "DisruptionBudget"
            assert f"The disruption budget {app} needs 1 healthy pods" in cause["message"]

            final = await asyncio.wait_for(watching, timeout=30)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        assert time.monotonic() - started >= GRACE, "the pod went before its grace period"
        assert final["status"]["phase"] == "Failed"
        [container] = final["status"]["containerStatuses"]
        assert container["state"]["terminated"]["exitCode"] == 137
        assert not container["ready"]
        conditions = {c["type"]: c for c in final["status"]["conditions"]}
        assert conditions["Ready"]["status"] == "False"
        # The eviction's own condition survives kubelet's terminal status.
        assert conditions["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"

        replaced = await eventually(
            lambda: pods_of(client, pods_ns, app),
            until=lambda pods: len(pods) == 2 and all(ready(p) for p in pods),
            what="the ReplicaSet's new pod to run",
        )
        [new] = [
            p for p in replaced if p["metadata"]["name"] not in (name, other["metadata"]["name"])
        ]
        assert new["spec"]["nodeName"] == victim["spec"]["nodeName"]
        assert new["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"

        # One disruption allowed, none while the victim was going and its replacement not yet
        # running, then one again, written by the disruption controller.
        try:
            assert await asyncio.wait_for(course, timeout=30) == [1, 0, 1]
        finally:
            course.cancel()
            await asyncio.gather(course, return_exceptions=True)
        assert budget_writes(control_plane, pods_ns, app)[-1] == 1

        events = control_plane.audit_events()
        deletes = [
            (e.get("userAgent"), e["responseStatus"]["code"])
            for e in events
            if e["verb"] == "delete"
            and e["objectRef"].get("resource") == "pods"
            and (e["objectRef"].get("namespace"), e["objectRef"].get("name")) == (pods_ns, name)
        ]
        assert deletes == [(KUBELET_USER_AGENT, 200)], deletes  # the eviction is a create
        bound = {
            e["objectRef"]["name"]
            for e in events
            if e["objectRef"].get("subresource") == "binding"
            and e["objectRef"].get("namespace") == pods_ns
            and e["user"]["username"] == "system:kube-scheduler"
        }
        assert new["metadata"]["name"] in bound
    finally:
        await delete_and_wait(client, f"{deployments}/{app}")


async def test_a_daemonset_gets_its_pod_on_the_node_it_selects_and_it_runs(
    control_plane: ControlPlane, sim: GpuClusterSimulator, pods_ns: str
) -> None:
    pool = h.unique("ds")
    chosen, _ = await sim.create_gpu_nodes(pool=pool, count=2, gpus=1)
    app, client = f"{pool}-agent", sim.client
    pod_template = template(app, selector={"kubernetes.io/hostname": chosen})
    pod_template["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "50m"}}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": app},
        "spec": {"selector": {"matchLabels": {"app": app}}, "template": pod_template},
    }
    daemonsets = f"/apis/apps/v1/namespaces/{pods_ns}/daemonsets"
    await h.ok(client, "POST", daemonsets, daemonset)
    try:
        [pod] = await eventually(
            lambda: pods_of(client, pods_ns, app),
            until=lambda pods: len(pods) == 1 and ready(pods[0]),
            what="the DaemonSet's pod to run",
        )
        assert pod["spec"]["nodeName"] == chosen
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
        created = [
            e.get("userAgent", "")
            for e in control_plane.audit_events()
            if e["verb"] == "create"
            and e["objectRef"].get("resource") == "pods"
            and not e["objectRef"].get("subresource")
            and e["objectRef"].get("namespace") == pods_ns
        ]
        # Made by the daemonset controller: the only pod ever created in this namespace.
        assert len(created) == 1 and created[0].startswith(CONTROLLER_MANAGER), created
        await eventually(
            lambda: h.ok(client, "GET", f"{daemonsets}/{app}"),
            until=lambda ds: (ds.get("status") or {}).get("numberReady") == 1,
            what="the DaemonSet to count its pod ready",
        )
    finally:
        await delete_and_wait(client, f"{daemonsets}/{app}")
    assert await pods_of(client, pods_ns, app) == []


async def test_a_deleted_pod_holds_its_gpu_until_its_grace_period_is_over(
    control_plane: ControlPlane, sim: GpuClusterSimulator, pods_ns: str
) -> None:
    """Kubelet admits against the pods whose containers may still run: one being stopped
    still holds its GPU, so a pod bound to it meanwhile is rejected; once it is gone the GPU
    is free again.  A delete with grace period 0 needs no kubelet at all."""
    [node] = await sim.create_gpu_nodes(pool=h.unique("hold"), count=1, gpus=1)
    client, pods = sim.client, f"/api/v1/namespaces/{pods_ns}/pods"
    victim = small_pod("victim", gpus=1, node=node)
    victim["spec"]["terminationGracePeriodSeconds"] = 10
    await create(sim, pods_ns, victim)
    await eventually(lambda: read(sim, pods_ns, "victim"), until=ready, what="victim to run")

    status, answer = await client.delete(f"{pods}/victim")  # its own grace period, 10 s
    assert status == 200 and answer["metadata"]["deletionGracePeriodSeconds"] == 10, answer
    await create(sim, pods_ns, small_pod("intruder", gpus=1, node=node))
    rejected = await eventually(
        lambda: read(sim, pods_ns, "intruder"),
        until=lambda p: (p.get("status") or {}).get("phase") == "Failed",
        what="kubelet to reject the intruder",
    )
    assert "Requested: 1, Available: 0" in rejected["status"]["message"]
    assert (await client.get(f"{pods}/victim"))[0] == 200, "the victim went before its time"

    async def victim_gone() -> bool:
        return (await client.get(f"{pods}/victim"))[0] == 404

    await eventually(victim_gone, timeout=30, what="the victim to be stopped and deleted")
    await create(sim, pods_ns, small_pod("after", gpus=1, node=node))
    after = await eventually(lambda: read(sim, pods_ns, "after"), until=ready, what="after")
    assert after["spec"]["nodeName"] == node

    status, answer = await client.delete(f"{pods}/after", params={"gracePeriodSeconds": "0"})
    assert status == 200, answer
    assert (await client.get(f"{pods}/after"))[0] == 404  # gone at once, by the API server

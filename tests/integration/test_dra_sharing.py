"""TimeSlicing and MPS under backend DRA (``--dra-sharing``), on the real control plane
(Kubernetes 1.37: kube-scheduler allocates extended-resource claims through our DeviceClass).

- The chart's ValidatingAdmissionPolicy (rendered by the real helm, applied to the real API
  server) refuses such a policy at admission while ``operator.draSharing`` is false, lets an
  update of one accepted earlier through, and is not rendered with ``draSharing=true``, which
  runs the operator with ``--dra-sharing`` instead.
- An operator without the flag refuses one that got past admission: ``Ready=False``
  ``DRASharingDisabled`` and an Event, and (from the audit log) no write to its node.
- With the flag, the policy's DeviceClass carries NVIDIA's ``GpuConfig``; its nodes move to
  DRA and are Verified at one slot per GPU; a pod asking ``nvidia.com/gpu.shared: 1`` gets a
  claim kube-scheduler allocated from its node's slice through that class, with the class's
  config in the allocation (what NVIDIA's kubelet plugin reads).  Moving the policy to MPS
  rewrites the class's config and no node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import gpupods
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import kubectl
from gpushare_testing.draobjects import CLASSES, DRA_LABEL, claim_of, labels_of, running
from gpushare_testing.helm import Helm
from gpushare_testing.replicas import USERS, Replicas
from gpushare_testing.rolloutstate import all_verified
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

TEMPLATE = "templates/drasharing.yaml"
POLICIES = "/apis/gpushare.dev/v1alpha1/gpusharingpolicies"
SHARED_CLASS = "gpu-shared.gpushare.dev"
SHARED = "nvidia.com/gpu.shared"


def shared_policy(name: str, pool: str, strategy: str = "TimeSlicing") -> dict[str, Any]:
    return h.policy(name, pool=pool, strategy=strategy, backend="DRA", renameByDefault=True)


def node_writes_by_us(plane: ControlPlane, node: str, *, since: float) -> list[Mapping[str, Any]]:
    """Every write to the Node the replicas' identities tried since ``since``, done or not."""
    return [
        e
        for user in USERS.values()
        for e in h.writes_to(h.operator_writes(plane, user=user), resource="nodes", name=node)
        if audit.moment(e) >= since
    ]


async def dry_run_create(sim: GpuClusterSimulator, body: dict[str, Any]) -> tuple[int, Any]:
    return await sim.client.post(POLICIES, body, params={"dryRun": "All"})


def test_the_chart_refuses_at_admission_only_while_dra_sharing_is_off(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    helm = Helm.for_plane(control_plane, tmp_path)
    off = helm.template()
    names = {(d["kind"], d["metadata"]["name"]) for d in off}
    assert ("ValidatingAdmissionPolicy", "gs-gpushare-operator-dra-sharing") in names
    on = helm.template("--set", "operator.draSharing=true")
    assert not [d for d in on if d["metadata"]["name"].endswith("-dra-sharing")]
    [deployment] = [d for d in on if d["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["GPUSHARE_DRA_SHARING"] == "true"


async def test_the_admission_policy_refuses_a_new_shared_dra_policy_and_ratchets(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    policies: list[str],
    tmp_path: Path,
) -> None:
    pool = h.unique("drashare")
    earlier = h.unique("earlier")
    # Accepted before the policy is there (as while the flag was on): no operator runs here.
    await h.add_policy(sim, policies, shared_policy(earlier, pool))
    rendered = Helm.for_plane(control_plane, tmp_path).render("--show-only", TEMPLATE).stdout
    kubectl(control_plane, "apply", "-f", "-", stdin=rendered)
    try:
        fresh = shared_policy(h.unique("fresh"), pool)
        refused = await eventually(
            lambda: dry_run_create(sim, fresh),
            until=lambda answer: answer[0] == 422,
            timeout=30,
            what="the dra-sharing admission policy in force",
        )
        message = json.dumps(refused[1])
        assert "TimeSlicingSettings, MPSSupport" in message and "draSharing" in message
        mps = shared_policy(h.unique("fresh"), pool, strategy="MPS")
        assert (await dry_run_create(sim, mps))[0] == 422
        # What the policy does not refuse: DRA Exclusive, and sharing on the device plugin.
        whole = h.policy(h.unique("whole"), pool=pool, strategy="Exclusive", replicas=1)
        whole["spec"]["backend"] = "DRA"
        assert (await dry_run_create(sim, whole))[0] == 201
        plugin_shared = h.policy(h.unique("plugin"), pool=pool)
        assert (await dry_run_create(sim, plugin_shared))[0] == 201
        # A policy accepted earlier can still change (its finalizer must come off, say).
        path = f"{POLICIES}/{earlier}"
        await h.ok(sim.client, "PATCH", path, {"metadata": {"labels": {"team": "a"}}})
        await h.ok(sim.client, "PATCH", path, {"spec": {"strategy": "MPS"}})
    finally:
        kubectl(control_plane, "delete", "--wait", "-f", "-", stdin=rendered)
        # In force until the API server's informers see it gone: the next test must not meet it.
        await eventually(
            lambda: dry_run_create(sim, shared_policy(h.unique("after"), pool)),
            until=lambda answer: answer[0] == 201,
            timeout=30,
            what="the dra-sharing admission policy gone",
        )


async def test_without_the_flag_a_shared_dra_policy_is_refused_and_no_node_is_written(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    policies: list[str],
    start_replicas: Callable[..., Awaitable[Replicas]],
) -> None:
    pool = h.unique("drashare")
    [target] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    name = h.unique("refused")
    await h.add_policy(sim, policies, shared_policy(name, pool))
    since = time.time()
    await start_replicas()

    async def ready() -> Mapping[str, Any]:
        return h.condition((await h.get_policy(sim.client, name)).get("status"), "Ready")

    cond = await eventually(
        ready,
        until=lambda c: c.get("reason") == "DRASharingDisabled",
        timeout=60,
        what="Ready=False DRASharingDisabled",
    )
    assert cond["status"] == "False" and "--dra-sharing" in cond["message"]
    events = await eventually(
        lambda: h.events_about(sim.client, name),
        until=lambda es: any(e["reason"] == "InvalidPolicy" for e in es),
        what="the InvalidPolicy Event",
    )
    assert any("TimeSlicingSettings" in e["message"] for e in events)
    # The node was never switched: no write of ours to it, and neither DRA label.
    assert node_writes_by_us(control_plane, target, since=since) == []
    assert DRA_LABEL not in await labels_of(sim, target)
    status, _ = await sim.client.get(f"{CLASSES}/{SHARED_CLASS}")
    assert status == 404


async def test_with_the_flag_the_class_carries_gpuconfig_and_a_pod_gets_a_whole_gpu(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    policies: list[str],
    pods_ns: str,
    start_replicas: Callable[..., Awaitable[Replicas]],
) -> None:
    pool = h.unique("drashare")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=2, gpus=2))
    name = h.unique("shared")
    await h.add_policy(sim, policies, shared_policy(name, pool))
    await start_replicas("--dra-sharing")
    await all_verified(sim, nodes, name)
    for node in nodes:
        state = (await h.node_state(sim.client, node) or {}).get("status") or {}
        assert (state["replicas"], state["slots"]["capacity"]) == (1, 2)
    status = (await h.get_policy(sim.client, name))["status"]
    alpha = h.condition(status, "DRASharing")
    assert (alpha["status"], alpha["reason"]) == ("True", "Alpha")
    assert "TimeSlicingSettings" in alpha["message"]

    klass = await h.ok(sim.client, "GET", f"{CLASSES}/{SHARED_CLASS}")
    assert klass["spec"]["extendedResourceName"] == SHARED
    [config] = klass["spec"]["config"]
    assert config["opaque"]["driver"] == "gpu.nvidia.com"
    parameters = config["opaque"]["parameters"]
    assert (parameters["kind"], parameters["sharing"]["strategy"]) == ("GpuConfig", "TimeSlicing")

    # A pod asking the shared resource gets a whole GPU of its node's slice through the class,
    # and the allocation carries the class's config for NVIDIA's kubelet plugin.
    body = gpupods.small_pod("one", gpus=0, selector={"kubernetes.io/hostname": nodes[0]})
    body["spec"]["containers"][0]["resources"]["limits"] = {SHARED: "1"}
    await gpupods.create(sim, pods_ns, body)
    [placed] = await running(sim, pods_ns, 1)
    claim = await claim_of(sim, placed)
    allocation = claim["status"]["allocation"]["devices"]
    [result] = allocation["results"]
    assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", nodes[0])
    from_class = [c for c in allocation.get("config") or () if c.get("source") == "FromClass"]
    assert [c["opaque"]["parameters"]["sharing"]["strategy"] for c in from_class] == ["TimeSlicing"]

    # To MPS: the class's config changes; the nodes' labels do not (each GPU is still one slot).
    since = time.time()
    await h.patch_policy(sim.client, name, {"strategy": "MPS"})

    async def class_config() -> Any:
        got = await h.ok(sim.client, "GET", f"{CLASSES}/{SHARED_CLASS}")
        return got["spec"]["config"][0]["opaque"]["parameters"]["sharing"]

    sharing = await eventually(
        class_config, until=lambda s: s["strategy"] == "MPS", what="the class moved to MPS"
    )
    assert sharing["mpsConfig"] == {"defaultActiveThreadPercentage": 25}
    await all_verified(sim, nodes, name)
    for node in nodes:
        assert node_writes_by_us(control_plane, node, since=since) == []

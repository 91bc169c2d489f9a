"""``kubectl gpushare plan`` of a backend move on the real control plane: the pods DRA would
not serve on a moving node are named, and the plan exits 2.

A time-slicing pool renamed to ``nvidia.com/gpu.shared`` runs a pod asking for it.  A plan
moving the pool to DRA Exclusive serves ``nvidia.com/gpu`` there, not the shared resource:
once gone, that pod could not be placed on its node again, so the plan names it under
``unservedByDRA`` and exits 2, and says so in text.  Planned as a DRA time-slicing pool under
the same name (``--dra-sharing``: admission decides, and no ValidatingAdmissionPolicy refuses
it here), the shared resource is served there and nothing is unserved; the plan still exits 2,
saying the node waits for its pod before it changes backend.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import yaml

from gpushare_testing import apiobjects as h
from gpushare_testing import gpupods
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.draobjects import running
from gpushare_testing.pluginruns import plugin
from gpushare_testing.replicas import Replicas
from gpushare_testing.rolloutstate import all_verified
from gpushare_testing.simulator import GpuClusterSimulator

pytestmark = pytest.mark.usefixtures("crds_installed")

SHARED = "nvidia.com/gpu.shared"


async def test_a_plan_names_the_pods_dra_would_not_serve_and_exits_2(
    control_plane: ControlPlane,
    namespace: str,
    sim: GpuClusterSimulator,
    policies: list[str],
    pods_ns: str,
    start_replicas: Callable[..., Awaitable[Replicas]],
    tmp_path: Path,
) -> None:
    pool = h.unique("draplan")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=2, gpus=2))
    name = h.unique("draplan")
    rollout = {"maxUnavailable": 1, "canary": 1}
    body = h.policy(name, pool=pool, replicas=2, renameByDefault=True, rollout=rollout)
    await h.add_policy(sim, policies, body)
    await start_replicas()
    await all_verified(sim, nodes, name)
    pod = gpupods.small_pod("shared", gpus=0, selector={"kubernetes.io/hostname": nodes[0]})
    pod["spec"]["containers"][0]["resources"]["limits"] = {SHARED: "1"}
    await gpupods.create(sim, pods_ns, pod)
    await running(sim, pods_ns, 1)

    moved = {**body, "spec": {**body["spec"], "strategy": "Exclusive", "backend": "DRA"}}
    moved["spec"].pop("replicas")
    moved["spec"].pop("renameByDefault")
    manifest = tmp_path / "to-dra.yaml"
    manifest.write_text(yaml.safe_dump(moved))
    common = ("--device-plugin-namespace", namespace)
    kubeconfig = control_plane.admin_kubeconfig
    run = await plugin(kubeconfig, "plan", "-f", str(manifest), "-o", "json", *common)
    assert run.code == 2, run.stderr
    report = run.json()
    assert report["unservedByDRA"] == [
        {"node": nodes[0], "pod": f"{pods_ns}/shared", "resource": SHARED}
    ]
    assert any("backend DRA does not serve" in p for p in report["problems"])
    text = await plugin(kubeconfig, "plan", "-f", str(manifest), *common)
    assert text.code == 2 and f"{pods_ns}/shared" in text.stdout, text.stderr

    # As a DRA time-slicing pool of the same resource: served there, nothing unserved.
    shared = {**body, "spec": {**body["spec"], "backend": "DRA"}}
    (tmp_path / "shared.yaml").write_text(yaml.safe_dump(shared))
    again = await plugin(
        kubeconfig, "plan", "-f", str(tmp_path / "shared.yaml"), "-o", "json", *common
    )
    # Exit 2 all the same: a backend move waits for the node's pods, and the plan says why.
    assert again.code == 2, again.stderr
    planned = again.json()
    assert planned["unservedByDRA"] == []
    [waits] = planned["overcommitted"]
    assert (waits["node"], waits["backendChange"]) == (nodes[0], True)
    assert any("before it changes backend" in p for p in planned["problems"])

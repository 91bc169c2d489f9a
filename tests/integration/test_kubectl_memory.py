"""``kubectl gpushare`` and memory requests on the real control plane, run as users run it.

An MPS pool at 4 replicas of simulated H100s (81559 MiB each, GFD's label): the operator (its
webhook off, as the fixtures start it) labels each Verified node with its promise, 20389 MiB a
slot (the MPS daemon's floor(memory / replicas)).  A pod asking for 20Gi of GPU memory is bound
to one of them directly (no webhook: the label and one nvidia.com/gpu).  Then ``status`` shows
the class and its free slots, ``plan`` of 8 replicas (10194 MiB a slot) names the pod and exits
2, of 2 replicas (40779 MiB) exits 0, and ``explain node`` says what a slot promises and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_testing import apiobjects as h
from gpushare_testing import webhooks as wh
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create, small_pod, wait_node_usage
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.pluginruns import plugin
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

GPU = "nvidia.com/gpu"
H100_MIB = 81559
SLOT_4 = H100_MIB // 4  # 20389
FAST_AGENTS = pytest.mark.simulator(config_sync_delay=0.5, restart_window=0.5)


async def wait_slot_memory(sim: GpuClusterSimulator, node: str, memory: str) -> None:
    async def labels() -> dict[str, str]:
        return (await h.node(sim.client, node))["metadata"].get("labels") or {}

    await eventually(
        labels,
        until=lambda shown: shown.get(wh.SLOT_MEMORY) == memory,
        timeout=60,
        what=f"{node} to promise {memory} MiB a slot",
    )


def memory_pod(name: str, node: str, request: str) -> dict[str, Any]:
    body = small_pod(name, gpus=1, node=node)
    body["metadata"]["labels"] = {"gpushare.dev/gpu-memory": request}
    body["spec"]["containers"][0]["resources"]["requests"][GPU] = "1"
    return body


@FAST_AGENTS
async def test_status_plan_and_explain_follow_a_20gi_request_on_an_mps_pool(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    tmp_path: Path,
) -> None:
    pool = h.unique("memplan")
    nodes = await sim.create_gpu_nodes(pool=pool, count=2, gpus=1)
    name = h.unique("memplan")
    await h.add_policy(sim, policies, h.policy(name, pool=pool, strategy="MPS", replicas=4))
    await start_operator("--device-plugin-namespace", namespace)
    for node in nodes:
        await wait_slot_memory(sim, node, str(SLOT_4))
    await create(sim, pods_ns, memory_pod("train-0", nodes[0], "20Gi"))
    await wait_node_usage(sim, nodes[0], 1, 1)
    kubeconfig = control_plane.kubeconfig_for_user(
        "kubectl-gpushare-user", groups=("system:masters",)
    )
    common = ("--device-plugin-namespace", namespace)

    # status: the class, counted on the two labelled nodes, one slot held.
    run = await plugin(kubeconfig, "status", "-o", "json", *common)
    assert run.code == 0, run.stderr
    [shown] = [c for c in run.json()["slotClasses"] if name in c["policies"]]
    assert shown == {
        "resource": GPU,
        "isolation": "mps",
        "enforced": True,
        "memoryMiB": SLOT_4,
        "policies": [name],
        "nodes": 2,
        "capacity": 8,
        "allocated": 1,
        "free": 7,
        "notOffered": {"nodes": 0, "capacity": 0, "allocated": 0, "why": {}},
    }
    text = await plugin(kubeconfig, "status", *common)
    row = next(line.split() for line in text.stdout.splitlines() if line.split()[4:5] == [name])
    assert row[:6] == [GPU, "mps", str(SLOT_4), "MiB", name, "2"] and row[-2:] == ["1/8", "7"]

    # plan: 8 replicas shrink the slot to 10194 MiB, under the 20Gi the pod asked for.
    manifest = tmp_path / "policy.yaml"
    manifest.write_text(yaml.safe_dump(h.policy(name, pool=pool, strategy="MPS", replicas=8)))
    args = ("plan", "-f", str(manifest), *common)
    run = await plugin(kubeconfig, *args, "-o", "json")
    assert run.code == 2, run.stderr
    plan = run.json()
    [item] = plan["memoryRequests"]
    assert (item["namespace"], item["name"], item["node"]) == (pods_ns, "train-0", nodes[0])
    assert (item["requestMiB"], item["loss"]) == (20480, "shrinks")
    assert item["before"]["class"] == {"resource": GPU, "isolation": "mps", "memoryMiB": SLOT_4}
    assert item["after"]["class"]["memoryMiB"] == H100_MIB // 8 == 10194
    assert len(plan["problems"]) == 1 and not plan["overcommitted"]
    text = await plugin(kubeconfig, *args)
    assert text.code == 2
    assert f"{pods_ns}/train-0" in text.stdout and "Result: blocked (exit 2)" in text.stdout

    # ... 2 replicas make it 40779 MiB: it holds the request, and nothing else blocks.
    manifest.write_text(yaml.safe_dump(h.policy(name, pool=pool, strategy="MPS", replicas=2)))
    run = await plugin(kubeconfig, *args, "-o", "json")
    assert run.code == 0, run.stdout
    assert run.json()["memoryRequests"] == []
    assert (await h.get_policy(sim.client, name))["spec"]["replicas"] == 4  # nothing applied

    # explain node: the promise, where it comes from, and the labels that say it.
    run = await plugin(kubeconfig, "explain", "node", nodes[0], "-o", "json", *common)
    assert run.code == 0, run.stderr
    promise = run.json()["slotPromise"]
    assert promise["promise"] == f"each slot enforces {SLOT_4} MiB ({GPU}, mps)"
    assert promise["labels"]["offered"]
    assert promise["labels"]["carried"] == {
        wh.SLOT_MEMORY: str(SLOT_4),
        wh.SLOT_ISOLATION: "mps",
        wh.SLOT_RESOURCE: "nvidia.com_gpu",
    }
    text = await plugin(kubeconfig, "explain", "node", nodes[0], *common)
    assert f"floor({H100_MIB} MiB / 4 replicas)" in text.stdout
    assert f"{wh.SLOT_MEMORY}={SLOT_4}" in text.stdout

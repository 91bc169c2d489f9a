"""The real GPU stack talks back: GFD's rewrites never move a node, Verified means the slots exist.

The operator runs as a child process; the faithful simulator plays GFD (the ``-SHARED`` product
suffix, the sharing labels), the device plugin (a restart window with 0 allocatable) and the
config manager.  Label writes are counted in the API server's audit log.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpushare_testing import apiobjects as h
from gpushare_testing import bodies, demo, rolloutaudit, webhooks
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.demo import POOLS, _create_pools
from gpushare_testing.operators import OPERATOR_NAMESPACE, OperatorFactory
from gpushare_testing.paths import ROOT
from gpushare_testing.quiet import quiet
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

PRODUCT = "nvidia.com/gpu.product"
SAMPLES = ROOT / "examples" / "policies.yaml"
MEMORY_REQUEST = ROOT / "examples" / "pods" / "memory-request.yaml"


_phase = h.phase_of


async def _phase_is(sim: GpuClusterSimulator, node: str, phase: str, timeout: float = 60) -> Any:
    return await h.wait_phase(sim, node, phase, timeout)


def _label_writes(plane: ControlPlane, node: str) -> int:
    """Config changes applied to ``node`` (its slot labels' own applies are not)."""
    return len(rolloutaudit.config_applies(h.operator_writes(plane), [node]))


async def _product_of(sim: GpuClusterSimulator, node: str) -> str:
    return str((await h.node(sim.client, node))["metadata"]["labels"][PRODUCT])


async def _rolled_out(
    sim: GpuClusterSimulator, nodes: list[str], policy: str, *, shared: bool
) -> None:
    key = (
        await eventually(
            lambda: h.get_policy(sim.client, policy),
            until=lambda b: (
                (b.get("status") or {}).get("observedGeneration") == b["metadata"]["generation"]
            ),
            what="the policy's config key for its current generation",
        )
    )["status"]["configKey"]
    for node in nodes:
        await eventually(
            lambda node=node: h.node_state(sim.client, node),
            until=lambda s: _phase(s) == "Verified" and s["status"]["configKey"] == key,
            timeout=90,
            what=f"{node} Verified with {key}",
        )
        product = await _product_of(sim, node)
        assert product.endswith("-SHARED") is shared, product


async def test_a_product_selected_policy_keeps_its_nodes_through_gfd_cycles(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("a10g")
    nodes = await sim.create_gpu_nodes(pool=pool, count=3, product="NVIDIA-A10G", gpus=4)
    name = h.unique("by-product")
    body = h.policy(name, pool=pool)
    body["spec"]["nodeSelector"] = {
        "matchExpressions": [{"key": PRODUCT, "operator": "In", "values": ["NVIDIA-A10G"]}]
    }
    await h.add_policy(sim, policies, body)
    operator = await start_operator("--device-plugin-namespace", namespace)

    await _rolled_out(sim, nodes, name, shared=True)  # GFD rewrote the product: still ours
    state = await h.node_state(sim.client, nodes[0])
    assert state is not None and state["status"]["product"] == "NVIDIA-A10G"
    # Three more rollouts, the suffix going and coming back with each: one label write each.
    await h.patch_policy(sim.client, name, {"strategy": "Exclusive", "replicas": None})
    await _rolled_out(sim, nodes, name, shared=False)
    await h.patch_policy(sim.client, name, {"strategy": "TimeSlicing", "replicas": 2})
    await _rolled_out(sim, nodes, name, shared=True)
    await h.patch_policy(sim.client, name, {"strategy": "MPS", "replicas": 3})
    await _rolled_out(sim, nodes, name, shared=True)
    await sim.wait_idle()
    await quiet(control_plane, [operator], namespace=namespace)  # a flap would have relabelled
    assert {node: _label_writes(control_plane, node) for node in nodes} == dict.fromkeys(nodes, 4)
    status = (await h.get_policy(sim.client, name))["status"]
    assert (status["matchedNodes"], status["verifiedNodes"]) == (3, 3)


async def test_verified_only_once_allocatable_agrees(
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("alloc")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    name = h.unique("alloc")
    await h.add_policy(sim, policies, h.policy(name, pool=pool, replicas=4))
    await start_operator("--device-plugin-namespace", namespace, "--mismatch-timeout", "6")
    await _phase_is(sim, node, "Verified")

    # The plugin advertises fewer slots than the config asks (say, a GPU fell off the bus)
    # while GFD's labels still agree: no longer Verified.  The node was Verified on this config,
    # so it is drift (Degraded, saying why), not a rollout failure (Mismatch): see
    # test_rollout_promise_drift for what it then halts (nothing).
    sim.set_healthy(node, False)
    patch = {"status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    await h.ok(sim.client, "PATCH", f"/api/v1/nodes/{node}/status", patch)
    degraded = await _phase_is(sim, node, "Degraded", timeout=20)
    assert (
        "allocatable nvidia.com/gpu is 4, expected 8"
        in h.condition(degraded["status"], "Ready")["message"]
    )
    sim.set_healthy(node, True)
    await h.ok(
        sim.client,
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": {"allocatable": {"nvidia.com/gpu": "8"}}},
    )
    await _phase_is(sim, node, "Verified", timeout=30)


async def test_the_restart_window_is_no_mismatch(
    control_plane: ControlPlane,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=namespace, restart_window=4.0
    ) as sim:
        pool = h.unique("window")
        nodes = await sim.create_gpu_nodes(pool=pool, count=2, gpus=2)
        name = h.unique("window")
        await h.create_policy(sim.client, h.policy(name, pool=pool, replicas=4))
        try:
            await start_operator("--device-plugin-namespace", namespace, "--mismatch-timeout", "8")
            seen: set[str | None] = set()
            zero_seen = False

            async def watch(replicas: int) -> bool:
                nonlocal zero_seen
                for node in nodes:
                    seen.add(_phase(await h.node_state(sim.client, node)))
                    body = await h.node(sim.client, node)
                    if body["status"].get("allocatable", {}).get("nvidia.com/gpu") == "0":
                        zero_seen = True
                states = [await h.node_state(sim.client, n) for n in nodes]
                return all(
                    _phase(s) == "Verified" and (s or {})["status"].get("replicas") == replicas
                    for s in states
                )

            await eventually(lambda: watch(4), timeout=60, what="both nodes Verified")
            await h.patch_policy(sim.client, name, {"replicas": 3})
            seen.clear()
            await eventually(lambda: watch(3), timeout=60, what="the change Verified")
            assert zero_seen, "the simulated device plugin never restarted"
            assert "Mismatch" not in seen
            for node in nodes:
                events = await h.events_about(sim.client, node)
                assert not [e for e in events if e["reason"] == "NotConfirmed"]
        finally:
            await h.delete_policy(sim.client, name)


async def test_an_exclusive_policy_carves_a_pool_out_of_a_shared_one(
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("wide")
    shared = await sim.create_gpu_nodes(pool=pool, count=2, gpus=4)
    training = [
        (
            await sim.create_node(
                bodies.gpu_node(
                    name=h.unique("train"), pool=pool, gpus=4, extra_labels={"team": "training"}
                )
            )
        )["metadata"]["name"]
        for _ in range(2)
    ]
    wide, carve = h.unique("wide"), h.unique("training")
    await h.add_policy(sim, policies, h.policy(wide, pool=pool, replicas=4, priority=10))
    exclusive = h.policy(carve, pool=pool, strategy="Exclusive", priority=200)
    del exclusive["spec"]["replicas"]
    exclusive["spec"]["nodeSelector"]["matchLabels"]["team"] = "training"
    await h.add_policy(sim, policies, exclusive)
    await start_operator("--device-plugin-namespace", namespace)

    for node in training:
        state = await _phase_is(sim, node, "Verified", timeout=90)
        assert state["status"]["policy"] == carve
        assert state["status"]["strategy"] == "Exclusive"
        assert state["status"]["slots"]["capacity"] == 4  # one slot per GPU
        assert "-excl-" in state["status"]["configKey"]
        labels = (await h.node(sim.client, node))["metadata"]["labels"]
        assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
        assert not labels[PRODUCT].endswith("-SHARED")
    for node in shared:
        state = await _phase_is(sim, node, "Verified", timeout=90)
        assert state["status"]["policy"] == wide
        assert state["status"]["slots"]["capacity"] == 16
    status = (await h.get_policy(sim.client, wide))["status"]
    assert (status["matchedNodes"], status["conflictingNodes"]) == (4, 2)
    carved = await eventually(
        lambda: h.get_policy(sim.client, carve),
        until=lambda b: (b.get("status") or {}).get("verifiedNodes") == 2,
        what="the carve-out's status",
    )
    assert carved["status"]["slots"]["capacity"] == 8


async def test_an_unsupported_winner_falls_through(
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("mig")
    [mixed] = [
        (
            await sim.create_node(
                bodies.gpu_node(name=h.unique("mixed"), pool=pool, gpus=2, mig_strategy="mixed")
            )
        )["metadata"]["name"]
    ]
    [plain] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    mps, ts = h.unique("mps"), h.unique("ts")
    await h.add_policy(sim, policies, h.policy(mps, pool=pool, strategy="MPS", priority=100))
    await h.add_policy(sim, policies, h.policy(ts, pool=pool, replicas=2, priority=1))
    await start_operator("--device-plugin-namespace", namespace)

    state = await _phase_is(sim, mixed, "Verified", timeout=90)
    assert state["status"]["policy"] == ts  # MPS cannot work with mixed MIG: the next one does
    assert state["status"]["slots"]["capacity"] == 4
    assert (await _phase_is(sim, plain, "Verified", timeout=90))["status"]["policy"] == mps
    body = await eventually(
        lambda: h.get_policy(sim.client, mps),
        until=lambda b: (b.get("status") or {}).get("unsupportedNodes") == 1,
        what="the skipped node counted",
    )
    unsupported = h.condition(body["status"], "Unsupported")
    assert unsupported["status"] == "True" and mixed in unsupported["message"]
    await eventually(
        lambda: h.events_about(sim.client, mps),
        until=lambda es: any(e["reason"] == "NodesUnsupported" for e in es),
        what="the NodesUnsupported Event",
    )
    ts_status = (await h.get_policy(sim.client, ts))["status"]
    assert ts_status["slots"]["capacity"] >= 4  # the fallen-through node's slots count here


async def test_deleting_the_policy_an_unsupported_node_fell_through_to_releases_it(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    """Once the TimeSlicing policy a mixed-MIG node fell through to is deleted, only the MPS
    policy, which cannot work there, selects it: the node loses the gone policy's labels
    and the policy's finalizer goes (it used to wait for that label for ever)."""
    pool = h.unique("mig")
    body = bodies.gpu_node(name=h.unique("mixed"), pool=pool, gpus=2, mig_strategy="mixed")
    mixed = (await sim.create_node(body))["metadata"]["name"]
    mps, ts = h.unique("mps"), h.unique("ts")
    await h.add_policy(sim, policies, h.policy(mps, pool=pool, strategy="MPS", priority=100))
    await h.add_policy(sim, policies, h.policy(ts, pool=pool, replicas=2, priority=1))
    await start_operator("--device-plugin-namespace", namespace)
    assert (await _phase_is(sim, mixed, "Verified", timeout=90))["status"]["policy"] == ts

    before = _label_writes(control_plane, mixed)
    await h.delete_policy(sim.client, ts)
    await eventually(
        lambda: sim.client.get(f"{h.API}/gpusharingpolicies/{ts}"),
        until=lambda answer: answer[0] == 404,
        timeout=90,
        what="the deleted policy gone, its finalizer removed",
    )
    labels = (await h.node(sim.client, mixed))["metadata"]["labels"]
    assert h.CONFIG_LABEL not in labels and h.POLICY_LABEL not in labels
    state = await _phase_is(sim, mixed, "Unsupported", timeout=30)
    assert _label_writes(control_plane, mixed) == before + 1  # the removal, nothing else
    assert state["status"]["policy"] == mps
    assert state["status"]["conditions"][0]["reason"] == "MPSWithMixedMIG"


async def test_the_make_run_samples_converge_with_gfd_rewriting_the_product(
    control_plane: ControlPlane,
    namespace: str,
    start_operator: OperatorFactory,
) -> None:
    samples = list(yaml.safe_load_all(SAMPLES.read_text()))
    by_product = [
        s["metadata"]["name"]
        for s in samples
        if any(e["key"] == PRODUCT for e in s["spec"]["nodeSelector"].get("matchExpressions", []))
    ]
    assert by_product, "no sample policy selects by GPU product"
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=namespace, reaction_delay=1.0
    ) as sim:
        await _create_pools(sim)
        names = [f"gpu-{pool}-{i}" for pool, count, *_ in POOLS for i in range(count)]
        created: list[str] = []
        webhook: list[webhooks.WebhookFlags] = []
        try:
            for sample in samples:
                await h.create_policy(sim.client, sample)
                created.append(sample["metadata"]["name"])
            # As make run: the webhook's configuration, and 127.0.0.1 in its certificate.
            port, flags = free_port(), webhooks.WebhookFlags(h.unique("gpu"), h.unique("tls"))
            webhook.append(flags)
            await demo.ensure_webhook(sim, port=port, name=flags.configuration)
            await start_operator("--device-plugin-namespace", namespace, *flags.args(port=port))
            for node in names:
                await _phase_is(sim, node, "Verified", timeout=120)
            for policy in by_product:
                governed = [n for n in names if n.startswith(f"gpu-{policy}-")]
                count = len(governed)
                assert governed
                for node in governed:
                    assert (await _product_of(sim, node)).endswith("-SHARED")
                    assert _label_writes(control_plane, node) == 1  # no flap
                await eventually(
                    lambda policy=policy: h.get_policy(sim.client, policy),
                    until=lambda b, n=count: (b.get("status") or {}).get("verifiedNodes") == n,
                    what=f"{policy} counting its verified nodes",
                )
            # The README's memory request lands on a batch node's MPS slot (5120 MiB).
            pod = yaml.safe_load(MEMORY_REQUEST.read_text())
            pod["metadata"]["namespace"] = namespace
            await h.ok(sim.client, "POST", f"/api/v1/namespaces/{namespace}/pods", pod)
            placed = await eventually(
                lambda: h.ok(sim.client, "GET", f"/api/v1/namespaces/{namespace}/pods/llm-small"),
                until=lambda p: bool(p["spec"].get("nodeName")),
                timeout=60,
                what="the example memory request placed",
            )
            assert placed["spec"]["nodeName"].startswith("gpu-batch-")
            limits = placed["spec"]["containers"][0]["resources"]["limits"]
            assert limits == {"nvidia.com/gpu.shared": "1"}
        finally:
            for flags in webhook:
                await webhooks.remove(
                    sim, flags.configuration, secret=flags.secret, namespace=OPERATOR_NAMESPACE
                )
            for name in created:
                await h.delete_policy(sim.client, name)
            for node in names:
                await sim.delete_node(node)

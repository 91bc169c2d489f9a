"""``make run``'s simulated cluster: GPU nodes in four pools (one for MIG), and the NVIDIA
agents on them.

Runs until SIGINT/SIGTERM.  Nodes are left in place on exit, so that ``kubectl get gsp,gns``
still has something to show after the operator stopped; ``make dev-cluster-down`` wipes all.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence
from pathlib import Path

from gpushare_testing import bodies, podbodies, webhooks
from gpushare_testing.simulator import GpuClusterSimulator

logger = logging.getLogger("gpushare.demo")

# (pool, nodes, GPU product, GPUs per node, memory MiB per GPU)
POOLS = (
    ("inference", 4, "NVIDIA-H100-80GB-HBM3", 8, 81559),
    ("batch", 3, "NVIDIA-A100-SXM4-40GB", 4, 40960),
    ("training", 3, "NVIDIA-H100-80GB-HBM3", 8, 81559),
    ("mig", 2, "NVIDIA-H100-80GB-HBM3", 8, 81559),
)
# The MIG pool's GPU Operator presets no layout (migManager.config.default=""): gpushare never
# takes over a nvidia.com/mig.config label someone else set.
NO_MIG_PRESET = frozenset({"mig"})


async def _ensure_namespace(sim: GpuClusterSimulator, name: str) -> None:
    status, _ = await sim.client.get(f"/api/v1/namespaces/{name}")
    if status == 404:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await sim.client.post("/api/v1/namespaces", body)


async def _create_pools(sim: GpuClusterSimulator) -> None:
    for pool, count, product, gpus, memory in POOLS:
        for index in range(count):
            name = f"gpu-{pool}-{index}"
            status, _ = await sim.client.get(f"/api/v1/nodes/{name}")
            if status == 200:
                continue  # a second `make run` on the same dev cluster
            body = bodies.gpu_node(
                name=name,
                pool=pool,
                product=product,
                gpus=gpus,
                memory_mib=memory,
                mig_preset=pool not in NO_MIG_PRESET,
            )
            await sim.create_node(body)
    logger.info("simulated GPU nodes ready: %s", ", ".join(f"{p[1]} in {p[0]}" for p in POOLS))


# (pod, node, resource, slots): a few workloads so that `kubectl get gsp,gns` shows usage.
SAMPLE_PODS = (
    ("chat-0", "gpu-inference-0", "nvidia.com/gpu", 2),
    ("chat-1", "gpu-inference-0", "nvidia.com/gpu", 1),
    ("embed-0", "gpu-inference-1", "nvidia.com/gpu", 3),
    ("etl-0", "gpu-batch-0", "nvidia.com/gpu.shared", 4),
    ("etl-1", "gpu-batch-1", "nvidia.com/gpu.shared", 2),
)
DEMO_NAMESPACE = "gpushare-demo"


async def _create_sample_pods(sim: GpuClusterSimulator) -> None:
    await _ensure_namespace(sim, DEMO_NAMESPACE)
    pods = f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods"
    for name, node, resource, count in SAMPLE_PODS:
        status, _ = await sim.client.get(f"{pods}/{name}")
        if status == 200:
            continue
        body = podbodies.shared_gpu_pod(
            name=name,
            node=node,
            namespace=DEMO_NAMESPACE,
            resource=resource,
            count=count,
            managed_fields=False,
        )
        body["metadata"].pop("resourceVersion", None)
        # Its ReplicaSet does not exist: the garbage collector would delete the pod at once.
        body["metadata"].pop("ownerReferences", None)
        body.pop("status", None)
        await sim.client.post(pods, body)  # the simulated kubelet admits and runs it
    logger.info("sample pods created in namespace %s", DEMO_NAMESPACE)


# The operator's own defaults (``--webhook-port``, ``--webhook-configuration``); make run adds
# 127.0.0.1 to its certificate (``--webhook-hosts``), since there is no Service here to call.
WEBHOOK_PORT = 9443
WEBHOOK_CONFIGURATION = "gpushare-operator"


async def ensure_webhook(
    sim: GpuClusterSimulator, *, port: int = WEBHOOK_PORT, name: str = WEBHOOK_CONFIGURATION
) -> None:
    """The memory-request webhook's configuration, as the chart's but calling 127.0.0.1: the
    operator publishes its CA bundle (examples/pods/memory-request.yaml is then admitted)."""
    status, _ = await sim.client.get(f"{webhooks.CONFIGURATIONS}/{name}")
    if status == 404:
        await sim.client.post(webhooks.CONFIGURATIONS, webhooks.configuration(name, port=port))
        logger.info("memory-request webhook configured: https://127.0.0.1:%d", port)


async def run(*, kubeconfig: Path, namespace: str, namespaces: Sequence[str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with GpuClusterSimulator(
        kubeconfig=kubeconfig, namespace=namespace, cleanup=False, reaction_delay=1.0
    ) as sim:
        for name in (namespace, *namespaces):
            await _ensure_namespace(sim, name)
        await _create_pools(sim)
        await _create_sample_pods(sim)
        await ensure_webhook(sim)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-demo")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--device-plugin-namespace", default="gpu-operator")
    parser.add_argument("--also-namespace", action="append", default=[])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s simulator: %(message)s")
    asyncio.run(
        run(
            kubeconfig=args.kubeconfig,
            namespace=args.device_plugin_namespace,
            namespaces=args.also_namespace,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

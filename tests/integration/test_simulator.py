"""The GPU node simulator plays config manager + device plugin + GFD against a real API server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import yaml

from gpushare_operator.testing import bodies
from gpushare_operator.testing.controlplane import ControlPlane
from gpushare_operator.testing.simulator import (
    NO_SHARING,
    GpuClusterSimulator,
    RawClient,
    Sharing,
    WatchLines,
    parse_device_plugin_config,
)

CONFIG = "nvidia.com/device-plugin.config"
TS4 = "inference-ts4-a1b2c3"
MPS8 = "batch-mps8-d4e5f6"


def plugin_config(strategy: str | None, replicas: int = 0, *, rename: bool = False) -> str:
    """A device-plugin config v1, as the operator renders it."""
    config: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if strategy is not None:
        resources = [{"name": "nvidia.com/gpu", "replicas": replicas}]
        config["sharing"] = {
            strategy: {
                "renameByDefault": rename,
                "failRequestsGreaterThanOne": True,
                "resources": resources,
            }
        }
    return yaml.safe_dump(config)


CONFIGS = {
    "default": plugin_config(None),
    TS4: plugin_config("timeSlicing", 4),
    MPS8: plugin_config("mps", 8, rename=True),
}


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[RawClient]:
    async with RawClient(kubeconfig=control_plane.admin_kubeconfig) as client:
        yield client


@pytest.fixture
async def plugin_namespace(api: RawClient) -> AsyncIterator[str]:
    """A fresh stand-in for the GPU Operator's namespace, holding the device-plugin ConfigMap."""
    name = f"gpu-operator-{uuid.uuid4().hex[:8]}"
    status, body = await api.post("/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    configmap = {"metadata": {"name": "gpushare-device-plugin-configs"}, "data": CONFIGS}
    status, body = await api.post(f"/api/v1/namespaces/{name}/configmaps", configmap)
    assert status == 201, body
    yield name
    await api.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
async def simulator(
    control_plane: ControlPlane, plugin_namespace: str
) -> AsyncIterator[GpuClusterSimulator]:
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_namespace
    ) as sim:
        yield sim


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def read_node(api: RawClient, name: str) -> dict[str, Any]:
    status, node = await api.get(f"/api/v1/nodes/{name}")
    assert status == 200, node
    return dict(node)


def sharing_of(node: dict[str, Any]) -> tuple[str, str, str | None, str | None]:
    """GFD's two sharing labels and the advertised (allocatable) GPU resources of a node."""
    labels, allocatable = node["metadata"]["labels"], node["status"]["allocatable"]
    return (
        labels["nvidia.com/gpu.replicas"],
        labels["nvidia.com/gpu.sharing-strategy"],
        allocatable.get("nvidia.com/gpu"),
        allocatable.get("nvidia.com/gpu.shared"),
    )


# -- against the API server ------------------------------------------------------------------


async def test_nodes_are_created_with_capacity_labels_and_kubelet_as_manager(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    pool = unique("sim-pool")
    names = await simulator.create_gpu_nodes(pool=pool, count=2, gpus=4, product="NVIDIA-L4")
    await simulator.wait_idle()
    for name in names:
        node = await read_node(api, name)
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
        assert node["metadata"]["labels"]["pool"] == pool
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
        assert len(node["status"]["images"]) == 40
        assert "kubelet" in {entry["manager"] for entry in node["metadata"]["managedFields"]}
        assert sharing_of(node) == ("1", "none", "4", None)
    assert simulator.node_names == sorted(names)
    assert simulator.reconfigurations == {}


async def test_time_slicing_key_makes_gfd_labels_and_capacity_follow(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    (name,) = await simulator.create_gpu_nodes(pool=unique("ts"), count=1)
    await simulator.relabel(name, {CONFIG: TS4})
    await simulator.wait_idle()
    node = await read_node(api, name)
    assert sharing_of(node) == ("4", "time-slicing", "32", None)
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "32"
    managers = {entry["manager"] for entry in node["metadata"]["managedFields"]}
    assert {"gpu-feature-discovery", "nvidia-device-plugin", "kubectl-label"} <= managers
    assert simulator.reconfigurations == {name: 1}

    # An event that changes nothing the agents care about makes them do nothing.
    await simulator.relabel(name, {"team": "search"})
    await simulator.wait_idle()
    assert simulator.reconfigurations == {name: 1}


async def test_mps_with_rename_by_default_advertises_the_shared_resource(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    (name,) = await simulator.create_gpu_nodes(pool=unique("mps"), count=1)
    await simulator.relabel(name, {CONFIG: MPS8})
    await simulator.wait_idle()
    node = await read_node(api, name)
    assert sharing_of(node) == ("8", "mps", "0", "64")
    assert node["status"]["capacity"]["nvidia.com/gpu.shared"] == "64"
    assert node["metadata"]["labels"]["nvidia.com/mps.capable"] == "true"
    created = bodies.gpu_node(name=name, pool="any")["metadata"]["labels"]
    assert (
        node["metadata"]["labels"]["nvidia.com/gfd.timestamp"]
        != (created["nvidia.com/gfd.timestamp"])
    )


async def test_a_key_missing_from_the_configmap_changes_nothing_until_it_appears(
    simulator: GpuClusterSimulator, api: RawClient, plugin_namespace: str
) -> None:
    (name,) = await simulator.create_gpu_nodes(pool=unique("missing"), count=1)
    await simulator.relabel(name, {CONFIG: TS4})
    await simulator.wait_idle()
    await simulator.relabel(name, {CONFIG: "inference-ts2-ffffff"})
    await simulator.wait_idle()
    before = await read_node(api, name)
    await asyncio.sleep(1.0)
    after = await read_node(api, name)
    # Neither the new config nor a reset: the node keeps what it had.
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert sharing_of(after) == ("4", "time-slicing", "32", None)
    assert simulator.reconfigurations == {name: 1}

    # Once the key is written, the (crash-looping) config manager comes up with it.
    path = f"/api/v1/namespaces/{plugin_namespace}/configmaps/gpushare-device-plugin-configs"
    patch = {"data": {"inference-ts2-ffffff": plugin_config("timeSlicing", 2)}}
    status, body = await api.patch(path, patch)
    assert status == 200, body
    await simulator.wait_idle()
    assert sharing_of(await read_node(api, name)) == ("2", "time-slicing", "16", None)


async def test_removing_the_label_or_naming_default_resets_the_node(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    first, second = await simulator.create_gpu_nodes(pool=unique("reset"), count=2)
    await simulator.relabel(first, {CONFIG: TS4})
    await simulator.relabel(second, {CONFIG: MPS8})
    await simulator.wait_idle()
    assert sharing_of(await read_node(api, second)) == ("8", "mps", "0", "64")

    await simulator.relabel(first, {CONFIG: "default"})
    await simulator.relabel(second, {CONFIG: None})
    await simulator.wait_idle()
    for name in (first, second):
        node = await read_node(api, name)
        assert sharing_of(node) == ("1", "none", "8", None)
        assert "nvidia.com/gpu.shared" not in node["status"]["capacity"]
        assert node["metadata"]["labels"]["nvidia.com/mps.capable"] == "false"
    assert simulator.reconfigurations == {first: 2, second: 2}


async def test_nodes_it_did_not_create_are_never_touched(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    name = unique("foreign")
    body = bodies.gpu_node(name=name, pool="foreign", managed_fields=False)
    status, created = await api.post("/api/v1/nodes", bodies.relabel(body, {CONFIG: TS4}))
    assert status == 201, created
    try:
        (ours,) = await simulator.create_gpu_nodes(pool=unique("ours"), count=1)
        await simulator.relabel(ours, {CONFIG: TS4})
        await simulator.wait_idle()
        node = await read_node(api, name)
        assert node["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        assert sharing_of(node) == ("1", "none", "8", None)
        assert simulator.reconfigurations == {ours: 1}
    finally:
        await api.delete(f"/api/v1/nodes/{name}")


async def test_without_verify_capacity_follows_but_gfd_labels_do_not(
    control_plane: ControlPlane, plugin_namespace: str, api: RawClient
) -> None:
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_namespace, verify=False
    ) as sim:
        (name,) = await sim.create_gpu_nodes(pool=unique("noverify"), count=1)
        await sim.relabel(name, {CONFIG: TS4})
        await sim.wait_idle()
        assert sharing_of(await read_node(api, name)) == ("1", "none", "32", None)


async def test_reaction_delay_holds_the_agents_back(
    control_plane: ControlPlane, plugin_namespace: str, api: RawClient
) -> None:
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_namespace, reaction_delay=1.5
    ) as sim:
        (name,) = await sim.create_gpu_nodes(pool=unique("slow"), count=1)
        await sim.wait_idle()
        await sim.relabel(name, {CONFIG: TS4})
        await asyncio.sleep(0.7)
        assert sharing_of(await read_node(api, name)) == ("1", "none", "8", None)
        await sim.wait_idle()
        assert sharing_of(await read_node(api, name)) == ("4", "time-slicing", "32", None)


async def test_created_nodes_are_deleted_on_exit(
    control_plane: ControlPlane, plugin_namespace: str, api: RawClient
) -> None:
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_namespace
    ) as sim:
        names = await sim.create_gpu_nodes(pool=unique("gone"), count=2)
    for name in names:
        status, _ = await api.get(f"/api/v1/nodes/{name}")
        assert status == 404


# -- the pure parts --------------------------------------------------------------------------


def test_watch_lines_reassemble_lines_from_any_chunking_including_huge_ones() -> None:
    node = bodies.gpu_node(name="gpu-huge", pool="p", images=400)  # one line of ~75 KiB
    stream = b"".join(
        bodies.watch_event_line("MODIFIED", node, resource_version=str(rv)) for rv in (1, 2, 3)
    )
    assert len(stream) > 3 * 65_536
    for size in (1, 7, 4096, 65_536, len(stream)):
        lines = WatchLines()
        decoded = [
            orjson.loads(line)
            for start in range(0, len(stream), size)
            for line in lines.feed(stream[start : start + size])
        ]
        versions = [event["object"]["metadata"]["resourceVersion"] for event in decoded]
        assert versions == ["1", "2", "3"], size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (plugin_config(None), NO_SHARING),
        (plugin_config("timeSlicing", 4), Sharing("time-slicing", 4)),
        (plugin_config("mps", 8, rename=True), Sharing("mps", 8, rename_by_default=True)),
        (plugin_config("timeSlicing", 1), None),  # the plugin refuses fewer than 2 replicas
        ("version: v2\n", None),
        (  # both strategies at once
            "version: v1\nsharing:\n"
            "  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
            "  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
            None,
        ),
        ("{not yaml", None),
    ],
)
def test_device_plugin_configs_parse_as_the_plugin_reads_them(
    text: str, expected: Sharing | None
) -> None:
    assert parse_device_plugin_config(text) == expected


def test_sharing_capacity_with_and_without_rename() -> None:
    assert Sharing("time-slicing", 4).capacity(gpus=8) == {
        "nvidia.com/gpu": "32",
        "nvidia.com/gpu.shared": None,
    }
    assert Sharing("mps", 2, rename_by_default=True).capacity(gpus=8) == {
        "nvidia.com/gpu": "0",
        "nvidia.com/gpu.shared": "16",
    }
    assert NO_SHARING.capacity(gpus=8) == {"nvidia.com/gpu": "8", "nvidia.com/gpu.shared": None}

"""The GPU node simulator plays config manager + device plugin + GFD against a real API server.

Each behaviour of the real agents (see docs/simulator.md) has a test here that fails without
it: the -SHARED product suffix, the plugin's restart window, the config manager's blindness to
content changes, its back-off on a missing key, its lagging view of the ConfigMap, a refused
config, and a node whose agents are broken.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import yaml

from gpushare_testing import bodies
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.simulator import GpuClusterSimulator, RawClient, WatchLines
from gpushare_testing.waiting import eventually

CONFIG = "nvidia.com/device-plugin.config"
PRODUCT = "nvidia.com/gpu.product"
TS4 = "inference-ts4-a1b2c3"
MPS8 = "batch-mps8-d4e5f6"
CONFIGMAP = "gpushare-device-plugin-configs"


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
    configmap = {"metadata": {"name": CONFIGMAP}, "data": CONFIGS}
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


def simulator_with(
    control_plane: ControlPlane, plugin_namespace: str, **knobs: Any
) -> GpuClusterSimulator:
    return GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_namespace, **knobs
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def read_node(api: RawClient, name: str) -> dict[str, Any]:
    status, node = await api.get(f"/api/v1/nodes/{name}")
    assert status == 200, node
    return dict(node)


async def set_config(api: RawClient, namespace: str, key: str, text: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps/{CONFIGMAP}"
    status, body = await api.patch(path, {"data": {key: text}})
    assert status == 200, body


def sharing_of(node: dict[str, Any]) -> tuple[str, str, str | None, str | None]:
    """GFD's two sharing labels and the advertised (allocatable) GPU resources of a node."""
    labels, allocatable = node["metadata"]["labels"], node["status"]["allocatable"]
    return (
        labels["nvidia.com/gpu.replicas"],
        labels["nvidia.com/gpu.sharing-strategy"],
        allocatable.get("nvidia.com/gpu"),
        allocatable.get("nvidia.com/gpu.shared"),
    )


def gpus_of(node: dict[str, Any]) -> tuple[str | None, str | None]:
    """``nvidia.com/gpu`` in capacity and in allocatable."""
    status = node["status"]
    return status["capacity"].get("nvidia.com/gpu"), status["allocatable"].get("nvidia.com/gpu")


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
        assert node["metadata"]["labels"][PRODUCT] == "NVIDIA-L4"
        assert len(node["status"]["images"]) == 40
        assert "kubelet" in {entry["manager"] for entry in node["metadata"]["managedFields"]}
        assert sharing_of(node) == ("1", "none", "4", None)
    assert simulator.node_names == sorted(names)
    assert simulator.reconfigurations == {}


async def test_time_slicing_makes_gfd_labels_capacity_and_the_shared_suffix_follow(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    (name,) = await simulator.create_gpu_nodes(pool=unique("ts"), count=1, product="Tesla-T4")
    before = await read_node(api, name)
    await simulator.relabel(name, {CONFIG: TS4})
    await simulator.wait_idle()
    node = await read_node(api, name)
    assert sharing_of(node) == ("4", "time-slicing", "32", None)
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "32"
    assert node["metadata"]["labels"][PRODUCT] == "Tesla-T4-SHARED"
    managers = {entry["manager"] for entry in node["metadata"]["managedFields"]}
    assert {"gpu-feature-discovery", "nvidia-device-plugin", "kubectl-label"} <= managers
    assert simulator.reconfigurations == {name: 1}
    # GFD changed only what sharing changes (and its timestamp).
    changed = {
        k
        for k in before["metadata"]["labels"]
        if before["metadata"]["labels"][k] != node["metadata"]["labels"].get(k)
    }
    assert changed == {
        PRODUCT,
        "nvidia.com/gpu.replicas",
        "nvidia.com/gpu.sharing-strategy",
        "nvidia.com/gfd.timestamp",
    }

    # An event that changes nothing the agents care about makes them do nothing.
    await simulator.relabel(name, {"team": "search"})
    await simulator.wait_idle()
    assert simulator.reconfigurations == {name: 1}

    # Sharing ends: the suffix goes.
    await simulator.relabel(name, {CONFIG: "default"})
    await simulator.wait_idle()
    node = await read_node(api, name)
    assert node["metadata"]["labels"][PRODUCT] == "Tesla-T4"
    assert sharing_of(node) == ("1", "none", "8", None)


async def test_mps_with_rename_by_default_advertises_the_shared_resource_without_suffix(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    (name,) = await simulator.create_gpu_nodes(pool=unique("mps"), count=1)
    await simulator.relabel(name, {CONFIG: MPS8})
    await simulator.wait_idle()
    node = await read_node(api, name)
    # kubelet zeroes the resource the plugin stopped registering; it does not remove it.
    assert sharing_of(node) == ("8", "mps", "0", "64")
    assert node["status"]["capacity"]["nvidia.com/gpu.shared"] == "64"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "0"
    assert node["metadata"]["labels"]["nvidia.com/mps.capable"] == "true"
    assert node["metadata"]["labels"][PRODUCT] == "NVIDIA-H100-80GB-HBM3"  # renamed: no suffix
    created = bodies.gpu_node(name=name, pool="any")["metadata"]["labels"]
    assert (
        node["metadata"]["labels"]["nvidia.com/gfd.timestamp"]
        != created["nvidia.com/gfd.timestamp"]
    )


async def test_the_plugin_restart_shows_allocatable_zero_then_the_new_value(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    (name,) = await simulator.create_gpu_nodes(pool=unique("restart"), count=1)
    await simulator.wait_idle()
    await simulator.relabel(name, {CONFIG: TS4})

    async def gpus() -> tuple[str | None, str | None]:
        return gpus_of(await read_node(api, name))

    # Capacity kept, allocatable 0: kubelet's view of a plugin that went away.
    await eventually(gpus, until=lambda g: g == ("8", "0"), what="the restart window")
    node = await read_node(api, name)
    assert node["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "1"  # GFD waits for it
    await eventually(gpus, until=lambda g: g == ("32", "32"), what="the plugin to come back")
    await simulator.wait_idle()
    assert sharing_of(await read_node(api, name)) == ("4", "time-slicing", "32", None)


async def test_the_config_manager_ignores_a_content_change_under_an_unchanged_label(
    simulator: GpuClusterSimulator, api: RawClient, plugin_namespace: str
) -> None:
    (name,) = await simulator.create_gpu_nodes(pool=unique("content"), count=1)
    await simulator.relabel(name, {CONFIG: TS4})
    await simulator.wait_idle()
    await set_config(api, plugin_namespace, TS4, plugin_config("timeSlicing", 2))
    await simulator.wait_idle()  # includes the config managers' view catching up
    assert sharing_of(await read_node(api, name)) == ("4", "time-slicing", "32", None)
    assert simulator.reconfigurations == {name: 1}

    # A label change makes it read the key again, new content included.
    await simulator.relabel(name, {CONFIG: MPS8})
    await simulator.wait_idle()
    await simulator.relabel(name, {CONFIG: TS4})
    await simulator.wait_idle()
    assert sharing_of(await read_node(api, name)) == ("2", "time-slicing", "16", "0")
    assert simulator.reconfigurations == {name: 3}


async def test_a_missing_key_is_retried_with_backoff_while_the_node_keeps_its_config(
    control_plane: ControlPlane, api: RawClient, plugin_namespace: str
) -> None:
    async with simulator_with(
        control_plane, plugin_namespace, backoff_initial=0.2, backoff_cap=0.8
    ) as sim:
        (name,) = await sim.create_gpu_nodes(pool=unique("missing"), count=1, product="Tesla-T4")
        await sim.relabel(name, {CONFIG: TS4})
        await sim.wait_idle()
        before = await read_node(api, name)
        await sim.relabel(name, {CONFIG: "inference-ts2-ffffff"})

        async def failures() -> tuple[float, ...]:
            return sim.config_manager_failures.get(name, ())

        runs = await eventually(failures, until=lambda f: len(f) >= 6, what="six failed runs")
        gaps = [later - earlier for earlier, later in itertools.pairwise(runs)]
        assert gaps[0] >= 0.2 and gaps[1] >= 0.4 and gaps[2] >= 0.8  # doubling...
        assert gaps[4] < 1.6  # ...up to the cap: uncapped, it would be 3.2
        await sim.wait_idle()  # a crash loop that would only fail again is idle
        after = await read_node(api, name)
        # Neither the new config nor a reset: labels, capacity, allocatable as they were.
        assert sharing_of(after) == ("4", "time-slicing", "32", None)
        assert after["status"]["capacity"] == before["status"]["capacity"]
        assert after["metadata"]["labels"][PRODUCT] == "Tesla-T4-SHARED"
        assert sim.reconfigurations == {name: 1}

        # Once the key is written, the crash-looping config manager comes up with it.
        await set_config(api, plugin_namespace, "inference-ts2-ffffff", plugin_config("mps", 2))
        await sim.wait_idle()
        assert sharing_of(await read_node(api, name)) == ("2", "mps", "16", None)
        assert sim.config_manager_failures == {}


async def test_the_config_managers_view_of_the_configmap_lags_the_api_server(
    control_plane: ControlPlane, api: RawClient, plugin_namespace: str
) -> None:
    lag = 1.5
    async with simulator_with(
        control_plane, plugin_namespace, config_sync_delay=lag, backoff_initial=0.1
    ) as sim:
        (name,) = await sim.create_gpu_nodes(pool=unique("lag"), count=1)
        await sim.wait_idle()
        written = time.monotonic()
        await set_config(api, plugin_namespace, "fresh-ts3-abcdef", plugin_config("timeSlicing", 3))
        await sim.relabel(name, {CONFIG: "fresh-ts3-abcdef"})  # as an operator would, at once

        async def gpus() -> tuple[str | None, str | None]:
            return gpus_of(await read_node(api, name))

        await eventually(gpus, until=lambda g: g == ("24", "24"), what="the new config")
        assert time.monotonic() - written >= lag
        await sim.wait_idle()
        assert sim.reconfigurations == {name: 1}


async def test_a_refused_config_keeps_labels_and_capacity_but_the_plugin_is_down(
    simulator: GpuClusterSimulator, api: RawClient, plugin_namespace: str
) -> None:
    (name,) = await simulator.create_gpu_nodes(pool=unique("refused"), count=1)
    await set_config(api, plugin_namespace, "bad-ts1-000000", plugin_config("timeSlicing", 1))
    await simulator.relabel(name, {CONFIG: TS4})
    await simulator.wait_idle()
    await simulator.relabel(name, {CONFIG: "bad-ts1-000000"})

    async def failures() -> int:
        return simulator.plugin_failures.get(name, 0)

    await eventually(failures, what="the plugin to refuse replicas: 1")
    await simulator.wait_idle()
    node = await read_node(api, name)
    assert node["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"
    assert gpus_of(node) == ("32", "0")  # a crash-looping plugin serves nothing

    await simulator.relabel(name, {CONFIG: TS4})
    await simulator.wait_idle()
    assert sharing_of(await read_node(api, name)) == ("4", "time-slicing", "32", None)


async def test_a_node_with_broken_agents_shows_nothing_new_until_healed(
    simulator: GpuClusterSimulator, api: RawClient
) -> None:
    broken, fine = await simulator.create_gpu_nodes(pool=unique("broken"), count=2)
    await simulator.wait_idle()
    simulator.set_healthy(broken, False)
    await simulator.relabel(broken, {CONFIG: TS4})
    await simulator.relabel(fine, {CONFIG: TS4})
    await simulator.wait_idle()
    assert sharing_of(await read_node(api, fine)) == ("4", "time-slicing", "32", None)
    assert sharing_of(await read_node(api, broken)) == ("1", "none", "8", None)

    simulator.set_healthy(broken, True)
    await simulator.wait_idle()
    assert sharing_of(await read_node(api, broken)) == ("4", "time-slicing", "32", None)


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
        assert sharing_of(node)[:3] == ("1", "none", "8")
        assert node["metadata"]["labels"]["nvidia.com/mps.capable"] == "false"
    # The shared resource was registered once: kubelet keeps it, at 0.
    assert (await read_node(api, second))["status"]["capacity"]["nvidia.com/gpu.shared"] == "0"
    assert "nvidia.com/gpu.shared" not in (await read_node(api, first))["status"]["capacity"]
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
    async with simulator_with(control_plane, plugin_namespace, verify=False) as sim:
        (name,) = await sim.create_gpu_nodes(pool=unique("noverify"), count=1)
        await sim.relabel(name, {CONFIG: TS4})
        await sim.wait_idle()
        node = await read_node(api, name)
        assert sharing_of(node) == ("1", "none", "32", None)
        assert node["metadata"]["labels"][PRODUCT] == "NVIDIA-H100-80GB-HBM3"


async def test_reaction_delay_holds_the_config_manager_back(
    control_plane: ControlPlane, plugin_namespace: str, api: RawClient
) -> None:
    async with simulator_with(
        control_plane, plugin_namespace, reaction_delay=1.5, restart_window=0.0
    ) as sim:
        (name,) = await sim.create_gpu_nodes(pool=unique("slow"), count=1)
        await sim.wait_idle()
        labelled = time.monotonic()
        await sim.relabel(name, {CONFIG: TS4})

        async def gpus() -> tuple[str | None, str | None]:
            return gpus_of(await read_node(api, name))

        await eventually(gpus, until=lambda g: g == ("32", "32"), what="the new config")
        assert time.monotonic() - labelled >= 1.5
        await sim.wait_idle()
        assert sharing_of(await read_node(api, name)) == ("4", "time-slicing", "32", None)


async def test_created_nodes_are_deleted_on_exit(
    control_plane: ControlPlane, plugin_namespace: str, api: RawClient
) -> None:
    async with simulator_with(control_plane, plugin_namespace) as sim:
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

"""The simulator alone plays the MIG manager, GFD and the device plugin on the real control plane.

No operator runs: each test labels a node by hand (a raw client, as an admin would), writes the
device-plugin and mig-parted ConfigMaps, and reads what the simulated NVIDIA agents did: the
MIG manager's label writes in the API server's audit log (their order is the state sequence),
GFD's labels and kubelet's allocatable on the Node.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from gpushare_testing.auditlog import AuditEvent, received
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create_pod
from gpushare_testing.simulator import GpuClusterSimulator

H100 = "NVIDIA-H100-80GB-HBM3"
STATE = "nvidia.com/mig.config.state"
MIG_CONFIG = "nvidia.com/mig.config"
PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
DEPLOY_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DEPLOY_GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
PAUSED = "paused-for-mig-change"
DEVICE_PLUGIN_CONFIGMAP = "gpushare-device-plugin-configs"
MIG_CONFIGMAP = "gpushare-mig-parted-config"

PLUGIN_CONFIGS = {
    "default": "version: v1\nflags:\n  migStrategy: none\n",
    "mig-single": "version: v1\nflags:\n  migStrategy: single\n",
    "mig-mixed-ts2": yaml.safe_dump(
        {
            "version": "v1",
            "flags": {"migStrategy": "mixed"},
            "sharing": {
                "timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}
            },
        }
    ),
}
MIG_CONFIGS = {
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
    "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
    "mixed-3-2-1": [
        {
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
        }
    ],
    "too-many": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 8}}],
}


async def _write_configmaps(sim: GpuClusterSimulator, namespace: str) -> None:
    mig_text = yaml.safe_dump({"version": "v1", "mig-configs": MIG_CONFIGS})
    for name, data in (
        (DEVICE_PLUGIN_CONFIGMAP, PLUGIN_CONFIGS),
        (MIG_CONFIGMAP, {"config.yaml": mig_text}),
    ):
        body = {"metadata": {"name": name}, "data": data}
        status, answer = await sim.client.post(f"/api/v1/namespaces/{namespace}/configmaps", body)
        assert status == 201, answer
    await sim.wait_idle()


async def _node(sim: GpuClusterSimulator, namespace: str, product: str = H100) -> str:
    [name] = await sim.create_gpu_nodes(pool=namespace, count=1, gpus=2, product=product)
    await _write_configmaps(sim, namespace)
    return name


async def _label(sim: GpuClusterSimulator, name: str, labels: dict[str, str]) -> None:
    """What the operator does in one apply: both labels at once (here an admin's patch)."""
    status, answer = await sim.client.patch(
        f"/api/v1/nodes/{name}", {"metadata": {"labels": labels}}, params={"fieldManager": "admin"}
    )
    assert status == 200, answer


async def _settled(sim: GpuClusterSimulator, name: str) -> dict[str, Any]:
    await sim.wait_idle(timeout=60.0)
    status, node = await sim.client.get(f"/api/v1/nodes/{name}")
    assert status == 200, node
    return dict(node)


def _manager_writes(plane: ControlPlane, name: str, since: datetime) -> list[AuditEvent]:
    """The MIG manager's writes to the node, in the order the API server received them."""
    events = [
        e
        for e in plane.audit_events()
        if e["objectRef"].get("resource") == "nodes"
        and e["objectRef"].get("name") == name
        and "fieldManager=nvidia-mig-manager" in e.get("requestURI", "")
        and received(e) >= since
    ]
    return sorted(events, key=received)


def _labels_written(events: list[AuditEvent]) -> list[dict[str, str]]:
    return [((e.get("requestObject") or {}).get("metadata") or {}).get("labels") for e in events]


def _states(events: list[AuditEvent]) -> list[str]:
    return [labels[STATE] for labels in _labels_written(events) if labels and STATE in labels]


async def test_models_are_mig_capable_as_nvidia_lists_them(
    sim: GpuClusterSimulator, namespace: str
) -> None:
    for product, capable in (
        ("NVIDIA-A100-SXM4-40GB", "true"),
        ("NVIDIA-A30-PCIE-24GB", "true"),
        ("NVIDIA-H200-141GB-HBM3e", "true"),
        ("NVIDIA-B200-180GB-HBM3e", "true"),
        ("NVIDIA-L4", "false"),
    ):
        [name] = await sim.create_gpu_nodes(
            pool=namespace, count=1, prefix=f"{namespace}-{product.lower()[:12]}", product=product
        )
        status, node = await sim.client.get(f"/api/v1/nodes/{name}")
        assert status == 200, node
        assert node["metadata"]["labels"]["nvidia.com/mig.capable"] == capable, product


async def test_single_layout_pending_paused_then_success_with_gfd_and_allocatable(
    sim: GpuClusterSimulator, control_plane: ControlPlane, namespace: str
) -> None:
    name = await _node(sim, namespace)
    since = datetime.now(UTC)
    await _label(sim, name, {PLUGIN_CONFIG: "mig-single", MIG_CONFIG: "all-1g.10gb"})
    node = await _settled(sim, name)
    labels = node["metadata"]["labels"]
    assert labels[STATE] == "success"
    writes = _manager_writes(control_plane, name, since)
    written = _labels_written(writes)
    assert _states(writes) == ["pending", "success"], written
    # pending, then the components paused, then restored, then success: reconfigure.go's order.
    assert written[1][DEPLOY_PLUGIN] == PAUSED and written[1][DEPLOY_GFD] == PAUSED, written
    assert written[2][DEPLOY_PLUGIN] == "true" and written[-1] == {STATE: "success"}, written
    assert labels[DEPLOY_PLUGIN] == labels[DEPLOY_GFD] == "true"
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == f"{H100}-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "10240"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "14"
    assert sim.mig.runs[name] == [("all-1g.10gb", "success")]


async def test_mixed_layout_time_sliced_advertises_each_profile(
    sim: GpuClusterSimulator, namespace: str
) -> None:
    name = await _node(sim, namespace)
    await _label(sim, name, {PLUGIN_CONFIG: "mig-mixed-ts2", MIG_CONFIG: "mixed-3-2-1"})
    node = await _settled(sim, name)
    labels, allocatable = node["metadata"]["labels"], node["status"]["allocatable"]
    assert labels[STATE] == "success" and labels["nvidia.com/mig.strategy"] == "mixed"
    assert allocatable["nvidia.com/mig-1g.10gb"] == "4"  # 1 per GPU x 2 GPUs x 2 replicas
    assert allocatable["nvidia.com/mig-2g.20gb"] == allocatable["nvidia.com/mig-3g.40gb"] == "2"
    assert allocatable["nvidia.com/gpu"] == "0"  # registered at first, served no more
    assert labels["nvidia.com/mig-1g.10gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.10gb.replicas"] == "2"
    assert labels["nvidia.com/mig-1g.10gb.product"] == f"{H100}-MIG-1g.10gb-SHARED"
    assert labels["nvidia.com/mig-3g.40gb.memory"] == "40960"
    assert labels["nvidia.com/gpu.product"] == H100 and labels["nvidia.com/gpu.count"] == "2"
    # Back to all-disabled: the MIG labels go, the full GPUs come back.
    await _label(sim, name, {PLUGIN_CONFIG: "default", MIG_CONFIG: "all-disabled"})
    node = await _settled(sim, name)
    labels = node["metadata"]["labels"]
    assert labels[STATE] == "success"
    assert not [k for k in labels if k.startswith("nvidia.com/mig-")], labels
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "0"


async def test_a_layout_nvidia_refuses_fails_and_leaves_empty_mig_gpus(
    sim: GpuClusterSimulator, control_plane: ControlPlane, namespace: str
) -> None:
    name = await _node(sim, namespace)
    since = datetime.now(UTC)
    await _label(sim, name, {PLUGIN_CONFIG: "mig-single", MIG_CONFIG: "too-many"})
    node = await _settled(sim, name)
    labels = node["metadata"]["labels"]
    assert _states(_manager_writes(control_plane, name, since)) == ["pending", "failed"]
    assert labels[STATE] == "failed" and labels[DEPLOY_PLUGIN] == "true"
    assert "cannot hold" in sim.mig.failures[name]
    # MIG is on with no device: the plugin refuses to start, GFD says INVALID.
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "0"
    assert labels["nvidia.com/gpu.product"] == f"{H100}-MIG-INVALID"
    assert sim.plugin_failures.get(name, 0) >= 1


async def test_a_config_missing_from_the_lagging_view_fails_without_pausing(
    sim: GpuClusterSimulator, control_plane: ControlPlane, namespace: str
) -> None:
    name = await _node(sim, namespace)
    since = datetime.now(UTC)
    await _label(sim, name, {MIG_CONFIG: "not-there"})
    node = await _settled(sim, name)
    writes = _manager_writes(control_plane, name, since)
    assert _states(writes) == ["failed"]
    assert not [w for w in _labels_written(writes) if PAUSED in (w or {}).values()]
    assert node["metadata"]["labels"][STATE] == "failed"
    assert "not in the mig-parted config file" in sim.mig.failures[name]


async def test_a_pod_holding_a_gpu_fails_the_change(
    sim: GpuClusterSimulator, control_plane: ControlPlane, namespace: str
) -> None:
    name = await _node(sim, namespace)
    await create_pod(sim, namespace, "holder", name)
    await sim.wait_idle()
    since = datetime.now(UTC)
    await _label(sim, name, {PLUGIN_CONFIG: "mig-single", MIG_CONFIG: "all-1g.10gb"})
    node = await _settled(sim, name)
    assert _states(_manager_writes(control_plane, name, since)) == ["pending", "failed"]
    assert f"{namespace}/holder" in sim.mig.failures[name]
    # Nothing changed on the GPUs: the plugin came back serving the two full GPUs.
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == H100
    # The same label again does not retry (the informer acts on a change of value only).
    await _label(sim, name, {MIG_CONFIG: "all-1g.10gb"})
    await _settled(sim, name)
    assert len(sim.mig.runs[name]) == 1


@pytest.mark.simulator(mig_reboot_seconds=1.0)
async def test_a_mode_change_with_reboot_goes_not_ready_and_back(
    sim: GpuClusterSimulator, control_plane: ControlPlane, namespace: str
) -> None:
    name = await _node(sim, namespace)
    since = datetime.now(UTC)
    await _label(sim, name, {PLUGIN_CONFIG: "mig-single", MIG_CONFIG: "all-1g.10gb"})
    node = await _settled(sim, name)
    writes = _manager_writes(control_plane, name, since)
    assert _states(writes) == ["pending", "rebooting", "pending", "success"]
    ready = [
        c["status"]
        for e in control_plane.audit_events()
        if e["objectRef"].get("name") == name
        and e["objectRef"].get("subresource") == "status"
        and received(e) >= since
        for c in ((e.get("requestObject") or {}).get("status") or {}).get("conditions") or []
        if c.get("type") == "Ready"
    ]
    assert ready == ["Unknown", "True"], ready
    assert sim.mig.reboots[name] == 1
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "14"


async def test_an_injected_error_fails_the_next_change_only(
    sim: GpuClusterSimulator, control_plane: ControlPlane, namespace: str
) -> None:
    name = await _node(sim, namespace)
    sim.mig.fail_next(name, "Insufficient Resources")
    since = datetime.now(UTC)
    await _label(sim, name, {PLUGIN_CONFIG: "mig-single", MIG_CONFIG: "all-1g.10gb"})
    await _settled(sim, name)
    await _label(sim, name, {MIG_CONFIG: "mixed-3-2-1", PLUGIN_CONFIG: "mig-mixed-ts2"})
    node = await _settled(sim, name)
    writes = _manager_writes(control_plane, name, since)
    assert _states(writes) == ["pending", "failed", "pending", "success"]
    assert sim.mig.runs[name] == [("all-1g.10gb", "failed"), ("mixed-3-2-1", "success")]
    assert node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "2"

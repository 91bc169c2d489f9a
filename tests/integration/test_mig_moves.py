"""A node moving between two MIG policies whose layouts are identical, on the real control plane:
only its labels change.  The MIG manager (simulated from NVIDIA/mig-parted
``pkg/mig/reconfigure/reconfigure.go``) finds the named config already applied and says
``success`` without pausing anything; gpushare neither taints the node, nor waits for its GPU
pod, nor evicts it.  Every "nothing happened" is counted from the API server's audit log.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import migparted
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create, read, small_pod
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.rolloutstate import all_verified
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

H100 = "NVIDIA-H100-80GB-HBM3"
MIG_LABEL = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
MIG_CONFIGMAP = "gpushare-mig-parted-config"
LAYOUT = {"3g.40gb": 1, "1g.10gb": 4}
SMALL = "nvidia.com/mig-1g.10gb"


def mig_policy(name: str, *, pool: str, priority: int = 0, **rollout: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": pool}},
            "priority": priority,
            "strategy": "MIG",
            "mig": {"devices": LAYOUT},
            "rollout": {"maxUnavailable": "100%", "canary": 0, **rollout},
        },
    }


async def mig_configs(sim: GpuClusterSimulator, namespace: str) -> dict[str, Any]:
    """The mig-parted ConfigMap's configs, read back by the simulator's own mig-parted parser."""
    body = await h.ok(
        sim.client, "GET", f"/api/v1/namespaces/{namespace}/configmaps/{MIG_CONFIGMAP}"
    )
    spec = migparted.parse_mig_parted_config(body["data"]["config.yaml"])
    return {
        name: [(e.devices, e.mig_enabled, dict(e.mig_devices)) for e in entries]
        for name, entries in spec.configs.items()
    }


def node_writes(plane: ControlPlane, node: str, *, since: float) -> list[Mapping[str, Any]]:
    """Every successful write to the Node since ``since``, by anyone, in log order."""
    return [
        e
        for e in plane.audit_events()
        if e["objectRef"].get("resource") == "nodes"
        and e["objectRef"].get("name") == node
        and e["verb"] in ("patch", "update")
        and 200 <= int((e.get("responseStatus") or {}).get("code", 0)) < 300
        and audit.moment(e) >= since
    ]


def labels_written(event: Mapping[str, Any]) -> dict[str, Any]:
    body = event.get("requestObject")
    return dict((body.get("metadata") or {}).get("labels") or {}) if isinstance(body, dict) else {}


async def test_an_identical_layout_under_another_policy_is_only_a_label_change(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("migmove")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, product=H100, gpus=1, mig_preset=False)
    first, second = h.unique("mig-a"), h.unique("mig-b")
    await h.add_policy(sim, policies, mig_policy(first, pool=pool))
    await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, [node], first)
    # A GPU pod on one of the slices: a change of layout would have to wait for it.
    pod = small_pod("holder", gpus=1, selector={"pool": pool})
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits[SMALL] = limits.pop("nvidia.com/gpu")
    await create(sim, pods_ns, pod)
    await eventually(
        lambda: read(sim, pods_ns, "holder"),
        until=lambda p: p["status"].get("phase") == "Running",
        what="the holder running",
    )
    runs_before = len(sim.mig.runs.get(node, ()))
    since = time.time()

    # The second policy wins the node (priority) with the very same layout.
    await h.add_policy(sim, policies, mig_policy(second, pool=pool, priority=10))
    await all_verified(sim, [node], second)

    configs = await mig_configs(sim, namespace)
    node_body = await h.node(sim.client, node)
    name = node_body["metadata"]["labels"][MIG_LABEL]
    assert name.startswith(second)  # the new policy's name for the layout ...
    [old] = [n for n in configs if n.startswith(first)]
    assert configs[name] == configs[old]  # ... whose content is the old one's
    # gpushare: one label apply (the new key, policy and layout name), no taint, no eviction.
    [(_, _, key)] = audit.label_writes(control_plane, [node], since=since)
    applies = [e for e in node_writes(control_plane, node, since=since) if labels_written(e)]
    ours = [labels_written(e) for e in applies if e["user"]["username"] == h.OPERATOR_USER]
    assert any(labels.get(MIG_LABEL) == name for labels in ours), ours
    assert audit.taint_writes(control_plane, [node], since=since) == []
    evictions = [
        e
        for e in control_plane.audit_events()
        if e["objectRef"].get("subresource") == "eviction" and audit.moment(e) >= since
    ]
    assert evictions == []
    # The MIG manager: one run, already applied: never pending, nothing paused.
    assert all(labels_written(e).get(MIG_STATE) != "pending" for e in applies)
    assert not any(
        value == "paused-for-mig-change" for e in applies for value in labels_written(e).values()
    )
    assert sim.mig.runs[node][runs_before:] == [(name, "success")]
    assert sim.mig.failures.get(node) is None
    # The pod ran through it, on its slice.
    kept = await read(sim, pods_ns, "holder")
    assert kept["status"]["phase"] == "Running" and not kept["metadata"].get("deletionTimestamp")
    assert key is not None

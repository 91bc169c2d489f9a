"""The realistic bodies are realistic: size, determinism, labels, and status-only heartbeats."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest

from gpushare_testing import bodies, podbodies

GFD_LABELS = (
    "nvidia.com/gpu.present",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.machine",
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
    "nvidia.com/cuda.runtime.major",
    "nvidia.com/cuda.runtime.minor",
    "nvidia.com/gfd.timestamp",
    "nvidia.com/mig.capable",
    "nvidia.com/mig.strategy",
    "nvidia.com/mps.capable",
    "nvidia.com/gpu.replicas",
    "nvidia.com/gpu.sharing-strategy",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/gpu.compute.minor",
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
)
NODE_LABELS = (
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
)


def _size(body: Any) -> int:
    return len(orjson.dumps(body))


def test_a_gpu_node_is_about_15_kb_of_json() -> None:
    node = bodies.gpu_node(name="gpu-h100-0001", pool="inference")
    assert 12_000 <= _size(node) <= 20_000
    slim = bodies.gpu_node(name="gpu-h100-0001", pool="inference", managed_fields=False)
    assert "managedFields" not in slim["metadata"]
    assert _size(slim) < _size(node) - 3_000


def test_nodes_are_deterministic_per_name_and_differ_between_names() -> None:
    first = bodies.gpu_node(name="gpu-a-0001", pool="p")
    again = bodies.gpu_node(name="gpu-a-0001", pool="p")
    other = bodies.gpu_node(name="gpu-a-0002", pool="p")
    assert orjson.dumps(first) == orjson.dumps(again)
    assert first is not again
    assert first["metadata"]["labels"] is not again["metadata"]["labels"]
    assert first["metadata"]["uid"] != other["metadata"]["uid"]
    assert first["status"]["nodeInfo"]["machineID"] != other["status"]["nodeInfo"]["machineID"]
    assert first["status"]["addresses"] != other["status"]["addresses"]


def test_node_carries_kubelet_nfd_gfd_labels_and_the_pool() -> None:
    node = bodies.gpu_node(
        name="gpu-t4-0007",
        pool="batch",
        product="Tesla-T4",
        gpus=4,
        memory_mib=15360,
        mig_strategy="none",
        extra_labels={"team": "vision"},
    )
    labels = node["metadata"]["labels"]
    for key in (*GFD_LABELS, *NODE_LABELS):
        assert key in labels, key
    nfd = [key for key in labels if key.startswith("feature.node.kubernetes.io/")]
    assert len(nfd) >= 10
    assert labels["kubernetes.io/hostname"] == "gpu-t4-0007"
    assert labels["pool"] == "batch"
    assert labels["team"] == "vision"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.memory"] == "15360"
    assert labels["nvidia.com/gpu.family"] == "turing"
    assert labels["nvidia.com/mig.capable"] == "false"
    assert labels["nvidia.com/mig.strategy"] == "none"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"


def test_node_status_advertises_gpus_and_looks_like_kubelet_wrote_it() -> None:
    node = bodies.gpu_node(name="gpu-a-0003", pool="p", gpus=8, images=40)
    status = node["status"]
    for section in ("capacity", "allocatable"):
        assert status[section]["nvidia.com/gpu"] == "8"
        assert {"cpu", "memory", "pods", "ephemeral-storage", "hugepages-1Gi"} <= set(
            status[section]
        )
    assert [c["type"] for c in status["conditions"]] == [
        "NetworkUnavailable",
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "Ready",
    ]
    assert all(c["lastHeartbeatTime"] for c in status["conditions"])
    assert status["nodeInfo"]["kubeletVersion"].startswith("v1.")
    assert {a["type"] for a in status["addresses"]} == {"InternalIP", "InternalDNS", "Hostname"}
    assert len(status["images"]) == 40
    for image in status["images"]:
        digest, tagged = image["names"]
        assert "@sha256:" in digest
        assert len(digest.rsplit(":", 1)[1]) == 64
        assert ":" in tagged
        assert "@" not in tagged
        assert image["sizeBytes"] > 0
    sizes = [image["sizeBytes"] for image in status["images"]]
    assert sizes == sorted(sizes, reverse=True)
    many = bodies.gpu_node(name="x", pool="p", images=100)["status"]["images"]
    assert len({tuple(image["names"]) for image in many}) == 100


def test_node_managed_fields_name_real_managers_and_own_real_fields() -> None:
    node = bodies.gpu_node(name="gpu-a-0004", pool="p")
    entries = node["metadata"]["managedFields"]
    managers = {entry["manager"] for entry in entries}
    assert {"kubelet", "kube-controller-manager", "gpu-feature-discovery", "kubectl-label"} <= (
        managers
    )
    for entry in entries:
        assert entry["fieldsType"] == "FieldsV1"
        assert entry["operation"] == "Update"
    gfd = next(e for e in entries if e["manager"] == "gpu-feature-discovery")
    owned = gfd["fieldsV1"]["f:metadata"]["f:labels"]
    assert "f:nvidia.com/gpu.count" in owned
    assert "f:pool" not in owned
    status_entry = next(e for e in entries if e.get("subresource") == "status")
    conditions = status_entry["fieldsV1"]["f:status"]["f:conditions"]
    assert 'k:{"type":"Ready"}' in conditions
    assert "f:lastHeartbeatTime" in conditions['k:{"type":"Ready"}']


def test_heartbeat_changes_status_only_and_leaves_the_input_alone() -> None:
    node = bodies.gpu_node(name="gpu-a-0005", pool="p")
    before = copy.deepcopy(node)
    beat = bodies.heartbeat(node, at="2030-01-01T00:00:00Z")
    assert node == before
    assert beat["metadata"] == node["metadata"]
    assert beat["spec"] == node["spec"]
    assert beat["status"] != node["status"]
    changed = {k for k in node["status"] if beat["status"][k] != node["status"][k]}
    assert changed == {"conditions"}
    times = {c["type"]: c["lastHeartbeatTime"] for c in beat["status"]["conditions"]}
    assert times["Ready"] == times["MemoryPressure"] == "2030-01-01T00:00:00Z"
    assert times["NetworkUnavailable"] != "2030-01-01T00:00:00Z"  # written by the CNI, not kubelet


def test_relabel_sets_and_removes_labels_and_leaves_the_input_alone() -> None:
    node = bodies.gpu_node(name="gpu-a-0006", pool="p")
    before = copy.deepcopy(node)
    changed = bodies.relabel(node, {"nvidia.com/device-plugin.config": "k1", "pool": None})
    assert node == before
    assert changed["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "k1"
    assert "pool" not in changed["metadata"]["labels"]
    assert changed["status"] == node["status"]
    assert changed["metadata"]["uid"] == node["metadata"]["uid"]


def test_watch_event_line_is_one_newline_terminated_json_event_with_a_resource_version() -> None:
    node = bodies.gpu_node(name="gpu-a-0008", pool="p")
    line = bodies.watch_event_line("MODIFIED", node, resource_version="4242")
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    event = json.loads(line)
    assert event["type"] == "MODIFIED"
    assert event["object"]["metadata"]["resourceVersion"] == "4242"
    assert event["object"]["metadata"]["labels"] == node["metadata"]["labels"]
    assert "resourceVersion" not in node["metadata"]


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/gpu.shared"])
def test_shared_gpu_pod_asks_for_the_resource_in_limits_and_is_bound(resource: str) -> None:
    pod = podbodies.shared_gpu_pod(
        name="vllm-7d9c-x1", namespace="ml", node="gpu-1", resource=resource, count=2
    )
    assert 6_000 <= _size(pod) <= 11_000
    assert pod["spec"]["nodeName"] == "gpu-1"
    assert pod["metadata"]["namespace"] == "ml"
    (server,) = pod["spec"]["containers"]
    assert server["resources"]["limits"][resource] == "2"
    assert resource not in server["resources"]["requests"]
    assert "initContainers" not in pod["spec"]
    assert pod["status"]["phase"] == "Running"
    assert {e["manager"] for e in pod["metadata"]["managedFields"]} == {
        "kube-controller-manager",
        "kubelet",
    }


def test_shared_gpu_pod_init_and_sidecar_containers_and_unbound_pods() -> None:
    pod = podbodies.shared_gpu_pod(
        name="vllm-7d9c-x2", node=None, count=1, init_count=3, sidecar_count=2
    )
    assert "nodeName" not in pod["spec"]
    assert pod["status"]["phase"] == "Pending"
    init, sidecar = pod["spec"]["initContainers"]
    assert init["resources"]["limits"]["nvidia.com/gpu.shared"] == "3"
    assert "restartPolicy" not in init
    assert sidecar["resources"]["limits"]["nvidia.com/gpu.shared"] == "2"
    assert sidecar["restartPolicy"] == "Always"


def test_plain_pod_has_no_gpu_and_pods_share_no_mutable_parts() -> None:
    plain = podbodies.plain_pod(name="web-5f6b-a", node="cpu-1", phase="Succeeded")
    assert 6_000 <= _size(plain) <= 11_000
    assert "nvidia" not in json.dumps(plain["spec"]["containers"])
    assert plain["status"]["phase"] == "Succeeded"
    other = podbodies.plain_pod(name="web-5f6b-b", node="cpu-1")
    plain["spec"]["containers"][0]["env"].clear()
    plain["spec"]["tolerations"].clear()
    assert other["spec"]["containers"][0]["env"]
    assert other["spec"]["tolerations"]
    assert podbodies.plain_pod(name="web-5f6b-b", node="cpu-1") == other

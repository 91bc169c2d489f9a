"""NVIDIA's DRA kubelet plugin and the GPU Operator's deploy label, as pure rules.

What the simulator plays for backend DRA (``docs/simulator.md`` has the sources):

- **Which plugin runs.**  The GPU Operator's device-plugin DaemonSet selects
  ``nvidia.com/gpu.deploy.device-plugin=true``; the operator sets the label to ``true`` on a GPU
  node that lacks it and keeps any non-empty value a node carries (gpu-operator
  ``controllers/state_manager.go``, ``addGPUStateLabels``).  So ``false`` takes the device
  plugin off the node (kubelet keeps its resource with allocatable 0), and removing the label
  brings it back, once the GPU Operator has set ``true`` again.
- **The DRA kubelet plugin** runs where its DaemonSet's selector, ``gpushare.dev/dra-driver=
  true``, matches (the values gpushare's docs give the driver's chart).  The driver's chart
  refuses to run beside the device plugin on one node; harsher than reality, a slice appears
  only once the API server shows the device plugin's resource gone (allocatable 0 or absent).
- **Its ResourceSlice** (dra-driver-nvidia-gpu ``cmd/gpu-kubelet-plugin/deviceinfo.go``, and
  the docs' ResourceSlice attribute reference): driver ``gpu.nvidia.com``, one pool named after
  the node, a device ``gpu-<minor>`` per full GPU with attributes ``type`` (``gpu``), ``uuid``,
  ``productName``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``, ``index``,
  ``minor``, and capacity ``memory``.  It goes when the plugin goes (its label removed).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

DRIVER: Final = "gpu.nvidia.com"
DEPLOY_LABEL: Final = "nvidia.com/gpu.deploy.device-plugin"
DRA_LABEL: Final = "gpushare.dev/dra-driver"
GPU_RESOURCE: Final = "nvidia.com/gpu"
SLICES_PATH: Final = "/apis/resource.k8s.io/v1/resourceslices"
FIELD_MANAGER: Final = "gpu-kubelet-plugin"
# The GPU Operator's own field manager, for the deploy label it restores.
GPU_OPERATOR: Final = "gpu-operator"
_ARCHITECTURES: Final = {
    "hopper": "Hopper",
    "ampere": "Ampere",
    "blackwell": "Blackwell",
    "ada-lovelace": "Ada Lovelace",
    "turing": "Turing",
}


def device_plugin_deployed(labels: Mapping[str, str]) -> bool:
    """Whether the device-plugin DaemonSet has a pod on the node."""
    return labels.get(DEPLOY_LABEL) == "true"


def deploy_label_missing(labels: Mapping[str, str]) -> bool:
    """Whether the GPU Operator would set the deploy label (it sets only an absent one)."""
    return labels.get("nvidia.com/gpu.present") == "true" and DEPLOY_LABEL not in labels


def wants_slice(labels: Mapping[str, str], allocatable: Mapping[str, Any]) -> bool:
    """Whether the DRA kubelet plugin runs and publishes: selected, the device plugin off, and
    its resource gone from the node's allocatable as the API server shows it."""
    if labels.get(DRA_LABEL) != "true" or device_plugin_deployed(labels):
        return False
    left = allocatable.get(GPU_RESOURCE)
    return left is None or str(left) == "0"


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID per node and GPU, in NVML's ``GPU-`` form."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}')}"


def slice_body(*, node: str, node_uid: str, gpus: int, labels: Mapping[str, str]) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's kubelet plugin publishes for ``node``'s full GPUs."""
    product = labels.get("nvidia.com/gpu.product", "")
    memory = labels.get("nvidia.com/gpu.memory", "0")
    family = labels.get("nvidia.com/gpu.family", "")
    major = labels.get("nvidia.com/gpu.compute.major", "0")
    minor = labels.get("nvidia.com/gpu.compute.minor", "0")
    driver = ".".join(
        labels.get(f"nvidia.com/cuda.driver.{p}", "0").lstrip("0") or "0"
        for p in ("major", "minor", "rev")
    )
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": gpu_uuid(node, i)},
                "productName": {"string": product.replace("-", " ")},
                "brand": {"string": "Nvidia"},
                "architecture": {"string": _ARCHITECTURES.get(family, family.title())},
                "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
                "driverVersion": {"version": driver},
                "index": {"int": i},
                "minor": {"int": i},
            },
            "capacity": {"memory": {"value": f"{int(memory) if memory.isdigit() else 0}Mi"}},
        }
        for i in range(gpus)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"{node}-{DRIVER}-",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def served_by_claims(pod: Mapping[str, Any]) -> set[str]:
    """The extended resources of a pod that DRA serves (KEP 5004): the scheduler wrote them in
    ``status.extendedResourceClaimStatus.requestMappings`` with the claim it allocated, and
    kubelet leaves them to the DRA manager (neither the device manager nor the fit checks see
    them)."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return {
        str(m.get("resourceName"))
        for m in status.get("requestMappings") or ()
        if isinstance(m, Mapping) and m.get("resourceName")
    }

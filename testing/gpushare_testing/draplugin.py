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
- **MIG** (``nvlib.go`` ``GetPerGpuAllocatableDevices``, ``mig.go``): a GPU in MIG mode is not
  listed as a full GPU; each of its pre-made MIG devices is, named
  ``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<placement start>``, with ``type``
  ``mig``, ``profile``, ``parentUUID`` and capacity ``memory`` in bytes (``CommonCapacitiesMig``).
  The plugin enumerates the devices once, when it starts, and nothing in NVIDIA's stack restarts
  it after a layout change (mig-parted's ``reconfigure-mig.sh`` pauses only the device plugin,
  GFD and DCGM's deploy labels): its DaemonSet is installed to leave a node while
  ``nvidia.com/mig.config.state`` is ``pending`` or ``rebooting`` (the affinity gpushare's docs
  give), so it starts again, and lists the new devices, once the MIG manager is done.  A slice
  already published is never rewritten.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpushare_testing.migtables import GpuModel

DRIVER: Final = "gpu.nvidia.com"
DEPLOY_LABEL: Final = "nvidia.com/gpu.deploy.device-plugin"
DRA_LABEL: Final = "gpushare.dev/dra-driver"
GPU_RESOURCE: Final = "nvidia.com/gpu"
SHARED_RESOURCE: Final = "nvidia.com/gpu.shared"
MIG_PREFIX: Final = "nvidia.com/mig-"
MIG_STATE_LABEL: Final = "nvidia.com/mig.config.state"
# The MIG manager's states while it changes a node's layout: the plugin's DaemonSet leaves.
MIG_CHANGING: Final = frozenset({"pending", "rebooting"})
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
    """Whether the DRA kubelet plugin runs and publishes: selected (and no MIG change under
    way), the device plugin off, and its resources gone from the node's allocatable as the API
    server shows it."""
    if labels.get(DRA_LABEL) != "true" or device_plugin_deployed(labels):
        return False
    if labels.get(MIG_STATE_LABEL) in MIG_CHANGING:
        return False
    return all(str(v) == "0" for r, v in allocatable.items() if _served_by_plugin(r))


def _served_by_plugin(resource: str) -> bool:
    return resource in (GPU_RESOURCE, SHARED_RESOURCE) or resource.startswith(MIG_PREFIX)


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID per node and GPU, in NVML's ``GPU-`` form."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}')}"


def mig_uuid(node: str, index: int, name: str) -> str:
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}.{name}')}"


def mig_device_names(profiles: Sequence[str], model: GpuModel, *, minor: int) -> list[str]:
    """NVIDIA's canonical names of one GPU's MIG devices (``mig.go`` ``ToCanonicalName``), in
    the order of ``profiles``, at the first placements (NVML's) that hold them all."""
    order = sorted(range(len(profiles)), key=lambda i: -model.profiles[profiles[i]].memory_slices)
    starts = _place([profiles[i] for i in order], model, used=frozenset())
    if starts is None:
        raise ValueError(f"{', '.join(profiles)} do not fit together on GPU {minor}")
    at = dict(zip(order, starts, strict=True))
    names = []
    for i, profile in enumerate(profiles):
        pname = re.sub(r"[^a-z0-9-]", "-", profile.replace(".", "").lower())
        profile_id = model.profiles[profile].extra.get("giProfileId", 0)
        names.append(f"gpu-{minor}-mig-{pname}-{profile_id}-{at[i]}")
    return names


def _place(profiles: Sequence[str], model: GpuModel, *, used: frozenset[int]) -> list[int] | None:
    """Placement starts for ``profiles`` in the memory slices ``used`` leaves free (the first
    that works, trying each profile's placements in NVML's order)."""
    if not profiles:
        return []
    for start, size in model.profiles[profiles[0]].placements:
        span = frozenset(range(start, start + size))
        if span & used:
            continue
        rest = _place(profiles[1:], model, used=used | span)
        if rest is not None:
            return [start, *rest]
    return None


def slice_body(
    *,
    node: str,
    node_uid: str,
    gpus: int,
    labels: Mapping[str, str],
    mig: Sequence[Sequence[str] | None] = (),
    model: GpuModel | None = None,
) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's kubelet plugin publishes for ``node``: each GPU whole, or
    (``mig``: per GPU, its MIG devices' profiles, None where MIG is off) its MIG devices."""
    product = labels.get("nvidia.com/gpu.product", "")
    memory = labels.get("nvidia.com/gpu.memory", "0")
    family = labels.get("nvidia.com/gpu.family", "")
    major = labels.get("nvidia.com/gpu.compute.major", "0")
    minor = labels.get("nvidia.com/gpu.compute.minor", "0")
    driver = ".".join(
        labels.get(f"nvidia.com/cuda.driver.{p}", "0").lstrip("0") or "0"
        for p in ("major", "minor", "rev")
    )
    common = {
        "productName": {"string": product.replace("-", " ")},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": _ARCHITECTURES.get(family, family.title())},
        "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
        "driverVersion": {"version": driver},
    }
    devices: list[dict[str, Any]] = []
    for i in range(gpus):
        profiles = mig[i] if i < len(mig) else None
        if profiles is None:
            devices.append(
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": gpu_uuid(node, i)},
                        **common,
                        "index": {"int": i},
                        "minor": {"int": i},
                    },
                    "capacity": {
                        "memory": {"value": f"{int(memory) if memory.isdigit() else 0}Mi"}
                    },
                }
            )
            continue
        assert model is not None, "MIG devices need the GPU model's tables"
        for name, profile in zip(mig_device_names(profiles, model, minor=i), profiles, strict=True):
            mib = model.profiles[profile].memory_mib
            attributes = {
                "type": {"string": "mig"},
                "uuid": {"string": mig_uuid(node, i, name)},
                "parentUUID": {"string": gpu_uuid(node, i)},
                "profile": {"string": profile},
                **common,
            }
            capacity = {"memory": {"value": str(mib * 1024 * 1024)}}
            devices.append({"name": name, "attributes": attributes, "capacity": capacity})
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

"""Realistic GPU Node bodies, as a real kubelet + NFD + GFD cluster shows them.

(Pods are built in ``podbodies``.)

The operator's reason to exist is to stay cheap on exactly these bodies: a GPU Node is about
15 KB of JSON (managedFields, 40 images, ~75 labels, conditions), and a benchmark or test fed a
1 KB toy node would measure and exercise nothing.  So the builders include every part a real
node carries, with the values GPU Feature Discovery, NFD, the GPU Operator and kubelet write.

Everything is pure and deterministic for a given name: what differs between nodes (IPs, zone,
machine ids, timestamps) is drawn from a hash of the name, so building 5,000 nodes twice gives
byte-identical bodies.  Every builder returns a fresh body that shares nothing with another.
The derivers (``heartbeat``, ``relabel``, ``watch_event_line``) never mutate their input: they
copy only the path they change and share the rest, as the operator's caches do, so treat what
they return as immutable.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson

from gpushare_testing.bodyparts import (
    GPU_RESOURCE,
    SHARED_GPU_RESOURCE,
    Body,
    creation_time,
    managed_entry,
    name_digest,
    octet,
    rfc3339,
    uuid_of,
)

__all__ = [
    "GPU_RESOURCE",
    "KUBELET_CONDITIONS",
    "SHARED_GPU_RESOURCE",
    "Body",
    "gpu_node",
    "heartbeat",
    "relabel",
    "watch_event_line",
]

KUBELET_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")

_REGION = "us-east-2"


@dataclass(frozen=True, slots=True)
class _Machine:
    """What a GPU model implies about the machine around it."""

    family: str
    compute: tuple[int, int]
    instance_type: str
    cpus: int
    memory_kib: int
    mig_capable: bool
    memory_mib: int = 81559  # GFD's nvidia.com/gpu.memory (NVML's total memory, MiB)


# The MIG-capable models are those of NVIDIA's MIG tables (``migtables``): A100 40GB / 80GB,
# A30, H100, H200, B200, under the names GFD gives them; GFD labels them mig.capable=true.
# Their memory is NVML's (the tables'); the older entries keep 81559 (an H100's GFD label).
_MACHINES: Mapping[str, _Machine] = {
    "NVIDIA-H100-80GB-HBM3": _Machine("hopper", (9, 0), "p5.48xlarge", 192, 2_063_912_392, True),
    "NVIDIA-A100-SXM4-80GB": _Machine("ampere", (8, 0), "p4de.24xlarge", 96, 1_176_721_092, True),
    "NVIDIA-A100-SXM4-40GB": _Machine(
        "ampere", (8, 0), "p4d.24xlarge", 96, 1_176_721_092, True, 40960
    ),
    "NVIDIA-A30-PCIE-24GB": _Machine(
        "ampere", (8, 0), "a30.8x.large", 64, 527_948_000, True, 24576
    ),
    "NVIDIA-H200-141GB-HBM3e": _Machine(
        "hopper", (9, 0), "p5e.48xlarge", 192, 2_063_912_392, True, 144384
    ),
    "NVIDIA-B200-180GB-HBM3e": _Machine(
        "blackwell", (10, 0), "p6-b200.48xlarge", 192, 2_063_912_392, True, 184320
    ),
    "NVIDIA-L4": _Machine("ada-lovelace", (8, 9), "g6.48xlarge", 192, 784_283_452, False),
    "Tesla-T4": _Machine("turing", (7, 5), "g4dn.12xlarge", 48, 195_875_584, False),
}
_GENERIC = _Machine("hopper", (9, 0), "gpu.8x.large", 128, 1_056_561_152, True)


def _pairs(text: str, *, prefix: str) -> dict[str, str]:
    return {prefix + key: value for key, _, value in (p.partition("=") for p in text.split())}


# Node Feature Discovery: the CPU, kernel, OS and PCI facts of a p5-like machine.
_NFD_LABELS = _pairs(
    """
    cpu-cpuid.AVX2=true cpu-cpuid.AVX512F=true cpu-hardware_multithreading=true
    cpu-model.vendor_id=AMD kernel-version.full=5.15.0-1072-aws kernel-version.major=5
    memory-numa=true pci-10de.present=true storage-nonrotationaldisk=true
    system-os_release.ID=ubuntu system-os_release.VERSION_ID=22.04
    """,
    prefix="feature.node.kubernetes.io/",
)
# GFD labels that do not depend on the GPU model.
_GFD_STATIC = _pairs(
    """
    cuda.driver.major=570 cuda.driver.minor=124 cuda.driver.rev=06 cuda.runtime.major=12
    cuda.runtime.minor=8 gpu-driver-upgrade-state=upgrade-done gpu.deploy.container-toolkit=true
    gpu.deploy.dcgm=true gpu.deploy.dcgm-exporter=true gpu.deploy.device-plugin=true
    gpu.deploy.driver=true gpu.deploy.gpu-feature-discovery=true
    gpu.deploy.node-status-exporter=true gpu.deploy.operator-validator=true gpu.mode=compute
    gpu.present=true gpu.replicas=1 gpu.sharing-strategy=none mps.capable=false
    vgpu.present=false
    """,
    prefix="nvidia.com/",
)
_MIG_PRESET = ("nvidia.com/mig.config", "nvidia.com/mig.config.state")
_GFD_MIG = _pairs(
    "gpu.deploy.mig-manager=true mig.config=all-disabled mig.config.state=success",
    prefix="nvidia.com/",
)

# What a busy GPU node has pulled: GPU Operator operands, system DaemonSets, ML workloads (MB).
_IMAGES = """
nvcr.io/nvidia/cuda:12.8.1-base-ubi9 251 nvcr.io/nvidia/driver:570.124.06-ubuntu22.04 1520
nvcr.io/nvidia/k8s-device-plugin:v0.17.1 271 nvcr.io/nvidia/gpu-operator:v25.3.0 310
nvcr.io/nvidia/k8s/container-toolkit:v1.17.5-ubuntu20.04 140
nvcr.io/nvidia/cloud-native/dcgm:4.1.1-2-ubuntu22.04 1890
nvcr.io/nvidia/k8s/dcgm-exporter:4.1.1-4.0.4-ubuntu22.04 1960
nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.12.1-ubuntu20.04 190
nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0 320
nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.0 52
registry.k8s.io/nfd/node-feature-discovery:v0.17.2 60 registry.k8s.io/kube-proxy:v1.37.2 31
registry.k8s.io/pause:3.10 1 registry.k8s.io/coredns/coredns:v1.12.0 21
docker.io/calico/node:v3.29.3 151 docker.io/calico/cni:v3.29.3 95
quay.io/prometheus/node-exporter:v1.9.0 12 docker.io/fluent/fluent-bit:3.2.8 34
public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver:v1.41.0 33
registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0 9
docker.io/vllm/vllm-openai:v0.8.4 8930 docker.io/vllm/vllm-openai:v0.8.3 8890
nvcr.io/nvidia/tritonserver:25.02-py3 7420 nvcr.io/nvidia/pytorch:25.02-py3 11280
nvcr.io/nvidia/nemo:25.02 14710 nvcr.io/nvidia/tensorrt:25.02-py3 6020
ghcr.io/huggingface/text-generation-inference:3.2.1 5110 docker.io/rayproject/ray-ml:2.44.0-gpu 6700
docker.io/pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime 3120 ghcr.io/acme/model-fetcher:1.8.2 88
ghcr.io/acme/inference-router:4.2.0 64 ghcr.io/acme/batch-runner:2.31.7 412
ghcr.io/acme/feature-store-client:0.19.4 213 docker.io/library/busybox:1.37.0 2
docker.io/library/python:3.12-slim 45 docker.io/jupyter/pytorch-notebook:cuda12-2025-02-24 4730
quay.io/jetstack/cert-manager-webhook:v1.17.1 19 docker.io/grafana/alloy:v1.7.5 161
docker.io/nvidia/samples:vectoradd-cuda11.2.1 98 docker.io/kubeflow/training-operator:v1-855e096 40
"""

_NODE_CONDITIONS = (
    ("NetworkUnavailable", "False", "CalicoIsUp", "Calico is running on this node"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)


# -- nodes -----------------------------------------------------------------------------------


def gpu_node(
    *,
    name: str,
    pool: str,
    product: str = "NVIDIA-H100-80GB-HBM3",
    gpus: int = 8,
    memory_mib: int | None = None,
    mig_strategy: str = "single",
    mig_preset: bool = True,
    images: int = 40,
    managed_fields: bool = True,
    extra_labels: Mapping[str, str] | None = None,
) -> Body:
    """A Node as the API server returns it once kubelet, NFD, GFD and the GPU Operator ran.

    It has no ``resourceVersion``, so that it can be POSTed as it is; ``watch_event_line`` sets
    one.  GFD reports no sharing yet (``gpu.replicas=1``, ``gpu.sharing-strategy=none``).
    ``memory_mib`` defaults to the model's (81559 for models not listed).  The MIG-capable
    models (H100, H200, B200, A100 40GB / 80GB, A30) start with MIG disabled on every GPU,
    ``nvidia.com/mig.config=all-disabled`` and ``nvidia.com/mig.config.state=success``, as the
    GPU Operator presets them (``migManager.config.default``); ``mig_preset=False``: without.
    """
    machine = _MACHINES.get(product, _GENERIC)
    memory_mib = machine.memory_mib if memory_mib is None else memory_mib
    digest = name_digest(name)
    created = creation_time(name)
    zone = f"{_REGION}{'abc'[octet(digest, 8) % 3]}"
    ip = f"10.{octet(digest, 0)}.{octet(digest, 2)}.{octet(digest, 4) or 1}"
    instance = f"i-0{digest[12:28]}"
    kubelet_labels = _pairs(
        f"beta.kubernetes.io/arch=amd64 beta.kubernetes.io/instance-type={machine.instance_type}"
        f" beta.kubernetes.io/os=linux kubernetes.io/arch=amd64"
        f" kubernetes.io/hostname={name} kubernetes.io/os=linux"
        f" node.kubernetes.io/instance-type={machine.instance_type}"
        f" topology.kubernetes.io/region={_REGION} topology.kubernetes.io/zone={zone}",
        prefix="",
    )
    gfd = _gfd_labels(product=product, gpus=gpus, memory_mib=memory_mib, machine=machine)
    if not mig_preset:
        # The GPU Operator told to preset no layout (migManager.config.default=""): the MIG
        # manager waits for a label, and there is no state before its first run.
        gfd = {k: v for k, v in gfd.items() if k not in _MIG_PRESET}
    gfd |= {
        "nvidia.com/gfd.timestamp": str(int(created.timestamp()) + 3_600),
        "nvidia.com/mig.strategy": mig_strategy,
    }
    admin = {"pool": pool, **(extra_labels or {})}
    kubelet_annotations = {
        "alpha.kubernetes.io/provided-node-ip": ip,
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    }
    metadata: Body = {
        "name": name,
        "uid": uuid_of(digest),
        "creationTimestamp": rfc3339(created),
        "labels": kubelet_labels | _NFD_LABELS | gfd | admin,
        "annotations": kubelet_annotations
        | {
            "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": instance}),
            "node.alpha.kubernetes.io/ttl": "0",
            "nvidia.com/gpu-driver-upgrade-enabled": "true",
        },
    }
    cidr = f"100.{octet(digest, 6) % 64 + 64}.{octet(digest, 10)}.0/24"
    spec = {"podCIDR": cidr, "podCIDRs": [cidr], "providerID": f"aws:///{zone}/{instance}"}
    status = _node_status(name=name, machine=machine, gpus=gpus, ip=ip, created=created)
    status["images"] = _node_images(images)
    if managed_fields:
        owners = {"kubelet": kubelet_annotations, "gpu-feature-discovery": gfd, "admin": admin}
        metadata["managedFields"] = _node_managers(
            at=rfc3339(created), owners=owners, spec=spec, status=status
        )
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": spec,
        "status": status,
    }


def _node_managers(
    *, at: str, owners: Mapping[str, Mapping[str, str]], spec: Body, status: Body
) -> list[Body]:
    """managedFields as the API server keeps them: who last wrote which field, and when."""
    kubelet_status = {key: value for key, value in status.items() if key != "addresses"}
    kubelet_status["conditions"] = status["conditions"][1:]  # not NetworkUnavailable (the CNI's)
    ttl = {"node.alpha.kubernetes.io/ttl": ""}
    return [
        managed_entry("kubelet", at, {"metadata": {"annotations": owners["kubelet"]}}),
        managed_entry(
            "kube-controller-manager", at, {"metadata": {"annotations": ttl}, "spec": spec}
        ),
        managed_entry("nfd-master", at, {"metadata": {"labels": _NFD_LABELS}}),
        managed_entry(
            "gpu-feature-discovery", at, {"metadata": {"labels": owners["gpu-feature-discovery"]}}
        ),
        managed_entry("kubectl-label", at, {"metadata": {"labels": owners["admin"]}}),
        managed_entry(
            "kubelet",
            status["conditions"][-1]["lastHeartbeatTime"],
            {"status": kubelet_status},
            subresource="status",
        ),
    ]


def _gfd_labels(*, product: str, gpus: int, memory_mib: int, machine: _Machine) -> dict[str, str]:
    """GPU Feature Discovery's labels for this GPU model (without the per-node timestamp)."""
    model = _pairs(
        f"gpu.compute.major={machine.compute[0]} gpu.compute.minor={machine.compute[1]}"
        f" gpu.count={gpus} gpu.family={machine.family} gpu.machine={machine.instance_type}"
        f" gpu.memory={memory_mib} gpu.product={product}"
        f" mig.capable={str(machine.mig_capable).lower()}",
        prefix="nvidia.com/",
    )
    return _GFD_STATIC | model | (_GFD_MIG if machine.mig_capable else {})


def _node_status(*, name: str, machine: _Machine, gpus: int, ip: str, created: datetime) -> Body:
    capacity = {
        "cpu": str(machine.cpus),
        "ephemeral-storage": "3750056952Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{machine.memory_kib}Ki",
        GPU_RESOURCE: str(gpus),
        "pods": "110",
    }
    allocatable = capacity | {
        "cpu": f"{machine.cpus * 1000 - 920}m",
        "ephemeral-storage": "3455869940266",
        "memory": f"{machine.memory_kib - 7_768_000}Ki",
    }
    since = rfc3339(created + timedelta(minutes=1))
    beat = rfc3339(created + timedelta(days=2))
    machine_digest = name_digest(name, "machine")
    return {
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": [
            {
                "type": kind,
                "status": state,
                "lastHeartbeatTime": beat if kind in KUBELET_CONDITIONS else since,
                "lastTransitionTime": since,
                "reason": reason,
                "message": message,
            }
            for kind, state, reason, message in _NODE_CONDITIONS
        ],
        "addresses": [
            {"type": "InternalIP", "address": ip},
            {"type": "InternalDNS", "address": f"ip-{ip.replace('.', '-')}.ec2.internal"},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": machine_digest[:32],
            "systemUUID": uuid_of(machine_digest[32:]).upper(),
            "bootID": uuid_of(name_digest(name, "boot")),
            "kernelVersion": _NFD_LABELS["feature.node.kubernetes.io/kernel-version.full"],
            "osImage": "Ubuntu 22.04.5 LTS",
            "containerRuntimeVersion": "containerd://1.7.27",
            "kubeletVersion": "v1.37.2",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "runtimeHandlers": [
            {"name": handler, "features": {"recursiveReadOnlyMounts": True}}
            for handler in ("nvidia", "runc")
        ],
    }


def _node_images(count: int) -> list[Body]:
    return [
        {"names": [pinned, tagged], "sizeBytes": size} for pinned, tagged, size in _images(count)
    ]


@functools.cache
def _images(count: int) -> tuple[tuple[str, str, int], ...]:
    """``count`` pulled images, largest first as kubelet lists them; tags repeat past the table.

    Every node of a cluster runs the same DaemonSets, so one table serves all (and is cached:
    the benchmarks build thousands of nodes).
    """
    table = _IMAGES.split()
    rows = [(table[i], int(table[i + 1])) for i in range(0, len(table), 2)]
    images = []
    for index in range(count):
        reference, megabytes = rows[index % len(rows)]
        repository, tag = reference.rsplit(":", 1)
        if index >= len(rows):
            tag = f"{tag}-{index // len(rows)}"
        digest = name_digest(f"{repository}:{tag}", "image")
        size = megabytes * 1_000_000 + int(digest[:5], 16)
        images.append((f"{repository}@sha256:{digest}", f"{repository}:{tag}", size))
    return tuple(sorted(images, key=lambda image: -image[2]))


def heartbeat(node: Body, *, at: str) -> Body:
    """The same node after a kubelet heartbeat: kubelet's conditions now say ``at``.

    A status-only change and the most common Node event in a cluster; the operator must not
    write, nor even re-index, anything for it, which is what the benchmarks feed it to check.
    """
    status = node["status"]
    conditions = [
        {**condition, "lastHeartbeatTime": at}
        if condition["type"] in KUBELET_CONDITIONS
        else condition
        for condition in status["conditions"]
    ]
    return {**node, "status": {**status, "conditions": conditions}}


def relabel(node: Body, labels: Mapping[str, str | None]) -> Body:
    """The same node with ``labels`` merged in; a ``None`` value removes the key (merge patch)."""
    merged = dict(node["metadata"].get("labels") or {})
    for key, value in labels.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return {**node, "metadata": {**node["metadata"], "labels": merged}}


def watch_event_line(event_type: str, obj: Body, *, resource_version: str) -> bytes:
    """One line of a watch stream as the API server sends it, newline included."""
    stamped = {**obj, "metadata": {**obj["metadata"], "resourceVersion": resource_version}}
    return orjson.dumps({"type": event_type, "object": stamped}, option=orjson.OPT_APPEND_NEWLINE)

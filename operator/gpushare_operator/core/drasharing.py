"""Sharing under backend DRA (``--dra-sharing``): TimeSlicing and MPS as NVIDIA's DRA driver
expresses them, which is alpha there.

The driver takes sharing as opaque config of kind ``GpuConfig`` (API group
``resource.nvidia.com/v1beta1``, ``api/nvidia.com/resource/v1beta1/gpuconfig.go`` and
``sharing.go`` in kubernetes-sigs/dra-driver-nvidia-gpu): ``sharing.strategy`` TimeSlicing (with a
``timeSlicingConfig.interval`` of Default, Short, Medium or Long) or MPS (with an ``mpsConfig``:
``defaultActiveThreadPercentage``, pinned-memory limits).  It validates that config only with
its feature gates ``TimeSlicingSettings`` and ``MPSSupport`` on, and refuses it otherwise.  A
DeviceClass may carry such config (``spec.config[].opaque``), and the driver applies it to every
device allocated through the class.

What replicas cannot be: a DRA device is allocated to one claim, and the scheduler makes one
claim per pod for an extended-resource request (KEP 5004), so ``replicas: 4`` cannot make four
pods' ``nvidia.com/gpu: 1`` land on one GPU.  The driver's sharing applies among the containers
and pods that share one ResourceClaim.  So on a DRA node a sharing policy's slots are its GPUs
(one slot each), and replicas map to what the driver can say per class:

- TimeSlicing: nothing (the interval is the driver's ``Default``, as the device plugin's is);
- MPS: ``defaultActiveThreadPercentage`` = 100 / replicas, rounded down, the share of the GPU's
  SMs each client of the device plugin's MPS got (its ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).
  The device plugin's per-client pinned-memory limit (memory / replicas) has no per-class
  equivalent: it depends on each GPU's memory, and one class serves every GPU model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from gpushare_operator.core.api.models import GPUSharingPolicySpec, SharingStrategy
from gpushare_operator.core.conditions import Cond

CONFIG_API: Final = "resource.nvidia.com/v1beta1"
CONFIG_KIND: Final = "GpuConfig"
INTERVAL: Final = "Default"
GATES: Final = {
    SharingStrategy.TIME_SLICING: "TimeSlicingSettings",
    SharingStrategy.MPS: "MPSSupport",
}
CONDITION: Final = "DRASharing"


def gpu_config(spec: GPUSharingPolicySpec) -> dict[str, Any] | None:
    """The ``GpuConfig`` the driver gets for ``spec``; None when it shares nothing."""
    if not spec.dra_shared:
        return None
    if spec.strategy is SharingStrategy.MPS:
        percentage = 100 // spec.slots_per_gpu
        sharing: dict[str, Any] = {
            "strategy": "MPS",
            "mpsConfig": {"defaultActiveThreadPercentage": percentage},
        }
    else:
        sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": INTERVAL}}
    return {"apiVersion": CONFIG_API, "kind": CONFIG_KIND, "sharing": sharing}


def canonical(config: object) -> str | None:
    """A ``GpuConfig`` as one comparable text (None for none): what a policy wants on its
    class, and what a class carries, compared without caring for key order."""
    if not config:
        return None
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def describe(config: str | None) -> str:
    """``GpuConfig TimeSlicing`` / ``GpuConfig MPS (defaultActiveThreadPercentage 25)`` / ``no
    config``: a ``canonical`` config in a message."""
    if config is None:
        return "no config"
    try:
        parameters = json.loads(config)
        sharing = parameters["sharing"]
    except (ValueError, LookupError, TypeError):
        return "a config gpushare does not write"
    if not isinstance(sharing, Mapping):
        return "a config gpushare does not write"
    mps = sharing.get("mpsConfig") or {}
    extra = ""
    if isinstance(mps, Mapping) and "defaultActiveThreadPercentage" in mps:
        extra = f" (defaultActiveThreadPercentage {mps['defaultActiveThreadPercentage']})"
    return f"{parameters.get('kind')} {sharing.get('strategy')}{extra}"


def condition(spec: GPUSharingPolicySpec) -> Cond | None:
    """The policy's ``DRASharing`` condition: that this is alpha, the gate NVIDIA's driver
    needs, and what became of replicas."""
    if not spec.dra_shared:
        return None
    gate = GATES[spec.strategy]
    replicas = spec.slots_per_gpu
    if spec.strategy is SharingStrategy.MPS:
        mapped = (
            f"replicas {replicas} become the DeviceClass's MPS defaultActiveThreadPercentage"
            f" {100 // replicas} (each client's share of the SMs, as under the device plugin);"
            " the per-client pinned-memory limit has no per-class equivalent"
        )
    else:
        mapped = (
            f"replicas {replicas} have no per-class equivalent (the time slice is the"
            f" driver's {INTERVAL})"
        )
    message = (
        f"{spec.strategy} under backend DRA is alpha in NVIDIA's DRA driver: its kubelet plugin"
        f" must run with the feature gate {gate}, or it refuses the DeviceClass's {CONFIG_KIND}."
        f" A DRA device goes to one claim, so each request is a whole GPU (one slot per GPU)"
        f" and pods share a GPU only through one ResourceClaim they all name; {mapped}"
    )
    return Cond(CONDITION, "True", "Alpha", message)

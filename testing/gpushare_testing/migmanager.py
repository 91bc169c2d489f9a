"""The GPU Operator's MIG manager as pure rules: what it does with a ``nvidia.com/mig.config``.

Written from NVIDIA/mig-parted ``cmd/nvidia-mig-manager/main.go`` (the node informer: a run per
change of the label's value, nothing for an empty value, the latest value once a run is over)
and ``pkg/mig/reconfigure/reconfigure.go`` (``Run``: the order of the checks and of the label
writes).  ``migagent`` does the I/O in that order; this module decides.

One run, for the config the label names:

1. ``mig-parted assert --valid-config``: the config file must parse (``migparted``) and hold the
   named config, or the state is ``failed`` at once (nothing paused).
2. Already applied (every GPU as the config wants it): ``success`` at once, no ``pending``.
3. ``pending``; the GPU clients' deploy labels (device plugin, GFD, DCGM exporter, DCGM, NVSM)
   become ``paused-for-mig-change`` (one that is ``false`` stays ``false``); their pods go.
4. The MIG mode change (enable / disable).  With the GPU still in use by a process it fails;
   the simulator fails the run then (the real one may reboot, or fail later): harsher.  When a
   reboot is asked for (``with_reboot``) and the mode changes, the state is ``rebooting`` and
   the node reboots; the manager starts again after it and makes the same run anew.
5. The layout: every GPU instance must fit NVIDIA's geometry for the model (``migtables``), or
   the state is ``failed``; the GPU is then left MIG-enabled with no MIG device (mig-parted
   destroys the old instances before it creates the new ones): the half-way state users meet.
6. The deploy labels go back to ``true`` (or stay ``false``), then the state is ``success``.
   On every failure after step 1 they are restored too, before ``failed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpushare_testing.migparted import MigPartedError, parse_mig_parted_config
from gpushare_testing.migtables import GpuModel, fits

__all__ = [
    "CONFIG_LABEL",
    "DEPLOY_LABELS",
    "PAUSED",
    "STATE_LABEL",
    "GpuMig",
    "Layout",
    "Target",
    "apply_layout",
    "disabled",
    "mode_changes",
    "paused_labels",
    "restored_labels",
    "select_target",
]

CONFIG_LABEL: Final = "nvidia.com/mig.config"
STATE_LABEL: Final = "nvidia.com/mig.config.state"
PAUSED: Final = "paused-for-mig-change"
# reconfigure.go: the components it tears down and brings back, in that file's order.
DEPLOY_LABELS: Final = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.nvsm",
)


@dataclass(frozen=True, slots=True)
class GpuMig:
    """One GPU's MIG mode and its MIG devices (profile names, one per device)."""

    enabled: bool = False
    devices: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        result: dict[str, int] = {}
        for profile in self.devices:
            result[profile] = result.get(profile, 0) + 1
        return result


Layout = tuple[GpuMig, ...]


def disabled(gpus: int) -> Layout:
    return tuple(GpuMig() for _ in range(gpus))


@dataclass(frozen=True, slots=True)
class Target:
    """What a valid config asks of each GPU; ``reason`` is set when the run cannot apply it."""

    layout: Layout
    reason: str = ""


def select_target(
    *, text: str | None, selected: str, current: Layout, device_id: str
) -> Target | str:
    """Step 1 and the per-GPU choice: the target layout, or why the config is not valid.

    ``text`` is the config file as the manager's mounted ConfigMap shows it (``None``: no such
    key).  GPUs no entry matches keep what they have.  Two entries matching one GPU are taken
    as a refusal (``reason``): harsher than mig-parted, which would apply both in turn.
    """
    if text is None:
        return "the mig-parted config file does not exist"
    try:
        spec = parse_mig_parted_config(text)
    except MigPartedError as exc:
        return f"invalid mig-parted config: {exc}"
    entries = spec.configs.get(selected)
    if entries is None:
        return f"config {selected!r} is not in the mig-parted config file"
    layout: list[GpuMig] = []
    reason = ""
    for index, gpu in enumerate(current):
        matching = [e for e in entries if e.matches(index, device_id)]
        if len(matching) > 1:
            reason = f"GPU {index} is matched by {len(matching)} entries of {selected!r}"
        if not matching:
            layout.append(gpu)
            continue
        entry = matching[-1]
        devices = tuple(p for p, n in sorted(entry.mig_devices.items()) for _ in range(n))
        layout.append(GpuMig(enabled=entry.mig_enabled, devices=devices))
    return Target(layout=tuple(layout), reason=reason)


def apply_layout(*, target: Target, current: Layout, model: GpuModel | None) -> tuple[Layout, str]:
    """Step 5: the GPUs after ``mig-parted apply``, and why it failed (empty: it did not).

    A model NVIDIA's tables do not have cannot hold any MIG device.
    """
    reason = target.reason
    if not reason:
        for index, gpu in enumerate(target.layout):
            if not gpu.enabled or not gpu.devices:
                continue
            if model is None:
                reason = "the GPU model is not in NVIDIA's MIG tables"
            elif not fits(model, gpu.counts()):
                reason = f"GPU {index} ({model.product}) cannot hold {gpu.counts()}"
            if reason:
                break
    if not reason:
        return target.layout, ""
    # The mode change took effect; the instances are gone and the new ones were not made.
    broken = tuple(
        GpuMig(enabled=want.enabled) if want != have else have
        for want, have in zip(target.layout, current, strict=True)
    )
    return broken, reason


def mode_changes(target: Layout, current: Layout) -> bool:
    return any(t.enabled != c.enabled for t, c in zip(target, current, strict=True))


def paused_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """reconfigure.go ``maybeSetPaused``: every deploy label paused, unless it is ``false``."""
    return {k: "false" if labels.get(k) == "false" else PAUSED for k in DEPLOY_LABELS}


def restored_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """reconfigure.go ``maybeSetTrue``: every deploy label ``true``, unless it is ``false``."""
    return {k: "false" if labels.get(k) == "false" else "true" for k in DEPLOY_LABELS}

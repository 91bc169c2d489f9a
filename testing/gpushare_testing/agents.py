"""What the NVIDIA agents make of a node, as pure functions: no I/O, no clock, no asyncio.

The simulator (``simulator``) plays the GPU Operator's config manager, the NVIDIA device plugin
and GPU Feature Discovery on real Nodes; the decisions those agents take are here, so that a
property test can pin them without an API server.  Each rule names its source in NVIDIA's code
or documentation; ``docs/simulator.md`` has the table.

- ``parse_device_plugin_config``: the plugin's config parser (k8s-device-plugin
  ``api/config/v1``): which configs it refuses, and the sharing it runs with otherwise.
- ``gfd_labels``: GFD's resource labeler (k8s-device-plugin ``internal/lm/resource.go``):
  ``gpu.product`` (with ``-SHARED``), ``gpu.replicas``, ``gpu.sharing-strategy``, and
  ``mps.capable`` (``internal/lm/nvml.go``).
- ``plugin_resources``: what kubelet's device manager shows in ``status.capacity``.
- ``resolve_config_key``: the config manager's choice of ConfigMap key (``cmd/config-manager``).
- ``backoff_delay``: kubelet's crash-loop back-off, doubling up to a cap.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

import yaml

from gpushare_testing.bodyparts import GPU_RESOURCE, SHARED_GPU_RESOURCE

__all__ = [
    "CONFIG_LABEL",
    "DEFAULT_CONFIG_KEY",
    "MISSING",
    "MPS_LABEL",
    "NO_SHARING",
    "PRODUCT_LABEL",
    "REPLICAS_LABEL",
    "SHARED_SUFFIX",
    "STRATEGY_LABEL",
    "TIMESTAMP_LABEL",
    "Missing",
    "Sharing",
    "backoff_delay",
    "gfd_labels",
    "parse_device_plugin_config",
    "plugin_resources",
    "resolve_config_key",
]

CONFIG_LABEL: Final = "nvidia.com/device-plugin.config"
PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"
STRATEGY_LABEL: Final = "nvidia.com/gpu.sharing-strategy"
MPS_LABEL: Final = "nvidia.com/mps.capable"
TIMESTAMP_LABEL: Final = "nvidia.com/gfd.timestamp"
DEFAULT_CONFIG_KEY: Final = "default"
SHARED_SUFFIX: Final = "-SHARED"

_RESOURCE_PREFIX = "nvidia.com"
_MIG_PREFIX = "nvidia.com/mig-"
_MAX_RESOURCE_NAME = 63  # api/config/v1/consts.go: MaxResourceNameLength
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_GPU_INDEX = re.compile(r"[0-9]+")
_MIG_INDEX = re.compile(r"[0-9]+:[0-9]+")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_DEVICE_UUID = re.compile(rf"GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/[0-9]+/[0-9]+")


@dataclass(frozen=True, slots=True)
class Sharing:
    """The sharing the plugin runs with for ``nvidia.com/gpu``: what GFD and kubelet show."""

    strategy: str  # "none" | "time-slicing" | "mps", as in nvidia.com/gpu.sharing-strategy
    replicas: int
    rename_by_default: bool = False
    # What only MIG GPUs make a difference to (``miglabels``).  Left out of equality, which
    # stays the sharing of ``nvidia.com/gpu`` that full GPUs show:
    # flags.migStrategy as the file says it ("": not set, the DaemonSet's default applies);
    mig_strategy: str = field(default="", compare=False)
    # every replicated resource of the sharing section (MIG devices too), and its strategy.
    replicated: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    replication: str = field(default="none", compare=False)

    @property
    def shared(self) -> bool:
        return self.strategy != "none"

    @property
    def advertised(self) -> str:
        """The resource the plugin registers: renamed to ``nvidia.com/gpu.shared`` if asked."""
        return SHARED_GPU_RESOURCE if self.shared and self.rename_by_default else GPU_RESOURCE


NO_SHARING: Final = Sharing(strategy="none", replicas=1)


class _Refused(ValueError):
    """The plugin would exit with this error (and crash-loop) rather than run the config."""


def parse_device_plugin_config(text: str) -> Sharing | None:
    """The sharing a device-plugin config asks for; ``None`` when the plugin would refuse it.

    An empty text is the config manager's empty config (``/dev/null``): no sharing.
    """
    try:
        return _parse(text)
    except (_Refused, yaml.YAMLError):
        return None


def _parse(text: str) -> Sharing:
    # sigs.k8s.io/yaml, as the plugin uses it: an empty document is the zero Config.
    config = yaml.safe_load(text)
    if config is None:
        return NO_SHARING
    if not isinstance(config, dict):
        raise _Refused("unmarshal error: not a mapping")
    version = config.get("version")
    if version not in (None, "", "v1"):  # config.go parseConfigFrom: "" defaults to v1
        raise _Refused(f"unknown version: {version!r}")
    sharing = config.get("sharing")
    if sharing is None:
        return _unshared(_mig_strategy(config.get("flags")))
    if not isinstance(sharing, dict):
        raise _Refused("sharing is not a mapping")
    time_slicing = _replicated(sharing["timeSlicing"]) if "timeSlicing" in sharing else None
    # sharing.go: MPS is a pointer, so `mps: null` is the same as no mps at all.
    mps = _replicated(sharing["mps"]) if sharing.get("mps") is not None else None
    if time_slicing is not None and mps is not None:
        # The plugin's README: "The use of time-slicing and MPS are mutually exclusive".  The
        # parser itself would let MPS win (Sharing.SharingStrategy); refusing is harsher.
        raise _Refused("time-slicing and MPS together")
    if mps is not None:
        _check_mig_strategy_for_mps(config.get("flags"))
    mig_strategy = _mig_strategy(config.get("flags"))
    # sharing.go ReplicatedResources(): MPS's resources if MPS is set, else time-slicing's.
    strategy, section = ("mps", mps) if mps is not None else ("time-slicing", time_slicing)
    if section is None:
        return _unshared(mig_strategy)
    rename_by_default, resources = section
    if strategy == "mps" and any(n.startswith(_MIG_PREFIX) for n, _ in resources):
        # README: "Sharing with MPS is currently not supported on devices with MIG enabled".
        raise _Refused("MPS of MIG devices")
    replicated = tuple(resources)
    replicas = [count for name, count in resources if name == GPU_RESOURCE]
    if not replicas:  # only other resources (MIG devices) are shared
        return Sharing("none", 1, rename_by_default, mig_strategy, replicated, replication=strategy)
    # config.go DisableResourceNamingInConfig: an explicit `rename` is dropped; only
    # renameByDefault renames, to <name>.shared.
    return Sharing(strategy, replicas[0], rename_by_default, mig_strategy, replicated, strategy)


def _unshared(mig_strategy: str) -> Sharing:
    return Sharing("none", 1, mig_strategy=mig_strategy) if mig_strategy else NO_SHARING


def _mig_strategy(flags: object) -> str:
    """flags.migStrategy (config.go; validateFlags refuses any other value than these)."""
    if not isinstance(flags, dict) or flags.get("migStrategy") is None:
        return ""
    value = flags["migStrategy"]
    if value not in ("none", "single", "mixed"):
        raise _Refused(f"unknown MIG strategy: {value!r}")
    return str(value)


def _replicated(section: object) -> tuple[bool, list[tuple[str, int]]]:
    """replicas.go ReplicatedResources.UnmarshalJSON: flags, then a non-empty resource list."""
    if not isinstance(section, dict):
        raise _Refused("no resources specified")
    rename = section.get("renameByDefault", False)
    fail_greater = section.get("failRequestsGreaterThanOne", False)
    if not isinstance(rename, bool | None) or not isinstance(fail_greater, bool | None):
        raise _Refused("renameByDefault / failRequestsGreaterThanOne must be booleans")
    resources = section.get("resources")
    if not isinstance(resources, list) or not resources:
        raise _Refused("no resources specified")
    return bool(rename), [_replicated_resource(r) for r in resources]


def _replicated_resource(resource: object) -> tuple[str, int]:
    """replicas.go ReplicatedResource.UnmarshalJSON: name, devices, replicas >= 2, rename."""
    if not isinstance(resource, dict) or "name" not in resource:
        raise _Refused("no resource name specified")
    name = _resource_name(resource["name"])
    _devices(resource.get("devices", "all"))
    if "replicas" not in resource:
        raise _Refused("no replicas specified")
    replicas = resource["replicas"]
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        raise _Refused("replicas is not an integer")
    if replicas < 2:
        raise _Refused("number of replicas must be >= 2")
    if "rename" in resource:
        _resource_name(resource["rename"])
    return name, replicas


def _resource_name(raw: object) -> str:
    """resources.go NewResourceName: prefixed with nvidia.com/, <= 63 chars, a DNS subdomain."""
    if not isinstance(raw, str):
        raise _Refused("a resource name must be a string")
    name = raw if raw.startswith(_RESOURCE_PREFIX + "/") else f"{_RESOURCE_PREFIX}/{raw}"
    _, _, short = name.partition("/")
    if len(name) > _MAX_RESOURCE_NAME or not _DNS_SUBDOMAIN.fullmatch(short):
        raise _Refused(f"incorrect format for resource name {name!r}")
    return name


def _devices(devices: object) -> None:
    """replicas.go ReplicatedDevices.UnmarshalJSON: "all", a count > 0, or a list of ids."""
    if devices == "all":
        return
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices <= 0:
            raise _Refused("a count of devices must be > 0")
        return
    if isinstance(devices, list):
        for device in devices:
            if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
                continue
            if isinstance(device, str) and (
                _GPU_INDEX.fullmatch(device)
                or _MIG_INDEX.fullmatch(device)
                or _DEVICE_UUID.fullmatch(device)
            ):
                continue
            raise _Refused(f"unsupported device in devices list: {device!r}")
        return
    raise _Refused(f"unrecognized type for devices spec: {devices!r}")


def _check_mig_strategy_for_mps(flags: object) -> None:
    """cmd/nvidia-device-plugin/main.go validateFlags: MPS refuses migStrategy=mixed."""
    if isinstance(flags, dict) and flags.get("migStrategy") == "mixed":
        raise _Refused("using --mig-strategy=mixed is not supported with MPS")


def gfd_labels(labels: Mapping[str, str], sharing: Sharing) -> dict[str, str]:
    """The node's whole label set after one GFD pass with ``sharing`` in force.

    ``nvidia.com/gfd.timestamp`` is left as it was: the caller stamps each pass with its clock,
    so that this function stays deterministic.  Every label GFD does not derive from sharing is
    left exactly as it was.  GFD derives the product from NVML's device name; here the base name
    is the current label without its ``-SHARED`` suffix, and a node without the label gets none.
    """
    result = dict(labels)
    product = labels.get(PRODUCT_LABEL)
    if product is not None:
        base = product.removesuffix(SHARED_SUFFIX)
        # resource.go getProductName: "-SHARED" when the resource is replicated and not renamed.
        shared_name = sharing.shared and not sharing.rename_by_default
        result[PRODUCT_LABEL] = base + SHARED_SUFFIX if shared_name else base
    result[REPLICAS_LABEL] = str(sharing.replicas)
    result[STRATEGY_LABEL] = sharing.strategy
    # nvml.go newSharingLabeler: "true" only when the MPS strategy is in force (no MIG here).
    result[MPS_LABEL] = "true" if sharing.strategy == "mps" else "false"
    return result


def plugin_resources(
    *, gpus: int, sharing: Sharing, registered: Collection[str] = (GPU_RESOURCE,)
) -> dict[str, str | None]:
    """The GPU extended resources kubelet shows once the plugin runs with ``sharing``.

    The values are the same for capacity and allocatable (kubelet reserves none of them);
    ``None`` means absent.  A resource kubelet saw registered before (``registered``; every GPU
    node starts with the unshared plugin, hence ``nvidia.com/gpu``) and that the plugin no
    longer advertises is shown as ``"0"``, not removed: kubelet's node status setter zeroes the
    capacity of a device-plugin resource whose endpoint went away rather than deleting it.
    A node without GPUs registers nothing (the plugin serves no devices).
    """
    result: dict[str, str | None] = {GPU_RESOURCE: None, SHARED_GPU_RESOURCE: None}
    for resource in registered:
        if resource in result:
            result[resource] = "0"
    if gpus > 0:
        result[sharing.advertised] = str(gpus * sharing.replicas)
    return result


class Missing:
    """The config manager's failure: the label names a key its ConfigMap view lacks."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = Missing()


def resolve_config_key(label: str | None, keys: Collection[str]) -> str | Missing | None:
    """The ConfigMap key the config manager links to; ``None`` is its empty config (no sharing).

    config-manager ``updateConfigName``: a label naming a key that is not there is an error
    (``MISSING``; the container exits and kubelet restarts it with back-off).  An absent or
    empty label falls back to the default config: the GPU Operator passes its ClusterPolicy's
    ``devicePlugin.config.default`` as ``DEFAULT_CONFIG``, which we take to be ``default``; with
    no such key the node runs the plugin's empty config.  A label naming ``default`` when there
    is no ``default`` key also means the empty config (a rule of this project's brief: the real
    config manager would fail on it, see docs/simulator.md).
    """
    if not label or label == DEFAULT_CONFIG_KEY:
        return DEFAULT_CONFIG_KEY if DEFAULT_CONFIG_KEY in keys else None
    return label if label in keys else MISSING


def backoff_delay(failures: int, *, initial: float, cap: float) -> float:
    """Kubelet's crash-loop back-off before the restart after ``failures`` failed runs (>= 1).

    kubelet doubles the delay after each failed run (10 s, 20 s, ... up to 5 min); tests scale
    ``initial`` and ``cap`` down.
    """
    if failures < 1:
        return 0.0
    return float(min(cap, initial * 2 ** min(failures - 1, 62)))

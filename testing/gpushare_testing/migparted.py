"""A parser of mig-parted config files that follows mig-parted's own rules.

The simulated MIG manager reads the ConfigMap the operator writes with this, and the tests read
the operator's rendering back with it: written from NVIDIA/mig-parted's ``api/spec/v1``
(``Spec.UnmarshalJSON``, ``MigConfigSpec.UnmarshalJSON``) and ``pkg/types``
(``ParseMigProfile``, ``MigConfig.AssertValid``), independently of the operator's renderer, so
that both cannot share a misreading.  It refuses what mig-parted refuses:

- a file that is not YAML or not a mapping; a non-empty file without ``version``; a version
  other than ``v1``; any top-level field but ``version`` and ``mig-configs``;
- an empty ``mig-configs``, or a config with no entry;
- an entry without ``devices`` or ``mig-enabled``, or with a field it does not know
  (``device-filter``, ``devices``, ``mig-enabled``, ``mig-devices`` are the only ones);
- ``devices`` other than the string ``all`` or a list of integers; a ``device-filter`` other
  than a string or a list of strings; a non-boolean ``mig-enabled``;
- ``mig-devices`` that is not a mapping of profile names to non-negative integers, a profile
  name ``ParseMigProfile`` rejects, counts that are all 0, ``mig-devices`` missing (or null)
  while ``mig-enabled`` is true, or any device while it is false.

mig-parted reads YAML through sigs.k8s.io/yaml (YAML to JSON, then Go's decoder): a float or a
boolean where an integer belongs is refused, as Go's ``json.Unmarshal`` does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = [
    "MigConfigEntry",
    "MigPartedError",
    "MigPartedSpec",
    "MigProfileName",
    "parse_mig_parted_config",
    "parse_mig_profile",
]

VERSION = "v1"
_SLICES = (1, 2, 3, 4, 6, 7, 8)  # pkg/types ParseMigProfile: the NVML slice-count profiles
_ATTRIBUTES = ("me",)  # pkg/types: AttributeMediaExtensions is the one attribute known
_NUMBER = re.compile(r"[+-]?[0-9]+")  # strconv.Atoi


class MigPartedError(ValueError):
    """mig-parted would refuse this file (``assert --valid-config`` fails)."""


@dataclass(frozen=True, slots=True)
class MigProfileName:
    """A parsed profile: compute slices, GPU-instance slices, memory in GB, attributes."""

    c: int
    g: int
    gb: int
    attributes: tuple[str, ...] = ()

    def __str__(self) -> str:
        """The canonical name, as mig-parted's ``MigProfile.String`` prints it."""
        suffix = "+" + ",".join(self.attributes) if self.attributes else ""
        if self.c == self.g:
            return f"{self.g}g.{self.gb}gb{suffix}"
        return f"{self.c}c.{self.g}g.{self.gb}gb{suffix}"


@dataclass(frozen=True, slots=True)
class MigConfigEntry:
    """One entry of a named config: which GPUs, MIG on or off, and the devices per GPU."""

    devices: str | tuple[int, ...]  # "all" or GPU indices
    mig_enabled: bool
    mig_devices: Mapping[str, int]  # canonical profile name -> count (zeros dropped)
    device_filter: tuple[str, ...] = ()  # PCI device ids ("0x233010DE"); empty: any

    def matches(self, index: int, device_id: str) -> bool:
        """``MatchesDeviceFilter`` and ``MatchesDevices`` (api/spec/v1/helpers.go)."""
        if self.device_filter and not any(
            _same_device_id(f, device_id) for f in self.device_filter
        ):
            return False
        return self.devices == "all" or index in self.devices


@dataclass(frozen=True, slots=True)
class MigPartedSpec:
    version: str
    configs: Mapping[str, tuple[MigConfigEntry, ...]]


def _same_device_id(raw: str, device_id: str) -> bool:
    try:
        return int(raw, 16) == int(device_id, 16)
    except ValueError:
        return False


def parse_mig_parted_config(text: str) -> MigPartedSpec:
    """The spec of a mig-parted config file; ``MigPartedError`` when mig-parted refuses it."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigPartedError(f"not YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise MigPartedError("not a mapping")
    if raw and "version" not in raw:
        raise MigPartedError("unable to parse with missing 'version' field")
    version = raw.get("version", "")
    if not isinstance(version, str) or version != VERSION:
        raise MigPartedError(f"unknown version: {version!r}")
    configs: dict[str, tuple[MigConfigEntry, ...]] = {}
    for key, value in raw.items():
        if key == "version":
            continue
        if key != "mig-configs":
            raise MigPartedError(f"unexpected field: {key}")
        configs = _configs(value)
    return MigPartedSpec(version=version, configs=configs)


def _configs(raw: object) -> dict[str, tuple[MigConfigEntry, ...]]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise MigPartedError("mig-configs is not a mapping")
    if not raw:
        raise MigPartedError("at least one entry in 'mig-configs' is required")
    configs = {}
    for name, entries in raw.items():
        if not isinstance(name, str):
            raise MigPartedError(f"config name {name!r} is not a string")
        if entries is None:
            entries = []
        if not isinstance(entries, list):
            raise MigPartedError(f"config {name!r} is not a list")
        if not entries:
            raise MigPartedError(f"at least one entry in '{name}' is required")
        configs[name] = tuple(_entry(e) for e in entries)
    return configs


def _entry(raw: object) -> MigConfigEntry:
    if not isinstance(raw, dict):
        raise MigPartedError("an entry is not a mapping")
    for required in ("devices", "mig-enabled"):
        if required not in raw:
            raise MigPartedError(f"missing required field: {required}")
    unknown = set(raw) - {"device-filter", "devices", "mig-enabled", "mig-devices"}
    if unknown:
        raise MigPartedError(f"unexpected field: {sorted(map(str, unknown))[0]}")
    enabled = raw["mig-enabled"]
    if not isinstance(enabled, bool):
        raise MigPartedError("mig-enabled is not a boolean")
    devices = _mig_devices(raw["mig-devices"]) if "mig-devices" in raw else None
    if enabled and devices is None:
        raise MigPartedError("missing required field 'mig-devices' when 'mig-enabled' is true")
    if not enabled and devices:
        raise MigPartedError("MIG devices included when 'mig-enabled' is false")
    return MigConfigEntry(
        devices=_devices(raw["devices"]),
        mig_enabled=enabled,
        mig_devices={k: v for k, v in (devices or {}).items() if v > 0},
        device_filter=_device_filter(raw.get("device-filter")),
    )


def _devices(raw: object) -> str | tuple[int, ...]:
    if isinstance(raw, str):
        if raw != "all":
            raise MigPartedError(f"invalid string input for 'devices': {raw}")
        return raw
    if isinstance(raw, list) and all(_is_int(i) for i in raw):
        return tuple(raw)
    raise MigPartedError(f"devices must be 'all' or a list of integers: {raw!r}")


def _device_filter(raw: object) -> tuple[str, ...]:
    if raw is None or raw == "":
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(i, str) for i in raw):
        return tuple(raw)
    raise MigPartedError(f"device-filter must be a string or a list of strings: {raw!r}")


def _mig_devices(raw: object) -> dict[str, int] | None:
    """``types.MigConfig`` and its ``AssertValid``; ``None`` for a null value (a nil map)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise MigPartedError("mig-devices is not a mapping")
    devices: dict[str, int] = {}
    for name, count in raw.items():
        if not isinstance(name, str):
            raise MigPartedError(f"invalid format for {name!r}")
        profile = parse_mig_profile(name)
        if not _is_int(count):
            raise MigPartedError(f"count for {name!r} is not an integer")
        if count < 0:
            raise MigPartedError(f"invalid count for {name!r}: {count}")
        canonical = str(profile)
        devices[canonical] = devices.get(canonical, 0) + count
    if devices and not any(devices.values()):
        raise MigPartedError("all counts for all MigProfiles are 0")
    return devices


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_mig_profile(name: str) -> MigProfileName:
    """pkg/types ``ParseMigProfile``: ``[<c>c.]<g>g.<gb>gb[+attr,...]``."""
    if not name:
        raise MigPartedError("empty MigProfile string")
    fields, plus, attrs = name.partition("+")
    attributes = _attributes(attrs) if plus else ()
    parts = fields.split(".", 2)
    if len(parts) == 3:
        c, g, gb = _field(parts[0], "c"), _field(parts[1], "g"), _field(parts[2], "gb")
    elif len(parts) == 2:
        g, gb = _field(parts[0], "g"), _field(parts[1], "gb")
        c = g
    else:
        raise MigPartedError(f"{name!r}: parsed wrong number of fields, expected 2 or 3")
    if c not in _SLICES:
        raise MigPartedError(f"{name!r}: unknown Compute Instance slice size: {c}")
    if g not in _SLICES:
        raise MigPartedError(f"{name!r}: unknown GPU Instance slice size: {g}")
    return MigProfileName(c=c, g=g, gb=gb, attributes=attributes)


def _field(text: str, suffix: str) -> int:
    if text.strip() != text:
        raise MigPartedError(f"leading or trailing spaces on '%d{suffix}'")
    if not text.endswith(suffix):
        raise MigPartedError(f"missing '{suffix}' from '%d{suffix}'")
    number = text.removesuffix(suffix)
    if not _NUMBER.fullmatch(number):
        raise MigPartedError(f"malformed number in '%d{suffix}'")
    return int(number)


def _attributes(text: str) -> tuple[str, ...]:
    attributes = text.split(",")
    if len(set(attributes)) != len(attributes):
        raise MigPartedError("non unique attribute in list")
    for attribute in attributes:
        if not attribute:
            raise MigPartedError("empty attribute in list")
        if not attribute.isascii() or not attribute.isalnum() or attribute[0].isdigit():
            raise MigPartedError(f"malformed attribute {attribute!r}")
        if attribute not in _ATTRIBUTES:
            raise MigPartedError(f"unknown MigProfile attribute: {attribute}")
    return tuple(attributes)

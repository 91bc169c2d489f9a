"""The mig-parted config gpushare owns: rendering, content-hashed names, reading back.

The GPU Operator's MIG manager applies the layout that a node's ``nvidia.com/mig.config`` label
names, looked up in one config file (format ``v1`` of NVIDIA/mig-parted, ``api/spec/v1``). gpushare
owns one such file, ``config.yaml`` in the ConfigMap ``gpushare-mig-parted-config``, and the GPU
Operator is pointed at it (``migManager.config.name``). Like device-plugin keys, a name is never
edited in place: the MIG manager acts on a label change, not on a change behind a name, so the
name carries a hash of its content (:func:`layout_name`) and a new layout is a new name.

Every name configures all GPUs of a node alike (``devices: all``): a policy's layout is per GPU.
``all-disabled`` is always present: a node that a MIG policy leaves is switched to it before the
next policy's config, and it is what NVIDIA's own default config calls that state.

:func:`validate_spec` accepts exactly the shape :func:`render_text` writes and, within it, applies
mig-parted's own rules (``MigConfigSpec.UnmarshalJSON``, ``MigConfig.AssertValid``): a version,
a non-empty list per name, ``mig-devices`` required when enabled and refused when disabled,
profile names as ``pkg/types`` parses them (:mod:`~gpushare_operator.core.hardware.migprofiles`).
It is
stricter where mig-parted accepts spellings we never write: counts of at least 1 (mig-parted
allows 0 beside a non-zero count), no ``device-filter``, no device index lists.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from gpushare_operator.core.hardware.migprofiles import ProfileError, parse_profile
from gpushare_operator.core.labelling.labels import label_value_error, label_value_prefix

CONFIGMAP_NAME: Final = "gpushare-mig-parted-config"
CONFIGMAP_KEY: Final = "config.yaml"
ALL_DISABLED: Final = "all-disabled"
VERSION: Final = "v1"
NAME_TAG: Final = "mig"
MAX_NAME_LENGTH: Final = 63  # a name is also a node label value

_HASH_LENGTH: Final = 6
_ALL_DEVICES: Final = "all"
_HASHED_NAME: Final = re.compile(rf"(?:.+-)?{NAME_TAG}-(?P<hash>[0-9a-f]{{{_HASH_LENGTH}}})")


class MigConfigError(ValueError):
    """A mig-parted config that mig-parted would refuse, or that gpushare would not write."""


@dataclass(frozen=True, slots=True)
class MigLayout:
    """How many instances of each MIG profile every GPU of a node holds.

    ``devices`` is kept in one canonical order (largest profile first, then by name) whatever
    order it was given in, so equal layouts compare, hash and render equal.
    """

    devices: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        counts = _checked_devices(self.devices, where="layout")
        ordered = tuple(sorted(counts, key=lambda item: parse_profile(item[0]).sort_key))
        object.__setattr__(self, "devices", ordered)

    @classmethod
    def from_mapping(cls, devices: Mapping[str, int]) -> MigLayout:
        """The layout with ``devices[profile]`` instances of each profile per GPU."""
        return cls(tuple(devices.items()))

    @property
    def profiles(self) -> tuple[str, ...]:
        return tuple(profile for profile, _ in self.devices)

    def as_dict(self) -> dict[str, int]:
        return dict(self.devices)


def layout_name(*, policy_name: str, layout: MigLayout) -> str:
    """The config name for this policy and layout: ``<policy>-mig-<6 hex>``.

    The hash covers the rendered entry, so a new layout is a new name, and the same layout
    under two policies differs only in the policy part. The name is a node-label value, so it
    is at most 63 characters: the policy part is cut to fit and trimmed to end on a letter or
    digit, leaving ``mig-<hash>`` alone when nothing usable is left.
    """
    suffix = f"{NAME_TAG}-{_digest(layout)}"
    prefix = label_value_prefix(policy_name, budget=MAX_NAME_LENGTH - len(suffix) - 1)
    return f"{prefix}-{suffix}" if prefix else suffix


def render_spec(layouts: Mapping[str, MigLayout]) -> dict[str, Any]:
    """The config as a plain dict, validated: every name sorted, ``all-disabled`` among them."""
    if ALL_DISABLED in layouts:
        raise MigConfigError(f"{ALL_DISABLED!r} is always rendered and names no layout")
    entries: dict[str, Any] = {ALL_DISABLED: [_disabled_entry()]}
    for name in sorted(layouts):
        entries[name] = [_entry(layouts[name])]
    spec = {"version": VERSION, "mig-configs": dict(sorted(entries.items()))}
    validate_spec(spec)
    return spec


def render_text(layouts: Mapping[str, MigLayout]) -> str:
    """The exact text stored under ``config.yaml``; deterministic for equal inputs."""
    return _dump(render_spec(layouts))


def parse_text(text: str) -> dict[str, MigLayout | None] | None:
    """The layouts of a config we rendered, by name (``all-disabled`` -> None); None for text
    we would not render (another manager's, or broken), whose layouts are unknown to us."""
    try:
        spec = yaml.safe_load(text)
        validate_spec(spec)
    except (yaml.YAMLError, MigConfigError):
        return None
    return {name: _layout_of(entry) for name, [entry] in spec["mig-configs"].items()}


def validate_spec(spec: Any) -> None:
    """Accept exactly the shape :func:`render_spec` writes; raise :class:`MigConfigError`."""
    if not isinstance(spec, Mapping):
        raise MigConfigError("config must be an object with version and mig-configs")
    _only_fields(spec, allowed=("version", "mig-configs"), where="config")
    if spec.get("version") != VERSION:
        raise MigConfigError(f"config: version must be {VERSION!r}, not {spec.get('version')!r}")
    configs = spec.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        raise MigConfigError("config: mig-configs must be an object with at least one entry")
    if ALL_DISABLED not in configs:
        raise MigConfigError(f"config: mig-configs must contain {ALL_DISABLED!r}")
    for name, entries in configs.items():
        _validate_config(name, entries)


def _validate_config(name: Any, entries: Any) -> None:
    problem = label_value_error(name) if isinstance(name, str) else "it is not a string"
    if problem is not None or not name:
        raise MigConfigError(
            f"mig-configs: name {name!r} must be a non-empty label value "
            f"(it is the nvidia.com/mig.config label): {problem or 'it is empty'}"
        )
    where = f"mig-configs.{name}"
    if isinstance(entries, str) or not isinstance(entries, Sequence) or len(entries) != 1:
        raise MigConfigError(f"{where} must be a list of exactly one entry (devices: all)")
    layout = _validate_entry(entries[0], where=f"{where}[0]")
    if (name == ALL_DISABLED) != (layout is None):
        raise MigConfigError(
            f"{where}: {ALL_DISABLED!r} and only it disables MIG; every other name enables it"
        )
    if layout is not None:
        _validate_hashed_name(name, layout, where=where)


def _validate_entry(entry: Any, *, where: str) -> MigLayout | None:
    if not isinstance(entry, Mapping):
        raise MigConfigError(f"{where} must be an object with devices and mig-enabled")
    _only_fields(entry, allowed=("devices", "mig-enabled", "mig-devices"), where=where)
    if entry.get("devices") != _ALL_DEVICES:
        raise MigConfigError(
            f"{where}.devices must be {_ALL_DEVICES!r}, not {entry.get('devices')!r}: "
            "a layout applies to every GPU of a node"
        )
    enabled = entry.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{where}.mig-enabled must be true or false, not {enabled!r}")
    if not enabled:
        if "mig-devices" in entry:
            raise MigConfigError(f"{where}: MIG devices included when 'mig-enabled' is false")
        return None
    devices = entry.get("mig-devices")
    if not isinstance(devices, Mapping):
        raise MigConfigError(
            f"{where}: 'mig-devices' is required when 'mig-enabled' is true, "
            f"as an object of profile: count, not {devices!r}"
        )
    return MigLayout(_checked_devices(tuple(devices.items()), where=f"{where}.mig-devices"))


def _validate_hashed_name(name: str, layout: MigLayout, *, where: str) -> None:
    # Content addressing: a name whose hash is not its content's was edited in place, and a
    # node carrying it may run either layout.
    found = _HASHED_NAME.fullmatch(name)
    if found is None or found["hash"] != _digest(layout):
        raise MigConfigError(
            f"{where}: the name must end in {NAME_TAG}-{_digest(layout)}, the hash of its layout"
        )


def _checked_devices(devices: Any, *, where: str) -> tuple[tuple[str, int], ...]:
    if isinstance(devices, str) or not isinstance(devices, Sequence) or not devices:
        raise MigConfigError(f"{where} must name at least one profile")
    seen: dict[str, int] = {}
    for item in devices:
        if not isinstance(item, tuple) or len(item) != 2:
            raise MigConfigError(f"{where}: {item!r} is not a (profile, count) pair")
        profile, count = item
        try:
            parse_profile(profile)
        except ProfileError as exc:
            raise MigConfigError(f"{where}: {exc}") from None
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise MigConfigError(
                f"{where}: the count of {profile!r} must be an integer of at least 1, not {count!r}"
            )
        if profile in seen:
            raise MigConfigError(f"{where}: {profile!r} is named more than once")
        seen[profile] = count
    return tuple(seen.items())


def _layout_of(entry: Mapping[str, Any]) -> MigLayout | None:
    if not entry["mig-enabled"]:
        return None
    return MigLayout(tuple(entry["mig-devices"].items()))


def _entry(layout: MigLayout) -> dict[str, Any]:
    return {"devices": _ALL_DEVICES, "mig-enabled": True, "mig-devices": layout.as_dict()}


def _disabled_entry() -> dict[str, Any]:
    return {"devices": _ALL_DEVICES, "mig-enabled": False}


def _digest(layout: MigLayout) -> str:
    return hashlib.sha256(_dump([_entry(layout)]).encode()).hexdigest()[:_HASH_LENGTH]


def _dump(rendered: Any) -> str:
    return yaml.safe_dump(rendered, sort_keys=False, default_flow_style=False, indent=2, width=1000)


def _only_fields(body: Mapping[str, Any], *, allowed: Sequence[str], where: str) -> None:
    unknown = sorted(str(k) for k in body if k not in allowed)
    if unknown:
        raise MigConfigError(
            f"{where}: unexpected field(s) {', '.join(map(repr, unknown))}; "
            f"gpushare writes only {', '.join(allowed)}"
        )

"""The NVIDIA device plugin's config file (format v1): the shape gpushare writes, checked.

The plugin ignores unknown keys and, at best, logs and ignores ``rename``/``devices`` in shared
resources; a mistake there does not fail, it just shares nothing. So :func:`validate_config`
is stricter than the plugin: it accepts exactly the shape
:mod:`~gpushare_operator.core.deviceplugin.devconfigs`
renders, and within it applies the rules of the plugin's own parser (``api/config/v1`` in
NVIDIA/k8s-device-plugin): a sharing section with a non-empty resource list, replicas of at least
2 for a shared resource (the plugin treats 1 as not replicated), at most 48 for MPS (MPS serves
at most 48 clients per device), resource names in the ``nvidia.com`` domain, and no MPS under a
MIG strategy (NVIDIA: "Sharing with MPS is currently not supported on devices with MIG enabled").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpushare_operator.core.labelling.labels import dns_subdomain_error

VERSION: Final = "v1"
MIN_REPLICAS: Final = 2
MAX_MPS_REPLICAS: Final = 48
RESOURCE_DOMAIN: Final = "nvidia.com"
MAX_RESOURCE_NAME_LENGTH: Final = 63
NO_MIG: Final = "none"
MIG_SINGLE: Final = "single"
MIG_MIXED: Final = "mixed"
TIME_SLICING_SECTION: Final = "timeSlicing"
MPS_SECTION: Final = "mps"
MPS_ON_MIG: Final = "Sharing with MPS is currently not supported on devices with MIG enabled"

_MIG_STRATEGIES: Final = (NO_MIG, MIG_SINGLE, MIG_MIXED)
_SECTIONS: Final = (TIME_SLICING_SECTION, MPS_SECTION)
_STRATEGY_FLAGS: Final = ("renameByDefault", "failRequestsGreaterThanOne")


class ConfigError(ValueError):
    """A device-plugin config the plugin would reject, or would silently not apply."""


def validate_config(config: Mapping[str, Any]) -> None:
    """Accept exactly the shape devconfigs renders; raise :class:`ConfigError` otherwise."""
    _only_fields(config, allowed=("version", "flags", "sharing"), where="config")
    if config.get("version") != VERSION:
        raise ConfigError(f"config: version must be {VERSION!r}, not {config.get('version')!r}")
    _validate_flags(config.get("flags"))
    if config.get("sharing") is not None:
        _validate_sharing(config["sharing"])
        if config["flags"]["migStrategy"] != NO_MIG and config["sharing"].get(MPS_SECTION):
            raise ConfigError(
                f"sharing.mps with migStrategy {config['flags']['migStrategy']}: "
                f"NVIDIA: {MPS_ON_MIG!r}"
            )


def _validate_flags(flags: Any) -> None:
    if not isinstance(flags, Mapping):
        raise ConfigError("config: flags must be an object with migStrategy")
    _only_fields(flags, allowed=("migStrategy",), where="flags")
    if flags.get("migStrategy") not in _MIG_STRATEGIES:
        raise ConfigError(
            f"flags: migStrategy must be one of {', '.join(_MIG_STRATEGIES)}, "
            f"not {flags.get('migStrategy')!r}"
        )


def _validate_sharing(sharing: Any) -> None:
    if not isinstance(sharing, Mapping):
        raise ConfigError("config: sharing must be an object")
    _only_fields(sharing, allowed=_SECTIONS, where="sharing")
    present = [name for name in _SECTIONS if sharing.get(name) is not None]
    if len(present) != 1:
        raise ConfigError(
            "sharing: exactly one of timeSlicing or mps must be set, "
            f"not {' and '.join(present) or 'neither'}"
        )
    _validate_strategy(sharing[present[0]], where=f"sharing.{present[0]}", mps=present[0] == "mps")


def _validate_strategy(body: Any, *, where: str, mps: bool) -> None:
    if not isinstance(body, Mapping):
        raise ConfigError(f"{where} must be an object")
    _only_fields(body, allowed=(*_STRATEGY_FLAGS, "resources"), where=where)
    for flag in _STRATEGY_FLAGS:
        if not isinstance(body.get(flag, False), bool):
            raise ConfigError(f"{where}.{flag} must be true or false, not {body[flag]!r}")
    resources = body.get("resources")
    if isinstance(resources, str) or not isinstance(resources, Sequence) or not resources:
        raise ConfigError(f"{where}.resources must be a non-empty list")
    names = [
        _validate_resource(r, where=f"{where}.resources[{i}]", mps=mps)
        for i, r in enumerate(resources)
    ]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.resources names a resource more than once: {names}")


def _validate_resource(resource: Any, *, where: str, mps: bool) -> str:
    if not isinstance(resource, Mapping):
        raise ConfigError(f"{where} must be an object with name and replicas")
    for ignored in ("rename", "devices"):
        if ignored in resource:
            raise ConfigError(
                f"{where}.{ignored} is not supported: the device plugin ignores it for shared "
                "resources (use renameByDefault to advertise <name>.shared)"
            )
    _only_fields(resource, allowed=("name", "replicas"), where=where)
    replicas = resource.get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < MIN_REPLICAS:
        raise ConfigError(
            f"{where}.replicas must be an integer of at least {MIN_REPLICAS}, not {replicas!r}"
        )
    if mps and replicas > MAX_MPS_REPLICAS:
        raise ConfigError(
            f"{where}.replicas must be at most {MAX_MPS_REPLICAS} for MPS, not {replicas}"
        )
    name = resource.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name must be a resource name string, not {name!r}")
    validate_resource_name(name, where=f"{where}.name")
    return name


def validate_resource_name(name: str, *, where: str) -> None:
    """Mirror the plugin's rule: ``nvidia.com/`` then a DNS subdomain, 63 characters in all.

    The plugin prefixes names outside its domain with ``nvidia.com/``, which turns any other
    ``domain/name`` into an invalid name, so those are refused here by name. The ``.shared``
    name that renameByDefault advertises needs no check of its own: its part after the domain
    is at most 59 characters, within the 63 that Kubernetes allows.
    """
    domain, slash, short = name.partition("/")
    if not slash or domain != RESOURCE_DOMAIN:
        raise ConfigError(
            f"{where}: resource {name!r} must be named {RESOURCE_DOMAIN}/<name>; "
            "the device plugin only advertises resources in its own domain"
        )
    if len(name) > MAX_RESOURCE_NAME_LENGTH:
        raise ConfigError(
            f"{where}: resource {name!r} must be at most {MAX_RESOURCE_NAME_LENGTH} characters, "
            f"not {len(name)}"
        )
    if problem := dns_subdomain_error(short):
        raise ConfigError(f"{where}: the part of {name!r} after '/' {problem}")


def _only_fields(body: Mapping[str, Any], *, allowed: Sequence[str], where: str) -> None:
    unknown = sorted(str(k) for k in body if k not in allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))} would be ignored by "
            f"the device plugin; expected only {', '.join(allowed)}"
        )

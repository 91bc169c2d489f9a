"""NVIDIA device-plugin configs (format v1): rendering, content-addressed keys, validation.

Each policy renders to one key of the device-plugin ConfigMap. The GPU Operator's config manager
reloads the plugin only when a node's ``nvidia.com/device-plugin.config`` label changes, not when
the content behind a key changes; so a key is never edited in place. Instead the key name carries
a hash of its content (:func:`config_key`), and any change of content is a new key and therefore
a node-label change.

The text is YAML, not JSON: the plugin reads either (``sigs.k8s.io/yaml``), but YAML is what its
documentation and the GPU Operator's examples use and what people read in ``kubectl get cm -o
yaml``. pyyaml is told exactly how to emit (block style, insertion order), and the unit tests pin
the bytes, so a pyyaml change that would silently rename every key fails a test instead.

The plugin ignores unknown keys and, at best, logs and ignores ``rename``/``devices`` in shared
resources; a mistake there does not fail, it just shares nothing. So :func:`validate_config`
is stricter than the plugin: it accepts exactly the shape this module renders, and within it
applies the rules of the plugin's own parser (``api/config/v1`` in NVIDIA/k8s-device-plugin):
a sharing section with a non-empty resource list, replicas of at least 2 for a shared resource
(the plugin treats 1 as not replicated), at most 48 for MPS (MPS serves at most 48 clients per
device), resource names in the ``nvidia.com`` domain.

An Exclusive policy renders without a sharing section: the same content as ``default``, under
a key of its own, so that moving a node between Exclusive and shared is a label change like any
other.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from gpushare_operator.core.labels import dns_subdomain_error, label_value_prefix

DEFAULT_KEY: Final = "default"
VERSION: Final = "v1"
TIME_SLICING: Final = "TimeSlicing"
MPS: Final = "MPS"
EXCLUSIVE: Final = "Exclusive"
MIN_REPLICAS: Final = 2
MAX_MPS_REPLICAS: Final = 48
RESOURCE_DOMAIN: Final = "nvidia.com"
SHARED_SUFFIX: Final = ".shared"
MAX_RESOURCE_NAME_LENGTH: Final = 63
MAX_KEY_LENGTH: Final = 63  # the key is also a node label value
SHARING_STRATEGY_LABEL: Final = "nvidia.com/gpu.sharing-strategy"

_MIG_STRATEGIES: Final = ("none", "single", "mixed")
_SECTIONS: Final = {TIME_SLICING: "timeSlicing", MPS: "mps"}
_KEY_TAGS: Final = {TIME_SLICING: "ts", MPS: "mps", EXCLUSIVE: "excl"}
_GFD_STRATEGIES: Final = {TIME_SLICING: "time-slicing", MPS: "mps", EXCLUSIVE: "none"}
_FLAGS: Final = {"migStrategy": "none"}
_STRATEGY_FLAGS: Final = ("renameByDefault", "failRequestsGreaterThanOne")
_HASH_LENGTH: Final = 6


class ConfigError(ValueError):
    """A device-plugin config the plugin would reject, or would silently not apply."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SharingConfig:
    """The part of a policy's spec that decides the rendered config, and so its key.

    ``strategy`` is ``"TimeSlicing"``, ``"MPS"`` or ``"Exclusive"`` (a ``StrEnum`` member works
    too); Exclusive has 1 replica and no sharing flags.
    """

    strategy: str
    replicas: int
    resource_name: str = f"{RESOURCE_DOMAIN}/gpu"
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False

    @property
    def shared(self) -> bool:
        return self.strategy != EXCLUSIVE


def render_config(config: SharingConfig) -> dict[str, Any]:
    """The config as a plain dict, validated; raise :class:`ConfigError` if it cannot work.

    ``failRequestsGreaterThanOne`` is always written out, as the caller resolved it: the
    plugin's default for an omitted value differs between strategies (false for time-slicing,
    true for MPS), and an explicit value says in the ConfigMap what is in force.
    """
    if _checked_strategy(config.strategy) == EXCLUSIVE:
        if config.replicas != 1:
            raise ConfigError(f"Exclusive has 1 replica per GPU, not {config.replicas}")
        rendered: dict[str, Any] = {"version": VERSION, "flags": dict(_FLAGS)}
        validate_config(rendered)
        return rendered
    rendered = {
        "version": VERSION,
        "flags": dict(_FLAGS),
        "sharing": {
            _section(config.strategy): {
                "renameByDefault": config.rename_by_default,
                "failRequestsGreaterThanOne": config.fail_requests_greater_than_one,
                "resources": [{"name": config.resource_name, "replicas": config.replicas}],
            },
        },
    }
    validate_config(rendered)
    return rendered


def render_config_text(config: SharingConfig) -> str:
    """The exact text stored under the config's key; deterministic for equal configs."""
    return _dump(render_config(config))


def render_default_text() -> str:
    """The ``default`` key: no sharing, for GPU nodes that no policy governs."""
    rendered: dict[str, Any] = {"version": VERSION, "flags": dict(_FLAGS)}
    validate_config(rendered)
    return _dump(rendered)


def config_key(*, policy_name: str, config: SharingConfig) -> str:
    """The ConfigMap key for this policy and content: ``<policy>-<ts|mps><replicas>-<6 hex>``.

    The hash covers the rendered text, so any change of content is a change of key. The key is
    also a node-label value, so it is at most 63 characters: the policy part is cut to fit and
    trimmed to end on a letter or digit. Two long names that share their first ~50 characters
    get the same key only for identical content, which is harmless: the text is the same.
    """
    text = render_config_text(config)
    digest = hashlib.sha256(text.encode()).hexdigest()[:_HASH_LENGTH]
    tag = _KEY_TAGS[_checked_strategy(config.strategy)]
    suffix = f"{tag}{config.replicas if config.shared else ''}-{digest}"
    prefix = label_value_prefix(policy_name, budget=MAX_KEY_LENGTH - len(suffix) - 1)
    return f"{prefix}-{suffix}" if prefix else suffix


def parse_config_text(text: str) -> SharingConfig | None:
    """What a key of ours configures, read back from its text; None for text this module would
    not render (another manager's, or broken): what such a key makes a node do is unknown.

    A node may carry a key other than its policy's current one (the spec moved on, the policy
    is gone): whether its device plugin runs that key's config is judged from the key itself.
    """
    try:
        config = yaml.safe_load(text)
        validate_config(config)
    except (yaml.YAMLError, ConfigError):
        return None
    sharing = config.get("sharing")
    if sharing is None:
        return SharingConfig(strategy=EXCLUSIVE, replicas=1)
    [(section, body)] = [(name, body) for name, body in sharing.items() if body is not None]
    [resource] = body["resources"] if len(body["resources"]) == 1 else [None]
    if resource is None:
        return None  # several resources: never rendered by gpushare
    strategy = TIME_SLICING if section == _SECTIONS[TIME_SLICING] else MPS
    return SharingConfig(
        strategy=strategy,
        replicas=int(resource["replicas"]),
        resource_name=str(resource["name"]),
        rename_by_default=bool(body.get("renameByDefault", False)),
        fail_requests_greater_than_one=bool(body.get("failRequestsGreaterThanOne", False)),
    )


def advertised_resource(config: SharingConfig) -> str:
    """The extended resource whose slots pods request on a node governed by ``config``."""
    if config.rename_by_default and config.shared:
        return config.resource_name + SHARED_SUFFIX
    return config.resource_name


def sharing_strategy_label(config: SharingConfig) -> str:
    """The value GPU Feature Discovery puts in ``nvidia.com/gpu.sharing-strategy`` once applied."""
    return _GFD_STRATEGIES[_checked_strategy(config.strategy)]


def validate_config(config: Mapping[str, Any]) -> None:
    """Accept exactly the shape this module renders; raise :class:`ConfigError` otherwise."""
    _only_fields(config, allowed=("version", "flags", "sharing"), where="config")
    if config.get("version") != VERSION:
        raise ConfigError(f"config: version must be {VERSION!r}, not {config.get('version')!r}")
    _validate_flags(config.get("flags"))
    if config.get("sharing") is not None:
        _validate_sharing(config["sharing"])


def _section(strategy: str) -> str:
    return _SECTIONS[_checked_strategy(strategy)]


def _checked_strategy(strategy: str) -> str:
    if strategy not in _KEY_TAGS:
        raise ConfigError(
            f"strategy {strategy!r} is not supported; use {TIME_SLICING}, {MPS} or {EXCLUSIVE}"
        )
    return strategy


def _dump(rendered: Mapping[str, Any]) -> str:
    return yaml.safe_dump(rendered, sort_keys=False, default_flow_style=False, indent=2, width=1000)


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
    _only_fields(sharing, allowed=tuple(_SECTIONS.values()), where="sharing")
    present = [name for name in _SECTIONS.values() if sharing.get(name) is not None]
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
    _validate_resource_name(name, where=f"{where}.name")
    return name


def _validate_resource_name(name: str, *, where: str) -> None:
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

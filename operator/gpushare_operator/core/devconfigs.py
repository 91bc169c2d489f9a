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

A MIG policy's key carries the plugin's MIG strategy (``flags.migStrategy``): ``single``
advertises every MIG device as ``nvidia.com/gpu``, ``mixed`` one resource per profile,
``nvidia.com/mig-<profile>`` (``internal/rm`` in the plugin: ``+`` becomes ``.``, and profiles
whose compute instance is smaller than its GPU instance are not advertised). With replicas, every
one of those resources is time-sliced (the plugin's README: time-slicing is supported on MIG
devices); MPS is not ("Sharing with MPS is currently not supported on devices with MIG enabled").
The layout itself is mig-parted's business (:mod:`~gpushare_operator.core.migconfigs`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from gpushare_operator.core import migprofiles
from gpushare_operator.core.labels import dns_subdomain_error, label_value_prefix

DEFAULT_KEY: Final = "default"
VERSION: Final = "v1"
TIME_SLICING: Final = "TimeSlicing"
MPS: Final = "MPS"
EXCLUSIVE: Final = "Exclusive"
MIG: Final = "MIG"
MIG_SINGLE: Final = "single"
MIG_MIXED: Final = "mixed"
NO_MIG: Final = "none"
MAX_MIG_REPLICAS: Final = 64  # the policy API's bound for time-sliced MIG devices
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
MIN_REPLICAS: Final = 2
MAX_MPS_REPLICAS: Final = 48
RESOURCE_DOMAIN: Final = "nvidia.com"
SHARED_SUFFIX: Final = ".shared"
MAX_RESOURCE_NAME_LENGTH: Final = 63
MAX_KEY_LENGTH: Final = 63  # the key is also a node label value
SHARING_STRATEGY_LABEL: Final = "nvidia.com/gpu.sharing-strategy"

_MIG_STRATEGIES: Final = (NO_MIG, MIG_SINGLE, MIG_MIXED)
_SECTIONS: Final = {TIME_SLICING: "timeSlicing", MPS: "mps"}
_KEY_TAGS: Final = {TIME_SLICING: "ts", MPS: "mps", EXCLUSIVE: "excl", MIG: "mig"}
_GFD_STRATEGIES: Final = {TIME_SLICING: "time-slicing", MPS: "mps", EXCLUSIVE: "none"}
_FLAGS: Final = {"migStrategy": NO_MIG}
_SINGLE_RESOURCES: Final = (f"{RESOURCE_DOMAIN}/gpu",)
_MPS_ON_MIG: Final = "Sharing with MPS is currently not supported on devices with MIG enabled"
_STRATEGY_FLAGS: Final = ("renameByDefault", "failRequestsGreaterThanOne")
_HASH_LENGTH: Final = 6


class ConfigError(ValueError):
    """A device-plugin config the plugin would reject, or would silently not apply."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SharingConfig:
    """The part of a policy's spec that decides the rendered config, and so its key.

    ``strategy`` is ``"TimeSlicing"``, ``"MPS"``, ``"Exclusive"`` or ``"MIG"`` (a ``StrEnum``
    member works too); Exclusive has 1 replica and no sharing flags. MIG has a ``mig_strategy``
    (``"single"`` or ``"mixed"``; ``"none"`` for every other strategy) and the resources the
    plugin advertises for the layout, ``mig_resources`` (:func:`mig_resource_names`); with 1
    replica it shares nothing, with more it time-slices each of them.
    """

    strategy: str
    replicas: int
    resource_name: str = f"{RESOURCE_DOMAIN}/gpu"
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    mig_strategy: str = NO_MIG
    mig_resources: tuple[str, ...] = ()

    @property
    def shared(self) -> bool:
        """Whether the plugin replicates devices: a sharing section, the replicas in the key."""
        if self.strategy == MIG:
            return self.replicas > 1
        return self.strategy != EXCLUSIVE


def render_config(config: SharingConfig) -> dict[str, Any]:
    """The config as a plain dict, validated; raise :class:`ConfigError` if it cannot work.

    ``failRequestsGreaterThanOne`` is always written out, as the caller resolved it: the
    plugin's default for an omitted value differs between strategies (false for time-slicing,
    true for MPS), and an explicit value says in the ConfigMap what is in force.
    """
    strategy = _checked_strategy(config.strategy)
    if strategy == MIG:
        return _render_mig(config)
    if config.mig_strategy != NO_MIG or config.mig_resources:
        if strategy == MPS:
            raise ConfigError(f"MPS cannot share MIG devices: NVIDIA: {_MPS_ON_MIG!r}")
        raise ConfigError(f"{strategy} has no MIG strategy or MIG resources; use strategy MIG")
    if strategy == EXCLUSIVE:
        if config.replicas != 1:
            raise ConfigError(f"Exclusive has 1 replica per GPU, not {config.replicas}")
        rendered: dict[str, Any] = {"version": VERSION, "flags": dict(_FLAGS)}
        validate_config(rendered)
        return rendered
    rendered = {
        "version": VERSION,
        "flags": dict(_FLAGS),
        "sharing": {_section(strategy): _sharing_body(config, (config.resource_name,))},
    }
    validate_config(rendered)
    return rendered


def _render_mig(config: SharingConfig) -> dict[str, Any]:
    _check_mig(config)
    rendered: dict[str, Any] = {"version": VERSION, "flags": {"migStrategy": config.mig_strategy}}
    if config.shared:
        body = _sharing_body(config, config.mig_resources)
        rendered["sharing"] = {_SECTIONS[TIME_SLICING]: body}
    validate_config(rendered)
    return rendered


def _sharing_body(config: SharingConfig, resources: Sequence[str]) -> dict[str, Any]:
    return {
        "renameByDefault": config.rename_by_default,
        "failRequestsGreaterThanOne": config.fail_requests_greater_than_one,
        "resources": [{"name": name, "replicas": config.replicas} for name in resources],
    }


def _check_mig(config: SharingConfig) -> None:
    """What a MIG config needs beyond the plugin's syntax, so one config has one text."""
    if config.mig_strategy not in (MIG_SINGLE, MIG_MIXED):
        raise ConfigError(
            f"MIG needs migStrategy {MIG_SINGLE} or {MIG_MIXED}, not {config.mig_strategy!r}"
        )
    if config.resource_name != _SINGLE_RESOURCES[0]:
        raise ConfigError("MIG advertises what its layout holds; resourceName does not apply")
    if not 1 <= config.replicas <= MAX_MIG_REPLICAS:
        raise ConfigError(
            f"MIG has 1 replica per MIG device, or 2 to {MAX_MIG_REPLICAS} to time-slice "
            f"each, not {config.replicas}"
        )
    if not config.shared and (config.rename_by_default or config.fail_requests_greater_than_one):
        raise ConfigError(
            "renameByDefault and failRequestsGreaterThanOne apply to time-sliced MIG "
            "devices only (replicas of at least 2)"
        )
    _check_mig_resources(config)


def _check_mig_resources(config: SharingConfig) -> None:
    resources = config.mig_resources
    if config.mig_strategy == MIG_SINGLE:
        if resources != _SINGLE_RESOURCES:
            raise ConfigError(
                f"MIG single advertises {_SINGLE_RESOURCES[0]} only, not {list(resources)}"
            )
        return
    if not resources and not config.shared:
        return  # an unshared mixed text names no resource: the layout decides them
    if not resources:
        raise ConfigError("time-sliced MIG mixed needs the layout's resources to replicate")
    if list(resources) != sorted(set(resources)):
        raise ConfigError(f"MIG resources must be distinct and sorted, not {list(resources)}")
    for name in resources:
        if not name.startswith(MIG_RESOURCE_PREFIX):
            raise ConfigError(
                f"MIG mixed advertises {MIG_RESOURCE_PREFIX}<profile> resources, not {name!r}"
            )
        _validate_resource_name(name, where="mig_resources")
        if name not in mig_resource_names(mig_strategy=MIG_MIXED, profiles=[_profile_of(name)]):
            raise ConfigError(f"mig_resources: {name!r} names no MIG profile")


def _profile_of(resource: str) -> str:
    """The profile a mixed-strategy resource is named after: the plugin's ``+`` -> ``.`` undone
    for the attributes NVML has (``me.all`` before ``me``, which it ends with)."""
    short = resource.removeprefix(MIG_RESOURCE_PREFIX)
    for attribute in sorted(migprofiles.ATTRIBUTES, key=len, reverse=True):
        if short.endswith(f".{attribute}"):
            return f"{short.removesuffix(f'.{attribute}')}+{attribute}"
    return short


def mig_resource_names(*, mig_strategy: str, profiles: Iterable[str]) -> tuple[str, ...]:
    """The resources the plugin advertises for a layout of ``profiles`` under ``mig_strategy``:
    what :attr:`SharingConfig.mig_resources` holds, in its order.

    Single needs one profile on every GPU (the plugin refuses mixed devices under single);
    mixed cannot advertise a compute-instance profile such as ``1c.2g.20gb``, so a layout that
    holds one would offer slots no pod can ask for.
    """
    try:
        parsed = [migprofiles.parse_profile(p) for p in profiles]
    except migprofiles.ProfileError as exc:
        raise ConfigError(str(exc)) from None
    if not parsed:
        raise ConfigError("a MIG layout holds at least one profile")
    if mig_strategy == MIG_SINGLE:
        if len({p.name for p in parsed}) != 1:
            raise ConfigError(
                f"MIG single needs one profile on every GPU, not {sorted({p.name for p in parsed})}"
            )
        return _SINGLE_RESOURCES
    if mig_strategy != MIG_MIXED:
        raise ConfigError(f"MIG strategy must be {MIG_SINGLE} or {MIG_MIXED}, not {mig_strategy!r}")
    if partial := sorted(p.name for p in parsed if not p.whole_instance):
        raise ConfigError(
            f"MIG mixed advertises no resource for compute-instance profiles {partial}: "
            "the device plugin skips them"
        )
    return tuple(sorted({(MIG_RESOURCE_PREFIX + p.name).replace("+", ".") for p in parsed}))


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
    if config["flags"]["migStrategy"] != NO_MIG:
        return _parse_mig(config)
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


def _parse_mig(config: Mapping[str, Any]) -> SharingConfig | None:
    """A MIG key's config; None for one we would not render (MPS on MIG, a resource list out
    of order, ``nvidia.com/gpu`` time-sliced under mixed: the plugin's, not ours)."""
    sharing = config.get("sharing") or {}
    body = sharing.get(_SECTIONS[TIME_SLICING]) or {}
    resources = tuple(str(r["name"]) for r in body.get("resources", ()))
    mig_strategy = config["flags"]["migStrategy"]
    replicas = {int(r["replicas"]) for r in body.get("resources", ())} or {1}
    if sharing.get(_SECTIONS[MPS]) is not None or len(replicas) != 1:
        return None
    parsed = SharingConfig(
        strategy=MIG,
        replicas=replicas.pop(),
        rename_by_default=bool(body.get("renameByDefault", False)),
        fail_requests_greater_than_one=bool(body.get("failRequestsGreaterThanOne", False)),
        mig_strategy=mig_strategy,
        mig_resources=_SINGLE_RESOURCES if mig_strategy == MIG_SINGLE else resources,
    )
    try:
        _check_mig(parsed)
    except ConfigError:
        return None
    if mig_strategy == MIG_SINGLE and body and resources != _SINGLE_RESOURCES:
        return None
    return parsed


def advertised_resource(config: SharingConfig) -> str:
    """The extended resource whose slots pods request on a node governed by ``config``.

    A MIG config under mixed may advertise several: :func:`advertised_resources` says which;
    this one raises :class:`ConfigError` rather than pick one of them.
    """
    if config.strategy == MIG:
        resources = advertised_resources(config)
        if len(resources) != 1:
            named = list(resources) or "the resources of its layout"
            raise ConfigError(
                f"a MIG {config.mig_strategy} config advertises {named}, not one resource; "
                "use advertised_resources"
            )
        return resources[0]
    if config.rename_by_default and config.shared:
        return config.resource_name + SHARED_SUFFIX
    return config.resource_name


def advertised_resources(config: SharingConfig) -> tuple[str, ...]:
    """Every extended resource whose slots pods request on a node governed by ``config``:
    one for whole GPUs, the MIG resources (renamed to ``<name>.shared`` if asked) for MIG."""
    if config.strategy != MIG:
        return (advertised_resource(config),)
    if config.rename_by_default and config.shared:
        return tuple(name + SHARED_SUFFIX for name in config.mig_resources)
    return config.mig_resources


def sharing_strategy_label(config: SharingConfig) -> str:
    """The value GPU Feature Discovery puts in ``nvidia.com/gpu.sharing-strategy`` once applied."""
    if _checked_strategy(config.strategy) == MIG:
        return _GFD_STRATEGIES[TIME_SLICING] if config.shared else _GFD_STRATEGIES[EXCLUSIVE]
    return _GFD_STRATEGIES[config.strategy]


def validate_config(config: Mapping[str, Any]) -> None:
    """Accept exactly the shape this module renders; raise :class:`ConfigError` otherwise."""
    _only_fields(config, allowed=("version", "flags", "sharing"), where="config")
    if config.get("version") != VERSION:
        raise ConfigError(f"config: version must be {VERSION!r}, not {config.get('version')!r}")
    _validate_flags(config.get("flags"))
    if config.get("sharing") is not None:
        _validate_sharing(config["sharing"])
        if config["flags"]["migStrategy"] != NO_MIG and config["sharing"].get("mps") is not None:
            raise ConfigError(
                f"sharing.mps with migStrategy {config['flags']['migStrategy']}: "
                f"NVIDIA: {_MPS_ON_MIG!r}"
            )


def _section(strategy: str) -> str:
    return _SECTIONS[_checked_strategy(strategy)]


def _checked_strategy(strategy: str) -> str:
    if strategy not in _KEY_TAGS:
        raise ConfigError(
            f"strategy {strategy!r} is not supported; use {TIME_SLICING}, {MPS}, {EXCLUSIVE} "
            f"or {MIG}"
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

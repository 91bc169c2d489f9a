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

Every text is checked against the plugin's own rules before it is used
(:func:`~gpushare_operator.core.deviceplugin.devschema.validate_config`, re-exported here).

An Exclusive policy renders without a sharing section: the same content as ``default``, under
a key of its own, so that moving a node between Exclusive and shared is a label change like any
other.

A MIG policy's key carries the plugin's MIG strategy (``flags.migStrategy``): ``single``
advertises every MIG device as ``nvidia.com/gpu``, ``mixed`` one resource per profile,
``nvidia.com/mig-<profile>`` (``internal/rm`` in the plugin: ``+`` becomes ``.``, and profiles
whose compute instance is smaller than its GPU instance are not advertised). With replicas, every
one of those resources is time-sliced (the plugin's README: time-slicing is supported on MIG
devices); MPS is not ("Sharing with MPS is currently not supported on devices with MIG enabled").
The layout itself is mig-parted's business (:mod:`~gpushare_operator.core.mig.migconfigs`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from gpushare_operator.core.deviceplugin import devschema
from gpushare_operator.core.deviceplugin.devschema import MAX_MPS_REPLICAS as MAX_MPS_REPLICAS
from gpushare_operator.core.deviceplugin.devschema import (
    MAX_RESOURCE_NAME_LENGTH as MAX_RESOURCE_NAME_LENGTH,
)
from gpushare_operator.core.deviceplugin.devschema import MIG_MIXED as MIG_MIXED
from gpushare_operator.core.deviceplugin.devschema import MIG_SINGLE as MIG_SINGLE
from gpushare_operator.core.deviceplugin.devschema import MIN_REPLICAS as MIN_REPLICAS
from gpushare_operator.core.deviceplugin.devschema import (
    MPS_ON_MIG,
    MPS_SECTION,
    TIME_SLICING_SECTION,
)
from gpushare_operator.core.deviceplugin.devschema import NO_MIG as NO_MIG
from gpushare_operator.core.deviceplugin.devschema import RESOURCE_DOMAIN as RESOURCE_DOMAIN
from gpushare_operator.core.deviceplugin.devschema import VERSION as VERSION
from gpushare_operator.core.deviceplugin.devschema import ConfigError as ConfigError
from gpushare_operator.core.deviceplugin.devschema import validate_config as validate_config
from gpushare_operator.core.hardware import migprofiles
from gpushare_operator.core.labelling.labels import label_value_prefix

DEFAULT_KEY: Final = "default"
TIME_SLICING: Final = "TimeSlicing"
MPS: Final = "MPS"
EXCLUSIVE: Final = "Exclusive"
MIG: Final = "MIG"
MAX_MIG_REPLICAS: Final = 64  # the policy API's bound for time-sliced MIG devices
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
SHARED_SUFFIX: Final = ".shared"
MAX_KEY_LENGTH: Final = 63  # the key is also a node label value
SHARING_STRATEGY_LABEL: Final = "nvidia.com/gpu.sharing-strategy"

_SECTIONS: Final = {TIME_SLICING: TIME_SLICING_SECTION, MPS: MPS_SECTION}
_KEY_TAGS: Final = {TIME_SLICING: "ts", MPS: "mps", EXCLUSIVE: "excl", MIG: "mig"}
_GFD_STRATEGIES: Final = {TIME_SLICING: "time-slicing", MPS: "mps", EXCLUSIVE: "none"}
_FLAGS: Final = {"migStrategy": NO_MIG}
_SINGLE_RESOURCES: Final = (f"{RESOURCE_DOMAIN}/gpu",)
_HASH_LENGTH: Final = 6


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
            raise ConfigError(f"MPS cannot share MIG devices: NVIDIA: {MPS_ON_MIG!r}")
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
        devschema.validate_resource_name(name, where="mig_resources")
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


def config_key(*, policy_name: str, config: SharingConfig, dra: bool = False) -> str:
    """The ConfigMap key for this policy and content: ``<policy>-<ts|mps><replicas>-<6 hex>``.

    The hash covers the rendered text, so any change of content is a change of key. The key is
    also a node-label value, so it is at most 63 characters: the policy part is cut to fit and
    trimmed to end on a letter or digit. Two long names that share their first ~50 characters
    get the same key only for identical content, which is harmless: the text is the same.
    """
    text = render_config_text(config)
    digest = hashlib.sha256(text.encode()).hexdigest()[:_HASH_LENGTH]
    tag = _KEY_TAGS[_checked_strategy(config.strategy)]
    if dra:
        # The same device-plugin text (what GFD reads there), but another key: a move between
        # backends changes every node's key, and so is a rollout like any other change.
        tag = f"dra{tag}"
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

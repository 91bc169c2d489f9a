"""A GPUSharingPolicy compiled once per (uid, generation): validated spec, matcher, config key.

Everything expensive about a policy (pydantic validation, selector compilation, rendering and
hashing its device-plugin config) happens here, once per spec generation.  Status-only updates
(our own writes) keep the generation, so they never recompile anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from gpushare_operator.core import drasharing
from gpushare_operator.core.api.models import (
    DRA_SHARING,
    DRA_SHARING_ALPHA,
    Backend,
    GPUSharingPolicySpec,
    SharingStrategy,
)
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.labelling import selectors
from gpushare_operator.core.mig.migpolicies import CompiledMig, compile_mig

# Why a DRA TimeSlicing or MPS policy is refused by an operator without --dra-sharing.
DRA_SHARING_DISABLED = "DRASharingDisabled"


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    name: str
    uid: str
    generation: int
    priority: int
    spec: GPUSharingPolicySpec | None
    selector: selectors.CompiledSelector | None
    sharing: devconfigs.SharingConfig | None
    config_key: str | None
    config_text: str | None
    error: str | None  # why the policy cannot be used; None when it is valid
    error_reason: str | None = None  # CamelCase reason for conditions and Events
    # While this generation is invalid, the earlier valid generation still in force (its
    # selector, priority and config are what the other fields hold); None otherwise.
    kept_generation: int | None = None
    # Strategy MIG: the layout per GPU model, and the reasons for the models it cannot fit.
    mig: CompiledMig | None = None
    # TimeSlicing or MPS under backend DRA (--dra-sharing): the GpuConfig its DeviceClass
    # carries for NVIDIA's driver, as ``drasharing.canonical`` text; None for any other policy.
    gpu_config: str | None = None

    @property
    def generation_in_force(self) -> int | None:
        """The generation whose spec the nodes get; None when none is usable."""
        if self.kept_generation is not None:
            return self.kept_generation
        return self.generation if self.error is None else None

    def applied_spec(self) -> dict[str, Any] | None:
        """The spec in force as the API would show it: recorded in the status, so that a new
        leader facing a broken spec can keep this one in force (``keep_recorded``)."""
        if self.spec is None or self.generation_in_force is None:
            return None
        return self.spec.model_dump(mode="json", exclude_none=True)

    @property
    def valid(self) -> bool:
        return self.error is None

    @property
    def usable(self) -> bool:
        """Whether it governs nodes: valid, or an earlier valid generation kept in force."""
        return self.error is None or self.kept_generation is not None

    @property
    def paused(self) -> bool:
        return self.spec is not None and self.spec.paused

    @property
    def strategy(self) -> SharingStrategy | None:
        return self.spec.strategy if self.spec is not None else None

    @property
    def resources(self) -> tuple[str, ...]:
        """The extended resources whose slots pods of this policy's nodes request: one, or for
        MIG mixed one per profile; () for a policy that never compiled."""
        if self.sharing is None:
            return ()
        if self.mig is not None:
            return tuple(dict.fromkeys(self.mig.resources[p] for p in self.mig.profiles))
        return (devconfigs.advertised_resource(self.sharing),)

    @property
    def dra(self) -> bool:
        """Whether NVIDIA's DRA kubelet plugin serves this policy's nodes (backend DRA)."""
        return self.spec is not None and self.spec.backend is Backend.DRA

    @property
    def replicas(self) -> int | None:
        """Slots per GPU (1 for Exclusive, and for sharing under DRA, where a device goes to
        one claim: ``core.drasharing``); None for a policy that never compiled."""
        if self.spec is None:
            return None
        return 1 if self.spec.dra_shared else self.spec.slots_per_gpu


def _validation_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "spec"
        parts.append(f"spec.{where}: {error['msg']}")
    return "; ".join(parts)


def keep_last_good(current: CompiledPolicy, update: CompiledPolicy) -> CompiledPolicy:
    """A broken update of a working policy: report the error, keep applying what worked.

    A spec that slips past admission (an older CRD, a hand-made object) must not undo a working
    configuration on every node of the policy; the nodes stay as they are until the spec is
    fixed or the policy deleted.  A policy that never worked has nothing to keep.
    """
    if update.valid or not current.usable or current.uid != update.uid:
        return update
    kept = current.kept_generation if current.kept_generation is not None else current.generation
    return dataclasses.replace(
        current,
        generation=update.generation,
        error=update.error,
        error_reason=update.error_reason,
        kept_generation=kept,
    )


def keep_recorded(
    update: CompiledPolicy, status: object, *, dra_sharing: bool = False
) -> CompiledPolicy:
    """A broken spec met for the first time (a new leader, a restart): keep the last good spec
    that the status recorded in force, rather than release every node of the policy."""
    if update.valid or not isinstance(status, Mapping):
        return update
    recorded = status.get("appliedSpec")
    if not isinstance(recorded, Mapping):
        return update
    generation, spec = recorded.get("generation"), recorded.get("spec")
    if not isinstance(generation, int) or not isinstance(spec, Mapping):
        return update
    if generation >= update.generation:
        return update
    kept = compile_policy(
        name=update.name, uid=update.uid, generation=generation, spec=spec, dra_sharing=dra_sharing
    )
    return keep_last_good(kept, update) if kept.valid else update


def _invalid(*, name: str, uid: str, generation: int, message: str, reason: str) -> CompiledPolicy:
    return CompiledPolicy(
        name=name,
        uid=uid,
        generation=generation,
        priority=0,
        spec=None,
        selector=None,
        sharing=None,
        config_key=None,
        config_text=None,
        error=message,
        error_reason=reason,
    )


def sharing_config(spec: GPUSharingPolicySpec) -> devconfigs.SharingConfig:
    if spec.dra_shared:
        # NVIDIA's DRA driver shares (GpuConfig on the DeviceClass); GPU Feature Discovery, the
        # one reader of the device-plugin text on a DRA node, is told each GPU is one slot,
        # and the resource is the one the policy's pods ask (``.shared`` if renamed).
        name = spec.resourceName + (devconfigs.SHARED_SUFFIX if spec.renameByDefault else "")
        return devconfigs.SharingConfig(
            strategy=str(SharingStrategy.EXCLUSIVE), replicas=1, resource_name=name
        )
    if spec.mig is not None:
        mig = spec.mig
        return devconfigs.SharingConfig(
            strategy=str(spec.strategy),
            replicas=mig.slots_per_device,
            fail_requests_greater_than_one=(
                spec.fail_requests_greater_than_one and mig.slots_per_device > 1
            ),
            mig_strategy=str(mig.strategy),
            mig_resources=devconfigs.mig_resource_names(
                mig_strategy=str(mig.strategy), profiles=mig.profiles
            ),
        )
    exclusive = spec.strategy is SharingStrategy.EXCLUSIVE
    return devconfigs.SharingConfig(
        strategy=str(spec.strategy),
        replicas=spec.slots_per_gpu,
        resource_name=spec.resourceName,
        rename_by_default=spec.renameByDefault and not exclusive,
        fail_requests_greater_than_one=spec.fail_requests_greater_than_one and not exclusive,
    )


def compile_policy(
    *,
    name: str,
    uid: str,
    generation: int,
    spec: Mapping[str, Any] | None,
    dra_sharing: bool = False,
) -> CompiledPolicy:
    """Validate and compile; an invalid policy compiles too, carrying its error for status.
    ``dra_sharing``: the operator runs with ``--dra-sharing`` (TimeSlicing and MPS accepted
    under backend DRA)."""
    raw = dict(spec or {})
    try:
        selector = selectors.compile_selector(raw.get("nodeSelector"))
    except selectors.SelectorError as exc:
        return _invalid(
            name=name, uid=uid, generation=generation, message=str(exc), reason="InvalidSelector"
        )
    # Admission refuses these; one that got past an older CRD governs nothing.
    if (problem := selectors.rewritten_label_error(selector)) is not None:
        return _invalid(
            name=name, uid=uid, generation=generation, message=problem, reason="InvalidSelector"
        )
    try:
        parsed = GPUSharingPolicySpec.model_validate(raw, context={DRA_SHARING: dra_sharing})
        sharing = sharing_config(parsed)
        text = devconfigs.render_config_text(sharing)
        key = devconfigs.config_key(
            policy_name=name, config=sharing, dra=parsed.backend is Backend.DRA
        )
        mig = None if parsed.mig is None else compile_mig(policy_name=name, spec=parsed.mig)
    except pydantic.ValidationError as exc:
        message = _validation_message(exc)
        if DRA_SHARING_ALPHA in message:
            return _invalid(
                name=name,
                uid=uid,
                generation=generation,
                message=message,
                reason=DRA_SHARING_DISABLED,
            )
        return _invalid(
            name=name, uid=uid, generation=generation, message=message, reason="InvalidSpec"
        )
    except devconfigs.ConfigError as exc:
        return _invalid(
            name=name, uid=uid, generation=generation, message=str(exc), reason="InvalidConfig"
        )
    return CompiledPolicy(
        name=name,
        uid=uid,
        generation=generation,
        priority=parsed.priority,
        spec=parsed,
        selector=selector,
        sharing=sharing,
        config_key=key,
        config_text=text,
        error=None,
        mig=mig,
        gpu_config=drasharing.canonical(drasharing.gpu_config(parsed)),
    )

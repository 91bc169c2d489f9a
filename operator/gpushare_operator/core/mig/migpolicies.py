"""A MIG policy compiled once per generation: its layout on every GPU model NVIDIA's tables know.

A policy's ``mig`` block says what every GPU gets; what that means depends on the GPU: a uniform
``profile: 1g.10gb`` is seven instances on an H100 and none on an H200 (which has no such
profile), and an explicit layout may fit one model's placements and not another's.  So every
model of ``core.hardware.miggeometry`` is tried once, here, when the policy compiles: the layouts
that
fit are rendered and named (``core.mig.migconfigs``), and each model that cannot hold the layout
keeps the reason, which a node of that model then reports as ``Unsupported``.  Per node nothing
is left to compute but a lookup by its base product.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpushare_operator.core.api.migspec import MigSpec, MigStrategy
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.mig.migconfigs import MigLayout


@dataclass(frozen=True, slots=True)
class CompiledMig:
    strategy: MigStrategy
    replicas: int  # slots per MIG device
    profiles: tuple[str, ...]
    # Base product -> the layout one GPU of that model gets, for every model where it fits.
    layouts: Mapping[str, MigLayout]
    # Base product -> the mig-parted config name of its layout (content-hashed).
    names: Mapping[str, str]
    # Base product -> why a GPU of that model cannot hold the layout.
    refusals: Mapping[str, str]
    # Profile -> the extended resource its MIG devices are advertised as.
    resources: Mapping[str, str]

    @property
    def entries(self) -> dict[str, MigLayout]:
        """Every config this policy needs in the mig-parted ConfigMap, by name."""
        return {self.names[product]: layout for product, layout in self.layouts.items()}

    def slots_per_gpu(self, product: str | None) -> dict[str, int]:
        """Resource -> the slots one GPU of ``product`` offers; {} where the layout does not fit."""
        layout = self.layouts.get(product or "")
        if layout is None:
            return {}
        slots: dict[str, int] = {}
        for profile, count in layout.devices:
            resource = self.resources[profile]
            slots[resource] = slots.get(resource, 0) + count * self.replicas
        return slots


def compile_mig(*, policy_name: str, spec: MigSpec) -> CompiledMig:
    """Try the layout on every GPU model of NVIDIA's tables; raise ``devconfigs.ConfigError``
    for a layout no device-plugin config can advertise."""
    strategy = spec.strategy
    resources = {
        profile: devconfigs.mig_resource_names(mig_strategy=str(strategy), profiles=[profile])[0]
        for profile in spec.profiles
    }
    layouts: dict[str, MigLayout] = {}
    refusals: dict[str, str] = {}
    for product in miggeometry.products():
        model = miggeometry.model(product)
        assert model is not None
        devices, problem = _devices_on(model, spec)
        if problem is not None or devices is None:
            refusals[product] = problem or f"{product} cannot hold the layout"
            continue
        layouts[product] = MigLayout.from_mapping(devices)
    names = {
        product: migconfigs.layout_name(policy_name=policy_name, layout=layout)
        for product, layout in layouts.items()
    }
    return CompiledMig(
        strategy=strategy,
        replicas=spec.slots_per_device,
        profiles=spec.profiles,
        layouts=layouts,
        names=names,
        refusals=refusals,
        resources=resources,
    )


def _devices_on(
    model: miggeometry.GpuModel, spec: MigSpec
) -> tuple[dict[str, int] | None, str | None]:
    explicit = spec.explicit_devices()
    if explicit is None:
        assert spec.profile is not None
        devices = miggeometry.uniform(model, spec.profile)
        if devices is None:
            known = ", ".join(model.profiles)
            return None, f"{model.product} has no MIG profile {spec.profile} (it has {known})"
        return devices, None
    problem = miggeometry.layout_error(model, explicit)
    if problem is not None:
        return None, f"{model.product} cannot hold {miggeometry.describe(explicit)}: {problem}"
    return dict(explicit), None

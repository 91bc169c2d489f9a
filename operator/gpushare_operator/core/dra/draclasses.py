"""Backend DRA's DeviceClasses: the classes that keep ``nvidia.com/gpu`` (and, for MIG pools,
``nvidia.com/mig-<profile>``) requests working on DRA nodes, and what says whose a class is.

A class selects the ``gpu.nvidia.com`` devices that serve one resource and names that resource
as its ``extendedResourceName`` (KEP 5004), so the scheduler serves classic requests through it
on nodes whose allocatable for the resource is 0.  An extended resource name lives on one class
only (the API server picks the one created later), so a class of another's for a resource of
ours is a conflict, said in a condition.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpushare_operator.core import drasharing
from gpushare_operator.core.conditions import Cond
from gpushare_operator.core.dra.driver import DRIVER, GPU_TYPE, MIG_TYPE, Readiness, mig_profile

DEVICE_CLASS_API: Final = "resource.k8s.io/v1"
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGER: Final = "gpushare-operator"
CLASS_DOMAIN: Final = "gpushare.dev"


@dataclass(frozen=True, slots=True)
class ClassRecord:
    """A DeviceClass, slim: what says whose it is and which extended resource it serves."""

    name: str
    extended_resource: str | None
    ours: bool
    owners: tuple[str, ...] = ()  # the uids its ownerReferences name, sorted
    expressions: tuple[str, ...] = ()  # its selectors' CEL
    # Its ``spec.config`` for our driver, as ``drasharing.canonical`` text of the GpuConfig
    # (None: none); any other config (another driver's, more than one) as its whole text.
    config: str | None = None


def class_record(obj: Mapping[str, Any]) -> ClassRecord:
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    extended = spec.get("extendedResourceName")
    return ClassRecord(
        name=str(metadata.get("name")),
        extended_resource=extended if isinstance(extended, str) else None,
        ours=(metadata.get("labels") or {}).get(MANAGED_BY) == MANAGER,
        owners=tuple(sorted(str(r.get("uid")) for r in metadata.get("ownerReferences") or ())),
        expressions=tuple(
            str((s.get("cel") or {}).get("expression")) for s in spec.get("selectors") or ()
        ),
        config=_config(spec.get("config")),
    )


def _config(config: object) -> str | None:
    """What a class's ``spec.config`` configures, comparable with a policy's ``gpu_config``."""
    if not config:
        return None
    if isinstance(config, list) and len(config) == 1 and isinstance(config[0], Mapping):
        opaque = config[0].get("opaque") or {}
        if isinstance(opaque, Mapping) and opaque.get("driver") == DRIVER:
            return drasharing.canonical(opaque.get("parameters"))
    return json.dumps(config, sort_keys=True)


def class_name(resource: str) -> str:
    """The DeviceClass serving ``resource``: ``gpu.gpushare.dev`` for ``nvidia.com/gpu``."""
    last = resource.rsplit("/", 1)[-1]
    return f"{re.sub(r'[^a-z0-9-]', '-', last.lower()).strip('-')}.{CLASS_DOMAIN}"


@dataclass(frozen=True, slots=True)
class Owner:
    """A policy a DeviceClass belongs to (garbage-collected with the last of them)."""

    name: str
    uid: str


def selector(resource: str) -> str:
    """The CEL that picks what serves ``resource``: that profile's MIG devices for an
    ``nvidia.com/mig-<profile>``, full GPUs for any other (``nvidia.com/gpu``)."""
    attributes = f"device.attributes['{DRIVER}']"
    profile = mig_profile(resource)
    if profile is not None:
        return (
            f"device.driver == '{DRIVER}' && {attributes}.type == '{MIG_TYPE}'"
            f" && {attributes}.profile == '{profile}'"
        )
    return f"device.driver == '{DRIVER}' && {attributes}.type == '{GPU_TYPE}'"


def device_class(
    resource: str, owners: Iterable[Owner], *, api_version: str, config: str | None = None
) -> dict[str, Any]:
    """The class for ``resource``: the ``gpu.nvidia.com`` devices that serve it (``selector``),
    the classic ``resource`` requests served through it (KEP 5004), and for a sharing policy
    (``--dra-sharing``) the driver's GpuConfig (``config``, ``drasharing.canonical`` text)."""
    refs = [
        {"apiVersion": api_version, "kind": "GPUSharingPolicy", "name": o.name, "uid": o.uid}
        for o in sorted(owners, key=lambda o: o.name)
    ]
    expression = selector(resource)
    return {
        "apiVersion": DEVICE_CLASS_API,
        "kind": "DeviceClass",
        "metadata": {
            "name": class_name(resource),
            "labels": {MANAGED_BY: MANAGER},
            "ownerReferences": refs,
        },
        "spec": {
            "selectors": [{"cel": {"expression": expression}}],
            "extendedResourceName": resource,
            **(
                {}
                if config is None
                else {"config": [{"opaque": {"driver": DRIVER, "parameters": json.loads(config)}}]}
            ),
        },
    }


def conflicts(resource: str, classes: Iterable[ClassRecord]) -> list[str]:
    """Classes not ours that serve ``resource`` too: the API server picks the one created later,
    so which one a pod gets would be chance.  Named, for a condition."""
    return sorted(c.name for c in classes if not c.ours and c.extended_resource == resource)


def config_conflict(resource: str, *, held: str | None, wanted: str | None) -> str:
    """Why a DRA policy's nodes wait: our class for ``resource`` carries another DRA policy's
    config (``held``), and a class's config applies to every device it selects."""
    return (
        f"DeviceClass {class_name(resource)} serves {resource} with"
        f" {drasharing.describe(held)}, as another DRA policy serving {resource} has it, and this"
        f" policy wants {drasharing.describe(wanted)}: a class's config applies to every device"
        f" it selects, so DRA policies serving one resource must share alike; give this one a"
        " resource of its own (renameByDefault or resourceName)"
    )


def pick_config(configs: Iterable[tuple[str, str | None]], *, held: str | None) -> str | None:
    """The config a class serving several DRA policies carries, given ``(policy name, its
    config)`` pairs: the one the class already carries if one of them wants it (a new leader
    keeps it), else the first policy's by name.  The others' nodes wait (``config_conflict``)."""
    ordered = sorted(configs, key=lambda c: c[0])
    if any(c == held for _, c in ordered):
        return held
    return ordered[0][1] if ordered else None


def classes_named(resources: Iterable[str]) -> str:
    """``gpu.gpushare.dev (nvidia.com/gpu)``, joined: the classes of ``resources``, for a
    message."""
    return ", ".join(f"{class_name(r)} ({r})" for r in resources)


def class_condition(resources: tuple[str, ...], ready: Readiness) -> Cond:
    """A DRA policy's ``DeviceClassReady`` condition: its classes (one per resource it
    advertises) written, one missing, or in conflict with a class gpushare did not write."""
    named = classes_named(resources)
    if ready.conflict is not None:
        return Cond("DeviceClassReady", "False", "DeviceClassConflict", ready.conflict)
    if not ready.class_ready:
        message = f"DeviceClass(es) {named} not written yet"
        return Cond("DeviceClassReady", "False", "DeviceClassNotWritten", message)
    message = f"DeviceClass(es) {named} serve the policy's DRA nodes"
    return Cond("DeviceClassReady", "True", "DeviceClassWritten", message)

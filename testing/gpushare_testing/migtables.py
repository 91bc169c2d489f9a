"""NVIDIA's MIG geometry as the simulated GPUs obey it, and the simulator's own fitter.

The data (which profiles a GPU model has, their memory, instance counts and placements) is
NVIDIA's, exported once into the operator's package data (``gpushare_operator.core``,
``migtables.json``: go-nvml's mock tables checked against the MIG User Guide).  Only that DATA
is shared with the operator: the fitter below is written separately from the operator's, so
that a bug in the operator's geometry code is not also the simulator's.

A layout fits a GPU when every GPU instance it asks for can be given one of its profile's
placements (a start and a size in memory slices) with no two overlapping, and no profile is
asked for more often than its instance count.  That is what NVML checks when mig-parted
creates the GPU instances (``nvmlDeviceCreateGpuInstanceWithPlacement`` fails with
"Insufficient Resources" otherwise).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GpuModel", "MigProfileInfo", "fits", "load_tables", "models_from"]

_PACKAGE = "gpushare_operator.core.hardware"
_FILE = "migtables.json"


@dataclass(frozen=True, slots=True)
class MigProfileInfo:
    """One GPU-instance profile of one model, as NVML describes it."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    instances: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices
    extra: Mapping[str, int]  # any further NVML attribute the export carries (engines, SMs)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A MIG-capable GPU model: its whole memory and slices, and its profiles by name."""

    product: str
    memory_mib: int
    compute_slices: int
    memory_slices: int
    profiles: Mapping[str, MigProfileInfo]


def models_from(data: Mapping[str, Any]) -> dict[str, GpuModel]:
    """The models of an export (``{"models": {product: {...}}}``), keyed by GFD product name."""
    return {product: _model(product, raw) for product, raw in data["models"].items()}


def _model(product: str, raw: Mapping[str, Any]) -> GpuModel:
    profiles = {name: _profile(name, p) for name, p in raw["profiles"].items()}
    return GpuModel(
        product=product,
        memory_mib=int(raw["memoryMiB"]),
        compute_slices=int(raw["computeSlices"]),
        memory_slices=int(raw["memorySlices"]),
        profiles=profiles,
    )


_KNOWN = {"computeSlices", "memorySlices", "memoryMiB", "instances", "placements"}


def _profile(name: str, raw: Mapping[str, Any]) -> MigProfileInfo:
    placements = tuple((int(p["start"]), int(p["size"])) for p in raw["placements"])
    extra = {k: int(v) for k, v in raw.items() if k not in _KNOWN and isinstance(v, int)}
    return MigProfileInfo(
        name=name,
        compute_slices=int(raw["computeSlices"]),
        memory_slices=int(raw["memorySlices"]),
        memory_mib=int(raw["memoryMiB"]),
        instances=int(raw["instances"]),
        placements=placements,
        extra=extra,
    )


@functools.cache
def load_tables() -> Mapping[str, GpuModel]:
    """NVIDIA's tables from the operator's package data (read once per process)."""
    text = importlib.resources.files(_PACKAGE).joinpath(_FILE).read_text(encoding="utf-8")
    return models_from(json.loads(text))


def fits(model: GpuModel, devices: Mapping[str, int]) -> bool:
    """Whether one GPU of ``model`` can hold ``devices`` (profile name -> count) at once.

    A profile the model does not have never fits.  The search places the largest instances
    first and tries every placement of each: at most seven instances of eight-slot GPUs, so an
    exhaustive search is cheap, and it cannot miss a packing a greedy choice would.
    """
    wanted: list[MigProfileInfo] = []
    for name, count in devices.items():
        if count <= 0:
            continue
        profile = model.profiles.get(name)
        if profile is None or count > profile.instances:
            return False
        wanted += [profile] * count
    wanted.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    compute = sum(p.compute_slices for p in wanted)
    if compute > model.compute_slices:
        return False
    return _place(wanted, used=frozenset())


def _place(wanted: list[MigProfileInfo], *, used: frozenset[int]) -> bool:
    if not wanted:
        return True
    first, rest = wanted[0], wanted[1:]
    for start, size in first.placements:
        slots = frozenset(range(start, start + size))
        if slots & used:
            continue
        if _place(rest, used=used | slots):
            return True
    return False

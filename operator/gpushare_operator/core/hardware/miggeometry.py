"""MIG geometry: which GPU-instance profiles a GPU model has, and whether a layout fits one GPU.

A MIG layout (``{"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}``) is applied per GPU by NVIDIA's MIG
manager; a layout the GPU cannot hold fails there, on the node, after gpushare has drained it.
So the operator refuses such a layout first, from the same geometry NVML enforces: a GPU has
memory slices (8, the A30 4) and compute slices (7, the A30 4); each GPU-instance profile takes a
fixed number of each and may start only at the offsets NVML lists for it (its *placements*, on
the memory-slice axis), and no more than its instance count of it may exist. A layout fits when
every GPU instance of it can be given one of its placements without two overlapping; that is an
exact search here, not a sum of slices, because sums accept layouts NVML refuses (an H100 has 8
memory slices and four 1g.20gb take 8, but a 1g.10gb more still sums to only 5 compute slices).

The tables are package data (``migtables.json``): go-nvml's mock GPU tables as exported by
``make mig-tables``, corrected where NVIDIA's MIG User Guide disagrees, each correction listed
in the file with its source (docs/mig-geometry.md). They are read once, on first use.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any, Final

_DATA_PACKAGE: Final = "gpushare_operator.core.hardware"
_DATA_FILE: Final = "migtables.json"
_CACHE_SIZE: Final = 4096


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a GPU instance may sit: ``size`` memory slices from ``start`` (NVML's terms)."""

    start: int
    size: int

    @property
    def mask(self) -> int:
        """The memory slices it occupies, one bit per slice."""
        return ((1 << self.size) - 1) << self.start


@dataclass(frozen=True, slots=True)
class Profile:
    """A GPU-instance profile under mig-parted's name (``1g.10gb``, ``1g.10gb+me``)."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    instances: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model, keyed by GFD's ``nvidia.com/gpu.product`` of the whole GPU."""

    product: str
    memory_mib: int
    profiles: Mapping[str, Profile]
    compute_slices: int
    memory_slices: int
    nvml_name: str

    def __hash__(self) -> int:
        # The profiles mapping is not hashable; product and memory tell models apart, and
        # equality still compares every field. Hashable so that fits are memoized per model.
        return hash((self.product, self.memory_mib))


def products() -> tuple[str, ...]:
    """The GFD product values the tables know, sorted."""
    return tuple(sorted(_tables()))


def model(product: str | None) -> GpuModel | None:
    """The model whose whole-GPU ``nvidia.com/gpu.product`` is ``product``; None if unknown.

    The value must be the base product (``NVIDIA-H100-80GB-HBM3``): under the single MIG
    strategy GFD rewrites the label (``NVIDIA-H100-80GB-HBM3-MIG-1g.10gb``), and that rewritten
    value names no model here.
    """
    if product is None:
        return None
    return _tables().get(product)


def layout_error(model: GpuModel, devices: Mapping[str, int]) -> str | None:
    """Why one GPU of ``model`` cannot hold the layout ``devices``; None when it can.

    ``devices`` counts GPU instances per profile name, per GPU (mig-parted's ``mig-devices``).
    Counts of 0 are ignored; an empty layout fits (MIG enabled, no instances).
    """
    return _layout_error(model, _layout_key(devices))


def arrangement(
    model: GpuModel, devices: Mapping[str, int]
) -> tuple[tuple[str, Placement], ...] | None:
    """One concrete placement of every GPU instance of the layout, or None when there is none.

    Sorted by start; what a simulated MIG manager creates, and the proof behind
    :func:`layout_error` saying a layout fits.
    """
    layout = _layout_key(devices)
    if _count_error(model, layout) is not None:
        return None
    return _arrangement(model, layout)


def uniform(model: GpuModel, profile: str) -> dict[str, int] | None:
    """As many GPU instances of ``profile`` as fit one GPU (NVIDIA's ``all-1g.10gb``).

    None when the model has no such profile.
    """
    found = model.profiles.get(profile)
    if found is None:
        return None
    for count in range(found.instances, 0, -1):
        if _layout_error(model, ((profile, count),)) is None:
            return {profile: count}
    return None


def describe(devices: Mapping[str, int]) -> str:
    """A layout as people write it: ``1x 3g.40gb + 2x 1g.10gb`` (largest first)."""
    layout = _layout_key(devices)
    if not layout:
        return "no GPU instances"
    return " + ".join(f"{count}x {name}" for name, count in layout)


Layout = tuple[tuple[str, int], ...]


def _layout_key(devices: Mapping[str, int]) -> Layout:
    """The layout in one canonical, hashable order (the memo key); zero counts dropped."""
    items = [(name, count) for name, count in devices.items() if count != 0]
    return tuple(sorted(items, key=lambda item: (_slices_hint(item[0]), item[0])))


def _slices_hint(name: str) -> int:
    """Larger profiles first in descriptions: minus the compute slices in the name, if any."""
    head = name.split("g.", 1)[0]
    return -int(head) if head.isdigit() else 0


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _layout_error(model: GpuModel, layout: Layout) -> str | None:
    counted = _count_error(model, layout)
    if counted is not None:
        return counted
    if _arrangement(model, layout) is None:
        return (
            f"{describe(dict(layout))} cannot all be placed on one {model.product} without "
            f"overlapping: each profile may start only at NVML's placements on the GPU's "
            f"{model.memory_slices} memory slices"
        )
    return None


def _count_error(model: GpuModel, layout: Layout) -> str | None:
    """The reasons a layout fails before any placing: names, signs, instance counts, sums."""
    for name, count in layout:
        if count < 0:
            return f"the count of {name} is {count}; counts of GPU instances cannot be negative"
        profile = model.profiles.get(name)
        if profile is None:
            known = ", ".join(sorted(model.profiles))
            return f"{model.product} has no MIG profile {name} (it has {known})"
        if count > profile.instances:
            return (
                f"{model.product} holds at most {profile.instances} GPU instance(s) of "
                f"{name}, the layout asks for {count}"
            )
    compute = sum(model.profiles[name].compute_slices * count for name, count in layout)
    if compute > model.compute_slices:
        return (
            f"{describe(dict(layout))} needs {compute} compute slices, "
            f"{model.product} has {model.compute_slices}"
        )
    memory = sum(model.profiles[name].memory_slices * count for name, count in layout)
    if memory > model.memory_slices:
        return (
            f"{describe(dict(layout))} needs {memory} memory slices, "
            f"{model.product} has {model.memory_slices}"
        )
    return None


def _arrangement(model: GpuModel, layout: Layout) -> tuple[tuple[str, Placement], ...] | None:
    """Backtracking over placements, the most constrained instances first.

    At most 7 instances with at most 8 placements each; instances of one profile take their
    placements in increasing order, so no arrangement is tried twice in another order.
    """
    instances = [
        model.profiles[name]
        for name, count in sorted(
            layout,
            key=lambda item: (
                -model.profiles[item[0]].memory_slices,
                len(model.profiles[item[0]].placements),
                item[0],
            ),
        )
        for _ in range(count)
    ]
    chosen: list[tuple[str, Placement]] = []

    def place(index: int, used: int, floor: int) -> bool:
        if index == len(instances):
            return True
        profile = instances[index]
        for position, placement in enumerate(profile.placements):
            if position < floor or used & placement.mask:
                continue
            chosen.append((profile.name, placement))
            same_next = index + 1 < len(instances) and instances[index + 1] is profile
            if place(index + 1, used | placement.mask, position + 1 if same_next else 0):
                return True
            chosen.pop()
        return False

    if not place(0, 0, 0):
        return None
    return tuple(sorted(chosen, key=lambda item: (item[1].start, item[0])))


@functools.cache
def _tables() -> Mapping[str, GpuModel]:
    text = resources.files(_DATA_PACKAGE).joinpath(_DATA_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    return MappingProxyType(
        {product: _parse_model(product, raw) for product, raw in data["models"].items()}
    )


def _parse_model(product: str, raw: Mapping[str, Any]) -> GpuModel:
    memory_slices = int(raw["memorySlices"])
    profiles = {
        name: _parse_profile(product, name, memory_slices, body)
        for name, body in raw["profiles"].items()
    }
    return GpuModel(
        product=product,
        memory_mib=int(raw["memoryMiB"]),
        profiles=MappingProxyType(profiles),
        compute_slices=int(raw["computeSlices"]),
        memory_slices=memory_slices,
        nvml_name=str(raw["nvmlName"]),
    )


def _parse_profile(product: str, name: str, memory_slices: int, body: Mapping[str, Any]) -> Profile:
    profile = Profile(
        name=name,
        compute_slices=int(body["computeSlices"]),
        memory_slices=int(body["memorySlices"]),
        memory_mib=int(body["memoryMiB"]),
        instances=int(body["instances"]),
        placements=tuple(Placement(int(p["start"]), int(p["size"])) for p in body["placements"]),
    )
    _check_placements(product, profile, memory_slices)
    return profile


def _check_placements(product: str, profile: Profile, memory_slices: int) -> None:
    """Bad package data fails loudly at load, not as a wrong answer about a node."""
    bad = [
        p
        for p in profile.placements
        if p.size != profile.memory_slices or p.start < 0 or p.start + p.size > memory_slices
    ]
    if not profile.placements or bad:
        raise ValueError(f"{_DATA_FILE}: {product} {profile.name}: bad placements")

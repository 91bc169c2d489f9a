"""MIG profile names (``1g.10gb``, ``1c.2g.20gb``, ``1g.10gb+me``): parsing and validation.

A profile name is what mig-parted's config (``mig-devices``) counts and what the device plugin's
mixed strategy turns into a resource name, so one misspelling is a layout the MIG manager fails
or a resource no pod can request. The syntax is NVIDIA's (mig-parted ``pkg/types``, go-nvlib
``pkg/nvlib/device/mig_profile.go``): ``<g>g.<mem>gb`` for a GPU instance of ``g`` slices with
one compute instance of the same size, ``<c>c.<g>g.<mem>gb`` for a compute instance of ``c``
slices within it, then optionally ``+<attribute>`` or ``-<attribute>``.

:func:`parse_profile` is stricter than NVIDIA's parser in three ways, each so that one layout has
one spelling (the names are hashed into config names): numbers without sign or leading zeros
(NVIDIA's ``strconv.Atoi`` reads ``+1g`` and ``01g``), the short form whenever compute and GPU
slices are equal (NVIDIA's own ``String()`` writes it so), and only the attributes NVML has
profiles for (``me``, ``me.all``, ``gfx``, and ``-me``), one at most: NVIDIA's parser accepts any
well-formed word, and the MIG manager fails on a GPU later, where nothing tells the user why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# NVML's GPU and compute instance profile sizes: there are no 5-slice profiles.
SLICE_COUNTS: Final = (1, 2, 3, 4, 6, 7, 8)
ATTRIBUTES: Final = ("me", "me.all", "gfx")
NEGATIVE_ATTRIBUTES: Final = ("me",)

_NUMBER = r"(0|[1-9][0-9]*)"
_SHAPE: Final = re.compile(
    rf"(?:(?P<c>{_NUMBER})c\.)?(?P<g>{_NUMBER})g\.(?P<gb>{_NUMBER})gb"
    r"(?:(?P<sign>[-+])(?P<attr>[a-z][.a-z0-9]*))?"
)


class ProfileError(ValueError):
    """A MIG profile name that mig-parted would refuse, or that has a canonical spelling."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MigProfile:
    """One MIG profile: ``compute`` of ``gpu`` slices, ``memory_gb`` of memory, an attribute."""

    compute: int
    gpu: int
    memory_gb: int
    attribute: str = ""  # "" or one of ATTRIBUTES
    without: str = ""  # "" or one of NEGATIVE_ATTRIBUTES (the ``-me`` profiles)

    @property
    def name(self) -> str:
        """The canonical spelling, as NVIDIA's ``String()`` writes it."""
        base = f"{self.gpu}g.{self.memory_gb}gb"
        if self.compute != self.gpu:
            base = f"{self.compute}c.{base}"
        if self.attribute:
            return f"{base}+{self.attribute}"
        return f"{base}-{self.without}" if self.without else base

    @property
    def whole_instance(self) -> bool:
        """One compute instance spans the GPU instance: the device plugin advertises only these
        under the mixed strategy (``internal/rm``: profiles with ``C != G`` are skipped)."""
        return self.compute == self.gpu

    @property
    def sort_key(self) -> tuple[int, int, int, str]:
        """Largest first, as mig-parted orders the instances it creates; then by name."""
        return (-self.gpu, -self.compute, -self.memory_gb, self.name)


def parse_profile(name: str) -> MigProfile:
    """The profile ``name`` spells; raise :class:`ProfileError` saying why it is not one."""
    if not isinstance(name, str) or not name:
        raise ProfileError(f"MIG profile {name!r} must be a non-empty string like '1g.10gb'")
    found = _SHAPE.fullmatch(name)
    if found is None:
        raise ProfileError(
            f"MIG profile {name!r} must look like <g>g.<memory>gb or <c>c.<g>g.<memory>gb, "
            "optionally with +me, +me.all, +gfx or -me (e.g. '1g.10gb', '1c.2g.20gb')"
        )
    gpu = int(found["g"])
    compute = int(found["c"]) if found["c"] is not None else gpu
    profile = MigProfile(
        compute=compute,
        gpu=gpu,
        memory_gb=int(found["gb"]),
        attribute=found["attr"] if found["sign"] == "+" else "",
        without=found["attr"] if found["sign"] == "-" else "",
    )
    _check_numbers(name, profile)
    _check_attribute(name, sign=found["sign"], attribute=found["attr"])
    if profile.name != name:
        raise ProfileError(f"MIG profile {name!r} is written {profile.name!r}")
    return profile


def profile_error(name: str) -> str | None:
    """Say why ``name`` is not a MIG profile name, or ``None`` if it is."""
    try:
        parse_profile(name)
    except ProfileError as exc:
        return str(exc)
    return None


def _check_numbers(name: str, profile: MigProfile) -> None:
    for what, count in (("GPU instance", profile.gpu), ("compute instance", profile.compute)):
        if count not in SLICE_COUNTS:
            raise ProfileError(
                f"MIG profile {name!r}: a {what} has "
                f"{', '.join(map(str, SLICE_COUNTS))} slices, not {count}"
            )
    if profile.compute > profile.gpu:
        raise ProfileError(
            f"MIG profile {name!r}: a compute instance of {profile.compute} slices does not fit "
            f"in a GPU instance of {profile.gpu}"
        )
    if profile.memory_gb < 1:
        raise ProfileError(f"MIG profile {name!r}: memory must be at least 1gb")


def _check_attribute(name: str, *, sign: str | None, attribute: str | None) -> None:
    if sign is None or attribute is None:
        return
    known = ATTRIBUTES if sign == "+" else NEGATIVE_ATTRIBUTES
    if attribute not in known:
        raise ProfileError(
            f"MIG profile {name!r}: NVIDIA GPUs have no profile with {sign}{attribute}; "
            f"known: {', '.join('+' + a for a in ATTRIBUTES)}, "
            f"{', '.join('-' + a for a in NEGATIVE_ATTRIBUTES)}"
        )

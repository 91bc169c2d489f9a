"""The ``mig`` block of a GPUSharingPolicy: which MIG layout every GPU of its nodes gets.

A layout is a set of GPU instances per GPU, named by mig-parted's profile names (NVIDIA/mig-parted
``pkg/types``: ``<slices>g.<GB>gb``, ``+me`` for the media-extension variant).  Each instance gets
one compute instance spanning it, which is what mig-parted does for a ``<g>g.<gb>gb`` profile;
compute-instance profiles (``1c.3g.40gb``) are not offered.  Whether a layout fits a GPU depends
on the GPU model and is decided per node from NVIDIA's tables (``core.hardware.miggeometry``): here
only
the shape is checked, so that admission can refuse it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Final, Self

from pydantic import Field, StrictInt, model_validator
from pydantic.json_schema import WithJsonSchema

from gpushare_operator.core.api.modelbase import ApiModel

# GPU-instance slice sizes NVML has (GPU_INSTANCE_PROFILE_<n>_SLICE): 1, 2, 3, 4, 6, 7, 8.
MIG_PROFILE_PATTERN: Final = "[1234678]g[.][1-9][0-9]{0,3}gb([+]me)?"
MIG_PROFILE_MAX_LENGTH: Final = 12
# A GPU holds at most 7 GPU instances (7 compute slices), and no model has more than 16 profiles.
MAX_INSTANCES: Final = 7
MAX_PROFILES: Final = 16
MIN_MIG_REPLICAS: Final = 2
MAX_MIG_REPLICAS: Final = 64

# Under single, GPU Feature Discovery rewrites the node's GPU count and product to the MIG
# devices'; the physical count is read back as count / devices per GPU, which only the uniform
# layout of one profile (the same on every GPU of a model) makes exact.
SINGLE_NEEDS_PROFILE: Final = (
    "mig: migStrategy single advertises every MIG device as nvidia.com/gpu, so it needs the"
    " one-profile layout (mig.profile); use mixed with mig.devices"
)

MigProfileName = Annotated[
    str,
    Field(pattern=f"^{MIG_PROFILE_PATTERN}$", max_length=MIG_PROFILE_MAX_LENGTH),
]
InstanceCount = Annotated[StrictInt, Field(ge=1, le=MAX_INSTANCES)]


class MigStrategy(enum.StrEnum):
    """How the device plugin advertises MIG devices (its ``flags.migStrategy``)."""

    # Every MIG device as nvidia.com/gpu: one profile on every GPU of the node.
    SINGLE = "single"
    # Each profile as its own resource, nvidia.com/mig-<profile>.
    MIXED = "mixed"


class MigSpec(ApiModel):
    """The MIG layout of every GPU of the policy's nodes, and how it is advertised."""

    profile: MigProfileName | None = None
    """One profile on every GPU, as many instances as fit (NVIDIA's all-<profile> layouts),
    e.g. 1g.10gb. Exactly one of profile and devices."""
    devices: (
        Annotated[
            dict[MigProfileName, InstanceCount],
            Field(min_length=1, max_length=MAX_PROFILES),
            WithJsonSchema(
                {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": MAX_PROFILES,
                    "additionalProperties": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_INSTANCES,
                    },
                }
            ),
        ]
        | None
    ) = None
    """Instances per profile on every GPU, e.g. {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}.
    Exactly one of profile and devices."""
    migStrategy: MigStrategy | None = None
    """single: every MIG device as nvidia.com/gpu (with profile only); mixed: each profile as
    nvidia.com/mig-<profile>. Unset: single for profile, mixed for devices."""
    replicas: Annotated[StrictInt, Field(ge=MIN_MIG_REPLICAS, le=MAX_MIG_REPLICAS)] | None = None
    """Time-slice every MIG device into this many slots (2 to 64); unset: one slot each."""

    @model_validator(mode="after")
    def _one_layout(self) -> Self:
        if (self.profile is None) == (self.devices is None):
            raise ValueError("mig: exactly one of profile and devices must be set")
        if self.migStrategy is MigStrategy.SINGLE and self.profile is None:
            raise ValueError(SINGLE_NEEDS_PROFILE)
        return self

    @property
    def profiles(self) -> tuple[str, ...]:
        """The layout's profiles, sorted."""
        if self.profile is not None:
            return (self.profile,)
        return tuple(sorted(self.devices or {}))

    @property
    def strategy(self) -> MigStrategy:
        """What is in force: the spec's migStrategy, else single for profile, mixed for
        devices."""
        if self.migStrategy is not None:
            return self.migStrategy
        return MigStrategy.SINGLE if self.profile is not None else MigStrategy.MIXED

    @property
    def slots_per_device(self) -> int:
        return self.replicas or 1

    def explicit_devices(self) -> Mapping[str, int] | None:
        """The counts per GPU when the spec gives them; None for a one-profile layout, whose
        count depends on the GPU model."""
        return dict(self.devices) if self.devices is not None else None

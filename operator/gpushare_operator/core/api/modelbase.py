"""The base of every API model, spec and status alike (its own module so that the parts of the
API in other modules, such as ``migspec``, can share it without importing ``models``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ApiModel(BaseModel):
    """The base of every API model, spec and status alike."""

    # Frozen: records are shared between caches and snapshots, never copied (docs/architecture.md).
    # Unknown fields are ignored, not refused: the apiserver prunes them anyway, and a newer CRD
    # must not make an older operator fail on fields it does not know yet.
    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

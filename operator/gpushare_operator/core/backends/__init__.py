"""The three backends that change a GPU node, behind one seam (``base.Backend``): the device
plugin's config (``deviceplugin``), the MIG manager's layout (``mig``) and NVIDIA's DRA kubelet
plugin (``dra``).  ``of`` says which governs a policy's nodes; the rest of the package asks it.
"""

from __future__ import annotations

from gpushare_operator.core.api.models import MIG_IDLE
from gpushare_operator.core.backends.base import Backend as Backend
from gpushare_operator.core.backends.base import Check as Check
from gpushare_operator.core.backends.base import Layouts as Layouts
from gpushare_operator.core.backends.base import Rendered as Rendered
from gpushare_operator.core.backends.deviceplugin import DEVICE_PLUGIN
from gpushare_operator.core.backends.dra import DRA
from gpushare_operator.core.backends.mig import MIG
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy


def of(policy: CompiledPolicy | None) -> Backend:
    """The backend of ``policy``'s nodes: DRA for backend DRA (MIG layouts included), MIG for a
    MIG layout on the device plugin, else the device plugin.  None (a node being released):
    the device plugin, with no layout."""
    if policy is None:
        return DEVICE_PLUGIN
    if policy.dra:
        return DRA
    if policy.mig is not None:
        return MIG
    return DEVICE_PLUGIN


def disruption(
    record: NodeRecord, policy: CompiledPolicy | None, *, layouts: Layouts | None
) -> str | None:
    """Why moving the node to ``policy`` (None: releasing it) may only happen on idle GPUs (a
    change of backend or of MIG layout); None when it may happen under running pods."""
    return of(policy).disrupts(record, policy, layouts=layouts)


def needs_idle(
    record: NodeRecord, policy: CompiledPolicy | None, *, layouts: Layouts | None
) -> bool:
    return disruption(record, policy, layouts=layouts) is not None


def idle_reason(record: NodeRecord, policy: CompiledPolicy | None) -> str:
    """Why every GPU pod must go first, for a message (the layouts unknown here: a change of
    MIG layout is assumed when the backend stays)."""
    reason = disruption(record, policy, layouts=None)
    return reason if reason is not None else MIG_IDLE

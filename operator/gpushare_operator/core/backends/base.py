"""The seam every backend fills: what a node's target is, what confirms it, what a move onto it
disrupts, and what it renders cluster-wide.

Three things change a GPU node: the device plugin's config key (``deviceplugin``), the MIG
manager's layout (``mig``) and the switch to NVIDIA's DRA kubelet plugin (``dra``).  Each is a
``Backend``; ``core.backends.of`` says which one governs a policy's nodes, and the phase machine
(``core.phases.nodephases``) and the planners of the ConfigMaps and DeviceClasses ask it, never the
policy's fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpushare_operator.core.decisions import Labels, NodeDecision, Published
from gpushare_operator.core.dra.driver import Device
from gpushare_operator.core.mig.migconfigs import MigLayout
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy

Layouts = Mapping[str, MigLayout | None]


@dataclass(frozen=True, slots=True)
class Check:
    """What confirms a node on its target: what it shows that the target would not (nothing:
    confirmed), and what the Verified message says then."""

    problems: tuple[str, ...]
    verified: str


@dataclass(frozen=True, slots=True)
class Rendered:
    """What a policy needs written outside its nodes, by where it goes: device-plugin config
    keys (key -> text; GPU Feature Discovery reads them on DRA nodes too), mig-parted layouts
    (name -> layout), and the extended resources a DeviceClass must serve."""

    config: Mapping[str, str] = field(default_factory=dict)
    layouts: Mapping[str, MigLayout] = field(default_factory=dict)
    device_classes: tuple[str, ...] = ()


class Backend(Protocol):
    """One way a GPU node is changed.  Every method is pure: the node's record and the policy
    (and what the caller was told of the cluster) in, a value out."""

    @property
    def name(self) -> str:
        """As in messages and the plan: ``device plugin``, ``MIG``, ``DRA``."""
        ...

    def target(self, record: NodeRecord, policy: CompiledPolicy) -> Labels:
        """The labels beyond the config key and policy name that put the node on ``policy``
        (None: an apply leaves ours out, so server-side apply removes it)."""
        ...

    def describe(self, record: NodeRecord, policy: CompiledPolicy) -> str:
        """What ``target`` adds, for the LabelPending message (``""``: nothing)."""
        ...

    def shows(self, record: NodeRecord, policy: CompiledPolicy) -> bool:
        """Whether the node carries ``target`` (the key and name checked by the caller)."""
        ...

    def waiting(
        self,
        record: NodeRecord,
        policy: CompiledPolicy,
        *,
        published: Published,
        applied_since: float | None,
        now: float,
    ) -> NodeDecision | None:
        """A node agent's own states that decide the phase before any check (the MIG
        manager at work, or failed); None: none."""
        ...

    def check(
        self, record: NodeRecord, policy: CompiledPolicy, *, devices: tuple[Device, ...]
    ) -> Check:
        """What the node's own agents publish against what the target promises.
        ``devices``: what the node's ResourceSlices list (read by DRA alone)."""
        ...

    @property
    def applied(self) -> str:
        """The Applied message while the node's agents have not confirmed yet."""
        ...

    def disrupts(
        self, record: NodeRecord, policy: CompiledPolicy | None, *, layouts: Layouts | None
    ) -> str | None:
        """Why moving the node onto ``policy`` under this backend needs idle GPUs (None:
        it does not); ``policy`` None: releasing the node."""
        ...

    def renders(self, policy: CompiledPolicy) -> Rendered:
        """What ``policy`` needs written outside its nodes."""
        ...

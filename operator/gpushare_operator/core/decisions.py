"""A node's decision and what its GPUNodeState said: the values the phase machine
(``nodephases``) and the release rules (``releases``) pass between them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_operator.core import conditions
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.stamps import epoch_of

Labels = dict[str, str | None]


@dataclass(frozen=True, slots=True)
class KeyReadiness:
    """What the writer knows of a config key: in the ConfigMap, and usable from when."""

    present: bool
    ready_at: float | None = None  # monotonic time from which nodes may name it
    ready_at_wall: str | None = None  # the same moment, RFC 3339, fixed when the key was seen


@dataclass(frozen=True, slots=True)
class NodeDecision:
    policy: CompiledPolicy | None
    phase: NodePhase
    reason: str
    message: str
    labels: Labels | None  # our two labels as wanted (None value = remove); None = leave as is
    recheck_at: float | None = None  # when the decision may change by time alone
    config_ready_at: str | None = None  # published while waiting for config propagation
    # While our labels are gone but the device plugin is not yet back unshared: the policy the
    # node is being released from (its status keeps naming it, and its budget keeps the node).
    released_from: str | None = None
    # podPolicy Evict: the GPUNodeState's ``eviction`` block (statuses.EvictionStatus) while
    # the node is drained, or after it was given up (EvictionBlocked); None: no eviction.
    eviction: Mapping[str, Any] | None = None
    # A MIG change under podPolicy WaitForPods: the GPUNodeState's ``idleWait`` block
    # (statuses.IdleWaitStatus) while the admitted, tainted node waits for its GPU pods.
    idle_wait: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Published:
    """What the node's GPUNodeState says, as last written: every leader reads the same."""

    policy: str | None = None
    config_key: str | None = None
    phase: str | None = None
    reason: str | None = None  # its Ready condition's
    message: str = ""  # and that condition's message
    since: float | None = None  # its lastTransitionTime, on the caller's monotonic clock
    stamp: float | None = None  # the same, in seconds since the epoch (whole seconds)
    mig_config: str | None = None  # status.mig.config: the MIG layout name it speaks of

    @classmethod
    def of(cls, status: Mapping[str, Any] | None, *, since: float | None) -> Published:
        status = status or {}
        ready = conditions.find(status.get("conditions"), "Ready") or {}
        return cls(
            policy=status.get("policy"),
            config_key=status.get("configKey"),
            phase=status.get("phase"),
            reason=ready.get("reason"),
            message=str(ready.get("message") or ""),
            since=since,
            stamp=epoch_of(status.get("lastTransitionTime")),
            mig_config=mig.get("config") if isinstance(mig := status.get("mig"), Mapping) else None,
        )

    def verified(self, policy: CompiledPolicy, *, layout: str | None = None) -> bool:
        """Whether the node was confirmed for ``policy``'s config in force (drift since); for
        MIG, on the node's ``layout`` too (a new layout keeps the device-plugin key)."""
        return (
            self.policy == policy.name
            and self.config_key == policy.config_key
            and self.phase in (NodePhase.VERIFIED, NodePhase.DEGRADED)
            and (layout is None or self.mig_config == layout)
        )


NOTHING_PUBLISHED = Published()

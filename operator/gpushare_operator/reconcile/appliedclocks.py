"""Since when each node has shown its policy's label without the agents confirming it.

The Mismatch timeout runs from that moment.  It is kept on the monotonic clock of this process;
a node met for the first time since start (after a restart or a failover) resumes the clock its
published status implies, or the timeout would start again from zero and a node GFD never
confirmed would wait a whole timeout more to be reported.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.migphases import MIG_CHANGING
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.policies import CompiledPolicy


def _epoch(stamp: object) -> float | None:
    try:
        return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class AppliedClocks:
    def __init__(
        self,
        *,
        clock: Callable[[], float],
        epoch: Callable[[], float],
        published: Mapping[str, Mapping[str, Any]],
        mismatch_timeout: float,
    ) -> None:
        self._clock = clock  # monotonic
        self._epoch = epoch  # wall clock, to read published transition times
        self._published = published  # node -> its GPUNodeState status, as last seen
        self._timeout = mismatch_timeout
        self.since: dict[str, tuple[str, float]] = {}  # node -> (config key, applied since)
        # Nodes this process has decided on: for them the published status is history, not a
        # clock to resume.
        self._decided: set[str] = set()

    def of(self, name: str, policy: CompiledPolicy | None) -> float | None:
        """Since when this node has shown this policy's label without confirming it, on our
        monotonic clock; None: from now."""
        if policy is None:
            return None
        applied = self.since.get(name)
        if applied is not None:
            return applied[1] if applied[0] == policy.config_key else None
        return None if name in self._decided else self._resumed(name, policy)

    def _resumed(self, name: str, policy: CompiledPolicy) -> float | None:
        """What the published status says, for a node we have not timed ourselves."""
        status = self._published.get(name) or {}
        if status.get("configKey") != policy.config_key or status.get("policy") != policy.name:
            return None
        now = self._clock()
        if status.get("phase") == NodePhase.MISMATCH:
            return now - self._timeout
        at = _epoch(status.get("lastTransitionTime"))
        if status.get("phase") != NodePhase.APPLIED or at is None:
            return None
        return now - max(0.0, self._epoch() - at)

    def track(self, name: str, decision: nodephases.NodeDecision) -> None:
        policy = decision.policy
        first = name not in self._decided
        self._decided.add(name)
        if decision.phase in (NodePhase.APPLIED, NodePhase.MISMATCH) and policy is not None:
            key = policy.config_key or ""
            current = self.since.get(name)
            if current is None or current[0] != key:
                # Only a node met for the first time since start resumes a published clock;
                # one we saw unlabelled and labelled again starts afresh.
                since = self._resumed(name, policy) if first else None
                self.since[name] = (key, self._clock() if since is None else since)
        if decision.reason == MIG_CHANGING and policy is not None:
            # The MIG manager at work (a reboot, maybe): the device plugin and GFD come back
            # only after it, so the timeout runs from its end, not from our label.
            self.since[name] = (policy.config_key or "", self._clock())
        if decision.phase is NodePhase.VERIFIED and policy is not None:
            # A later disagreement (the device plugin restarting, say) is timed from when it
            # starts: a restart window of a confirmed node is no Mismatch.
            self.since.pop(name, None)
        elif decision.phase not in (NodePhase.APPLIED, NodePhase.MISMATCH):
            self.since.pop(name, None)

    def forget(self, name: str) -> None:
        self.since.pop(name, None)
        self._decided.discard(name)

"""What a write achieved, as a value, and what the write loop is to do about it.

In controller-runtime's shape: the reconciler hands back a result *value* and one switch alone
acts on the work queue.  Here ``kube.patching`` sends a plan's requests and returns what the
API server answered as a ``*Written`` value with an ``Outcome``; ``Reconciler.learn`` takes in
the answer and returns ``Orders``; the write loop's one switch carries them out.  Nothing on the
way raises to say how a write went, sets a flag for someone to read later, or touches the queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare_operator.core.phases.nodephases import Labels
from gpushare_operator.core.workqueue import Key
from gpushare_operator.reconcile.plans import Stage


@dataclass(frozen=True, slots=True)
class Done:
    """Everything planned was written, or nothing needed writing."""


@dataclass(frozen=True, slots=True)
class Gone:
    """The object was deleted meanwhile: there is nothing left to write."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Failed in a way another try may cure (a timeout, a 5xx, a patch whose test failed
    because the object changed): written again on the key's back-off."""

    why: str


@dataclass(frozen=True, slots=True)
class Refused:
    """Refused in a way retrying alone will not cure (401, 403, 422): reported in the object's
    status and an Event, and tried again on the key's back-off (RBAC may be fixed)."""

    problem: str


@dataclass(frozen=True, slots=True)
class LeadershipLost:
    """Not sent: we stopped leading (or the loop is stopping).  The key stays queued: the gate
    may open again after one late renewal, without the loop ever seeing it closed."""


Outcome = Done | Gone | Retry | Refused | LeadershipLost

# When a job takes two stages, the outcome that the queue must act on is the gravest.
_GRAVITY: dict[type, int] = {Done: 0, Gone: 1, Retry: 2, Refused: 3, LeadershipLost: 4}


@dataclass(frozen=True, slots=True)
class NodeWritten:
    outcome: Outcome
    node: dict[str, Any] | None = None  # the Node as our last patch (taint, labels) returned it
    labels: Labels | None = None  # the labels applied
    # Other field managers owning our labels after the apply (what a release could not remove)
    co_owners: tuple[str, ...] = ()
    status: Mapping[str, Any] | None = None  # the GPUNodeState status written
    echo: dict[str, Any] | None = None  # the GPUNodeState the status write returned
    evicted: tuple[str, ...] = ()  # uids of pods whose eviction the API server accepted
    # uid -> the PodDisruptionBudgets (namespace/name) that refused its eviction now (429)
    refused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The GPU pods (namespace/name) the idle check found bound to the node: its MIG layout
    # label was not sent (empty: no check, or the node was idle)
    busy: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyWritten:
    outcome: Outcome
    policy: dict[str, Any] | None = None  # the policy as the finalizer patch returned it
    finalized: bool = False  # the finalizer patch was applied
    proceed: bool = False  # the status is to follow (applied, or refused by an older RBAC)
    status: Mapping[str, Any] | None = None
    echo: dict[str, Any] | None = None  # the policy the status write returned


@dataclass(frozen=True, slots=True)
class ConfigWritten:
    outcome: Outcome
    data: dict[str, str] | None = None  # the data applied
    answer: dict[str, Any] | None = None  # the ConfigMap as the apply returned it
    problem: str | None = None  # why the ConfigMap cannot be written (shown on every policy)


Written = NodeWritten | PolicyWritten | ConfigWritten


@dataclass(frozen=True, slots=True)
class Orders:
    """What the write loop does with its queue once a job (or a tick of the timers) is over."""

    outcome: Outcome = Done()  # for the job's own key
    mark: frozenset[Key] = frozenset()  # other keys whose output this changed
    first: tuple[str, ...] = ()  # nodes to take before every other node (just admitted)
    at: tuple[tuple[Key, float], ...] = ()  # keys to look at again at a time
    again: Stage | None = None  # plan the job's key again at once, for this stage

    def then(self, later: Orders) -> Orders:
        """These orders followed by a later stage's: the gravest outcome, everything else."""
        graver = _GRAVITY[type(later.outcome)] > _GRAVITY[type(self.outcome)]
        return Orders(
            outcome=later.outcome if graver else self.outcome,
            mark=self.mark | later.mark,
            first=self.first + later.first,
            at=self.at + later.at,
            again=later.again,
        )

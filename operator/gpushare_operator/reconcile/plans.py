"""What planning returns: the writes one object needs, and what the planner saw on the way.

A plan is a value.  ``Planner`` makes it from the cache without changing anything; the write
loop sends its writes (``kube.patching``) and hands the plan and the answer to
``Reconciler.learn``, the one place where the rollout book, the clocks and the write memory
take in what the plan saw (its *facts*) and what the write achieved.

A job may take two *stages*: a node's label change is written first and its status planned
again from the Node the API server returned (or, if the write was refused, saying why); a
policy's finalizer goes before its status.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare_operator.core.listpatches import JsonPatch
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.workqueue import CONFIG_KEY, NODE, POLICY, Key
from gpushare_operator.reconcile.drains import Eviction
from gpushare_operator.reconcile.rollouts import Placement


class Stage(enum.Enum):
    FIRST = "first"  # whatever the object needs first (a node's labels, a policy's finalizer)
    STATUS = "status"  # only the status, after the first stage's write (or its refusal)
    # Only a node's status, once the Node its label write returned shows the labels; if it
    # does not, nothing (the Node's watch event plans it again).
    LABELLED = "labelled"


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What planning a node saw that the write path keeps (see ``Reconciler.learn``)."""

    decision: nodephases.NodeDecision | None  # None: the node is gone
    placement: Placement | None
    held_until: float | None  # a soon-outdated Pending status kept to ourselves until then
    recheck_at: float | None  # the decision may change by time alone then


@dataclass(frozen=True, slots=True)
class NodePlan:
    name: str
    uid: str
    facts: NodeFacts
    stage: Stage = Stage.FIRST
    taint: JsonPatch | None = None  # our NoSchedule taint added or removed, before the labels
    labels: nodephases.Labels | None = None  # SSA of our two labels; None: no label write
    status: dict[str, Any] | None = None  # GPUNodeState status; None: no status write
    create_state: bool = False  # the GPUNodeState object does not exist yet
    # podPolicy Evict: pods to evict, after the taint and before the status (never with labels)
    evictions: tuple[Eviction, ...] = ()
    evictions_done: tuple[str, ...] = ()  # uids of pods we evicted that are gone (counted)
    # A MIG layout label (with ``labels`` only): sent only if a list of the node's pods,
    # taken just before it, shows none that holds a GPU (``kube.checking``).
    idle_check: bool = False

    @property
    def key(self) -> Key:
        return (NODE, self.name)

    @property
    def writes(self) -> bool:
        return (
            self.taint is not None
            or self.labels is not None
            or self.status is not None
            or bool(self.evictions)
        )


@dataclass(frozen=True, slots=True)
class PolicyPlan:
    name: str
    uid: str
    stage: Stage = Stage.FIRST
    finalizer: JsonPatch | None = None  # add or remove our finalizer, before the status
    status: dict[str, Any] | None = None
    rendered: dict[str, Any] | None = None  # the status as rendered, written or not (/metrics)
    gone: bool = False  # the policy is no longer in the cache
    recheck_at: float | None = None  # its progress deadline passes then (time alone)

    @property
    def key(self) -> Key:
        return (POLICY, self.name)

    @property
    def writes(self) -> bool:
        return self.finalizer is not None or self.status is not None


@dataclass(frozen=True, slots=True)
class ConfigPlan:
    data: dict[str, str] | None  # the ConfigMap data to apply; None: the cluster shows it
    foreign_keys: Mapping[str, str] = field(default_factory=dict)  # key -> its field managers
    unused_since: Mapping[str, float] = field(default_factory=dict)  # our unused keys' clocks
    recheck_at: float | None = None  # an unused key's grace period ends then
    stage: Stage = Stage.FIRST
    target: str = ""  # CONFIG_KEY's name: "" the device-plugin ConfigMap, MIG_CONFIG mig-parted's

    @property
    def key(self) -> Key:
        return (CONFIG_KEY[0], self.target)

    @property
    def writes(self) -> bool:
        return self.data is not None


Plan = NodePlan | PolicyPlan | ConfigPlan

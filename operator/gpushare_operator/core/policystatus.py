"""A GPUSharingPolicy's status from per-node tallies: counts, slots and conditions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpushare_operator.core import conditions, drasharing
from gpushare_operator.core.api.models import MAX_LISTED_NODES, PodPolicy, RolloutPhase, RolloutSpec
from gpushare_operator.core.conditions import Cond
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.core.slots.slotstatus import ClassTally


@dataclass(slots=True)
class PolicyTally:
    """Per-policy numbers gathered over the nodes it matches."""

    matched: int = 0
    governed: int = 0
    applied: int = 0
    verified: int = 0
    pending: int = 0
    mismatched: int = 0
    unsupported: int = 0  # would win but cannot work there (skipped, or nothing else works)
    unusable: int = 0  # of those, governed anyway: no other policy could work there either
    gpus: int = 0
    capacity: int = 0
    allocated: int = 0
    # A MIG policy's slots per extended resource (a mixed layout has one per profile); empty
    # for other policies, whose one resource is the totals above.
    capacity_by: dict[str, int] = field(default_factory=dict)
    allocated_by: dict[str, int] = field(default_factory=dict)
    # Each slot class over the nodes it governs (``slots.classes``).
    classes: ClassTally = field(default_factory=ClassTally)
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (node, winning policy)
    # Nodes this policy would win but cannot work on: (node, why).
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _listed(pairs: Sequence[tuple[str, str]]) -> str:
    shown = ", ".join(f"{node} (won by {winner})" for node, winner in pairs[:MAX_LISTED_NODES])
    more = len(pairs) - MAX_LISTED_NODES
    return shown + (f" and {more} more" if more > 0 else "")


def _ready(policy: CompiledPolicy, tally: PolicyTally, config_problem: str | None) -> Cond:
    if not policy.valid:
        message = policy.error or ""
        if policy.kept_generation is not None:
            message += (
                f"; generation {policy.kept_generation} stays in force on its nodes until the"
                " spec is fixed"
            )
        return Cond("Ready", "False", policy.error_reason or "Invalid", message)
    if config_problem is not None:
        return Cond("Ready", "False", "DevicePluginConfigUnavailable", config_problem)
    if tally.mismatched:
        message = f"{tally.mismatched} node(s) never confirmed the config"
        return Cond("Ready", "False", "NodesMismatched", message)
    if tally.pending or tally.governed > tally.applied + tally.unusable:
        waiting = tally.governed - tally.applied - tally.unusable
        return Cond("Ready", "False", "NodesPending", f"{waiting} node(s) not configured yet")
    if tally.governed == 0:
        return Cond("Ready", "True", "NoNodes", "no GPU node is governed by this policy")
    message = f"{tally.applied} node(s) applied, {tally.verified} verified"
    return Cond("Ready", "True", "Applied", message)


def _unsupported(tally: PolicyTally) -> Cond:
    if not tally.skipped:
        return Cond(
            "Unsupported", "False", "Supported", "the policy can work on every node it wins"
        )
    shown = "; ".join(f"{node}: {why}" for node, why in tally.skipped[:MAX_LISTED_NODES])
    more = len(tally.skipped) - MAX_LISTED_NODES
    message = (
        f"{len(tally.skipped)} node(s) this policy would win cannot use it, so the next usable"
        f" policy governs them: {shown}" + (f"; and {more} more" if more > 0 else "")
    )
    return Cond("Unsupported", "True", "NodesUnsupported", message)


def policy_conditions(
    policy: CompiledPolicy, tally: PolicyTally, *, config_problem: str | None
) -> list[Cond]:
    wanted = [_ready(policy, tally, config_problem)]
    if policy.error_reason == "InvalidSelector":
        wanted.append(Cond("SelectorValid", "False", "InvalidSelector", policy.error or ""))
    else:
        wanted.append(Cond("SelectorValid", "True", "Valid", "the node selector is valid"))
    if tally.conflicts:
        message = f"{len(tally.conflicts)} matched node(s) governed by higher-priority policies: "
        wanted.append(
            Cond("Conflicting", "True", "LowerPriority", message + _listed(tally.conflicts))
        )
    else:
        wanted.append(
            Cond("Conflicting", "False", "NoConflict", "this policy wins every node it matches")
        )
    wanted.append(_unsupported(tally))
    wanted.append(_overcommitted(tally))
    paused = policy.paused
    wanted.append(
        Cond(
            "Paused",
            "True" if paused else "False",
            "Paused" if paused else "Active",
            "no node is changed while paused" if paused else "",
        )
    )
    return wanted


@dataclass(frozen=True, slots=True)
class RolloutView:
    """What the planner knows of the policy's rollout, for its status."""

    counts: rollouts.Counts
    failed_nodes: Sequence[str] = ()
    releasing: int | None = None  # deleting: nodes that still carry the policy's label
    unavailable_nodes: Sequence[str] = ()  # charged to this policy, not yet confirmed
    blocked_nodes: Sequence[str] = ()  # keeping their config until their pods fit
    waiting_nodes: Sequence[str] = ()  # waiting for their turn (or for a key to propagate)
    degraded_nodes: Sequence[str] = ()  # confirmed once, disagreeing since (unavailable)


def waiting_on(
    view: RolloutView, spec: RolloutSpec, *, state: RolloutPhase
) -> tuple[list[str], str]:
    """The nodes a rollout waits on, and why, in words: no rollout waits without saying so."""
    counts = view.counts

    def named(nodes: Sequence[str]) -> str:
        more = len(nodes) - MAX_LISTED_NODES
        return ", ".join(nodes[:MAX_LISTED_NODES]) + (f" and {more} more" if more > 0 else "")

    if state is RolloutPhase.HALTED and rollouts.halted(counts, spec):
        nodes = list(view.failed_nodes)
        return nodes[:MAX_LISTED_NODES], (
            f"halted: {counts.failed} node(s) never confirmed their new config (failureThreshold"
            f" {spec.failureThreshold}): {named(nodes)}; fix them, or change the spec"
        )
    if state is RolloutPhase.HALTED:
        nodes = list(view.failed_nodes) + list(view.degraded_nodes)
        return nodes[:MAX_LISTED_NODES], (
            f"halted: {len(nodes)} failed or degraded node(s) hold the whole budget"
            f" (maxUnavailable {spec.maxUnavailable}) and {counts.waiting} wait for their turn:"
            f" {named(nodes)}; it resumes when one of them is Verified or the spec changes"
        )
    if state is RolloutPhase.PAUSED:
        nodes = list(view.waiting_nodes) + list(view.blocked_nodes)
        return nodes[:MAX_LISTED_NODES], (
            f"paused: {len(nodes)} node(s) keep their config until the policy is resumed"
            + (f": {named(nodes)}" if nodes else "")
        )
    if state is RolloutPhase.WAITING_FOR_PODS:
        nodes = list(view.blocked_nodes)
        if spec.podPolicy is PodPolicy.EVICT:
            why = (
                "their pods could not be evicted in time (podPolicy Evict, EvictionBlocked on"
                " each node's GPUNodeState)"
            )
        else:
            why = "their pods fit the new one (podPolicy WaitForPods)"
        return nodes[:MAX_LISTED_NODES], (
            f"{len(nodes)} node(s) keep their config until {why}: {named(nodes)}"
        )
    if state is RolloutPhase.COMPLETE:
        return [], ""
    if view.unavailable_nodes:
        nodes = list(view.unavailable_nodes)
        return nodes[:MAX_LISTED_NODES], (
            f"waiting for {len(nodes)} node(s) to confirm their config (maxUnavailable"
            f" {spec.maxUnavailable}): {named(nodes)}"
            + (f"; {counts.waiting} more to change after them" if counts.waiting else "")
        )
    nodes = list(view.waiting_nodes)
    return nodes[:MAX_LISTED_NODES], (
        f"{len(nodes)} node(s) to change: {named(nodes)}" if nodes else "admitting the next nodes"
    )


def render_rollout(
    *,
    policy: CompiledPolicy,
    view: RolloutView,
    previous: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any] | None:
    """``status.rollout``: start and completion times are kept while the generation is the
    same, so that a re-render writes nothing."""
    generation = policy.generation_in_force
    if generation is None or policy.spec is None:
        return None
    counts = view.counts
    state = rollouts.phase(counts, policy.spec.rollout, paused=policy.paused)
    waiting, why = waiting_on(view, policy.spec.rollout, state=state)
    before = previous if previous and previous.get("generation") == generation else {}
    complete = state is RolloutPhase.COMPLETE
    waiting_nodes = counts.waiting + counts.blocked + counts.admitted
    rollout = {
        "generation": generation,
        "state": str(state),
        "totalNodes": counts.total,
        "updatedNodes": counts.updated,
        "unavailableNodes": counts.unavailable,
        "waitingNodes": waiting_nodes,
        "failedNodes": counts.failed,
        "degradedNodes": counts.degraded,
        "waitingOn": waiting,
        "message": why,
        "progress": f"{counts.updated}/{counts.total}",
        "startedAt": before.get("startedAt") or now,
        "completedAt": (before.get("completedAt") or now) if complete else None,
        "progressedAt": rollouts.progressed(
            before, state=state, updated=counts.updated, waiting=waiting_nodes, now=now
        ),
    }
    return {k: v for k, v in rollout.items() if v is not None}


def _rollout_conditions(
    policy: CompiledPolicy,
    view: RolloutView,
    *,
    rendered: Mapping[str, Any] | None,
    now: str,
) -> list[Cond]:
    wanted = []
    spec = policy.spec.rollout if policy.spec is not None else rollouts.DEFAULT_ROLLOUT
    reason = rollouts.halt_reason(view.counts, spec)
    if reason == rollouts.FAILURE_THRESHOLD:
        names = ", ".join(view.failed_nodes[:MAX_LISTED_NODES])
        more = len(view.failed_nodes) - MAX_LISTED_NODES
        message = (
            f"{view.counts.failed} node(s) ended in Mismatch (failureThreshold"
            f" {spec.failureThreshold}): {names}"
            + (f" and {more} more" if more > 0 else "")
            + "; no further node is changed until they are Verified or the spec changes"
        )
        wanted.append(Cond("RolloutHalted", "True", rollouts.FAILURE_THRESHOLD, message))
    elif reason == rollouts.BUDGET_HELD:
        message = str((rendered or {}).get("message") or "")
        wanted.append(Cond("RolloutHalted", "True", rollouts.BUDGET_HELD, message))
    else:
        wanted.append(Cond("RolloutHalted", "False", "NoFailures", ""))
    if rendered is not None:
        wanted.append(_progressing(rendered, spec, now=now))
    if view.releasing is not None:
        message = (
            f"{view.releasing} node(s) still carry this policy's config; they are released"
            " under its rollout budget, then the policy goes"
        )
        held = list(view.blocked_nodes)
        if held:
            more = len(held) - MAX_LISTED_NODES
            message += (
                f"; {len(held)} keep it until their pods fit the default config (podPolicy"
                f" WaitForPods): {', '.join(held[:MAX_LISTED_NODES])}"
                + (f" and {more} more" if more > 0 else "")
            )
        wanted.append(Cond("Deleting", "True", "ReleasingNodes", message))
    return wanted


def _progressing(rendered: Mapping[str, Any], spec: RolloutSpec, *, now: str) -> Cond:
    """A Deployment's Progressing condition: False with ProgressDeadlineExceeded once a rollout
    with nodes still to change has gone ``progressDeadlineSeconds`` without a node moving."""
    state = rendered.get("state")
    if state == RolloutPhase.PAUSED:
        return Cond("Progressing", "Unknown", "RolloutPaused", "not judged while paused")
    if state == RolloutPhase.COMPLETE:
        return Cond("Progressing", "True", "RolloutComplete", "every node is on the config")
    left = rollouts.deadline_left(rendered, deadline=spec.progressDeadlineSeconds, now=now)
    if left is not None and left <= 0:
        message = (
            f"no node has moved since {rendered.get('progressedAt')} (progressDeadlineSeconds"
            f" {spec.progressDeadlineSeconds}): {rendered.get('message') or ''}"
        )
        return Cond("Progressing", "False", rollouts.DEADLINE_EXCEEDED, message)
    return Cond("Progressing", "True", "NodesChanging", "")


def deadline_recheck(
    status: Mapping[str, Any], policy: CompiledPolicy, *, now: str
) -> float | None:
    """Seconds from ``now`` until time alone turns the policy's Progressing condition False;
    None when it will not (complete, paused, already passed, no rollout)."""
    rollout = status.get("rollout")
    if not isinstance(rollout, Mapping) or policy.spec is None:
        return None
    deadline = policy.spec.rollout.progressDeadlineSeconds
    left = rollouts.deadline_left(rollout, deadline=deadline, now=now)
    return None if left is None or left <= 0 else left


def _overcommitted(tally: PolicyTally) -> Cond:
    """Overcommitted on any one resource: free slots of one MIG profile do not make up for
    another's."""
    for resource, allocated in sorted(tally.allocated_by.items()):
        capacity = tally.capacity_by.get(resource, 0)
        if allocated > capacity:
            over = conditions.overcommitted(allocated=allocated, capacity=capacity)
            return Cond(over.type, over.status, over.reason, f"{resource}: {over.message}")
    return conditions.overcommitted(allocated=tally.allocated, capacity=tally.capacity)


def by_resource(tally: PolicyTally) -> dict[str, dict[str, int]] | None:
    """``slots.byResource``: every resource the policy's nodes advertise or its pods hold."""
    names = sorted({*tally.capacity_by, *tally.allocated_by})
    if not names:
        return None
    return {
        name: {
            "capacity": tally.capacity_by.get(name, 0),
            "allocated": tally.allocated_by.get(name, 0),
        }
        for name in names
    }


def resources_summary(slots: Mapping[str, Mapping[str, int]] | None) -> str | None:
    """For the printer column: ``mig-1g.10gb 3/14, mig-3g.40gb 0/2``."""
    if not slots:
        return None
    return ", ".join(
        f"{name.removeprefix('nvidia.com/')} {s['allocated']}/{s['capacity']}"
        for name, s in slots.items()
    )


def render_policy_status(
    *,
    policy: CompiledPolicy,
    tally: PolicyTally,
    previous: Mapping[str, Any] | None,
    now: str,
    config_problem: str | None = None,
    schema_problem: str | None = None,
    rollout: RolloutView | None = None,
    device_class: Cond | None = None,
) -> dict[str, Any]:
    """The status dict, with transition times kept while conditions hold.
    ``device_class``: for a policy of backend DRA, whether its DeviceClass is there."""
    previous = previous or {}
    wanted = policy_conditions(policy, tally, config_problem=config_problem)
    rendered = (
        None
        if rollout is None
        else render_rollout(policy=policy, view=rollout, previous=previous.get("rollout"), now=now)
    )
    if rollout is not None:
        wanted.extend(_rollout_conditions(policy, rollout, rendered=rendered, now=now))
    if schema_problem is not None:
        wanted.append(Cond("SchemaOutdated", "True", "CRDOutdated", schema_problem))
    if device_class is not None:
        wanted.append(device_class)
    alpha = drasharing.condition(policy.spec) if policy.spec is not None else None
    if alpha is not None:
        wanted.append(alpha)
    adjusted = policy.spec.rollout.eviction.adjustment() if policy.spec is not None else None
    if adjusted is not None:  # a value an older CRD let in, read otherwise
        wanted.append(Cond("SpecAdjusted", "True", "GracePeriodRaised", adjusted))
    status: dict[str, Any] = {
        "observedGeneration": policy.generation,
        "matchedNodes": tally.matched,
        "appliedNodes": tally.applied,
        "verifiedNodes": tally.verified,
        "conflictingNodes": len(tally.conflicts),
        "unsupportedNodes": tally.unsupported,
        "gpus": tally.gpus,
        "slots": _slots(tally),
        "slotsSummary": f"{tally.allocated}/{tally.capacity}",
        "resourcesSummary": resources_summary(by_resource(tally)),
        "configKey": policy.config_key,
        "appliedSpec": _applied(policy),
        "rollout": rendered,
        "conditions": conditions.render_conditions(
            wanted,
            previous=previous.get("conditions"),
            now=now,
            generation=policy.generation,
        ),
    }
    return {k: v for k, v in status.items() if v is not None}


def _slots(tally: PolicyTally) -> dict[str, Any]:
    slots: dict[str, Any] = {"capacity": tally.capacity, "allocated": tally.allocated}
    resources = by_resource(tally)
    if resources is not None:
        slots["byResource"] = resources
    classes = tally.classes.render()
    if classes is not None:
        slots["classes"] = classes
    return slots


def _applied(policy: CompiledPolicy) -> dict[str, Any] | None:
    spec = policy.applied_spec()
    generation = policy.generation_in_force
    if spec is None or generation is None:
        return None
    return {"generation": generation, "spec": spec}

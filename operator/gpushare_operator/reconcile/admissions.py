"""The admission pass: which waiting nodes the rollout book lets change now.

``admit`` is pure: from the book, the budgets and whether the write queue still holds nodes
to plan, it works out an ``Admissions`` value; ``RolloutBook.record`` and the write loop's
switch carry it out (``Reconciler.tick``).

A pass runs only once every node queued for planning has been placed (a node taken by a job
counts as queued until planned): the counts are then whole and the order global.  Under a
stream of node events that never lets the queue run dry, at most ``FULL_LOOK_EVERY`` seconds
pass between admissions, with what has been placed by then.  Before the first whole look
after gaining leadership, never: one node not yet planned may be mid-change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpushare_operator.core import resolution
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.reconcile.rollouts import CLUSTER, RELEASE, Placement, RolloutBook, Step

FULL_LOOK_EVERY = 2.0  # seconds between admissions while node events keep arriving
INTERVAL = 0.05  # seconds between two passes at the least


@dataclass(frozen=True, slots=True)
class Pacing:
    """When passes ran and may run: the admission pass's own memory."""

    primed: bool = False  # a whole look (nothing queued) happened since leading began
    busy_since: float | None = None  # nodes have been queued without a break since then
    last: float = float("-inf")  # the last pass
    halted: frozenset[str] = frozenset()  # policies whose waiting nodes were told so
    # The cache's policy epoch at the last pass: any edit of a spec (a rollout-only one too)
    # is a reason to look again, since what halts or admits may have changed with it.
    epoch: int = -1


@dataclass(frozen=True, slots=True)
class Admissions:
    pacing: Pacing
    admitted: tuple[Placement, ...] = ()  # in the order they go
    restate: frozenset[str] = frozenset()  # held nodes whose wait now reads otherwise
    again_at: float | None = None  # look again then
    ran: bool = False  # a pass was made: the book has seen everything that moved until now


def admit(*, book: RolloutBook, pacing: Pacing, busy: bool, now: float) -> Admissions:
    """The next admissions, if anything moved since the last pass and its time has come."""
    epoch = book.cache.policy_epoch
    if not book.stale and epoch == pacing.epoch:
        return Admissions(pacing)
    primed, busy_since = pacing.primed, pacing.busy_since
    if not busy:
        primed, busy_since = True, None
    elif not primed:
        return Admissions(pacing)
    elif busy_since is None:
        busy_since = now
    waited = replace(pacing, primed=primed, busy_since=busy_since)
    if busy and busy_since is not None and now - busy_since < FULL_LOOK_EVERY:
        return Admissions(waited, again_at=now + FULL_LOOK_EVERY / 10)
    if now - pacing.last < INTERVAL:
        return Admissions(waited, again_at=pacing.last + INTERVAL)
    halted = _halted(book)
    restate = {
        node
        for policy in halted ^ pacing.halted
        for step in (Step.WAITING, Step.BLOCKED)
        for node in book.at(policy, step)
    }
    admitted = _admit_all(book)
    done = replace(waited, last=now, halted=frozenset(halted), epoch=epoch)
    return Admissions(done, tuple(admitted), frozenset(restate), ran=True)


def _halted(book: RolloutBook) -> set[str]:
    """Policies whose rollout is halted while nodes wait in it."""
    halted = set()
    for policy in book.policies():
        if policy and (book.at(policy, Step.WAITING) or book.at(policy, Step.BLOCKED)):
            spec, _ = book.spec_of(policy)
            if rollouts.halted(book.counts(policy), spec):
                halted.add(policy)
    return halted


def _admit_all(book: RolloutBook) -> list[Placement]:
    room = book.cluster_budget() - book.unavailable()
    # A policy's nodes wait for our finalizer on it: deleted without it, the policy would
    # vanish and its nodes be released all at once, outside its budget.
    waiting = [p for p in book.policies() if book.at(p, Step.WAITING) and _finalized(book, p)]
    admitted: list[Placement] = []
    for policy in _by_rank(book, waiting):
        # Even with no room left, a node already unavailable may take its new target.
        placements, used = _admit(book, policy, cluster_room=max(0, room))
        admitted += placements
        room -= used
    return admitted


def _finalized(book: RolloutBook, policy: str) -> bool:
    if policy == CLUSTER or policy in book.cache.deleting:
        return True
    return rollouts.FINALIZER in book.cache.policy_finalizers.get(policy, ())


def _by_rank(book: RolloutBook, names: list[str]) -> list[str]:
    policies = book.cache.policies
    known = [policies[n] for n in names if n in policies]
    return [p.name for p in resolution.ranked(known)] + [n for n in names if n not in policies]


def _admit(book: RolloutBook, policy: str, *, cluster_room: int) -> tuple[list[Placement], int]:
    spec, paused = book.spec_of(policy)
    if policy == CLUSTER:
        room, canary = cluster_room, None
    elif policy in book.cache.deleting:
        # A deleted policy's nodes go under its budget whatever its spec said: paused or
        # halted, it would otherwise never let its finalizer go.
        room = rollouts.room(book.counts(policy), spec, cluster_room=cluster_room, deleting=True)
        canary = None
    else:
        counts = book.counts(policy)
        if paused or rollouts.halted(counts, spec):
            return [], 0  # not even a node already unavailable takes a new target
        room = rollouts.room(counts, spec, cluster_room=cluster_room)
        canary = rollouts.canary_room(counts, spec)
    usage = book.cache.usage
    order = sorted(
        book.at(policy, Step.WAITING),
        key=lambda n: rollouts.order_key(allocated=usage.node_total(n), name=n),
    )
    used = 0
    admitted: list[Placement] = []
    for node in order:
        # A node still unavailable from its last change (its target moved on meanwhile)
        # costs nothing more: changing it again leaves as many nodes unavailable.
        was_down = book.down_of(node)
        if was_down is None and used >= room:
            continue
        target = book.wanted(node)
        if target != RELEASE and canary is not None:
            if canary <= 0:
                continue
            canary -= 1
        admitted.append(
            Placement(
                node,
                policy,
                Step.ADMITTED,
                down=was_down or policy,
                grant=(target, policy),
            )
        )
        used += was_down is None
    return admitted, used

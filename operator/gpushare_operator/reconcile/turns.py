"""Whose turn it is: which key the write loop takes next, as a pure function of the queue.

The order, and why:

- **The device-plugin ConfigMap first, and alone.**  A key is written before any label names
  it, and nodes planned while the ConfigMap write is out would not see their new key yet (they
  would publish a Pending status only to replace it a moment later).
- **Nodes before policy statuses**, but every ``POLICY_EVERY``-th turn a policy may go:
  sustained node churn (pods coming and going) must not keep policy statuses unpublished.
- **A policy status waits while some of its nodes still have a write coming** (queued, being
  written, or holding back a Pending status): its counts would change a moment later, and a
  2,500-node rollout would rewrite the status dozens of times.  It looks again every
  ``POLICY_POLL`` seconds, for at most ``max_wait`` seconds since it was first marked, so
  that churn still shows in the policy's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpushare_operator.core.workqueue import (
    CONFIG_KEY,
    DEVICE_CLASSES_KEY,
    MIG_CONFIG_KEY,
    NODE,
    POLICY,
    Key,
    WorkQueue,
)

POLICY_EVERY = 10  # turns per policy turn while nodes and policies are both queued
POLICY_POLL = 0.5  # how often a held-back policy status looks again at its nodes


class Settling(Protocol):
    def policy_unsettled(self, name: str, *, busy: set[str]) -> bool: ...


@dataclass(frozen=True, slots=True)
class Turn:
    key: Key | None  # what to write next; None: nothing may go now
    alone: bool = False  # nothing else may be written while it is (the ConfigMap)
    deferred: tuple[tuple[Key, float], ...] = ()  # policy statuses held back, until when


def next_turn(
    queue: WorkQueue, *, turn: int, settling: Settling, now: float, max_wait: float
) -> Turn:
    """The key to take at the ``turn``-th turn, and the policies to hold back meanwhile."""
    # The mig-parted ConfigMap likewise, and the DRA DeviceClasses (a node moves to DRA only
    # once its class is there).
    for config in (CONFIG_KEY, MIG_CONFIG_KEY, DEVICE_CLASSES_KEY):
        if queue.is_queued(config):
            return Turn(config, alone=True)
    if queue.policies and turn % POLICY_EVERY == 0:
        policy = _policy_turn(queue, settling=settling, now=now, max_wait=max_wait)
        if policy.key is not None:
            return policy
        if queue.nodes:
            return Turn((NODE, next(iter(queue.nodes))), deferred=policy.deferred)
        return policy
    if queue.nodes:
        return Turn((NODE, next(iter(queue.nodes))))
    return _policy_turn(queue, settling=settling, now=now, max_wait=max_wait)


def _policy_turn(queue: WorkQueue, *, settling: Settling, now: float, max_wait: float) -> Turn:
    busy = queue.processing(NODE)
    deferred: list[tuple[Key, float]] = []
    for name in list(queue.policies):  # a copy: the loop postpones some before it takes one
        key = (POLICY, name)
        since = queue.waiting_since(key)
        deadline = (now if since is None else since) + max_wait
        if now < deadline and settling.policy_unsettled(name, busy=busy):
            deferred.append((key, min(now + POLICY_POLL, deadline)))
            continue
        return Turn(key, deferred=tuple(deferred))
    return Turn(None, deferred=tuple(deferred))

"""Incremental GPU-slot accounting: per node and per policy, with no pass over all pods.

A pod event moves its record off the node it was counted on and onto the one it is on now,
and its contribution out of the policy counters it was in and into the ones it is in now; a
node's counts are summed from its own few records when asked; a node whose governing policy
changes moves the node's total from one policy to the other.  ``core.records.pods.total`` is
the from-scratch reference that a property test holds these counters to.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from gpushare_operator.core.records.pods import PodRecord

Governor = tuple[str, tuple[str, ...]]  # (policy name, the resources it advertises)


class UsageLedger:
    def __init__(self) -> None:
        self.pods: dict[str, PodRecord] = {}  # uid -> record (pods asking for tracked resources)
        # node -> the records counted on it: exactly the pods that hold slots there (bound, not
        # finished), each once.  A node's counts are summed from them when asked (a node holds
        # a few pods, and a list is far smaller than a set and a counter dict per node).
        self._on_node: dict[str, list[PodRecord]] = {}
        self._governors: dict[str, Governor] = {}
        # Every distinct governor once: thousands of nodes share a handful of them, and each
        # would otherwise keep a tuple of its own (rebuilt from ``_governors`` when it grows).
        self._shared: dict[Governor, Governor] = {}
        # policy → resource → slots held on the nodes it governs; no zero entries, and no
        # policy without one (a mixed MIG policy has a resource per profile).
        self._by_policy: defaultdict[str, dict[str, int]] = defaultdict(dict)

    # -- reads -----------------------------------------------------------------------------------

    def node_usage(self, node: str, resource: str) -> tuple[int, int]:
        """(slots of ``resource`` held on ``node``, pods holding them)."""
        held = pods = 0
        for record in self._on_node.get(node, ()):
            amount = record.amount(resource)
            if amount:
                held, pods = held + amount, pods + 1
        return held, pods

    def node_slots(self, node: str) -> dict[str, int]:
        """Slots held on ``node`` per resource (only resources some pod holds)."""
        held: dict[str, int] = {}
        for record in self._on_node.get(node, ()):
            for resource, amount in record.requests:
                held[resource] = held.get(resource, 0) + amount
        return held

    def node_total(self, node: str) -> int:
        """Slots held on ``node`` over all resources, without building ``node_slots``'s dict
        (the rollout orders every waiting node by it on each admission)."""
        return sum(a for r in self._on_node.get(node, ()) for _, a in r.requests)

    def node_pods(self, node: str) -> list[PodRecord]:
        """The pods counted on ``node`` (bound, not finished, asking for a tracked resource)."""
        return list(self._on_node.get(node, ()))

    def policy_slots(self, policy: str) -> int:
        return sum(self._by_policy.get(policy, {}).values())

    def policy_resource_slots(self, policy: str) -> dict[str, int]:
        """Slots held per resource on the nodes ``policy`` governs (only resources in use)."""
        return dict(self._by_policy.get(policy, {}))

    def governor(self, node: str) -> Governor | None:
        return self._governors.get(node)

    def __iter__(self) -> Iterator[PodRecord]:
        return iter(self.pods.values())

    # -- pod events --------------------------------------------------------------------------------

    def _move(self, record: PodRecord, sign: int) -> None:
        node = record.node
        if node is None or not record.holds_slots:
            return
        if sign > 0:
            self._on_node.setdefault(node, []).append(record)
        else:
            held = self._on_node.get(node, [])
            for index, each in enumerate(held):
                if each is record:
                    del held[index]
                    break
            if not held:
                self._on_node.pop(node, None)
        governor = self._governors.get(node)
        if governor is not None:
            for resource, amount in record.requests:
                if resource in governor[1]:
                    self._add_policy(governor[0], resource, sign * amount)

    def _add_policy(self, policy: str, resource: str, amount: int) -> None:
        if not amount:
            return
        held = self._by_policy[policy]
        total = held.get(resource, 0) + amount
        if total:
            held[resource] = total
        else:
            del held[resource]
        if not held:
            del self._by_policy[policy]

    def replace(self, uid: str, record: PodRecord | None) -> tuple[PodRecord | None, bool]:
        """Swap a pod's record; returns the old one and whether any counter moved."""
        old = self.pods.pop(uid, None)
        if old == record:
            if old is not None:
                self.pods[uid] = old  # the very object the node's list holds
            return old, False
        if record is not None:
            self.pods[uid] = record
        if old is not None:
            self._move(old, -1)
        if record is not None:
            self._move(record, +1)
        counted = (old is not None and old.holds_slots) or (
            record is not None and record.holds_slots
        )
        return old, counted

    # -- node governance -----------------------------------------------------------------------

    def set_governor(self, node: str, governor: Governor | None) -> Governor | None:
        """Record who governs ``node``; move the node's slots between policies. Returns the old."""
        old = self._governors.get(node)
        if old == governor:
            return old
        if old is not None:
            for resource in old[1]:
                self._add_policy(old[0], resource, -self.node_usage(node, resource)[0])
            del self._governors[node]
            if not self._governors:
                self._shared.clear()  # nothing governed: nothing to share
        if governor is not None:
            governor = self._shared.setdefault(governor, governor)
            if len(self._shared) > 2 * len(self._governors) + 64:
                self._shared = {g: g for g in self._governors.values()}
            self._governors[node] = governor
            for resource in governor[1]:
                self._add_policy(governor[0], resource, self.node_usage(node, resource)[0])
        return old

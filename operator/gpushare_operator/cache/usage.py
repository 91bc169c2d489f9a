"""Incremental GPU-slot accounting: per node and per policy, O(1) per pod event.

Nothing here ever sums over all pods: a pod event moves its own contribution out of the
counters it was in and into the ones it is in now; a node whose governing policy changes moves
the node's total from one policy to the other.  ``core.records.pods.total`` is the from-scratch
reference that a property test holds these counters to.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from gpushare_operator.core.records.pods import PodRecord

Governor = tuple[str, tuple[str, ...]]  # (policy name, the resources it advertises)


class UsageLedger:
    def __init__(self) -> None:
        self.pods: dict[
            str, PodRecord
        ] = {}  # uid → record (only pods asking for tracked resources)
        # node → resource → [slots, pods]
        self._by_node: defaultdict[str, dict[str, list[int]]] = defaultdict(dict)
        # node → uids of the pods counted on it: exactly the pods whose ``_move`` added to
        # ``_by_node[node]`` (bound, not finished), so that evictions read one node's pods.
        self._on_node: defaultdict[str, set[str]] = defaultdict(set)
        self._governors: dict[str, Governor] = {}
        # policy → resource → slots held on the nodes it governs; no zero entries, and no
        # policy without one (a mixed MIG policy has a resource per profile).
        self._by_policy: defaultdict[str, dict[str, int]] = defaultdict(dict)

    # -- reads -----------------------------------------------------------------------------------

    def node_usage(self, node: str, resource: str) -> tuple[int, int]:
        counters = self._by_node.get(node, {}).get(resource)
        return (counters[0], counters[1]) if counters else (0, 0)

    def node_slots(self, node: str) -> dict[str, int]:
        """Slots held on ``node`` per resource (only resources some pod holds)."""
        return {resource: c[0] for resource, c in self._by_node.get(node, {}).items() if c[0]}

    def node_total(self, node: str) -> int:
        """Slots held on ``node`` over all resources, without building ``node_slots``'s dict
        (the rollout orders every waiting node by it on each admission)."""
        return sum(c[0] for c in self._by_node.get(node, {}).values())

    def node_pods(self, node: str) -> list[PodRecord]:
        """The pods counted on ``node`` (bound, not finished, asking for a tracked resource)."""
        return [self.pods[uid] for uid in self._on_node.get(node, ())]

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
        counters = self._by_node[node]
        governor = self._governors.get(node)
        if sign > 0:
            self._on_node[node].add(record.uid)
        else:
            held = self._on_node.get(node)
            if held is not None:
                held.discard(record.uid)
                if not held:
                    del self._on_node[node]
        for resource, amount in record.requests:
            slot = counters.setdefault(resource, [0, 0])
            slot[0] += sign * amount
            slot[1] += sign
            if slot == [0, 0]:
                del counters[resource]  # nodes come and go: keep no empty entries
            if governor is not None and resource in governor[1]:
                self._add_policy(governor[0], resource, sign * amount)
        if not counters:
            del self._by_node[node]

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
        if record is not None:
            self.pods[uid] = record
        if old == record:
            return old, False
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
        if governor is not None:
            self._governors[node] = governor
            for resource in governor[1]:
                self._add_policy(governor[0], resource, self.node_usage(node, resource)[0])
        return old

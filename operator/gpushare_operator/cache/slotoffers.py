"""The enforced slot classes the nodes' labels offer: what the memory-request webhook reads.

Read from the nodes' ``gpushare.dev/slot-*`` labels (which the leader writes once a node is
Verified), not from the leader's own decisions: every replica's node informer sees the same
labels, so a follower answers an admission exactly as the leader would, through a failover too.
Kept incrementally, one node's labels at a time; the sorted list is rebuilt only when a class
gains its first node or loses its last, so an admission reads a tuple and nothing more.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from gpushare_operator.core.records.nodes import POLICY_LABEL
from gpushare_operator.core.slots import slotclasses
from gpushare_operator.core.slots.slotclasses import Offer


class SlotOffers:
    def __init__(self) -> None:
        # node -> the offer its labels make; only nodes that make one.
        self._by_node: dict[str, Offer] = {}
        # offer -> nodes making it; no zero counts.
        self._nodes: Counter[Offer] = Counter()
        # Every offer in ``_nodes``, sorted by memory, then resource: None when it must be
        # rebuilt (a class appeared or went).
        self._sorted: tuple[Offer, ...] | None = ()

    def update(self, node: str, labels: Mapping[str, str] | None) -> None:
        """Take the node's labels now (None: the node is gone)."""
        new = None if labels is None else slotclasses.offer_of(labels, policy_label=POLICY_LABEL)
        old = self._by_node.get(node)
        if new == old:
            return
        if old is not None:
            self._nodes[old] -= 1
            if self._nodes[old] <= 0:
                del self._nodes[old]
                self._sorted = None
            del self._by_node[node]
        if new is not None:
            self._by_node[node] = new
            if new not in self._nodes:
                self._sorted = None
            self._nodes[new] += 1

    def offers(self) -> tuple[Offer, ...]:
        """Every class some node offers, smallest memory first (then by resource name)."""
        if self._sorted is None:
            self._sorted = tuple(sorted(self._nodes))
        return self._sorted

    def nodes(self, offer: Offer) -> int:
        return self._nodes.get(offer, 0)

    def of_node(self, node: str) -> Offer | None:
        return self._by_node.get(node)

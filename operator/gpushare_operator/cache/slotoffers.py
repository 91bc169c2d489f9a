"""The enforced slot classes the nodes' labels offer: what the memory-request webhook reads.

Read from the nodes' ``gpushare.dev/slot-*`` labels (which the leader writes once a node is
Verified), not from the leader's own decisions: every replica's node informer sees the same
labels, so a follower answers an admission exactly as the leader would, through a failover too.
Kept incrementally, one node's labels at a time; the sorted tuple is rebuilt only when a class
gains its first node or loses its last, so an admission reads a tuple and nothing more.  The
webhook answers on a thread of its own (``app.admission``): the tuple it reads is replaced
whole, on the main loop, and never changed in place.
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
        # Every offer in ``_nodes``, sorted by memory, then resource; replaced whole (never
        # changed in place) whenever a class appears or goes, so that another thread may read it.
        self._sorted: tuple[Offer, ...] = ()

    def update(self, node: str, labels: Mapping[str, str] | None) -> None:
        """Take the node's labels now (None: the node is gone)."""
        new = None if labels is None else slotclasses.offer_of(labels, policy_label=POLICY_LABEL)
        old = self._by_node.get(node)
        if new == old:
            return
        classes_changed = False
        if old is not None:
            self._nodes[old] -= 1
            if self._nodes[old] <= 0:
                del self._nodes[old]
                classes_changed = True
            del self._by_node[node]
        if new is not None:
            self._by_node[node] = new
            classes_changed = classes_changed or new not in self._nodes
            self._nodes[new] += 1
        if classes_changed:
            self._sorted = tuple(sorted(self._nodes))

    def offers(self) -> tuple[Offer, ...]:
        """Every class some node offers, smallest memory first (then by resource name)."""
        return self._sorted

    def nodes(self, offer: Offer) -> int:
        return self._nodes.get(offer, 0)

    def of_node(self, node: str) -> Offer | None:
        return self._by_node.get(node)

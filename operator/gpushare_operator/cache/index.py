"""node → matching policies, kept per node on label change and per policy on selector change.

A label change re-evaluates one node against every policy (≈50 compiled matchers); a selector
change re-evaluates every node against one policy.  Heartbeats never reach this module: the
node cache drops them before they become changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import CompiledPolicy

_NONE: frozenset[str] = frozenset()


class MatchIndex:
    def __init__(self) -> None:
        self._by_node: dict[str, frozenset[str]] = {}
        self._by_policy: dict[str, set[str]] = {}
        # Nodes of a pool match the same policies: a few dozen distinct sets for thousands of
        # nodes.  One shared frozenset per distinct set saves ~700 bytes per node.
        self._shared: dict[frozenset[str], frozenset[str]] = {}

    def policies_of(self, node: str) -> frozenset[str]:
        return self._by_node.get(node, _NONE)

    def nodes_of(self, policy: str) -> set[str]:
        return self._by_policy.get(policy) or set()

    def _set_node(self, node: str, matched: frozenset[str]) -> None:
        before = self._by_node.get(node, _NONE)
        if matched == before:
            return
        for policy in before - matched:
            self._by_policy.get(policy, set()).discard(node)
        for policy in matched - before:
            self._by_policy.setdefault(policy, set()).add(node)
        if matched:
            self._by_node[node] = self._shared.setdefault(matched, matched)
        else:
            self._by_node.pop(node, None)
        if len(self._shared) > 4 * len(self._by_policy) + 64 or not self._by_node:
            self._shared = {s: s for s in self._by_node.values()}  # drop unused sets

    def update_node(self, record: NodeRecord, policies: Iterable[CompiledPolicy]) -> bool:
        """Re-match one node; True when its set of matching policies changed."""
        before = self._by_node.get(record.name, _NONE)
        matched: frozenset[str] = _NONE
        if record.is_gpu_node:
            labels = record.labels
            matched = frozenset(
                p.name for p in policies if p.selector is not None and p.selector.matches(labels)
            )
        self._set_node(record.name, matched)
        return matched != before

    def remove_node(self, node: str) -> frozenset[str]:
        before = self._by_node.get(node, _NONE)
        self._set_node(node, _NONE)
        return before

    def update_policy(self, policy: CompiledPolicy, nodes: Mapping[str, NodeRecord]) -> set[str]:
        """Re-match every node against one policy; returns the nodes whose match changed."""
        before = set(self._by_policy.get(policy.name, ()))
        selector = policy.selector
        after: set[str] = set()
        if selector is not None:
            matches = selector.matches
            after = {n for n, r in nodes.items() if r.is_gpu_node and matches(r.labels)}
        changed = before ^ after
        for node in changed:
            current = self._by_node.get(node, _NONE)
            updated = current | {policy.name} if node in after else current - {policy.name}
            self._set_node(node, frozenset(updated))
        return changed

    def remove_policy(self, policy: str) -> set[str]:
        nodes = set(self._by_policy.pop(policy, ()))
        for node in nodes:
            self._set_node(node, self._by_node.get(node, _NONE) - {policy})
        return nodes

"""Dirty sets: what needs a fresh look, however many events said so.

Handlers never act on an event's delta; they mark objects dirty here.  A set holds each name once,
so a burst of events on one object costs one reconcile and at most one write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class DirtySet:
    def __init__(self) -> None:
        self.nodes: dict[str, None] = {}  # insertion-ordered set: first dirtied, first served
        self.policies: dict[str, None] = {}
        self.configmap = False
        self._wake: Callable[[], None] = lambda: None

    def set_waker(self, wake: Callable[[], None]) -> None:
        """Installed by the writer, so that marking something dirty wakes it up."""
        self._wake = wake

    def node(self, name: str) -> None:
        self.nodes[name] = None
        self._wake()

    def many_nodes(self, names: Iterable[str]) -> None:
        for name in names:
            self.nodes[name] = None
        self._wake()

    def policy(self, name: str) -> None:
        self.policies[name] = None
        self._wake()

    def many_policies(self, names: Iterable[str]) -> None:
        for name in names:
            self.policies[name] = None
        self._wake()

    def config(self) -> None:
        self.configmap = True
        self._wake()

    def __len__(self) -> int:
        return len(self.nodes) + len(self.policies) + int(self.configmap)

    def pop_node(self) -> str | None:
        if not self.nodes:
            return None
        name = next(iter(self.nodes))
        del self.nodes[name]
        return name

    def pop_policy(self) -> str | None:
        if not self.policies:
            return None
        name = next(iter(self.policies))
        del self.policies[name]
        return name

    def pop_config(self) -> bool:
        dirty, self.configmap = self.configmap, False
        return dirty

"""Informer sinks: how list/watch deliveries reach the cluster state, with replace semantics.

A re-list (first sync, or after 410 Gone) replaces a sink's contents: whatever the listing did
not mention was deleted while we were not watching, and leaves the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushare_operator.cache.state import ClusterState
from gpushare_operator.core import pods as core_pods


class NodeSink:
    """Informer sink for Nodes, with replace semantics on re-list."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._seen: set[str] | None = None

    def begin_relist(self) -> None:
        self._seen = set()

    def relist_item(self, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if self._seen is not None and isinstance(name, str):
            self._seen.add(name)
        self._state.upsert_node(obj)

    def end_relist(self) -> None:
        seen, self._seen = self._seen or set(), None
        for name in [n for n in self._state.nodes if n not in seen]:
            self._state.delete_node(name)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self._state.delete_node(str((obj.get("metadata") or {}).get("name")))
        else:
            self._state.upsert_node(obj)


class NodeStateSink:
    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._seen: set[str] | None = None

    def begin_relist(self) -> None:
        self._seen = set()

    def relist_item(self, obj: dict[str, Any]) -> None:
        if self._seen is not None:
            self._seen.add(str((obj.get("metadata") or {}).get("name")))
        self._state.upsert_node_state(obj)

    def end_relist(self) -> None:
        seen, self._seen = self._seen or set(), None
        for name in [n for n in self._state.node_states if n not in seen]:
            self._state.delete_node_state(name)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self._state.delete_node_state(str((obj.get("metadata") or {}).get("name")))
        else:
            self._state.upsert_node_state(obj)


class ConfigMapSink:
    """Sink for the single device-plugin ConfigMap (watched with a name field selector)."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._listed: Mapping[str, Any] | None = None
        self._first = True

    def begin_relist(self) -> None:
        self._listed = None

    def relist_item(self, obj: dict[str, Any]) -> None:
        self._listed = obj

    def end_relist(self) -> None:
        data = (self._listed or {}).get("data") if self._listed is not None else None
        self._state.set_config_data(
            data or ({} if self._listed is not None else None), initial=self._first
        )
        self._first = False

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        data = None if event_type == "DELETED" else (obj.get("data") or {})
        self._state.set_config_data(data, initial=False)


class PodSink:
    """Sink for Pods (the informer's field selector already leaves out finished ones)."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._seen: set[str] | None = None

    def begin_relist(self) -> None:
        self._seen = set()

    def relist_item(self, obj: dict[str, Any]) -> None:
        if self._seen is not None:
            self._seen.add(core_pods.uid_of(obj))
        self._state.upsert_pod(obj)

    def end_relist(self) -> None:
        seen, self._seen = self._seen or set(), None
        for uid in [u for u in self._state.usage.pods if u not in seen]:
            self._state.delete_pod(uid)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self._state.delete_pod(core_pods.uid_of(obj))
        else:
            self._state.upsert_pod(obj)

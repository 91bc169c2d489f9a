"""Informer sinks: how list/watch deliveries reach the cluster state, with replace semantics.

A re-list (first sync, or after 410 Gone) replaces a sink's contents: whatever the listing did
not mention was deleted while we were not watching, and leaves the cache.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from gpushare_operator.cache.budgets import budget_key
from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.records import pods as core_pods


class _ReplacingSink(abc.ABC):
    """A keyed sink: remembers what a re-list mentioned, and deletes the rest at its end."""

    def __init__(self, cache: ClusterCache) -> None:
        self._cache = cache
        self._seen: set[str] | None = None

    def key(self, obj: Mapping[str, Any]) -> str:
        return str((obj.get("metadata") or {}).get("name"))

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """Keys of everything the cache holds now."""

    @abc.abstractmethod
    def upsert(self, obj: dict[str, Any]) -> None:
        """Add or update one object."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Forget one object by key."""

    def begin_relist(self) -> None:
        self._seen = set()

    def relist_item(self, obj: dict[str, Any]) -> None:
        if self._seen is not None:
            self._seen.add(self.key(obj))
        self.upsert(obj)

    def end_relist(self) -> None:
        seen, self._seen = self._seen or set(), None
        for key in [k for k in self.keys() if k not in seen]:
            self.delete(key)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self.delete(self.key(obj))
        else:
            self.upsert(obj)


class NodeSink(_ReplacingSink):
    def keys(self) -> list[str]:
        return list(self._cache.nodes)

    def upsert(self, obj: dict[str, Any]) -> None:
        self._cache.upsert_node(obj)

    def delete(self, key: str) -> None:
        self._cache.delete_node(key)


class SliceSink(_ReplacingSink):
    """ResourceSlices (only ``gpu.nvidia.com`` ones are kept: ``cache.drastate``)."""

    def keys(self) -> list[str]:
        return self._cache.dra.slice_names()

    def upsert(self, obj: dict[str, Any]) -> None:
        self._cache.dra.upsert_slice(obj)

    def delete(self, key: str) -> None:
        self._cache.dra.delete_slice(key)


class ClaimSink(_ReplacingSink):
    """ResourceClaims, by uid (only those holding ``gpu.nvidia.com`` devices are kept)."""

    def key(self, obj: Mapping[str, Any]) -> str:
        return str((obj.get("metadata") or {}).get("uid"))

    def keys(self) -> list[str]:
        return self._cache.dra.claim_uids()

    def upsert(self, obj: dict[str, Any]) -> None:
        self._cache.dra.upsert_claim(obj)

    def delete(self, key: str) -> None:
        self._cache.dra.delete_claim(key)


class DeviceClassSink(_ReplacingSink):
    def keys(self) -> list[str]:
        return self._cache.dra.class_names()

    def upsert(self, obj: dict[str, Any]) -> None:
        self._cache.dra.upsert_class(obj)

    def delete(self, key: str) -> None:
        self._cache.dra.delete_class(key)


class NodeStateSink(_ReplacingSink):
    def keys(self) -> list[str]:
        return list(self._cache.node_states)

    def upsert(self, obj: dict[str, Any]) -> None:
        self._cache.upsert_node_state(obj)

    def delete(self, key: str) -> None:
        self._cache.delete_node_state(key)


class ConfigMapSink:
    """Sink for one ConfigMap watched with a name field selector: the device plugin's, or
    (``mig=True``) the mig-parted one."""

    def __init__(self, cache: ClusterCache, *, mig: bool = False) -> None:
        self._cache = cache
        self._listed: Mapping[str, Any] | None = None
        self._first = True
        self._set = cache.set_mig_config if mig else cache.set_config_data

    def begin_relist(self) -> None:
        self._listed = None

    def relist_item(self, obj: dict[str, Any]) -> None:
        self._listed = obj

    def end_relist(self) -> None:
        data = (self._listed or {}).get("data") if self._listed is not None else None
        self._set(
            data or ({} if self._listed is not None else None),
            initial=self._first,
            version=_version(self._listed),
            owners=data_owners(self._listed),
        )
        self._first = False

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        data = None if event_type == "DELETED" else (obj.get("data") or {})
        self._set(data, initial=False, version=_version(obj), owners=data_owners(obj))


def data_owners(obj: Mapping[str, Any] | None) -> dict[str, frozenset[str]] | None:
    """ConfigMap data key -> the field managers owning it; None when managedFields were not
    delivered (then what is known stays as it was)."""
    entries = ((obj or {}).get("metadata") or {}).get("managedFields")
    if not isinstance(entries, list):
        return None
    owners: dict[str, set[str]] = {}
    for entry in entries:
        fields = ((entry or {}).get("fieldsV1") or {}).get("f:data") or {}
        for field in fields:
            if isinstance(field, str) and field.startswith("f:"):
                owners.setdefault(field[2:], set()).add(str(entry.get("manager")))
    return {key: frozenset(managers) for key, managers in owners.items()}


def _version(obj: Mapping[str, Any] | None) -> str | None:
    version = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return str(version) if version is not None else None


class PodSink(_ReplacingSink):
    """Pods, keyed by uid (the informer's field selector already leaves out finished ones)."""

    def key(self, obj: Mapping[str, Any]) -> str:
        return core_pods.uid_of(obj)

    def keys(self) -> list[str]:
        return list(self._cache.usage.pods)

    def upsert(self, obj: dict[str, Any]) -> None:
        self._cache.upsert_pod(obj)

    def delete(self, key: str) -> None:
        self._cache.delete_pod(key)


class BudgetSink(_ReplacingSink):
    """PodDisruptionBudgets, keyed by namespace/name, into ``ClusterCache.budgets``."""

    def key(self, obj: Mapping[str, Any]) -> str:
        return budget_key(obj)

    def keys(self) -> list[str]:
        return self._cache.budgets.keys()

    def upsert(self, obj: dict[str, Any]) -> None:
        self._cache.budgets.upsert(obj)

    def delete(self, key: str) -> None:
        self._cache.budgets.delete(key)

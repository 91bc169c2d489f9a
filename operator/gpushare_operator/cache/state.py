"""The operator's picture of the cluster: slim records, indexes, and what it last wrote.

Fed by the informers (nodes, GPUNodeStates, the device-plugin ConfigMap) and by kopf's policy
events; read by the planner.  Every feed marks what it affects dirty and nothing more.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from gpushare_operator.cache.dirty import DirtySet
from gpushare_operator.cache.index import MatchIndex
from gpushare_operator.core import nodes as core_nodes
from gpushare_operator.core.nodes import NodeRecord
from gpushare_operator.core.policies import CompiledPolicy, compile_policy


class ClusterState:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.nodes: dict[str, NodeRecord] = {}
        self.policies: dict[str, CompiledPolicy] = {}
        self.policy_status: dict[str, Mapping[str, Any]] = {}
        self.node_states: dict[str, Mapping[str, Any]] = {}  # GPUNodeState name → status
        self.config_data: dict[str, str] | None = None  # None: ConfigMap absent
        self.config_synced = False
        self.key_seen_at: dict[str, float] = {}
        self.config_label_counts: Counter[str] = Counter()
        self.index = MatchIndex()
        self.dirty = DirtySet()
        # Payloads written but not yet seen back through a watch: (kind, name) → payload.
        self.in_flight: dict[tuple[str, str], Any] = {}

    # -- nodes (informer sink) -----------------------------------------------------------------

    def _count_config_label(self, record: NodeRecord | None, delta: int) -> None:
        if record is not None and record.config_label is not None:
            self.config_label_counts[record.config_label] += delta
            if self.config_label_counts[record.config_label] <= 0:
                del self.config_label_counts[record.config_label]

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            return
        old = self.nodes.get(name)
        if old is not None and core_nodes.content_unchanged(old, obj):
            return  # a heartbeat or another change we do not read: no index, no dirt
        if old is None and not core_nodes.is_gpu_node_body(obj):
            return  # non-GPU nodes are never kept
        new = core_nodes.project_node(obj)
        self.in_flight.pop(("node", name), None)
        self._count_config_label(old, -1)
        self._count_config_label(new, +1)
        self.nodes[name] = new
        before = self.index.policies_of(name)
        if old is None or old.labels != new.labels:
            self.index.update_node(new, self.policies.values())
        self.dirty.node(name)
        self.dirty.many_policies(before | self.index.policies_of(name))
        if old is None or old.config_label != new.config_label:
            self.dirty.config()

    def delete_node(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        if old is None:
            return
        self._count_config_label(old, -1)
        self.in_flight.pop(("node", name), None)
        self.dirty.many_policies(self.index.remove_node(name))
        self.dirty.config()

    # -- policies (kopf events) ---------------------------------------------------------------

    def upsert_policy(self, body: Mapping[str, Any]) -> None:
        metadata = body.get("metadata") or {}
        name = str(metadata.get("name"))
        uid = str(metadata.get("uid"))
        generation = int(metadata.get("generation") or 0)
        self.policy_status[name] = body.get("status") or {}
        self.in_flight.pop(("policy", name), None)
        old = self.policies.get(name)
        self.dirty.policy(name)
        if old is not None and (old.uid, old.generation) == (uid, generation):
            return  # status-only change (usually our own write): nothing to recompile
        new = compile_policy(name=name, uid=uid, generation=generation, spec=body.get("spec"))
        self.policies[name] = new
        self._reindex_policy(old, new)

    def _reindex_policy(self, old: CompiledPolicy | None, new: CompiledPolicy) -> None:
        if old is not None and old.selector == new.selector:
            affected = set(self.index.nodes_of(new.name))  # same nodes; priority or config changed
        else:
            changed = self.index.update_policy(new, self.nodes)
            affected = changed | set(self.index.nodes_of(new.name))
        self.dirty.many_nodes(affected)
        self.dirty.many_policies({p for n in affected for p in self.index.policies_of(n)})
        self.dirty.config()

    def delete_policy(self, name: str) -> None:
        if self.policies.pop(name, None) is None:
            return
        self.policy_status.pop(name, None)
        affected = self.index.remove_policy(name)
        self.dirty.many_nodes(affected)
        self.dirty.many_policies({p for n in affected for p in self.index.policies_of(n)})
        self.dirty.config()

    # -- GPUNodeStates and the ConfigMap (informer sinks) -------------------------------------

    def upsert_node_state(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        self.node_states[name] = obj.get("status") or {}
        self.in_flight.pop(("nodestate", name), None)
        if name in self.nodes:
            self.dirty.node(name)

    def delete_node_state(self, name: str) -> None:
        self.node_states.pop(name, None)
        self.in_flight.pop(("nodestate", name), None)
        if name in self.nodes:
            self.dirty.node(name)

    def set_config_data(self, data: Mapping[str, str] | None, *, initial: bool) -> None:
        """Record the ConfigMap; keys present at the first sync were written long ago."""
        now = self.clock()
        fresh = dict(data) if data is not None else None
        for key in fresh or {}:
            if key not in self.key_seen_at:
                self.key_seen_at[key] = float("-inf") if initial else now
        for key in list(self.key_seen_at):
            if fresh is None or key not in fresh:
                del self.key_seen_at[key]
        changed = fresh != self.config_data
        self.config_data = fresh
        self.config_synced = True
        self.in_flight.pop(("configmap", ""), None)
        if changed:
            self.dirty.config()
            self._dirty_nodes_waiting_on_keys()

    def _dirty_nodes_waiting_on_keys(self) -> None:
        for policy in self.policies.values():
            self.dirty.many_nodes(self.index.nodes_of(policy.name))
            self.dirty.policy(policy.name)


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

"""The operator's picture of the cluster: slim records, indexes, and what it last wrote.

Fed by the informers (nodes, GPUNodeStates, the device-plugin ConfigMap) and by kopf's policy
events; read by the planner.  Every feed marks what it affects dirty and nothing more.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpushare_operator.cache.budgets import BudgetCache
from gpushare_operator.cache.drastate import DraState
from gpushare_operator.cache.index import MatchIndex
from gpushare_operator.cache.migconfig import MigConfigState
from gpushare_operator.cache.slotoffers import SlotOffers
from gpushare_operator.cache.usage import UsageLedger
from gpushare_operator.core import resolution
from gpushare_operator.core.api import defaults
from gpushare_operator.core.deviceplugin.devconfigs import SharingConfig, parse_config_text
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records import nodes as core_nodes
from gpushare_operator.core.records import pods as core_pods
from gpushare_operator.core.records.nodes import NodeRecord
from gpushare_operator.core.records.policies import (
    CompiledPolicy,
    compile_policy,
    keep_last_good,
    keep_recorded,
)
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.core.workqueue import MIG_CONFIG, MIG_CONFIG_KEY, WorkQueue

ALWAYS_TRACKED = frozenset({core_nodes.GPU_RESOURCE, core_nodes.SHARED_RESOURCE})
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # devconfigs.MIG_RESOURCE_PREFIX: always kept
# How long a deleted policy's uid is remembered: longer than any list of policies can take to
# answer, so a list that began before the delete cannot bring it back.
TOMBSTONE_SECONDS = 600.0


def _version(metadata: Mapping[str, Any]) -> int | None:
    """A resourceVersion as a number (an etcd revision on every real server), or None."""
    text = metadata.get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


class ClusterCache:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
        dra_sharing: bool = False,
    ) -> None:
        self.clock = clock
        # --dra-sharing: TimeSlicing and MPS under backend DRA compile (core.drasharing).
        self.dra_sharing = dra_sharing
        self.wallclock = wallclock
        self.nodes: dict[str, NodeRecord] = {}
        # Node name -> resourceVersion of the newest Node the informer delivered; a write's
        # answer may be ahead of it (see ``watch_shows``).  Only for nodes in ``nodes``.
        self.node_watched: dict[str, int] = {}
        self.policies: dict[str, CompiledPolicy] = {}
        self.policy_status: dict[str, Mapping[str, Any]] = {}
        self.policy_versions: dict[str, int] = {}  # name -> resourceVersion of what we hold
        self.deleted_policies: dict[str, float] = {}  # uid -> when its delete was seen
        self.node_states: dict[str, Mapping[str, Any]] = {}  # GPUNodeState name → status
        # GPUNodeState name → uid: what an Event about the object itself needs (kubectl
        # describe finds Events by uid); only for the states in node_states.
        self.node_state_uids: dict[str, str] = {}
        self.config_data: dict[str, str] | None = None  # None: ConfigMap absent
        # data key -> the field managers that own it (from managedFields, when delivered)
        self.config_owners: dict[str, frozenset[str]] = {}
        self.config_synced = False
        self.config_version: int | None = None  # resourceVersion of what config_data shows
        # Every key of config_data -> what it configures (None: not a config gpushare renders).
        self.key_configs: dict[str, SharingConfig | None] = {}
        self.key_seen_at: dict[str, float] = {}
        # The same moments on the wall clock, fixed once: a published wait never drifts.
        self.key_seen_wall: dict[str, float] = {}
        self.config_label_counts: Counter[str] = Counter()
        self.mig_config = MigConfigState(clock=clock, wallclock=wallclock)
        self.mig_config_name = defaults.MIG_PARTED_CONFIGMAP  # set by the assembly, for messages
        self.policy_label_counts: Counter[str] = Counter()  # policy label value -> nodes
        # The same, of the nodes that carry our DRA switch (their class must stay).
        self.dra_label_counts: Counter[str] = Counter()
        # Policies being deleted (deletionTimestamp set): they govern nothing, and are kept
        # until our finalizer goes, which is when no node carries their label any more.
        self.deleting: set[str] = set()
        # Moves on every change of a compiled policy (spec, generation, deletion, removal): the
        # admission pass looks again at each, a rollout-only edit included.
        self.policy_epoch = 0
        self.policy_finalizers: dict[str, tuple[str, ...]] = {}
        self.index = MatchIndex()
        # What needs a fresh look: the cache only marks it; the writer takes it (see workqueue).
        self.queue = WorkQueue(clock=clock)
        # Payloads written but not yet seen back through a watch: (kind, name) → payload.
        self.in_flight: dict[tuple[str, str], Any] = {}
        self.usage = UsageLedger()
        # ResourceSlices of gpu.nvidia.com and DeviceClasses (backend DRA).
        self.dra = DraState(queue=self.queue)
        self.dra.on_classes = self._device_classes_changed
        self.dra.on_usage = self._claims_changed
        # PodDisruptionBudgets, for the victims podPolicy Evict chooses; they say which pod
        # labels the pod records keep.
        self.budgets = BudgetCache()
        # The enforced slot classes the nodes' labels offer (the memory-request webhook's).
        self.slot_offers = SlotOffers()
        # The resources pod records are kept for.  Replaced whole, never changed in place: the
        # webhook's thread reads it (app.admission).
        self.tracked_resources: set[str] = set(ALWAYS_TRACKED)
        # Called when a policy advertises a resource no pod was kept for: the pod informer
        # re-lists, so that pods asking for it (skipped so far) are not missed.
        self.on_new_resource: Callable[[], None] = lambda: None

    # -- our own writes -----------------------------------------------------------------------

    def sent(self, kind: str, name: str, payload: Any) -> None:
        """We wrote ``payload`` to (kind, name); until its watch event shows it, plans compare
        with it too, so that the write is not made again."""
        self.in_flight[(kind, name)] = payload

    def finalizers_set(self, name: str, finalizers: tuple[str, ...]) -> None:
        """A finalizer patch answered without the object: its result, until the watch shows it."""
        if name in self.policies:
            self._finalizers(name, finalizers)

    def _finalizers(self, name: str, finalizers: tuple[str, ...]) -> None:
        # Nodes wait for our finalizer before they are admitted: its coming is news to the
        # rollout as much as a spec edit is.
        if self.policy_finalizers.get(name) != finalizers:
            self.policy_finalizers[name] = finalizers
            self.policy_epoch += 1

    # -- governance ----------------------------------------------------------------------------

    def candidates(self, node: str) -> list[CompiledPolicy]:
        """Usable policies matching ``node``, the winner by priority and name first."""
        policies = self.policies
        matched = (policies[p] for p in self.index.policies_of(node) if p in policies)
        deleting = self.deleting
        return resolution.ranked(p for p in matched if p.usable and p.name not in deleting)

    def governing(self, node: str) -> CompiledPolicy | None:
        """The policy that governs ``node``: the first usable match by rank that can work
        there (falling through an Unsupported one), else the first, which reports why not."""
        record = self.nodes.get(node)
        if record is None:
            return None
        return nodephases.choose(record, self.candidates(node))

    def _refresh_governors(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            record = self.nodes.get(node)
            policy = self.governing(node) if record is not None else None
            governor = None
            if (
                policy is not None
                and policy.sharing is not None
                and record is not None
                and nodephases.unsupported(record, policy) is None  # no slots there to use
            ):
                governor = (policy.name, policy.resources)
            old = self.usage.set_governor(node, governor)
            if old != governor:
                self.queue.many_policies(g[0] for g in (old, governor) if g is not None)

    def dra_policies(self) -> list[CompiledPolicy]:
        """Usable policies of backend DRA, not being deleted."""
        return [
            p for p in self.policies.values() if p.usable and p.dra and p.name not in self.deleting
        ]

    def _device_classes_changed(self) -> None:
        """A DeviceClass came, went or changed: DRA policies' nodes may stop waiting for theirs
        (or meet a conflict), and the class writer looks again."""
        policies = {p.name for p in self.dra_policies()}
        self.queue.many_nodes({n for p in policies for n in self.index.nodes_of(p)})
        self.queue.many_policies(policies)

    def _claims_changed(self, node: str) -> None:
        """What claims hold on a node changed: its status and its policy's count again."""
        if node in self.nodes:
            self.queue.node(node)
        governor = self.usage.governor(node)
        if governor is not None:
            self.queue.policy(governor[0])

    # -- nodes (informer sink) -----------------------------------------------------------------

    def _count_config_label(self, record: NodeRecord | None, delta: int) -> None:
        if record is None:
            return
        self.mig_config.count(record.mig_config_label, delta)
        dra_policy = record.policy_label if dra.is_on(record) else None
        for counts, value in (
            (self.config_label_counts, record.config_label),
            (self.policy_label_counts, record.policy_label),
            (self.dra_label_counts, dra_policy),
        ):
            if value is not None:
                counts[value] += delta
                if counts[value] <= 0:
                    del counts[value]

    def upsert_node(self, obj: Mapping[str, Any], *, answer: bool = False) -> None:
        """Take a Node from the informer, or (``answer``) as a write of ours returned it."""
        name = (obj.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            return
        old = self.nodes.get(name)
        if not answer and old is not None and self._watched(name, obj, old):
            self.queue.node(name)
        if old is not None and core_nodes.content_unchanged(old, obj):
            return  # a heartbeat or another change we do not read: no index, no dirt
        if old is not None and core_nodes.older_than(obj, old):
            return  # the watch catching up to what a write's response already told us
        if old is None and not core_nodes.is_gpu_node_body(obj):
            return  # non-GPU nodes are never kept
        new = core_nodes.project_node(obj)
        if old is not None and old.mig_config_owners and not core_nodes.has_managed_fields(obj):
            new = core_nodes.keep_mig_owners(new, old)  # a write's answer, slimmed: same owners
        self.in_flight.pop(("node", name), None)
        self._count_config_label(old, -1)
        self._count_config_label(new, +1)
        self.nodes[name] = new
        version = _version(obj.get("metadata") or {})
        if old is None and not answer and version is not None:
            self.node_watched[name] = version
        before = self.index.policies_of(name)
        # Capacity alone can make (or unmake) a GPU node: that re-matches it too.
        if old is None or old.labels != new.labels or old.is_gpu_node != new.is_gpu_node:
            self.slot_offers.update(name, new.labels)
            self.index.update_node(new, self.policies.values())
            self._refresh_governors((name,))
        self.queue.node(name)
        self.queue.many_policies(before | self.index.policies_of(name))
        if old is None or (old.config_label, old.mig_config_label) != (
            new.config_label,
            new.mig_config_label,
        ):
            self.queue.config()

    def _watched(self, name: str, obj: Mapping[str, Any], old: NodeRecord) -> bool:
        """Note the version the informer delivered; True when it catches up with a write's
        answer that put our taint in the record: a plan waiting for the watch to show the
        taint (``reconcile.drains``) may go on now."""
        version = _version(obj.get("metadata") or {})
        if version is None:
            return False
        before = self.node_watched.get(name)
        self.node_watched[name] = version
        held = _version({"resourceVersion": old.resource_version})
        caught_up = held is not None and (before is None or before < held) and version >= held
        return caught_up and any(rollouts.is_ours(taint) for taint in old.taints)

    def watch_shows(self, name: str) -> bool:
        """Whether the node's record is one the informer has delivered, not only a write's
        answer: the change has reached the API server's watchers (ours at least), not just
        etcd."""
        record = self.nodes.get(name)
        if record is None:
            return False
        held = _version({"resourceVersion": record.resource_version})
        return held is None or self.node_watched.get(name, -1) >= held

    def delete_node(self, name: str) -> None:
        self.node_watched.pop(name, None)
        old = self.nodes.pop(name, None)
        if old is None:
            return
        self._count_config_label(old, -1)
        self.slot_offers.update(name, None)
        self.in_flight.pop(("node", name), None)
        self.queue.node(name)  # the planner forgets its clocks for it
        self.queue.many_policies(self.index.remove_node(name))
        self._refresh_governors((name,))
        self.queue.config()

    # -- policies (kopf events) ---------------------------------------------------------------

    def upsert_policy(self, body: Mapping[str, Any]) -> None:
        """Take a policy from kopf's watch or from a list, whichever arrives; never go back.

        Both feed this one method, and either may be older than what is held: a list answered
        before a watch event was applied, or one that began before a delete.  So a deleted uid
        never returns, and for the same uid neither the resourceVersion nor the generation may
        move backwards.
        """
        metadata = body.get("metadata") or {}
        name = str(metadata.get("name"))
        uid = str(metadata.get("uid"))
        generation = int(metadata.get("generation") or 0)
        version = _version(metadata)
        if uid in self.deleted_policies:
            return  # a list that started before the delete: the policy is gone for good
        held = self.policies.get(name)
        if held is not None and held.uid == uid:
            known = self.policy_versions.get(name)
            if generation < held.generation or (
                version is not None and known is not None and version < known
            ):
                return  # older than what we hold
        if version is not None:
            self.policy_versions[name] = version
        self._track_metadata(name, metadata)
        self.policy_status[name] = body.get("status") or {}
        self.in_flight.pop(("policy", name), None)
        old = self.policies.get(name)
        self.queue.policy(name)
        if old is not None and (old.uid, old.generation) == (uid, generation):
            return  # status-only change (usually our own write): nothing to recompile
        new = compile_policy(
            name=name,
            uid=uid,
            generation=generation,
            spec=body.get("spec"),
            dra_sharing=self.dra_sharing,
        )
        if old is not None:
            new = keep_last_good(old, new)
        else:
            new = keep_recorded(new, body.get("status"), dra_sharing=self.dra_sharing)
        self.policies[name] = new
        self.policy_epoch += 1
        self._track_resource(new)
        self._reindex_policy(old, new)

    def _track_metadata(self, name: str, metadata: Mapping[str, Any]) -> None:
        """Finalizers and deletion: neither changes the generation the early return keys on."""
        self._finalizers(name, tuple(str(f) for f in metadata.get("finalizers") or ()))
        if metadata.get("deletionTimestamp") and name not in self.deleting:
            self.deleting.add(name)
            self.policy_epoch += 1
            affected = set(self.index.nodes_of(name))
            self._refresh_governors(affected)
            self.queue.many_nodes(affected)
            self.queue.many_policies({p for n in affected for p in self.index.policies_of(n)})
            self.queue.config()

    def _reindex_policy(self, old: CompiledPolicy | None, new: CompiledPolicy) -> None:
        if old is not None and old.selector == new.selector:
            affected = set(self.index.nodes_of(new.name))  # same nodes; priority or config changed
        else:
            changed = self.index.update_policy(new, self.nodes)
            affected = changed | set(self.index.nodes_of(new.name))
        self._refresh_governors(affected)
        self.queue.many_nodes(affected)
        self.queue.many_policies({p for n in affected for p in self.index.policies_of(n)})
        self.queue.config()

    def delete_policy(self, name: str, *, uid: str | None = None) -> None:
        """Forget a policy; ``uid``, when given, must be the one held (a stale delete of an
        earlier incarnation of the name must not remove the new one)."""
        held = self.policies.get(name)
        if held is None or (uid is not None and uid != held.uid):
            return
        self.deleted_policies[held.uid] = self.clock()
        del self.policies[name]
        self.policy_epoch += 1
        self.deleting.discard(name)
        self.policy_finalizers.pop(name, None)
        self.policy_status.pop(name, None)
        self.policy_versions.pop(name, None)
        self.in_flight.pop(("policy", name), None)
        self._untrack_unused_resources()
        self.queue.policy(name)  # the planner forgets what it rendered for it
        affected = self.index.remove_policy(name)
        self._refresh_governors(affected)
        self.queue.many_nodes(affected)
        self.queue.many_policies({p for n in affected for p in self.index.policies_of(n)})
        self.queue.config()

    def expire_tombstones(self) -> None:
        """Forget deleted uids that no list in flight can still carry."""
        if not self.deleted_policies:
            return
        now = self.clock()
        for gone, since in list(self.deleted_policies.items()):
            if now - since > TOMBSTONE_SECONDS:
                del self.deleted_policies[gone]

    def _untrack_unused_resources(self) -> None:
        """Stop keeping pod requests of a resource no policy advertises any more; pods that
        asked only for it leave the ledger, as a fresh list would leave them out."""
        tracked = set(ALWAYS_TRACKED).union(
            resource for p in self.policies.values() for resource in p.resources
        )
        if tracked == self.tracked_resources:
            return
        self.tracked_resources = tracked
        for uid, record in list(self.usage.pods.items()):
            kept = tuple(
                (r, n)
                for r, n in record.requests
                if r in tracked or r.startswith(MIG_RESOURCE_PREFIX)
            )
            if kept != record.requests:
                slim = dataclasses.replace(record, requests=kept) if kept else None
                self._pod_changed(uid, slim)

    def tracks(self, resource: str) -> bool:
        """Whether pod requests of ``resource`` are kept: the resources policies advertise,
        and every MIG device resource whatever the policies say now, so that a pod on a MIG
        device holds a layout change however the policies changed since."""
        return resource in self.tracked_resources or resource.startswith(MIG_RESOURCE_PREFIX)

    def _track_resource(self, policy: CompiledPolicy) -> None:
        new = set(policy.resources) - self.tracked_resources
        if new:
            self.tracked_resources = self.tracked_resources | new
            self.on_new_resource()

    # -- pods (informer sink) ------------------------------------------------------------------

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        record = core_pods.project_pod(obj, tracked=self.tracks, label_keys=self.budgets.label_keys)
        self._pod_changed(core_pods.uid_of(obj), record)

    def delete_pod(self, uid: str) -> None:
        self._pod_changed(uid, None)

    def _pod_changed(self, uid: str, record: core_pods.PodRecord | None) -> None:
        old, counted = self.usage.replace(uid, record)
        if not counted:
            return
        for node in {r.node for r in (old, record) if r is not None and r.node is not None}:
            if node in self.nodes:
                self.queue.node(node)
            governor = self.usage.governor(node)
            if governor is not None:
                self.queue.policy(governor[0])

    # -- GPUNodeStates and the ConfigMap (informer sinks) -------------------------------------

    def upsert_node_state(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        self.node_states[name] = obj.get("status") or {}
        uid = (obj.get("metadata") or {}).get("uid")
        if isinstance(uid, str):
            self.node_state_uids[name] = uid
        self.in_flight.pop(("nodestate", name), None)
        if name in self.nodes:
            self.queue.node(name)

    def delete_node_state(self, name: str) -> None:
        self.node_states.pop(name, None)
        self.node_state_uids.pop(name, None)
        self.in_flight.pop(("nodestate", name), None)
        if name in self.nodes:
            self.queue.node(name)

    def set_config_data(
        self,
        data: Mapping[str, str] | None,
        *,
        initial: bool,
        version: str | None = None,
        owners: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        """Record the ConfigMap; keys present at the first sync were written long ago.

        The writer records its own write's answer at once, so a watch event older than that
        answer (``version`` lower) may still arrive after it: it is ignored, not taken as a
        revert.
        """
        number = int(version) if version and version.isdigit() else None
        known = self.config_version
        if number is not None and known is not None and number < known:
            return
        self.config_version = number
        if owners is not None or data is None:
            self.config_owners = dict(owners or {})
        now, wall = self.clock(), self.wallclock()
        fresh = dict(data) if data is not None else None
        for key in fresh or {}:
            if key not in self.key_seen_at:
                self.key_seen_at[key] = float("-inf") if initial else now
                self.key_seen_wall[key] = float("-inf") if initial else wall
        for key in list(self.key_seen_at):
            if fresh is None or key not in fresh:
                del self.key_seen_at[key]
                self.key_seen_wall.pop(key, None)
        changed = fresh != self.config_data
        self._parse_keys(fresh)
        self.config_data = fresh
        self.config_synced = True
        self.in_flight.pop(("configmap", ""), None)
        if changed:
            self.queue.config()
            self._dirty_nodes_waiting_on_keys()

    def set_mig_config(
        self,
        data: Mapping[str, str] | None,
        *,
        initial: bool,
        version: str | None = None,
        owners: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        """Record the mig-parted ConfigMap (None: absent)."""
        self.in_flight.pop(("configmap", MIG_CONFIG), None)
        if self.mig_config.set(data, initial=initial, version=version, owners=owners):
            self.queue.add(MIG_CONFIG_KEY)
            for policy in self.policies.values():
                if policy.mig is not None:
                    self.queue.many_nodes(self.index.nodes_of(policy.name))
                    self.queue.policy(policy.name)

    def _parse_keys(self, fresh: Mapping[str, str] | None) -> None:
        """What each key configures, parsed once per key and text (keys are few): whether a node
        runs the config its label names is judged from it (``RolloutBook.unavailable_for``)."""
        old = self.config_data or {}
        parsed = self.key_configs
        self.key_configs = {
            key: parsed[key] if key in parsed and old.get(key) == text else parse_config_text(text)
            for key, text in (fresh or {}).items()
        }

    def settle_initial_keys(self) -> None:
        self.mig_config.settle_initial()
        self._settle_initial_config_keys()

    def _settle_initial_config_keys(self) -> None:
        """Once every cache has synced: a key present at startup but named by no node may be
        only seconds old (a leader wrote it and died), so it waits the propagation delay from now;
        a key some node already names has evidently propagated."""
        now, wall = self.clock(), self.wallclock()
        for key, seen in self.key_seen_at.items():
            if seen == float("-inf") and not self.config_label_counts.get(key):
                self.key_seen_at[key] = now
                self.key_seen_wall[key] = wall

    def _dirty_nodes_waiting_on_keys(self) -> None:
        for policy in self.policies.values():
            self.queue.many_nodes(self.index.nodes_of(policy.name))
            self.queue.policy(policy.name)

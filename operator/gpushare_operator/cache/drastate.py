"""What the cluster shows of DRA: ``gpu.nvidia.com`` ResourceSlices per node, the claims that
hold their devices, and DeviceClasses.

Fed by three informers (``app.assembly``); read by the planner.  Slices are kept slim
(``core.dra.driver.SliceRecord``: devices by name, type and memory, nothing else), only for driver
``gpu.nvidia.com``, and indexed by node so that a node's plan reads its own slices only.  A
change marks the node it is about dirty.  Claims are kept only while they hold
``gpu.nvidia.com`` devices (``core.dra.draclaims.ClaimRecord``: the (node, device) pairs and the
pods
they serve), indexed by node: a DRA node's allocated slots are counted from them, not from
pod specs (a pod may ask through a ResourceClaimTemplate and name no resource at all); a
change marks the nodes it touches, through ``on_usage``.  A DeviceClass change marks every
node whose policy is of backend DRA (their wait for the class, or a conflict, may end),
through ``on_classes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpushare_operator.core.dra import draclaims, draclasses
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.workqueue import WorkQueue


class DraState:
    def __init__(self, *, queue: WorkQueue) -> None:
        self._queue = queue
        # Slice name -> its record; every record's node has the name in _by_node.
        self.slices: dict[str, dra.SliceRecord] = {}
        # Node name -> names of its slices; never an empty set (the node is dropped instead).
        self._by_node: dict[str, set[str]] = {}
        # DeviceClass name -> its record (every class: a foreign one may conflict with ours).
        self.classes: dict[str, draclasses.ClassRecord] = {}
        # Called after a DeviceClass change (the cache marks the DRA policies' nodes).
        self.on_classes: Callable[[], None] = lambda: None
        # Claim uid -> its record: only claims holding gpu.nvidia.com devices (core.dra.driver).
        self.claims: dict[str, draclaims.ClaimRecord] = {}
        # Node (pool) -> uids of the claims holding devices there: every claim is indexed under
        # each of its record's nodes and nowhere else; never an empty set.
        self._claims_on: dict[str, set[str]] = {}
        # Called with each node whose claims changed (the cache marks it and its policy).
        self.on_usage: Callable[[str], None] = lambda node: None

    # -- slices (informer sink) ------------------------------------------------------------

    def upsert_slice(self, obj: Mapping[str, Any]) -> None:
        record = dra.slice_record(obj)
        name = str((obj.get("metadata") or {}).get("name"))
        old = self.slices.get(name)
        if record is None:
            if old is not None:  # its driver or node changed: not ours to read any more
                self.delete_slice(name)
            return
        if old == record:
            return  # a change of nothing we read
        if old is not None and old.node != record.node:
            self._unindex(old)
        self.slices[name] = record
        self._by_node.setdefault(record.node, set()).add(name)
        self._queue.node(record.node)

    def delete_slice(self, name: str) -> None:
        old = self.slices.pop(name, None)
        if old is not None:
            self._unindex(old)

    def _unindex(self, old: dra.SliceRecord) -> None:
        names = self._by_node.get(old.node)
        if names is not None:
            names.discard(old.name)
            if not names:
                del self._by_node[old.node]
        self._queue.node(old.node)

    def devices(self, node: str) -> tuple[dra.Device, ...]:
        """The devices the node's newest pool generation lists
        (``core.dra.driver.node_devices``)."""
        names = self._by_node.get(node)
        if not names:
            return ()
        return dra.node_devices(self.slices[n] for n in names)

    def slice_names(self) -> list[str]:
        return list(self.slices)

    # -- claims (informer sink) ------------------------------------------------------------

    def upsert_claim(self, obj: Mapping[str, Any]) -> None:
        record = draclaims.claim_record(obj)
        uid = str((obj.get("metadata") or {}).get("uid"))
        old = self.claims.get(uid)
        if record is None:
            self.delete_claim(uid)  # deallocated, or never ours to count
            return
        if old == record:
            return  # a change of nothing we read (most claim updates)
        nodes = record.nodes
        if old is not None:
            self._unindex_claim(old)
        self.claims[uid] = record
        for node in nodes:
            self._claims_on.setdefault(node, set()).add(uid)
        for node in nodes | old.nodes if old is not None else nodes:
            self.on_usage(node)

    def delete_claim(self, uid: str) -> None:
        old = self.claims.pop(uid, None)
        if old is not None:
            self._unindex_claim(old)
            for node in old.nodes:
                self.on_usage(node)

    def _unindex_claim(self, old: draclaims.ClaimRecord) -> None:
        for node in old.nodes:
            uids = self._claims_on.get(node)
            if uids is not None:
                uids.discard(old.uid)
                if not uids:
                    del self._claims_on[node]

    def claim_uids(self) -> list[str]:
        return list(self.claims)

    def held(self, node: str) -> tuple[int, int]:
        """How many devices claims hold on ``node``, and the pods they serve."""
        devices, pods = self.held_devices(node)
        return len(devices), pods

    def held_devices(self, node: str) -> tuple[frozenset[str], int]:
        """The devices claims hold on ``node``, and the pods they serve
        (``core.dra.draclaims.held_on``)."""
        uids = self._claims_on.get(node)
        if not uids:
            return frozenset(), 0
        return draclaims.held_on(node, (self.claims[u] for u in uids))

    # -- device classes (informer sink) ----------------------------------------------------

    def upsert_class(self, obj: Mapping[str, Any]) -> None:
        record = draclasses.class_record(obj)
        if self.classes.get(record.name) == record:
            return
        self.classes[record.name] = record
        self.on_classes()

    def delete_class(self, name: str) -> None:
        if self.classes.pop(name, None) is not None:
            self.on_classes()

    def class_names(self) -> list[str]:
        return list(self.classes)

    def readiness(self, *resources: str, config: str | None = None) -> dra.Readiness:
        """Whether our classes for ``resources`` are all there carrying ``config`` (a sharing
        policy's GpuConfig, or none), and the first conflict: a foreign class claiming one of
        them, or ours carrying another DRA policy's config."""
        ready, conflict = True, None
        for resource in resources:
            ours = self.classes.get(draclasses.class_name(resource))
            ready = ready and ours is not None and ours.ours and ours.extended_resource == resource
            clash = draclasses.conflicts(resource, self.classes.values())
            if clash and conflict is None:
                conflict = (
                    f"DeviceClass(es) {', '.join(clash)} not written by gpushare also serve"
                    f" extendedResourceName {resource}; the API server picks the class created"
                    " later, so which one a pod gets is chance: remove theirs, or set backend"
                    " DevicePlugin"
                )
            if ready and ours is not None and ours.config != config and conflict is None:
                ready = False
                conflict = draclasses.config_conflict(resource, held=ours.config, wanted=config)
        return dra.Readiness(class_ready=ready, conflict=conflict)

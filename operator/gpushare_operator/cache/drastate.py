"""What the cluster shows of DRA: ``gpu.nvidia.com`` ResourceSlices per node, and DeviceClasses.

Fed by two informers (``app.assembly``); read by the planner.  Slices are kept slim
(``core.dra.SliceRecord``: devices by name, type and memory, nothing else), only for driver
``gpu.nvidia.com``, and indexed by node so that a node's plan reads its own slices only.  A
change marks the node it is about dirty; a DeviceClass change marks every node whose policy
is of backend DRA (their wait for the class, or a conflict, may end), through ``on_classes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpushare_operator.core import dra
from gpushare_operator.core.workqueue import WorkQueue


class DraState:
    def __init__(self, *, queue: WorkQueue) -> None:
        self._queue = queue
        # Slice name -> its record; every record's node has the name in _by_node.
        self.slices: dict[str, dra.SliceRecord] = {}
        # Node name -> names of its slices; never an empty set (the node is dropped instead).
        self._by_node: dict[str, set[str]] = {}
        # DeviceClass name -> its record (every class: a foreign one may conflict with ours).
        self.classes: dict[str, dra.ClassRecord] = {}
        # Called after a DeviceClass change (the cache marks the DRA policies' nodes).
        self.on_classes: Callable[[], None] = lambda: None

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
        """The devices the node's newest pool generation lists (``core.dra.node_devices``)."""
        names = self._by_node.get(node)
        if not names:
            return ()
        return dra.node_devices(self.slices[n] for n in names)

    def slice_names(self) -> list[str]:
        return list(self.slices)

    # -- device classes (informer sink) ----------------------------------------------------

    def upsert_class(self, obj: Mapping[str, Any]) -> None:
        record = dra.class_record(obj)
        if self.classes.get(record.name) == record:
            return
        self.classes[record.name] = record
        self.on_classes()

    def delete_class(self, name: str) -> None:
        if self.classes.pop(name, None) is not None:
            self.on_classes()

    def class_names(self) -> list[str]:
        return list(self.classes)

    def readiness(self, resource: str) -> dra.Readiness:
        """Whether our class for ``resource`` is there, and any foreign class claiming it."""
        ours = self.classes.get(dra.class_name(resource))
        clash = dra.conflicts(resource, self.classes.values())
        conflict = None
        if clash:
            conflict = (
                f"DeviceClass(es) {', '.join(clash)} not written by gpushare also serve"
                f" extendedResourceName {resource}; the API server picks the class created"
                " later, so which one a pod gets is chance: remove theirs, or set backend"
                " DevicePlugin"
            )
        ready = ours is not None and ours.ours and ours.extended_resource == resource
        return dra.Readiness(class_ready=ready, conflict=conflict)

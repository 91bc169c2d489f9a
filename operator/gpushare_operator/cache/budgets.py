"""PodDisruptionBudgets, as slim records by namespace, and the pod label keys they read.

Fed by an informer on policy/v1 ``poddisruptionbudgets`` (``cache.sinks.BudgetSink``): each
event replaces one record (``core.rollout.budgets.project_budget``: namespace, name, the selector
compiled once, ``disruptionsAllowed``, ``disruptedPods``; nothing else of the object is kept)
and moves the count of the label keys its selector reads.  Read when podPolicy Evict chooses
its victims (``reconcile.drains``, the plugin's plan): the budgets of one node's pods'
namespaces, never a copy of the whole collection.

Pod records keep only the labels under ``label_keys``; when a budget brings a key no budget
read before, the pods are listed again (``on_new_keys``) so that every record carries it.
A key no budget reads any more is dropped from what new records keep; records made earlier
keep it until their pod changes (no budget reads it, so it changes nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.core.rollout.budgets import BudgetRecord, project_budget


def budget_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a PodDisruptionBudget body."""
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


class BudgetCache:
    def __init__(self) -> None:
        # namespace -> name -> record; no empty namespace entry
        self._by_namespace: dict[str, dict[str, BudgetRecord]] = {}
        self._key_counts: Counter[str] = Counter()  # label key -> budgets whose selector reads it
        self.label_keys: frozenset[str] = frozenset()  # the keys of _key_counts, for pod records
        # Called when label_keys gains a key: the pod informer lists again (see above).
        self.on_new_keys: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return sum(len(names) for names in self._by_namespace.values())

    def keys(self) -> list[str]:
        """``namespace/name`` of every budget held."""
        return [f"{ns}/{name}" for ns, names in self._by_namespace.items() for name in names]

    def get(self, key: str) -> BudgetRecord | None:
        namespace, _, name = key.partition("/")
        return self._by_namespace.get(namespace, {}).get(name)

    def around(self, pods: Iterable[PodRecord]) -> list[BudgetRecord]:
        """The budgets of the namespaces ``pods`` live in: all that could cover one of them."""
        namespaces = sorted({pod.namespace for pod in pods})
        return [
            budget
            for namespace in namespaces
            for budget in self._by_namespace.get(namespace, {}).values()
        ]

    def upsert(self, obj: Mapping[str, Any]) -> None:
        record = project_budget(obj)
        held = self._by_namespace.setdefault(record.namespace, {})
        old = held.get(record.name)
        if old == record:
            return  # a status or metadata change the victim choice does not read
        held[record.name] = record
        self._recount(old, record)

    def delete(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        held = self._by_namespace.get(namespace)
        old = held.pop(name, None) if held is not None else None
        if held is not None and not held:
            del self._by_namespace[namespace]
        if old is not None:
            self._recount(old, None)

    def _recount(self, old: BudgetRecord | None, new: BudgetRecord | None) -> None:
        before = (old.label_keys if old is not None else frozenset(), -1)
        after = (new.label_keys if new is not None else frozenset(), +1)
        if before[0] == after[0]:
            return
        for keys, delta in (before, after):
            for key in keys:
                self._key_counts[key] += delta
                if self._key_counts[key] <= 0:
                    del self._key_counts[key]
        wider = not self._key_counts.keys() <= self.label_keys
        self.label_keys = frozenset(self._key_counts)
        if wider:
            self.on_new_keys()

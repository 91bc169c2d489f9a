"""The pod-usage baseline: the GPU-sharing scheduler of docs/architecture.md, in plain Python.

That scheduler kept every Pod its informer listed, whole, and on every scheduling attempt
deep-copied each cached Pod into a usage snapshot before summing it per node (124 MiB allocated
per new pod before the fix).  :class:`NaivePodCache` does the same per pod change: the cache
holds full decoded bodies, managedFields included, and every change rebuilds every node's usage
from a deep copy of every cached pod.  Nothing is made slow on purpose; it is the straightforward
design, so that the benchmark compares designs, not micro-optimisations.

It must also be *right*: the benchmark holds its per-node totals to gpushare's incremental
ledger, so its effective-request rule is written out here from docs/api.md rather than
imported from ``core.records.pods``, which it checks.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

Body = dict[str, Any]
# node → resource → (slots, pods): what the operator reports per node.
Totals = dict[str, dict[str, tuple[int, int]]]

FINISHED = frozenset({"Succeeded", "Failed"})


def container_request(container: Mapping[str, Any], resource: str) -> int:
    """The request of ``resource``, or its limit when only a limit is set (extended resources)."""
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    raw = requests[resource] if resource in requests else limits.get(resource, 0)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0


def effective_request(spec: Mapping[str, Any], resource: str) -> int:
    """The scheduler's rule: max(each init container with the sidecars before it, steady state)."""
    sidecars = 0
    init_peak = 0
    for container in spec.get("initContainers") or []:
        amount = container_request(container, resource)
        if container.get("restartPolicy") == "Always":
            sidecars += amount
        else:
            init_peak = max(init_peak, sidecars + amount)
    apps = sum(container_request(c, resource) for c in spec.get("containers") or [])
    return max(init_peak, apps + sidecars)


def pod_key(pod: Mapping[str, Any]) -> str:
    """namespace/name, as an informer's store keys it."""
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


class NaivePodCache:
    """Caches every pod whole and rebuilds all usage from a deep-copied snapshot per change."""

    def __init__(self, resources: Iterable[str]) -> None:
        self.resources = tuple(sorted(resources))
        self.pods: dict[str, Body] = {}
        self.usage: Totals = {}

    def cache_line(self, line: bytes) -> None:
        """What the informer does with a watch line: decode it and store or drop the object.

        The initial listing goes through here alone: a scheduler computes usage when asked,
        not per listed item.
        """
        event = json.loads(line)
        pod = event["object"]
        if event["type"] == "DELETED":
            self.pods.pop(pod_key(pod), None)
        else:
            self.pods[pod_key(pod)] = pod

    def handle_line(self, line: bytes) -> None:
        """One pod change: cache it, then rebuild every node's usage from scratch."""
        self.cache_line(line)
        self.usage = self.rebuild()

    def snapshot(self) -> list[Body]:
        """A lister over an informer cache: deep copies, so that no caller can corrupt it."""
        return [copy.deepcopy(pod) for pod in self.pods.values()]

    def rebuild(self) -> Totals:
        usage: dict[str, dict[str, list[int]]] = {}
        for pod in self.snapshot():
            node = pod.get("spec", {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            if not node or phase in FINISHED:
                continue
            for resource in self.resources:
                amount = effective_request(pod["spec"], resource)
                if amount > 0:
                    counters = usage.setdefault(node, {}).setdefault(resource, [0, 0])
                    counters[0] += amount
                    counters[1] += 1
        return {
            node: {resource: (c[0], c[1]) for resource, c in by_resource.items()}
            for node, by_resource in usage.items()
        }

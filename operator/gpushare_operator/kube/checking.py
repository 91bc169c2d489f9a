"""Checking, just before a MIG layout label, that no GPU pod is bound to the node.

The planner decides from the caches, and a cache may lag: kube-scheduler can bind a pod it
placed before our taint reached it, and our pod informer may not have it yet when the node is
planned.  So a plan whose labels change the MIG layout asks for this check
(``NodePlan.idle_check``), and the labels go only if a list of the node's pods, asked for now
(after the node cache showed our taint), holds no pod that uses a GPU, as the cache counts
them (``ClusterCache.tracks``), and no pod with a ResourceClaim.  The list is read with no
``resourceVersion``: the API server answers it from etcd's current state (or from a watch cache
it has brought up to that), never from an older snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from gpushare_operator.core.records import pods
from gpushare_operator.kube.sending import Sender

# Pods bound to one node: a few dozen at most (kubelet's default maximum is 110).
_PAGE: Final = "500"
_NOT_FINISHED: Final = "status.phase!=Succeeded,status.phase!=Failed"


async def gpu_pods(sender: Sender, *, node: str, tracked: Callable[[str], bool]) -> tuple[str, ...]:
    """The pods (namespace/name) bound to ``node`` that hold GPU slots, as listed now."""
    selector = f"spec.nodeName={node},{_NOT_FINISHED}"
    found: list[str] = []
    token = ""
    while True:
        query = [("fieldSelector", selector), ("limit", _PAGE)]
        if token:
            query.append(("continue", token))
        page: Any = await sender.read(path="/api/v1/pods", query=query)
        for item in (page or {}).get("items") or ():
            record = pods.project_pod(item, tracked=tracked)
            if record is not None and record.holds_slots:
                found.append(f"{record.namespace}/{record.name}")
            elif (item.get("spec") or {}).get("resourceClaims"):
                # A pod asking through a ResourceClaim names no resource (backend DRA); any
                # claim counts, though it may hold no GPU: better to wait than to take one.
                meta = item.get("metadata") or {}
                found.append(f"{meta.get('namespace')}/{meta.get('name')}")
        token = str(((page or {}).get("metadata") or {}).get("continue") or "")
        if not token:
            return tuple(sorted(found))

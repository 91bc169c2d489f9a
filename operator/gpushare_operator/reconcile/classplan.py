"""Which DeviceClasses gpushare should have, from the cache: level-based, like a ConfigMap key.

A class serves one extended resource (``core.dra.draclasses.device_class``: ``nvidia.com/gpu`` for
full
GPUs, ``nvidia.com/mig-<profile>`` for each profile of a MIG layout) for the policies of backend
DRA that advertise it, and stays while a node still carries our DRA switch under a policy that
advertised it (a move back to the device plugin, or a deleted policy's nodes being released):
its GPUs keep serving ``nvidia.com/gpu`` until the node has left DRA.  Its ownerReferences name
those policies, so the garbage collector removes it with the last of them; the writer deletes
one of ours that nothing wants any more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import backends
from gpushare_operator.core.api import models
from gpushare_operator.core.dra import draclasses
from gpushare_operator.core.records.nodes import GPU_RESOURCE


def wanted(cache: ClusterCache) -> dict[str, dict[str, Any]]:
    """Class name -> the whole body to apply."""
    owners: dict[str, set[draclasses.Owner]] = {}
    configs: dict[str, set[tuple[str, str | None]]] = {}
    for policy in cache.dra_policies():
        for resource in backends.of(policy).renders(policy).device_classes:
            owners.setdefault(resource, set()).add(draclasses.Owner(policy.name, policy.uid))
            configs.setdefault(resource, set()).add((policy.name, policy.gpu_config))
    for name in _still_on_dra(cache):
        held = cache.policies.get(name)
        if held is None:
            continue  # gone: its finalizer held it until no node carried its label
        for resource in held.resources or (GPU_RESOURCE,):
            owners.setdefault(resource, set()).add(draclasses.Owner(held.name, held.uid))
            configs.setdefault(resource, set()).add((held.name, held.gpu_config))
    wanted = {}
    for resource, who in owners.items():
        name = draclasses.class_name(resource)
        present = cache.dra.classes.get(name)
        config = draclasses.pick_config(
            configs[resource], held=present.config if present is not None else None
        )
        wanted[name] = draclasses.device_class(
            resource, who, api_version=models.API_VERSION, config=config
        )
    return wanted


def _still_on_dra(cache: ClusterCache) -> set[str]:
    """Policies named by the policy label of a node that carries our DRA switch."""
    return set(cache.dra_label_counts)


def unwanted(cache: ClusterCache, wanted: Mapping[str, Any]) -> list[str]:
    """Classes of ours nothing wants any more."""
    return sorted(n for n, c in cache.dra.classes.items() if c.ours and n not in wanted)

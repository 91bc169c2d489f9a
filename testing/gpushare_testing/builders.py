"""Builders for the unit tests: a clock that moves only when told, and the bodies of Nodes,
policies, pods and the device plugin's ConfigMap as the caches receive them.

Every body carries just what the caches read, so that a test says only what it is about.
"""

from __future__ import annotations

from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import ConfigMapSink
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.core.rollout.rollouts import FINALIZER
from gpushare_operator.kubectl.forecast import Forecaster
from gpushare_testing import writepath

TS = {"nvidia.com/gpu.sharing-strategy": "time-slicing"}


class Clock:
    """A monotonic clock for code that takes one (``clock=``): ``now`` moves only when the test
    moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def node(
    name: str,
    *,
    pool: str = "a",
    count: str = "4",
    allocatable: str | None = None,
    **extra: str,
) -> dict[str, Any]:
    """A GPU node; by default kubelet advertises what its GFD replicas label says, as the
    device plugin would after a restart with that config."""
    labels = {"pool": pool, "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": count}
    labels.update(extra)
    if allocatable is None:
        replicas = extra.get("nvidia.com/gpu.replicas", "1")
        allocatable = str(int(count) * int(replicas)) if count.isdigit() else "0"
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "labels": labels},
        "status": {
            "capacity": {"nvidia.com/gpu": allocatable},
            "allocatable": {"cpu": "8", "nvidia.com/gpu": allocatable},
            "conditions": [{"type": "Ready"}],
        },
    }


def policy(
    name: str,
    *,
    pool: str = "a",
    priority: int = 0,
    replicas: int = 4,
    generation: int = 1,
    finalized: bool = True,
    **spec: Any,
) -> dict[str, Any]:
    """A policy as the API returns it; ``finalized``: carrying our finalizer already, as the
    operator leaves every policy before it changes any node for it."""
    body_spec = {
        "nodeSelector": {"matchLabels": {"pool": pool}},
        "priority": priority,
        "strategy": "TimeSlicing",
        "replicas": replicas,
    }
    body_spec.update(spec)
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": generation,
            "finalizers": [FINALIZER] if finalized else [],
        },
        "spec": body_spec,
    }


def drain(cache: ClusterCache) -> None:
    """Empty the write queue, as if every key had been looked at."""
    writepath.drain(cache.queue)


def sync_config(cache: ClusterCache, data: dict[str, str] | None, *, initial: bool) -> None:
    sink = ConfigMapSink(cache)
    if initial:
        sink.begin_relist()
        if data is not None:
            sink.relist_item({"data": data})
        sink.end_relist()
    else:
        sink.apply("MODIFIED", {"data": data})


def on(key: str, name: str, replicas: int) -> dict[str, str]:
    """Labels of a node Verified on ``name``'s config ``key``."""
    return {CONFIG_LABEL: key, POLICY_LABEL: name, "nvidia.com/gpu.replicas": str(replicas), **TS}


def pod(uid: str, node_name: str, slots: int, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": uid},
        "spec": {
            "nodeName": node_name,
            "containers": [{"resources": {"requests": {resource: str(slots)}}}],
        },
        "status": {"phase": "Running"},
    }


def config_texts(cache: ClusterCache) -> dict[str, str]:
    """The ConfigMap data the operator would write for the policies ``cache`` holds now: each
    key with its real text (whether a node runs a key is judged from that text)."""
    data = {devconfigs.DEFAULT_KEY: devconfigs.render_default_text()}
    for compiled in cache.policies.values():
        if compiled.config_key and compiled.config_text:
            data[compiled.config_key] = compiled.config_text
    return data


def converged(forecaster: Forecaster, nodes: int, **spec: Any) -> str:
    """``nodes`` nodes in pool a, Verified on policy p (replicas 2); returns p's key."""
    cache = forecaster.cache
    cache.upsert_policy(policy("p", replicas=2, **spec))
    key = str(cache.policies["p"].config_key)
    cache.set_config_data(config_texts(cache), initial=True)
    for i in range(nodes):
        cache.upsert_node(node(f"n{i}", **on(key, "p", 2)))
    return key

"""The plan is a fixed point of the GPU agents' reaction to it.

For random GPU nodes and random valid policy sets over every strategy: decide who governs each
node, put that policy's config on it, let the simulated agents react as the real ones do
(GFD's labels, the product's ``-SHARED`` suffix, the device plugin's resources), and decide
again.  No node may change hands: gpushare's own configuration must never change which policy
governs a node.  The agents' rules are the simulator's own (``testing.agents``), not a copy.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_testing import agents

PRODUCT = "nvidia.com/gpu.product"
PRODUCTS = ("NVIDIA-A10G", "NVIDIA-H100-80GB-HBM3", "Tesla-T4")
POOLS = ("a", "b", "c")


def _requirement() -> st.SearchStrategy[dict[str, Any]]:
    on_product = st.builds(
        lambda op, values: {"key": PRODUCT, "operator": op, "values": sorted(set(values))},
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.sampled_from(PRODUCTS), min_size=1, max_size=2),
    )
    on_pool = st.builds(
        lambda op, values: {"key": "pool", "operator": op, "values": sorted(set(values))},
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.sampled_from(POOLS), min_size=1, max_size=2),
    )
    exists = st.builds(
        lambda key, op: {"key": key, "operator": op},
        st.sampled_from([PRODUCT, "pool", "nvidia.com/mig.strategy"]),
        st.sampled_from(["Exists", "DoesNotExist"]),
    )
    return on_product | on_pool | exists


def _spec() -> st.SearchStrategy[dict[str, Any]]:
    shared = st.builds(
        lambda strategy, replicas, rename: {
            "strategy": strategy,
            "replicas": replicas,
            "renameByDefault": rename,
        },
        st.sampled_from(["TimeSlicing", "MPS"]),
        st.integers(2, 8),
        st.booleans(),
    )
    exclusive = st.just({"strategy": "Exclusive"})
    selector = st.builds(
        lambda labels, expressions: {"matchLabels": labels, "matchExpressions": expressions},
        st.dictionaries(st.sampled_from([PRODUCT, "pool"]), st.sampled_from(PRODUCTS + POOLS)),
        st.lists(_requirement(), max_size=2),
    )
    return st.builds(
        lambda sharing, selector, priority: {
            **sharing,
            "nodeSelector": selector,
            "priority": priority,
        },
        shared | exclusive,
        selector,
        st.integers(0, 3),
    )


def _node() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda pool, product, gpus, mig: {
            "pool": pool,
            PRODUCT: product,
            "nvidia.com/gpu.count": str(gpus),
            **({"nvidia.com/mig.strategy": mig} if mig else {}),
        },
        st.sampled_from(POOLS),
        st.sampled_from(PRODUCTS),
        st.integers(1, 8),
        st.sampled_from([None, "single", "mixed"]),
    )


def _body(name: str, labels: dict[str, str], resources: dict[str, str | None]) -> dict[str, Any]:
    shown = {k: v for k, v in resources.items() if v is not None}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "labels": labels},
        "status": {"capacity": shown, "allocatable": shown},
    }


def _react(cache: ClusterCache, name: str) -> None:
    """The agents' answer to the node's governing policy: its config, relabelled by GFD."""
    record = cache.nodes[name]
    policy = cache.governing(name)
    labels = dict(record.labels)
    sharing = agents.NO_SHARING
    if policy is not None and policy.config_key is not None and policy.config_text is not None:
        labels.update({CONFIG_LABEL: policy.config_key, POLICY_LABEL: policy.name})
        sharing = agents.parse_device_plugin_config(policy.config_text) or agents.NO_SHARING
    gpus = int(labels["nvidia.com/gpu.count"])
    resources = agents.plugin_resources(gpus=gpus, sharing=sharing)
    cache.upsert_node(_body(name, agents.gfd_labels(labels, sharing), resources))


def _governors(cache: ClusterCache) -> dict[str, str | None]:
    return {
        name: (policy.name if (policy := cache.governing(name)) else None) for name in cache.nodes
    }


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_node(), min_size=1, max_size=6),
    st.lists(_spec(), min_size=1, max_size=4),
)
def test_the_agents_reaction_never_moves_a_node(
    nodes: list[dict[str, str]], specs: list[dict[str, Any]]
) -> None:
    cache = ClusterCache()
    for index, spec in enumerate(specs):
        metadata = {"name": f"p{index}", "uid": f"uid-p{index}", "generation": 1}
        cache.upsert_policy({"metadata": metadata, "spec": spec})
    for index, labels in enumerate(nodes):
        gpus = int(labels["nvidia.com/gpu.count"])
        unshared = agents.gfd_labels(labels, agents.NO_SHARING)  # GFD's labels before us
        resources = agents.plugin_resources(gpus=gpus, sharing=agents.NO_SHARING)
        cache.upsert_node(_body(f"n{index}", unshared, resources))
    planned = _governors(cache)
    for _ in range(2):  # the reaction, and the reaction to the reaction
        for name in list(cache.nodes):
            _react(cache, name)
        assert _governors(cache) == planned

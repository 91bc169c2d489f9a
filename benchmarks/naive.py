"""The baseline gpushare is measured against: the anti-pattern docs/architecture.md avoids.

One of the design's anchors is a node operator whose leader, on every Node event, listed every
selector object from a cache that deep-copies what it lists, re-parsed each selector for the
node, deep-copied the Node once per matching object, and cached whole decoded bodies,
managedFields included.  :class:`NaiveController` does exactly that, in plain readable Python,
so that the benchmark's "naive ÷ ours" ratio compares designs rather than micro-optimisations:
nothing here is made slow on purpose, it is only built the straightforward way.

It must also be *right*: the benchmark checks that it ends with the same node → policies mapping
as the real cache and index, so a ratio can never come from the two doing different work.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Body = dict[str, Any]

_GPU_PRESENT = "nvidia.com/gpu.present"
_GPU_COUNT = "nvidia.com/gpu.count"
_GPU_CAPACITY = ("nvidia.com/gpu", "nvidia.com/gpu.shared")


@dataclass(frozen=True)
class Requirement:
    """One parsed selector requirement; matchLabels pairs become ``In`` with one value."""

    key: str
    operator: str
    values: frozenset[str]

    def holds(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        raise ValueError(f"unknown selector operator {self.operator!r}")


def parse_selector(raw: Mapping[str, Any] | None) -> list[Requirement]:
    """A metav1.LabelSelector as a list of requirements, parsed from scratch on every call.

    A missing selector selects every node, as gpushare defines it.
    """
    if raw is None:
        return []
    requirements = [
        Requirement(key=str(key), operator="In", values=frozenset([str(value)]))
        for key, value in (raw.get("matchLabels") or {}).items()
    ]
    for expression in raw.get("matchExpressions") or []:
        requirements.append(
            Requirement(
                key=str(expression["key"]),
                operator=str(expression["operator"]),
                values=frozenset(str(v) for v in expression.get("values") or []),
            )
        )
    return requirements


def selector_matches(requirements: list[Requirement], labels: Mapping[str, str]) -> bool:
    return all(requirement.holds(labels) for requirement in requirements)


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    """A GPU node as docs/api.md defines it, read off the full body."""
    labels = node.get("metadata", {}).get("labels") or {}
    capacity = node.get("status", {}).get("capacity") or {}
    return (
        labels.get(_GPU_PRESENT) == "true"
        or _GPU_COUNT in labels
        or any(resource in capacity for resource in _GPU_CAPACITY)
    )


def desired_labels(node: Body, policy: Body) -> dict[str, str]:
    """What the naive reconciler derives from its private copy of the node: the labels to set."""
    gpus = node["metadata"].get("labels", {}).get(_GPU_COUNT, "0")
    replicas = policy["spec"].get("replicas", 1)
    return {
        "gpushare.dev/policy": policy["metadata"]["name"],
        "nvidia.com/device-plugin.config": f"{policy['metadata']['name']}-{replicas}x{gpus}",
    }


class NaiveController:
    """Caches full decoded bodies and reconciles every event from scratch."""

    def __init__(self) -> None:
        self.nodes: dict[str, Body] = {}
        self._policies: dict[str, Body] = {}
        self.matches: dict[str, frozenset[str]] = {}
        self.desired: dict[str, dict[str, str]] = {}

    def list_policies(self) -> list[Body]:
        """A lister over an informer cache: callers get deep copies so they cannot corrupt it."""
        return [copy.deepcopy(policy) for policy in self._policies.values()]

    def upsert_policy(self, body: Mapping[str, Any]) -> None:
        """Store the policy and reconcile every cached node against the new set of policies."""
        self._policies[str(body["metadata"]["name"])] = copy.deepcopy(dict(body))
        for node in list(self.nodes.values()):
            self.reconcile(node)

    def handle_line(self, line: bytes) -> None:
        """One watch-event line: decode it, cache the whole object, reconcile that node."""
        event = json.loads(line)
        node = event["object"]
        name = node["metadata"]["name"]
        if event["type"] == "DELETED":
            self.nodes.pop(name, None)
            self.matches.pop(name, None)
            self.desired.pop(name, None)
            return
        self.nodes[name] = node
        self.reconcile(node)

    def reconcile(self, node: Body) -> None:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        gpu = is_gpu_node(node)
        matched: list[str] = []
        desired: dict[str, str] = {}
        for policy in self.list_policies():
            requirements = parse_selector(policy["spec"].get("nodeSelector"))
            if gpu and selector_matches(requirements, labels):
                snapshot = copy.deepcopy(node)  # "so that rendering cannot mutate the cache"
                matched.append(policy["metadata"]["name"])
                desired |= desired_labels(snapshot, policy)
        self.matches[name] = frozenset(matched)
        self.desired[name] = desired

    def mapping(self) -> dict[str, frozenset[str]]:
        """node → matching policies, for the nodes that any policy matches."""
        return {name: matched for name, matched in self.matches.items() if matched}

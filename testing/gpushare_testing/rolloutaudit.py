"""What a rollout did, read back from the API server's audit log (never from our own logs).

A node is unavailable from the operator's label write that changes its config until the node
itself shows the config took: GPU Feature Discovery's label write with the new replicas (the
simulated device plugin writes the matching capacity just before).  That is the earliest moment
the operator could call it Verified, so the windows are never longer than the operator's own.
Writes are in the audit log with their bodies (see ``components.AUDIT_POLICY``).
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_testing import apiobjects as h
from gpushare_testing.controlplane import ADMIN_USER, ControlPlane


def moment(event: Mapping[str, Any]) -> float:
    stamp = str(event["stageTimestamp"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def _succeeded(event: Mapping[str, Any]) -> bool:
    return 200 <= int((event.get("responseStatus") or {}).get("code", 0)) < 300


USERS = (h.OPERATOR_USER,)


def _ours(
    plane: ControlPlane, since: float, users: Collection[str] = USERS
) -> list[dict[str, Any]]:
    return [
        e
        for e in plane.audit_events()
        if e["user"]["username"] in users and _succeeded(e) and moment(e) >= since
    ]


def label_writes(
    plane: ControlPlane,
    nodes: Collection[str],
    *,
    since: float,
    key: str | None = None,
    users: Collection[str] = USERS,
) -> list[tuple[float, str, str | None]]:
    """(when, node, config key written; None for a removal) of each label apply that changes
    a node's config, in order: not those that only add or remove its slot labels
    (``config_applies``)."""
    found = []
    for event in config_applies(_ours(plane, since, users), nodes):
        body = event["requestObject"]
        labels = (body.get("metadata") or {}).get("labels") or {}
        written = labels.get(h.CONFIG_LABEL)
        if key is None or written == key:
            found.append((moment(event), str(event["objectRef"]["name"]), written))
    return sorted(found)


SLOT_PREFIX = "gpushare.dev/slot-"
_CONFIG_KEYS = (h.CONFIG_LABEL, h.POLICY_LABEL, "nvidia.com/mig.config")


def config_applies(
    events: Iterable[Mapping[str, Any]], nodes: Collection[str] | None = None
) -> list[Mapping[str, Any]]:
    """The label applies among ``events`` (in log order) that change a node's config labels.

    A Verified node's slot labels come in an apply of their own that restates its config
    labels unchanged, and go (Degraded, say) in another: neither is a config change.  An apply
    that carries slot labels is one of the first kind; one that restates exactly the config
    labels of the node's last apply, of the second."""
    last: dict[str, tuple[str | None, ...]] = {}
    found = []
    for event in events:
        ref = event["objectRef"]
        name = ref.get("name")
        if ref.get("resource") != "nodes" or ref.get("subresource"):
            continue
        if nodes is not None and name not in nodes:
            continue
        body = event.get("requestObject") or {}
        if not isinstance(body, dict) or body.get("kind") != "Node":
            continue  # a taint patch (JSON patch, a list) is no label write
        labels = (body.get("metadata") or {}).get("labels") or {}
        config = tuple(labels.get(k) for k in _CONFIG_KEYS)
        slots = any(str(k).startswith(SLOT_PREFIX) for k in labels)
        previous = last.get(str(name))
        last[str(name)] = config
        if slots or previous == config:
            continue
        found.append(event)
    return found


def status_writes(
    plane: ControlPlane, nodes: Collection[str], *, since: float
) -> list[tuple[float, str, dict[str, Any]]]:
    """(when, node, status written) of each GPUNodeState status write, in order."""
    found = []
    for event in _ours(plane, since):
        ref = event["objectRef"]
        if ref.get("resource") != "gpunodestates" or ref.get("subresource") != "status":
            continue
        if ref.get("name") not in nodes:
            continue
        for op in event.get("requestObject") or ():
            if op.get("path") == "/status":
                found.append((moment(event), str(ref["name"]), dict(op["value"])))
    return sorted(found, key=lambda item: item[0])


def taint_writes(
    plane: ControlPlane, nodes: Collection[str], *, since: float, users: Collection[str] = USERS
) -> list[tuple[float, str, list[dict[str, Any]]]]:
    """(when, node, JSON patch) of each operator patch of a node's taints, by ``users``."""
    found = []
    for event in _ours(plane, since, users):
        ref = event["objectRef"]
        body = event.get("requestObject")
        if ref.get("resource") == "nodes" and ref.get("name") in nodes and isinstance(body, list):
            found.append((moment(event), str(ref["name"]), body))
    return sorted(found, key=lambda item: item[0])


@dataclass(frozen=True)
class Window:
    node: str
    start: float  # the label write
    end: float  # the Verified status write (inf: never seen)


def gfd_writes(
    plane: ControlPlane, nodes: Collection[str], *, replicas: int, since: float
) -> dict[str, list[float]]:
    """When GPU Feature Discovery (the simulator, never the operator) labelled each node with
    ``replicas``: the moment a change is confirmed on the node itself (the simulated plugin
    writes capacity first, so allocatable agrees by then)."""
    found: dict[str, list[float]] = {}
    for event in plane.audit_events():
        ref = event["objectRef"]
        node = ref.get("name")
        if ref.get("resource") != "nodes" or node not in nodes or ref.get("subresource"):
            continue
        if event["user"]["username"] != ADMIN_USER:  # the simulator's agents write as admin
            continue
        if not _succeeded(event) or moment(event) < since:
            continue
        body = event.get("requestObject")
        labels = (body.get("metadata") or {}).get("labels") if isinstance(body, dict) else None
        if labels and labels.get("nvidia.com/gpu.replicas") == str(replicas):
            found.setdefault(str(node), []).append(moment(event))
    return found


def unavailable_windows(
    plane: ControlPlane,
    nodes: Collection[str],
    *,
    key: str | None,
    replicas: int,
    since: float,
    users: Collection[str] = USERS,
) -> list[Window]:
    """Per label write of ``key`` (None: per removal), from that write to GFD's first write
    after it that shows ``replicas`` (1: unshared again)."""
    confirmed = gfd_writes(plane, nodes, replicas=replicas, since=since)
    windows = []
    for start, node, written in label_writes(plane, nodes, since=since, users=users):
        if written != key:
            continue
        after = [t for t in confirmed.get(node, ()) if t >= start]
        windows.append(Window(node, start, min(after, default=float("inf"))))
    return windows


def most_at_once(windows: Iterable[Window]) -> int:
    """The largest number of windows open at one moment (an end before a start at a tie)."""
    edges = sorted(
        [(w.start, 1) for w in windows] + [(w.end, -1) for w in windows if w.end != float("inf")]
    )
    open_now = most = 0
    for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        open_now += step
        most = max(most, open_now)
    return most


def release_windows(plane: ControlPlane, nodes: Collection[str], *, since: float) -> list[Window]:
    """Per released node, from the operator's removal of its labels to GFD's first write that
    shows it unshared again."""
    return unavailable_windows(plane, nodes, key=None, replicas=1, since=since)


def finalizer_writes(plane: ControlPlane, policy: str, *, since: float) -> list[float]:
    """When the operator patched the policy's finalizers away (JSON patches with a remove)."""
    found = []
    for event in _ours(plane, since):
        ref = event["objectRef"]
        if ref.get("resource") != "gpusharingpolicies" or ref.get("name") != policy:
            continue
        body = event.get("requestObject")
        removes = isinstance(body, list) and any(op.get("op") == "remove" for op in body)
        if ref.get("subresource") is None and removes:
            found.append(moment(event))
    return sorted(found)


def bindings(
    plane: ControlPlane, nodes: Collection[str], *, since: float
) -> list[tuple[float, str]]:
    """(when, node) of each pod kube-scheduler bound to one of ``nodes``."""
    found = []
    for event in plane.audit_events():
        ref = event["objectRef"]
        if ref.get("resource") != "pods" or ref.get("subresource") != "binding":
            continue
        if event["user"]["username"] != "system:kube-scheduler" or not _succeeded(event):
            continue
        target = ((event.get("requestObject") or {}).get("target") or {}).get("name")
        if target in nodes and moment(event) >= since:
            found.append((moment(event), str(target)))
    return sorted(found)

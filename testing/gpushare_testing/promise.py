"""The rollout promise, judged from the API server's audit log alone.

A node is *unavailable* from the operator's label write that changes its config (a new key, or
the removal of ours) until the node itself shows that the config took: GPU Feature Discovery has
labelled it, after that write, with the replicas of the key last written (1 once released), and
the device plugin's allocatable (kubelet's status writes) is what that config advertises.  Both
come from the simulator's own writes, as the simulator's user; the label writes from the
operator's users.  That is the earliest moment any leader could call the node Verified, so the
windows measured here are never longer than the operator's own.

``Ledger`` is what the test did (a policy's budget and replicas, and when each came in force);
``windows`` the unavailability the log shows; ``excesses`` and ``rewrites`` the two ways the
promise can be broken: more nodes unavailable at once than a budget allows, a node changed twice
for one generation of a policy's config.
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpushare_testing.agents import REPLICAS_LABEL, TIMESTAMP_LABEL
from gpushare_testing.apiobjects import CONFIG_LABEL, POLICY_LABEL
from gpushare_testing.bodyparts import GPU_RESOURCE
from gpushare_testing.controlplane import ADMIN_USER
from gpushare_testing.rolloutaudit import SLOT_PREFIX

INF = float("inf")
LAG = 2.0  # seconds in which the operator may still act on a budget the spec has just changed

Event = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One write about a node, in the order the API server completed them."""

    when: float
    order: int  # position in the audit log: the tie-breaker
    node: str
    kind: str  # "label" (the operator's), "gfd", "allocatable", "created", "deleted"
    key: str | None = None  # label: the config key written (None: ours removed)
    policy: str | None = None  # label: the policy label written
    allocatable: int | None = None  # allocatable and created: of nvidia.com/gpu
    replicas: int | None = None  # gfd and created: GFD's nvidia.com/gpu.replicas label
    slots: bool = False  # label: the apply also carried a Verified node's slot labels


@dataclass(frozen=True, slots=True)
class Window:
    node: str
    incarnation: int  # the node's registration this happened to (1: its first)
    policy: str  # the policy charged: the one whose label was written, or that it left
    start: float  # the label write
    end: float  # the confirmation (INF: never seen)
    keys: tuple[str | None, ...]  # the targets written during the window (None: a release)
    first: bool  # this registration of the node carried none of our config before

    def open_at(self, when: float) -> bool:
        return self.start <= when < self.end


def moment(event: Event) -> float:
    stamp = str(event["stageTimestamp"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def node_events(
    events: Sequence[Event],
    *,
    nodes: Collection[str],
    operators: Collection[str],
    simulator: str = ADMIN_USER,
) -> list[NodeEvent]:
    """The writes about ``nodes`` that the promise is judged by, in order."""
    found = []
    for order, event in enumerate(events):
        ref = event.get("objectRef") or {}
        name = ref.get("name")
        if ref.get("resource") != "nodes" or name not in nodes:
            continue
        if not 200 <= int((event.get("responseStatus") or {}).get("code", 0)) < 300:
            continue
        parsed = _parse(event, operators=operators, simulator=simulator)
        if parsed is not None:
            found.append(replace(parsed, when=moment(event), order=order, node=str(name)))
    return _changes_only(sorted(found, key=lambda e: (e.when, e.order)))


def _changes_only(events: Sequence[NodeEvent]) -> list[NodeEvent]:
    """Without the label applies that only add or take away a Verified node's slot labels (the
    config restated beside them): they change nothing the promise speaks of.  An apply that
    restates the config with no slot labels before or after is kept: that is a rewrite."""
    last: dict[str, NodeEvent] = {}
    kept = []
    for event in events:
        if event.kind in ("created", "deleted"):
            last.pop(event.node, None)  # a node of that name anew: its first label counts
        if event.kind == "label":
            before = last.get(event.node)
            last[event.node] = event
            if before is None:  # with slot labels: the log began after this config was written
                slots_only = event.slots
            else:
                restated = (before.key, before.policy) == (event.key, event.policy)
                slots_only = restated and (event.slots or before.slots)
            if slots_only:
                continue
        kept.append(event)
    return kept


def _parse(event: Event, *, operators: Collection[str], simulator: str) -> NodeEvent | None:
    """The event's part in the promise, its time and place left to the caller."""
    user, verb = event["user"]["username"], event.get("verb")
    body = event.get("requestObject")
    subresource = event["objectRef"].get("subresource")
    if verb == "delete" and not subresource:
        return NodeEvent(0.0, 0, "", "deleted")
    labels = (body.get("metadata") or {}).get("labels") or {} if isinstance(body, dict) else {}
    if verb == "create" and not subresource:
        replicas = _number(labels.get(REPLICAS_LABEL))
        return NodeEvent(0.0, 0, "", "created", allocatable=_allocatable(body), replicas=replicas)
    if not isinstance(body, dict):
        return None  # a JSON patch (taints): no label, no status
    if user in operators and not subresource and body.get("kind") == "Node":
        slots = any(str(k).startswith(SLOT_PREFIX) for k in labels)
        key, policy = labels.get(CONFIG_LABEL), labels.get(POLICY_LABEL)
        return NodeEvent(0.0, 0, "", "label", key=key, policy=policy, slots=slots)
    if user != simulator:
        return None
    if subresource == "status":
        value = _allocatable(body)
        return None if value is None else NodeEvent(0.0, 0, "", "allocatable", allocatable=value)
    if not subresource and TIMESTAMP_LABEL in labels:  # every GFD pass stamps the node
        return NodeEvent(0.0, 0, "", "gfd", replicas=_number(labels.get(REPLICAS_LABEL)))
    return None


def _number(value: object) -> int | None:
    return None if value is None else int(str(value))


def _allocatable(body: object) -> int | None:
    if not isinstance(body, dict):
        return None
    value = ((body.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
    return None if value is None else int(value)


@dataclass
class _Open:
    policy: str
    start: float
    first: bool
    keys: list[str | None] = field(default_factory=list)
    gfd_ok: bool = False
    released_at: float | None = None


@dataclass
class _Node:
    incarnation: int = 0
    config: str | None = None  # our config label as last written
    policy: str | None = None  # our policy label as last written
    labelled: bool = False  # our labels were written on this registration
    allocatable: int | None = None
    replicas: int | None = None  # GFD's replicas label, as last written
    open: _Open | None = None


def windows(
    events: Iterable[NodeEvent],
    *,
    replicas_of: Mapping[str, int],
    gpus: Mapping[str, int],
    release_timeout: float | None = None,
) -> list[Window]:
    """Every unavailability window in ``events``.  A release that is never confirmed stops
    counting ``release_timeout`` seconds after our labels went (the operator's rule for a node
    it cannot release cleanly, say one with a bad GPU); a deleted node's window ends with it."""
    states: dict[str, _Node] = defaultdict(_Node)
    found: list[Window] = []

    def close(name: str, state: _Node, when: float) -> None:
        opened = state.open
        assert opened is not None
        window = Window(
            name,
            state.incarnation,
            opened.policy,
            opened.start,
            when,
            tuple(opened.keys),
            opened.first,
        )
        found.append(window)
        state.open = None

    def expire(name: str, state: _Node, now: float) -> None:
        opened = state.open
        if opened is None or opened.released_at is None or release_timeout is None:
            return
        if opened.keys[-1] is None and opened.released_at + release_timeout <= now:
            close(name, state, opened.released_at + release_timeout)

    for event in events:
        state = states[event.node]
        expire(event.node, state, event.when)
        if event.kind == "created":
            if state.open is not None:
                close(event.node, state, event.when)
            states[event.node] = _Node(
                incarnation=state.incarnation + 1,
                allocatable=event.allocatable,
                replicas=event.replicas,
            )
            continue
        if event.kind == "deleted":
            if state.open is not None:
                close(event.node, state, event.when)
            state.config = state.policy = None
            continue
        if event.kind == "label":
            _labelled(state, event)
        elif event.kind == "gfd":
            state.replicas = state.replicas if event.replicas is None else event.replicas
            if state.open is not None:
                target = state.open.keys[-1]
                state.open.gfd_ok |= state.replicas == _replicas(target, replicas_of)
        elif event.kind == "allocatable":
            state.allocatable = event.allocatable
        opened = state.open
        if opened is not None and opened.gfd_ok:
            expected = gpus[event.node] * _replicas(opened.keys[-1], replicas_of)
            if state.allocatable is None or state.allocatable == expected:
                close(event.node, state, event.when)
    for name, state in states.items():
        expire(name, state, INF)
        if state.open is not None:
            close(name, state, INF)
    return sorted(found, key=lambda w: (w.start, w.node))


def _labelled(state: _Node, event: NodeEvent) -> None:
    if event.key == state.config:
        if event.policy is not None:
            state.policy = event.policy
        return  # the config stays: nothing restarts
    if state.open is None:
        charged = event.policy or state.policy or ""
        first = not state.labelled and state.config is None
        state.open = _Open(charged, event.when, first)
    state.open.keys.append(event.key)
    state.open.gfd_ok = False
    state.open.released_at = event.when if event.key is None else None
    state.config = event.key
    state.labelled = True
    if event.policy is not None:
        state.policy = event.policy


def _replicas(key: str | None, replicas_of: Mapping[str, int]) -> int:
    if key is None:
        return 1
    if key not in replicas_of:
        raise AssertionError(f"config key {key} was written but never seen in the ConfigMap")
    return replicas_of[key]


# -- what the test did --------------------------------------------------------------------------


@dataclass
class Ledger:
    """Each policy's budget and replicas, and when each came in force (the test's own edits);
    the cluster-wide budget (``--max-unavailable``) as a number of nodes."""

    cluster: int | None = None
    budgets: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    eras: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # replicas

    def record(
        self, policy: str, *, at: float, budget: int | None = None, replicas: int | None = None
    ) -> None:
        if budget is not None:
            self.budgets.setdefault(policy, []).append((at, budget))
        if replicas is not None:
            eras = self.eras.setdefault(policy, [])
            if not eras or eras[-1][1] != replicas:
                eras.append((at, replicas))

    def allowed(self, policy: str, at: float) -> int | None:
        """The largest budget in force within ``LAG`` seconds before ``at`` (None: unknown)."""
        changes = self.budgets.get(policy)
        if not changes:
            return None
        before = [b for t, b in changes if t <= at - LAG]
        during = [b for t, b in changes if at - LAG < t <= at]
        return max(before[-1:] + during) if before or during else None

    def era(self, policy: str, *, at: float, replicas: int) -> int | None:
        """Which generation of the policy's config a write of ``replicas`` at ``at`` was for:
        the latest one in force by then with those replicas."""
        matching = [
            i for i, (t, r) in enumerate(self.eras.get(policy, ())) if t <= at and r == replicas
        ]
        return matching[-1] if matching else None


Exempt = Callable[[Window], bool]


def excesses(
    found: Sequence[Window], ledger: Ledger, *, exempt: Exempt = lambda w: False
) -> list[str]:
    """Each moment a window opened while more were open than a budget allowed: of its policy
    (``maxUnavailable`` then in force) or of the cluster."""
    counted = [w for w in found if not exempt(w)]
    problems = []
    for window in counted:
        now = window.start
        same = [w for w in counted if w.policy == window.policy and w.open_at(now)]
        allowed = ledger.allowed(window.policy, now)
        if allowed is not None and len(same) > allowed:
            problems.append(
                f"{window.node} opened at {now:.2f} with {len(same)} of {window.policy}'s nodes"
                f" unavailable (maxUnavailable {allowed}): {sorted(w.node for w in same)}"
            )
        overall = [w for w in counted if w.open_at(now)]
        if ledger.cluster is not None and len(overall) > ledger.cluster:
            problems.append(
                f"{window.node} opened at {now:.2f} with {len(overall)} nodes unavailable"
                f" (--max-unavailable {ledger.cluster}): {sorted(w.node for w in overall)}"
            )
    return problems


def most_at_once(found: Iterable[Window], *, policy: str | None = None) -> int:
    """The largest number of windows (of ``policy``, or all) open at one moment."""
    chosen = [w for w in found if policy is None or w.policy == policy]
    return max((sum(1 for w in chosen if w.open_at(c.start)) for c in chosen), default=0)


def rewrites(
    events: Iterable[NodeEvent], ledger: Ledger, *, replicas_of: Mapping[str, int]
) -> list[str]:
    """Nodes whose label the operator wrote more than once for one generation of a policy's
    config (on one registration of the node)."""
    seen: Counter[tuple[str, int, str, int]] = Counter()
    incarnation: Counter[str] = Counter()
    problems = []
    for event in events:
        if event.kind == "created":
            incarnation[event.node] += 1
        if event.kind != "label" or event.key is None or event.policy is None:
            continue
        era = ledger.era(event.policy, at=event.when, replicas=_replicas(event.key, replicas_of))
        if era is None:
            continue
        slot = (event.node, incarnation[event.node], event.policy, era)
        seen[slot] += 1
        if seen[slot] == 2:
            problems.append(
                f"{event.node} labelled {event.key} again at {event.when:.2f} for generation"
                f" {era + 1} of {event.policy}'s config"
            )
    return problems

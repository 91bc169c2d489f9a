"""The promise checker over audit events as the API server logs them: windows from a label write
to GFD's and kubelet's confirmation, budgets, and rewrites within one generation."""

from __future__ import annotations

import datetime
from typing import Any

from gpushare_testing import promise
from gpushare_testing.controlplane import ADMIN_USER

OPERATOR = "gpushare-a"
CONFIG, POLICY = "nvidia.com/device-plugin.config", "gpushare.dev/policy"
REPLICAS = {"k4": 4, "k2": 2}


def at(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(1_800_000_000 + seconds, datetime.UTC)
    return moment.isoformat().replace("+00:00", "Z")


def event(
    when: float, node: str, *, user: str, verb: str = "patch", sub: str | None = None, body: Any
) -> dict[str, Any]:
    ref = {"resource": "nodes", "name": node} | ({"subresource": sub} if sub else {})
    return {
        "stageTimestamp": at(when),
        "objectRef": ref,
        "user": {"username": user},
        "verb": verb,
        "requestObject": body,
        "responseStatus": {"code": 200 if verb != "create" else 201},
    }


def label(when: float, node: str, key: str | None, policy: str = "p") -> dict[str, Any]:
    labels = {} if key is None else {CONFIG: key, POLICY: policy}
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}}
    return event(when, node, user=OPERATOR, body=body)


def slot_label(when: float, node: str, key: str | None, memory: str | None) -> dict[str, Any]:
    """Our apply that restates ``key`` and adds the slot labels (``memory``) or takes them away."""
    body = label(when, node, key)
    if memory is not None:
        body["requestObject"]["metadata"]["labels"]["gpushare.dev/slot-memory-mib"] = memory
    return body


def gfd(when: float, node: str, replicas: int | None) -> dict[str, Any]:
    labels = {"nvidia.com/gfd.timestamp": "1"}
    if replicas is not None:
        labels["nvidia.com/gpu.replicas"] = str(replicas)
    return event(when, node, user=ADMIN_USER, body={"metadata": {"labels": labels}})


def allocatable(when: float, node: str, value: int) -> dict[str, Any]:
    body = {"status": {"allocatable": {"nvidia.com/gpu": str(value)}}}
    return event(when, node, user=ADMIN_USER, sub="status", body=body)


def created(when: float, node: str) -> dict[str, Any]:
    body = {
        "metadata": {"name": node, "labels": {"nvidia.com/gpu.replicas": "1"}},
        "status": {"allocatable": {"nvidia.com/gpu": "2"}},
    }
    return event(when, node, user=ADMIN_USER, verb="create", body=body)


def windows(events: list[dict[str, Any]], **options: Any) -> list[promise.Window]:
    nodes = {e["objectRef"]["name"] for e in events}
    parsed = promise.node_events(events, nodes=nodes, operators=[OPERATOR])
    return promise.windows(parsed, replicas_of=REPLICAS, gpus=dict.fromkeys(nodes, 2), **options)


def spans(found: list[promise.Window]) -> list[tuple[str, float, float]]:
    return [
        (w.node, round(w.start - 1_800_000_000, 3), round(w.end - 1_800_000_000, 3)) for w in found
    ]


def test_a_window_closes_when_gfd_and_allocatable_both_agree() -> None:
    found = windows(
        [
            created(0, "a"),
            label(1, "a", "k4"),
            allocatable(2, "a", 0),
            allocatable(3, "a", 8),
            gfd(3.5, "a", 4),
        ]
    )
    assert spans(found) == [("a", 1, 3.5)]
    assert found[0].first and found[0].policy == "p"


def test_a_lost_gpu_keeps_it_open_until_allocatable_is_whole() -> None:
    found = windows(
        [
            created(0, "a"),
            label(1, "a", "k4"),
            allocatable(2, "a", 4),
            gfd(3, "a", 4),
            allocatable(9, "a", 8),
        ]
    )
    assert spans(found) == [("a", 1, 9)]


def test_a_stale_gfd_pass_of_the_last_target_does_not_close_the_window() -> None:
    found = windows(
        [
            created(0, "a"),
            label(1, "a", "k4"),
            label(2, "a", "k2"),  # retargeted mid-change: one window
            allocatable(3, "a", 8),
            gfd(3, "a", 4),
            allocatable(5, "a", 4),
            gfd(5, "a", None),  # a pass that changed no replicas label: still 4
            gfd(6, "a", 2),
        ]
    )
    assert spans(found) == [("a", 1, 6)]
    assert found[0].keys == ("k4", "k2")


def test_a_release_never_confirmed_stops_counting_after_the_timeout() -> None:
    events = [created(0, "a"), label(1, "a", "k4"), allocatable(2, "a", 8), gfd(2, "a", 4)]
    events += [label(10, "a", None), allocatable(12, "a", 1)]
    assert spans(windows(events))[-1] == ("a", 10, promise.INF)
    assert spans(windows(events, release_timeout=3))[-1] == ("a", 10, 13)
    released = windows(events)[-1]
    assert released.policy == "p" and released.keys == (None,)


def test_a_deleted_node_ends_its_window_and_its_next_registration_starts_afresh() -> None:
    delete = event(5, "a", user=ADMIN_USER, verb="delete", body=None)
    found = windows([created(0, "a"), label(1, "a", "k4"), delete, created(6, "a")])
    assert spans(found) == [("a", 1, 5)]
    again = windows([created(0, "a"), delete, created(6, "a"), label(7, "a", "k4")])
    assert [(w.incarnation, w.first) for w in again] == [(2, True)]


def test_budgets_are_checked_when_a_window_opens() -> None:
    events = [created(0, n) for n in "abc"]
    events += [label(1, "a", "k4"), label(1.5, "b", "k4"), label(2, "c", "k4")]
    events += [allocatable(3, n, 8) for n in "abc"] + [gfd(3, n, 4) for n in "abc"]
    found = windows(events)
    assert promise.most_at_once(found, policy="p") == 3
    ledger = promise.Ledger(cluster=5, budgets={"p": [(0.0, 2)]})
    [problem] = promise.excesses(found, ledger)
    assert "c opened" in problem and "maxUnavailable 2" in problem
    assert promise.excesses(found, ledger, exempt=lambda w: w.node == "c") == []
    assert promise.excesses(found, promise.Ledger(cluster=2)) != []


def test_a_budget_lowered_just_before_counts_as_the_higher_one_for_a_moment() -> None:
    ledger = promise.Ledger(budgets={"p": [(0.0, 3), (10.0, 1)]})
    assert ledger.allowed("p", 10.5) == 3
    assert ledger.allowed("p", 10.0 + promise.LAG + 0.1) == 1
    assert ledger.allowed("q", 5) is None


def test_a_node_labelled_twice_for_one_generation_is_a_rewrite() -> None:
    ledger = promise.Ledger()
    ledger.record("p", at=1_800_000_000.0, replicas=4)
    ledger.record("p", at=1_800_000_005.0, replicas=4)  # a rollout-only edit: the same era
    ledger.record("p", at=1_800_000_010.0, replicas=2)
    events = [created(0, "a"), label(1, "a", "k4"), label(11, "a", "k2")]
    parsed = promise.node_events(events, nodes={"a"}, operators=[OPERATOR])
    assert promise.rewrites(parsed, ledger, replicas_of=REPLICAS) == []
    events += [label(12, "a", "k2")]
    parsed = promise.node_events(events, nodes={"a"}, operators=[OPERATOR])
    [problem] = promise.rewrites(parsed, ledger, replicas_of=REPLICAS)
    assert "generation 2" in problem
    recreated = [created(0, "a"), label(1, "a", "k4"), created(5, "a"), label(6, "a", "k4")]
    parsed = promise.node_events(recreated, nodes={"a"}, operators=[OPERATOR])
    assert promise.rewrites(parsed, ledger, replicas_of=REPLICAS) == []


def test_applies_that_add_or_take_away_slot_labels_are_no_rewrite_but_a_bare_restatement_is() -> (
    None
):
    ledger = promise.Ledger()
    ledger.record("p", at=1_800_000_000.0, replicas=4)
    events = [created(0, "a"), label(1, "a", "k4"), slot_label(3, "a", "k4", "20389")]
    events += [slot_label(5, "a", "k4", None), slot_label(7, "a", "k4", "20389")]
    parsed = promise.node_events(events, nodes={"a"}, operators=[OPERATOR])
    assert [e.kind for e in parsed] == ["created", "label"]
    assert promise.rewrites(parsed, ledger, replicas_of=REPLICAS) == []
    events += [slot_label(9, "a", "k4", None), label(11, "a", "k4")]
    parsed = promise.node_events(events, nodes={"a"}, operators=[OPERATOR])
    [problem] = promise.rewrites(parsed, ledger, replicas_of=REPLICAS)
    assert problem.startswith("a labelled k4 again") and "generation 1" in problem
    # A log that begins after the config was written: its first apply, with slot labels, is none.
    late = promise.node_events(
        [slot_label(1, "a", "k4", "20389")], nodes={"a"}, operators=[OPERATOR]
    )
    assert late == []

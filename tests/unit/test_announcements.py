"""Which status changes become Events: edge-triggered, and none for routine progress."""

from __future__ import annotations

from typing import Any

from gpushare_operator.core.announcements import node_announcements, policy_announcements


def status(*conds: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": f"{t} is {s}: {r}"}
            for t, s, r in conds
        ]
    }


def test_a_new_conflict_is_announced_once() -> None:
    before = status(("Conflicting", "False", "NoConflict"))
    after = status(("Conflicting", "True", "LowerPriority"))
    [event] = policy_announcements(before, after)
    assert (event.type, event.reason) == ("Warning", "Conflict")
    assert "LowerPriority" in event.message
    assert list(policy_announcements(after, after)) == []


def test_routine_progress_is_not_announced() -> None:
    before = status(("Ready", "True", "Applied"))
    after = status(("Ready", "False", "NodesPending"))
    assert list(policy_announcements(before, after)) == []


def test_bad_spec_and_broken_config_are_announced() -> None:
    for reason, expected in (
        ("InvalidSpec", "InvalidPolicy"),
        ("DevicePluginConfigUnavailable", "DevicePluginConfigUnavailable"),
        ("NodesMismatched", "NodesMismatched"),
    ):
        [event] = policy_announcements({}, status(("Ready", "False", reason)))
        assert event.reason == expected


def test_overcommit_on_a_policy_and_on_a_node() -> None:
    over = ("Overcommitted", "True", "AllocationExceedsCapacity")
    [policy_event] = policy_announcements({}, status(over))
    [node_event] = node_announcements({}, status(over))
    assert policy_event.reason == node_event.reason == "Overcommitted"
    assert list(node_announcements(status(over), status(over))) == []


def test_node_problems_name_their_reason() -> None:
    [event] = node_announcements({}, status(("Ready", "False", "InvalidNodeLabel")))
    assert event.reason == "InvalidNodeLabel"
    assert list(node_announcements({}, status(("Ready", "False", "LabelPending")))) == []

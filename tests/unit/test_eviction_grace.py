"""An eviction is never a deletion: ``eviction.gracePeriodSeconds`` is at least 1 at admission,
and a 0 stored under an older CRD is read as 1 and reported, never sent."""

from __future__ import annotations

import pytest

from gpushare_operator.core import announcements, policystatus
from gpushare_operator.core.api import crds, models
from gpushare_operator.core.policystatus import PolicyTally
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy


def compiled(grace: int | None) -> CompiledPolicy:
    rollout = {"podPolicy": "Evict", "eviction": {"gracePeriodSeconds": grace}}
    spec = {"strategy": "TimeSlicing", "replicas": 2, "rollout": rollout}
    return compile_policy(name="p", uid="u", generation=3, spec=spec)


@pytest.mark.parametrize(("stored", "asked"), [(None, None), (0, 1), (1, 1), (30, 30)])
def test_what_an_eviction_asks_for(stored: int | None, asked: int | None) -> None:
    policy = compiled(stored)
    assert policy.valid, policy.error  # 0 does not make the whole spec invalid
    assert policy.spec is not None
    assert policy.spec.rollout.eviction.grace_period == asked
    assert models.eviction_grace_period(stored) == asked


def test_the_schema_refuses_0_saying_why() -> None:
    policy_crd = crds.policy_crd()
    spec = policy_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    eviction = spec["properties"]["rollout"]["properties"]["eviction"]["properties"]
    grace = eviction["gracePeriodSeconds"]
    assert (grace["minimum"], grace["maximum"]) == (1, models.MAX_GRACE_PERIOD)
    [rule] = grace["x-kubernetes-validations"]
    assert rule["rule"] == "self >= 1"
    assert "an eviction is never a deletion" in rule["message"]
    assert "drop the pod's record at once while its containers still run" in rule["message"]


def test_a_stored_0_is_a_condition_and_an_event_on_the_policy() -> None:
    status = policystatus.render_policy_status(
        policy=compiled(0), tally=PolicyTally(), previous=None, now="2026-01-01T00:00:00Z"
    )
    [adjusted] = [c for c in status["conditions"] if c["type"] == "SpecAdjusted"]
    assert (adjusted["status"], adjusted["reason"]) == ("True", "GracePeriodRaised")
    assert adjusted["message"].startswith("spec.rollout.eviction.gracePeriodSeconds is 0")
    assert "evictions ask for 1 s instead" in adjusted["message"]
    [event] = list(announcements.policy_announcements({}, status))
    assert (event.type, event.reason, event.message) == (
        "Warning",
        "SpecAdjusted",
        adjusted["message"],
    )
    # Once said, not again; and a spec put right drops the condition.
    assert list(announcements.policy_announcements(status, status)) == []
    fixed = policystatus.render_policy_status(
        policy=compiled(5), tally=PolicyTally(), previous=status, now="2026-01-01T00:01:00Z"
    )
    assert not [c for c in fixed["conditions"] if c["type"] == "SpecAdjusted"]

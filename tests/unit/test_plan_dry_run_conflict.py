"""The plan's dry run of an update meets a policy the operator changed since it was read (its
status, as its nodes and pods change): a 409 reads it again and tries again, a bounded number
of times; any other refusal is the user's at once."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_operator.kube import http
from gpushare_operator.kubectl import manifests

DOCUMENT = {
    "apiVersion": "gpushare.dev/v1alpha1",
    "kind": "GPUSharingPolicy",
    "metadata": {"name": "busy"},
    "spec": {"replicas": 2},
}


def conflict() -> http.ApiError:
    body = {"reason": "Conflict", "message": "the object has been modified"}
    return http.ApiError(status=409, reason="Conflict", body=body)


def scripted(monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> list[str]:
    """Each read returns the policy at a newer resourceVersion; each dry run takes the next
    answer (an exception is raised).  Returns the versions the dry runs were sent with."""
    reads = iter(range(1, 100))
    sent: list[str] = []

    async def read_one(*_: Any, **__: Any) -> dict[str, Any]:
        return {"metadata": {"name": "busy", "resourceVersion": str(next(reads))}}

    async def replace(_api: Any, _resource: Any, _name: str, body: Any) -> dict[str, Any]:
        sent.append(body["metadata"]["resourceVersion"])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    monkeypatch.setattr(manifests, "read_one", read_one)
    monkeypatch.setattr(manifests.dryrun, "replace", replace)
    return sent


async def test_a_conflict_is_read_again_and_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = scripted(monkeypatch, [conflict(), conflict(), {"metadata": {"name": "busy"}}])
    planned, refusals = await manifests.dry_run(None, [DOCUMENT], [])  # type: ignore[arg-type]
    assert refusals == [] and [p.action for p in planned] == ["update"]
    assert sent == ["1", "2", "3"]  # each try with the version just read


async def test_conflicts_past_the_bound_and_other_refusals_are_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = scripted(monkeypatch, [conflict()] * manifests.CONFLICT_TRIES)
    _, refusals = await manifests.dry_run(None, [DOCUMENT], [])  # type: ignore[arg-type]
    assert [r.status for r in refusals] == [409]
    assert len(sent) == manifests.CONFLICT_TRIES
    invalid = http.ApiError(status=422, reason="Invalid", body={"message": "replicas: bad"})
    sent = scripted(monkeypatch, [invalid])
    _, refusals = await manifests.dry_run(None, [DOCUMENT], [])  # type: ignore[arg-type]
    assert [r.status for r in refusals] == [422] and sent == ["1"]

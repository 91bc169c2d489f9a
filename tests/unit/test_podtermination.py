"""The simulated kubelet's pure rules for a pod being deleted: how long it takes, what it writes,
and how it deletes the pod at the end."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_testing import bodies
from gpushare_testing.podadmission import running_status
from gpushare_testing.podtermination import (
    KILLED_EXIT_CODE,
    MINIMUM_GRACE,
    final_delete,
    stop_seconds,
    terminated_status,
)

DISRUPTION = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "EvictionByEvictionAPI",
    "message": "Eviction API: evicting",
    "lastTransitionTime": "T0",
}


def pod(*, deleted: int | None = None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u-1"}
    if deleted is not None:
        metadata |= {"deletionTimestamp": "T9", "deletionGracePeriodSeconds": deleted}
    containers = [{"name": "app", "image": "r/i:1"}]
    return {"metadata": metadata, "spec": spec or {"containers": containers}}


def running(body: dict[str, Any]) -> dict[str, Any]:
    """The pod as the simulated kubelet ran it, with the condition an eviction adds."""
    node = bodies.gpu_node(name="n1", pool="p")
    status = running_status(pod=body, node=node, now="T1")
    status["conditions"].append(DISRUPTION)
    return body | {"status": status}


@pytest.mark.parametrize(
    ("grace", "expected"),
    [(30, 30), (2, 2), (1, MINIMUM_GRACE), (0, MINIMUM_GRACE)],
)
def test_a_deleted_pod_takes_its_whole_grace_period_and_at_least_two_seconds(
    grace: int, expected: int
) -> None:
    assert stop_seconds(pod(deleted=grace)) == expected


def test_a_pod_not_being_deleted_is_not_stopped() -> None:
    assert stop_seconds(pod()) is None


def test_without_a_deletion_grace_period_the_pods_own_is_taken() -> None:
    body = pod(deleted=5)
    del body["metadata"]["deletionGracePeriodSeconds"]
    assert stop_seconds(body) == 30  # the API's default
    body["spec"]["terminationGracePeriodSeconds"] = 7
    assert stop_seconds(body) == 7


def test_a_killed_pod_is_failed_with_its_containers_killed_and_not_ready() -> None:
    status = terminated_status(pod=running(pod(deleted=2)), now="T5")
    assert status["phase"] == "Failed"
    [container] = status["containerStatuses"]
    assert container["state"] == {
        "terminated": {
            "exitCode": KILLED_EXIT_CODE,
            "reason": "Error",
            "startedAt": "T1",
            "finishedAt": "T5",
        }
    }
    assert container["ready"] is False and container["started"] is False
    assert container["containerID"].startswith("containerd://")  # the same container
    conditions = {c["type"]: c for c in status["conditions"]}
    assert {k: c["status"] for k, c in conditions.items()} == {
        "DisruptionTarget": "True",
        "PodReadyToStartContainers": "False",
        "Initialized": "True",
        "Ready": "False",
        "ContainersReady": "False",
        "PodScheduled": "True",
    }
    assert conditions["Ready"]["reason"] == conditions["ContainersReady"]["reason"] == "PodFailed"
    assert conditions["DisruptionTarget"] == DISRUPTION  # not kubelet's: kept as it was
    # A condition that kept its status keeps its transition time; a changed one is now.
    assert conditions["Initialized"]["lastTransitionTime"] == "T1"
    assert conditions["Ready"]["lastTransitionTime"] == "T5"


def test_a_pod_deleted_before_it_started_has_its_containers_terminated_as_unknown() -> None:
    status = terminated_status(pod=pod(deleted=2), now="T5")
    assert status["phase"] == "Failed"
    [container] = status["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert terminated["exitCode"] == KILLED_EXIT_CODE
    assert terminated["reason"] == "ContainerStatusUnknown"
    assert container["name"] == "app" and container["ready"] is False


def test_completed_init_containers_stay_completed_and_sidecars_are_killed() -> None:
    spec = {
        "initContainers": [
            {"name": "fetch", "image": "r/f:1"},
            {"name": "proxy", "image": "r/p:1", "restartPolicy": "Always"},
        ],
        "containers": [{"name": "app", "image": "r/i:1"}],
    }
    before = running(pod(deleted=2, spec=spec))
    status = terminated_status(pod=before, now="T5")
    fetch, proxy = status["initContainerStatuses"]
    assert fetch == before["status"]["initContainerStatuses"][0]
    assert fetch["state"]["terminated"]["reason"] == "Completed"
    assert proxy["state"]["terminated"]["exitCode"] == KILLED_EXIT_CODE
    assert proxy["state"]["terminated"]["reason"] == "Error"


def test_the_final_delete_is_now_and_only_for_this_very_pod() -> None:
    assert final_delete(pod(deleted=2)) == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": "u-1"},
    }

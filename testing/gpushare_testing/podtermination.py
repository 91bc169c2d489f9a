"""What kubelet does with a pod of its node that is being deleted, as pure functions: how long it
takes, the terminal status it writes, and the final delete.  No I/O, no clock: ``podagent``
does those.

A graceful delete (``kubectl delete``, an eviction through ``pods/eviction``, the garbage
collector) only sets ``metadata.deletionTimestamp`` and ``deletionGracePeriodSeconds``; the pod
stays, ``Terminating``, until its kubelet has stopped it (kubelet v1.35):

1. The grace period is the pod's ``deletionGracePeriodSeconds``, at least 1
   (``pkg/kubelet/pod_workers.go``, ``calculateEffectiveGracePeriod``), and each container's
   stop is given at least 2 seconds (``pkg/kubelet/kuberuntime/kuberuntime_container.go``,
   ``killContainer``, ``minimumGracePeriodInSeconds``).  The simulated containers ignore SIGTERM
   and are killed when that time is up: exit code 137, reason ``Error``, the longest a real pod
   may take (a real one often exits sooner).  Its devices stay allocated until then: the device
   manager frees only those of inactive pods (``cm/devicemanager/manager.go``,
   ``UpdateAllocatedDevices``; ``kubelet_pods.go``, ``isPodInactive``).
2. The status is generated with the pod terminal (``kubelet_pods.go``, ``generateAPIPodStatus``
   and ``getPhase``: every container stopped and one failed is ``Failed``, whatever the restart
   policy); a container that never started is terminated as unknown, 137
   (``pkg/kubelet/status/status_manager.go``, ``TerminatePod``).  ``Ready`` and
   ``ContainersReady`` turn False with reason ``PodFailed``, ``PodReadyToStartContainers``
   False (the sandbox is gone) (``pkg/kubelet/status/generate.go``); conditions kubelet does
   not own (``DisruptionTarget``, which an eviction adds) are kept.
3. Then the status manager deletes the pod for good: grace period 0, with the pod's uid as a
   precondition, so that a new pod of the same name is never deleted (``status_manager.go``,
   ``syncPod``, ``canBeDeleted``).

``docs/simulator.md`` has the table of sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "KILLED_EXIT_CODE",
    "MINIMUM_GRACE",
    "final_delete",
    "stop_seconds",
    "terminated_status",
]

MINIMUM_GRACE: Final = 2  # minimumGracePeriodInSeconds
KILLED_EXIT_CODE: Final = 137  # 128 + SIGKILL
DEFAULT_GRACE: Final = 30  # the API's default terminationGracePeriodSeconds
_UNKNOWN: Final = "ContainerStatusUnknown"
_UNKNOWN_MESSAGE: Final = "The container could not be located when the pod was terminated"
# The conditions kubelet writes (kubetypes.PodConditionByKubelet); it keeps all others.
_KUBELET_CONDITIONS: Final = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)


def stop_seconds(pod: Mapping[str, Any]) -> int | None:
    """How long kubelet takes to stop a pod being deleted; ``None`` while it is not."""
    metadata = pod.get("metadata") or {}
    if not metadata.get("deletionTimestamp"):
        return None
    grace = metadata.get("deletionGracePeriodSeconds")
    if grace is None:  # the API server always sets it; the pod's own intent otherwise
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE)
    return max(MINIMUM_GRACE, int(grace))


def _killed(old: Mapping[str, Any] | None, *, name: str, now: str) -> dict[str, Any]:
    """A container's status once stopped: killed at the end of its grace period, or, if it
    never ran, terminated as unknown."""
    status = dict(old or {"name": name, "image": "", "imageID": "", "restartCount": 0})
    state = (old or {}).get("state") or {}
    if "terminated" in state:  # a regular init container that had completed
        return status
    if "running" in state:
        terminated = {"exitCode": KILLED_EXIT_CODE, "reason": "Error"}
        terminated |= {"startedAt": state["running"].get("startedAt"), "finishedAt": now}
    else:
        terminated = {"exitCode": KILLED_EXIT_CODE, "reason": _UNKNOWN}
        terminated["message"] = _UNKNOWN_MESSAGE
    status.update(ready=False, started=False, state={"terminated": terminated})
    return status


def _containers(
    containers: list[Mapping[str, Any]], statuses: list[Mapping[str, Any]], *, now: str
) -> list[dict[str, Any]]:
    by_name = {str(s.get("name")): s for s in statuses}
    return [
        _killed(by_name.get(str(c.get("name"))), name=str(c.get("name")), now=now)
        for c in containers
    ]


def _conditions(old: list[Mapping[str, Any]], *, now: str) -> list[dict[str, Any]]:
    """Kubelet's conditions of a failed pod, the others as they were."""
    kept = [dict(c) for c in old if c.get("type") not in _KUBELET_CONDITIONS]
    before = {str(c.get("type")): c for c in old}
    wanted = {
        "PodReadyToStartContainers": ("False", None),
        "Initialized": ("True", None),
        "Ready": ("False", "PodFailed"),
        "ContainersReady": ("False", "PodFailed"),
        "PodScheduled": ("True", None),
    }
    conditions = []
    for kind, (status, reason) in wanted.items():
        previous = before.get(kind) or {}
        condition: dict[str, Any] = {"type": kind, "status": status, "lastProbeTime": None}
        if previous.get("status") == status:
            condition["lastTransitionTime"] = previous.get("lastTransitionTime") or now
        else:
            condition["lastTransitionTime"] = now
        if reason is not None:
            condition["reason"] = reason
        conditions.append(condition)
    return kept + conditions


def terminated_status(*, pod: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The status kubelet writes once every container of a deleted pod has stopped.

    Addresses and ``startTime`` stay as they were (a merge patch leaves them); the lists are
    written whole, as the merge patch replaces them.
    """
    spec, old = pod.get("spec") or {}, pod.get("status") or {}
    status: dict[str, Any] = {
        "phase": "Failed",
        "conditions": _conditions(list(old.get("conditions") or ()), now=now),
    }
    if spec.get("initContainers"):
        inits = list(old.get("initContainerStatuses") or ())
        status["initContainerStatuses"] = _containers(spec["initContainers"], inits, now=now)
    status["containerStatuses"] = _containers(
        list(spec.get("containers") or ()), list(old.get("containerStatuses") or ()), now=now
    )
    return status


def final_delete(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The DeleteOptions of kubelet's last word on a pod: now, and only this very pod."""
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    return {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": uid},
    }

"""What kubelet does with a pod bound to its node, as pure functions: admit or reject, and what
it then writes to the pod's status.  No I/O, no clock: ``podagent`` does those.

Kubelet admits each new pod once, in order, against the pods it admitted before (its active
pods), and rejects it for good (``phase: Failed``) when an admit handler refuses it; such a pod
is never retried.  The handlers that matter here run in this order (kubelet ``kubelet.go``,
``NewMainKubelet``):

1. The device manager's ``Allocate`` (``pkg/kubelet/cm/devicemanager/manager.go``,
   ``devicesToAllocate``) for every device-plugin resource the pod asks for: a resource whose
   plugin is registered but has no healthy device (the plugin is restarting or crash-looping)
   fails with "no healthy devices present; cannot allocate unhealthy devices <name>"; too few
   free healthy devices fails with "requested number of devices unavailable for <name>.
   Requested: <n>, Available: <m>".  Kubelet words either as ``UnexpectedAdmissionError``,
   "Allocate failed due to <error>, which is unexpected" (``pkg/kubelet/cm/admission``).
2. The predicate admit handler (``pkg/kubelet/lifecycle/predicate.go``): the node's allocatable,
   first raised to at least the devices already allocated (``sanitizeNodeAllocatable``), must
   hold the pod's requests on top of what the admitted pods request: pod count, cpu, memory,
   then extended resources; an extended resource the node does not list at all is dropped from
   the pod's requests first (``removeMissingExtendedResources``).  A miss is ``OutOf<name>``,
   "Node didn't have enough resource: <name>, requested: <n>, used: <u>, capacity: <c>".

The status of a rejected pod is ``phase: Failed`` with that reason, and "Pod was rejected: "
before the message (``rejectPod``).  ``docs/simulator.md`` has the table of sources.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any, Final

from gpushare_operator.core.records.pods import effective_request

__all__ = [
    "REJECTED_PREFIX",
    "UNEXPECTED_ADMISSION_ERROR",
    "Admitted",
    "NodeResources",
    "Rejection",
    "admit",
    "is_extended",
    "parse_quantity",
    "pod_requests",
    "rejected_status",
    "running_status",
]

UNEXPECTED_ADMISSION_ERROR: Final = "UnexpectedAdmissionError"
REJECTED_PREFIX: Final = "Pod was rejected: "
PODS: Final = "pods"
CPU: Final = "cpu"
MEMORY: Final = "memory"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)}
_DECIMAL |= {"k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9)}
_DECIMAL |= {"T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}


def parse_quantity(raw: object, *, milli: bool = False) -> int:
    """A resource quantity ("500m", "32Gi", "1e3", 4) in whole units, rounded up as kubelet's
    ``Value()`` does; in thousandths (``MilliValue()``) with ``milli``.  Unreadable: 0."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        return 0
    text = str(raw).strip()
    suffix = next((s for s in _BINARY if text.endswith(s)), None)
    try:
        if suffix is not None:
            value = Decimal(text.removesuffix(suffix)) * _BINARY[suffix]
        elif text[-1:] in _DECIMAL and not text[-1:].isdigit():
            value = Decimal(text[:-1]) * _DECIMAL[text[-1]]
        else:
            value = Decimal(text)  # plain digits, or an exponent ("1e3", "1E3")
    except (InvalidOperation, IndexError):
        return 0
    if not value.is_finite():
        return 0
    if milli:
        value *= 1000
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def _cpu(raw: object) -> int:
    return parse_quantity(raw, milli=True)


def _units(raw: object) -> int:
    return parse_quantity(raw)


def is_extended(name: str) -> bool:
    """``IsExtendedResourceName``: qualified, outside ``kubernetes.io/``, not ``requests.*``."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _resource_names(spec: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or ():
            resources = container.get("resources") or {}
            names.update(resources.get("requests") or ())
            names.update(resources.get("limits") or ())
    return names


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """What the pod asks of its node, in kubelet's units: cpu in millicores, the rest whole.

    The scheduler's effective request (``core.records.pods.effective_request``: app containers and
    sidecars summed, the largest init container if more) for cpu, memory and every extended
    resource; a pod always takes one of the node's pod slots.
    """
    requests = {PODS: 1}
    for name in sorted(_resource_names(spec)):
        if name in (CPU, MEMORY) or is_extended(name):
            amount = effective_request(spec, name, quantity=_cpu if name == CPU else _units)
            if amount > 0:
                requests[name] = amount
    return requests


@dataclass(frozen=True, slots=True)
class NodeResources:
    """What kubelet admits against: its Node's allocatable and its device manager's devices."""

    allocatable: Mapping[str, int]  # status.allocatable in kubelet's units (cpu in millicores)
    devices: Mapping[str, int]  # each registered device-plugin resource -> its healthy devices

    @classmethod
    def of(
        cls,
        *,
        allocatable: Mapping[str, object],
        plugin: Mapping[str, str | None],
        registered: Collection[str],
    ) -> NodeResources:
        """From the Node's ``status.allocatable``, and the device plugin's own allocatable (the
        healthy devices it serves; ``None``: none) for each resource kubelet has registered."""
        parsed = {k: (_cpu(v) if k == CPU else _units(v)) for k, v in allocatable.items()}
        devices = {name: _units(plugin.get(name) or 0) for name in registered}
        return cls(allocatable=parsed, devices=devices)


@dataclass(frozen=True, slots=True)
class Admitted:
    """An admitted pod: what it requests (the fit's ``used``), and the devices it was given."""

    requests: Mapping[str, int]
    devices: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why kubelet rejects a pod: the status ``reason``, and the admit handler's message."""

    reason: str
    message: str


def _unexpected(error: str) -> Rejection:
    return Rejection(
        UNEXPECTED_ADMISSION_ERROR, f"Allocate failed due to {error}, which is unexpected"
    )


def _allocate(
    requests: Mapping[str, int], node: NodeResources, in_use: Mapping[str, int]
) -> dict[str, int] | Rejection:
    """The device manager: healthy, free devices for each device-plugin resource asked for."""
    devices: dict[str, int] = {}
    for name in sorted(n for n in requests if n in node.devices):
        needed, healthy = requests[name], node.devices[name]
        if healthy == 0:
            return _unexpected(
                f"no healthy devices present; cannot allocate unhealthy devices {name}"
            )
        available = max(0, healthy - in_use.get(name, 0))
        if available < needed:
            return _unexpected(
                f"requested number of devices unavailable for {name}."
                f" Requested: {needed}, Available: {available}"
            )
        devices[name] = needed
    return devices


def _fit_order(requests: Mapping[str, int]) -> list[str]:
    native = [n for n in (PODS, CPU, MEMORY) if n in requests]
    return native + sorted(n for n in requests if is_extended(n))


def admit(
    *, requests: Mapping[str, int], node: NodeResources, others: Iterable[Admitted]
) -> Admitted | Rejection:
    """Admit a pod asking ``requests`` on ``node``, where ``others`` were admitted before."""
    others = list(others)
    used: Counter[str] = Counter()
    in_use: Counter[str] = Counter()
    for pod in others:
        used.update(pod.requests)
        in_use.update(pod.devices)
    devices = _allocate(requests, node, in_use)
    if isinstance(devices, Rejection):
        return devices
    allocatable = dict(node.allocatable)
    if devices:  # sanitizeNodeAllocatable: at least what is allocated, this pod's included
        for name, count in (in_use + Counter(devices)).items():
            allocatable[name] = max(allocatable.get(name, 0), count)
    for name in _fit_order(requests):
        if is_extended(name) and name not in allocatable:
            continue  # removeMissingExtendedResources
        wanted, capacity = requests[name], allocatable.get(name, 0)
        if wanted > 0 and wanted > capacity - used[name]:
            message = (
                f"Node didn't have enough resource: {name}, requested: {wanted},"
                f" used: {used[name]}, capacity: {capacity}"
            )
            return Rejection(f"OutOf{name}", message)
    return Admitted(requests=dict(requests), devices=devices)


# -- the statuses kubelet writes -------------------------------------------------------------


def rejected_status(rejection: Rejection) -> dict[str, Any]:
    """``rejectPod``: Failed for good, with the handler's reason and message."""
    return {
        "phase": "Failed",
        "reason": rejection.reason,
        "message": REJECTED_PREFIX + rejection.message,
    }


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _addresses(node: Mapping[str, Any], uid: str) -> dict[str, Any]:
    """The node's InternalIP, and an address for the pod in the node's pod CIDR."""
    status, spec = node.get("status") or {}, node.get("spec") or {}
    result: dict[str, Any] = {}
    for address in status.get("addresses") or ():
        if address.get("type") == "InternalIP":
            result |= {"hostIP": address["address"], "hostIPs": [{"ip": address["address"]}]}
            break
    if cidr := spec.get("podCIDR"):
        network = ipaddress.ip_network(cidr, strict=False)
        hosts = max(1, network.num_addresses - 3)
        ip = str(network[2 + int(_digest(uid), 16) % hosts])
        result |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    return result


def _container_status(container: Mapping[str, Any], *, uid: str, now: str, done: bool) -> Any:
    image = str(container.get("image", ""))
    name = str(container.get("name", ""))
    state: dict[str, Any] = {"running": {"startedAt": now}}
    if done:
        state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now}}
        state["terminated"]["finishedAt"] = now
    return {
        "name": name,
        "image": image,
        "imageID": f"{image.rsplit(':', 1)[0]}@sha256:{_digest('image', image)}",
        "containerID": f"containerd://{_digest(uid, name)}",
        "ready": True,
        "started": not done,
        "restartCount": 0,
        "state": state,
    }


def running_status(*, pod: Mapping[str, Any], node: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The status of an admitted pod once its containers run: every condition True.

    A real kubelet gets there in a few writes (``ContainerCreating`` first, then probes); this
    is its last one.  Regular init containers have completed, sidecars and app containers run.
    """
    spec, uid = pod.get("spec") or {}, str((pod.get("metadata") or {}).get("uid", ""))
    scheduled = next(
        (
            c.get("lastTransitionTime")
            for c in (pod.get("status") or {}).get("conditions") or ()
            if c.get("type") == "PodScheduled" and c.get("status") == "True"
        ),
        None,
    )
    kinds = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
    conditions = [{"type": kind, "status": "True", "lastProbeTime": None} for kind in kinds]
    for condition in conditions:
        condition["lastTransitionTime"] = now
    conditions.append(
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None}
        | {"lastTransitionTime": scheduled or now}
    )
    inits = [
        _container_status(c, uid=uid, now=now, done=c.get("restartPolicy") != "Always")
        for c in spec.get("initContainers") or ()
    ]
    status: dict[str, Any] = {"phase": "Running", "conditions": conditions, "startTime": now}
    status |= _addresses(node, uid)
    if inits:
        status["initContainerStatuses"] = inits
    status["containerStatuses"] = [
        _container_status(c, uid=uid, now=now, done=False) for c in spec.get("containers") or ()
    ]
    return status

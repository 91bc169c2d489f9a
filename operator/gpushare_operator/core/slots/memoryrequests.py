"""A pod that asks for GPU memory gets a slot that enforces it: the webhook's decision, pure.

A pod created with the label ``gpushare.dev/gpu-memory: <quantity>`` is given the smallest
enforced slot class (``core.slots.slotclasses``) that holds the request, among those the nodes'
labels offer: a request and a limit of 1 of its resource in one container, node affinity that
lets kube-scheduler place it only on nodes whose slots enforce at least the request, and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` set to the request in that container (an MPS client may
lower its own limit below the daemon's; elsewhere the variable does nothing).  What cannot be
done is refused with a message that says what would fit: the webhook never guesses.

A limit the container sets itself is kept when it is at most the chosen slot, and refused
above it.  NVIDIA's MPS documentation (Appendix: Environment Variables,
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) says a client's value only ever tightens the limit its control
daemon set (``set_default_device_pinned_mem_limit``, which NVIDIA's device plugin sets to the
slot): a higher one is ignored.  On the chosen slot such a value would therefore do nothing, but
the affinity also admits nodes with bigger slots, where it would be obeyed; a pod whose own
limit says more than its label asks for has asked for two things, and the answer is to raise
the label, not for the webhook to pick one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final

from gpushare_operator.core import quantities
from gpushare_operator.core.records import pods
from gpushare_operator.core.slots import slotclasses
from gpushare_operator.core.slots.slotclasses import Offer

REQUEST_LABEL: Final = pods.MEMORY_REQUEST_LABEL
CONTAINER_ANNOTATION: Final = "gpushare.dev/gpu-container"
MPS_LIMIT_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
# The smallest class that fits is preferred over bigger ones that fit too (a soft term).
PREFERENCE_WEIGHT: Final = 100
# One entry of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: a device (ordinal or UUID) = an amount, whose
# unit NVIDIA writes M, MB, G or GB ("0=1G,1=512MB").  M is read as MiB and G as GiB: the larger
# reading, so that a value is never let through as smaller than CUDA may take it to be.
_LIMIT_ENTRY: Final = re.compile(r"\s*([^=,\s]+)\s*=\s*([0-9]+)\s*([MG])B?\s*", re.IGNORECASE)
_UNIT_MIB: Final = {"M": 1, "G": 1024}


# Why the webhook refuses a pod (``Refusal.reason``: the label of its refusals metric).
NO_OFFER: Final = "NoSlotEnforcesMemory"
TOO_LARGE: Final = "RequestLargerThanAnySlot"
BAD_LABEL: Final = "InvalidRequestLabel"
ALREADY_GPU: Final = "AlreadyRequestsGPU"
BAD_CONTAINER: Final = "InvalidContainer"
MPS_LIMIT: Final = "MPSLimitOutsideSlot"
REASONS: Final = (NO_OFFER, TOO_LARGE, BAD_LABEL, ALREADY_GPU, BAD_CONTAINER, MPS_LIMIT)


class Refusal(Exception):
    """The pod cannot be given a slot: the message says why, and what would fit."""

    def __init__(self, message: str, *, reason: str, code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class Placement:
    """What the webhook gives one pod."""

    container: int  # the index in spec.containers that gets the slot
    offer: Offer  # the class chosen
    request_mib: int  # what the pod asked for


def choose(request_mib: int, offers: Sequence[Offer]) -> Offer:
    """The smallest enforced class of at least ``request_mib``; ``offers`` sorted (by memory,
    then resource).  Raises ``Refusal`` naming the largest class when none is big enough."""
    for offer in offers:
        if offer.memory_mib >= request_mib:
            return offer
    asked = quantities.describe_mib(request_mib)
    if not offers:
        raise Refusal(
            f"no node gpushare governs offers a slot that enforces GPU memory, so {asked} cannot"
            " be promised: only MPS, MIG and Exclusive policies enforce memory (time-slicing"
            " enforces none), and a node offers its slots once it is Verified",
            code=403,
            reason=NO_OFFER,
        )
    largest = offers[-1]
    same = sorted({o.policy for o in offers if o.slot == largest.slot})
    named = ", ".join(same)
    raise Refusal(
        f"no GPU slot enforces {asked}: the largest is {largest.slot.describe()}, policy"
        f" {named}; ask for at most {quantities.describe_mib(largest.memory_mib)}",
        code=403,
        reason=TOO_LARGE,
    )


def place(
    pod: Mapping[str, Any],
    *,
    offers: Sequence[Offer],
    is_gpu_resource: Callable[[str], bool],
) -> Placement:
    """Decide for ``pod`` (its body as admitted); raises ``Refusal``."""
    metadata = pod.get("metadata") or {}
    text = (metadata.get("labels") or {}).get(REQUEST_LABEL)
    if not isinstance(text, str):
        raise Refusal(f"the pod has no {REQUEST_LABEL} label", reason=BAD_LABEL)
    try:
        request_mib = quantities.parse_mib(text)
    except quantities.QuantityError as exc:
        raise Refusal(f"label {REQUEST_LABEL}: {exc}", reason=BAD_LABEL) from None
    spec = pod.get("spec") or {}
    containers = list(spec.get("containers") or [])
    _refuse_gpu_requests(containers, spec.get("initContainers") or [], is_gpu_resource)
    index = _container(containers, (metadata.get("annotations") or {}).get(CONTAINER_ANNOTATION))
    offer = choose(request_mib, offers)
    _refuse_limit_above(containers[index], offer)
    return Placement(index, offer, request_mib)


def _refuse_gpu_requests(
    containers: Sequence[Mapping[str, Any]],
    init_containers: Sequence[Mapping[str, Any]],
    is_gpu_resource: Callable[[str], bool],
) -> None:
    for kind, listed in (("container", containers), ("init container", init_containers)):
        for container in listed:
            resources = container.get("resources") or {}
            for section in ("requests", "limits"):
                for name in resources.get(section) or {}:
                    if is_gpu_resource(str(name)):
                        raise Refusal(
                            f"{kind} {container.get('name')!r} already {section[:-1]}s"
                            f" {name}: a pod asks for GPU memory with the {REQUEST_LABEL} label"
                            " or for a GPU resource, not both (remove one)",
                            reason=ALREADY_GPU,
                        )


def _container(containers: Sequence[Mapping[str, Any]], wanted: object) -> int:
    names = [str(c.get("name")) for c in containers]
    if not names:
        raise Refusal("the pod has no containers to give a GPU slot to", reason=BAD_CONTAINER)
    if wanted is None:
        return 0
    if wanted in names:
        return names.index(str(wanted))
    raise Refusal(
        f"annotation {CONTAINER_ANNOTATION} names container {wanted!r}, which the pod does not"
        f" have (its containers: {', '.join(names)}; init containers cannot hold the slot)",
        reason=BAD_CONTAINER,
    )


def user_limits(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The container's own ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` entries (the kubelet gives the
    process the last of several; each is checked)."""
    return [e for e in container.get("env") or [] if e.get("name") == MPS_LIMIT_ENV]


def limit_mib(value: str) -> dict[str, int]:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` as {device: MiB}; raises ``ValueError`` for what
    does not read as NVIDIA's form."""
    limits: dict[str, int] = {}
    for part in value.split(","):
        found = _LIMIT_ENTRY.fullmatch(part)
        if found is None:
            raise ValueError(part)
        device, amount, unit = found.groups()
        limits[device] = int(amount) * _UNIT_MIB[unit.upper()]
    return limits


def _refuse_limit_above(container: Mapping[str, Any], offer: Offer) -> None:
    """Refuse a limit of the container's own that the chosen slot cannot be shown to hold."""
    most = quantities.describe_mib(offer.memory_mib)
    fix = (
        f"set it to at most {most} (the slot chosen), or remove it and let gpushare set it;"
        f" for more memory raise the {REQUEST_LABEL} label"
    )
    name = container.get("name")
    for entry in user_limits(container):
        value = entry.get("value") or ""
        if not value and "valueFrom" not in entry:
            continue  # set to nothing: no limit of its own, the daemon's (the slot) holds
        if "valueFrom" in entry or not isinstance(value, str):
            raise Refusal(
                f"container {name!r} takes {MPS_LIMIT_ENV} from elsewhere (valueFrom), so"
                f" gpushare cannot tell whether it stays within its GPU slot: {fix}",
                reason=MPS_LIMIT,
            )
        try:
            limits = limit_mib(value)
        except ValueError:
            raise Refusal(
                f"container {name!r} sets {MPS_LIMIT_ENV}={value!r}, which does not read as"
                f" NVIDIA's <device>=<amount><M|G>[,...] (e.g. 0=20G): {fix}",
                reason=MPS_LIMIT,
            ) from None
        over = {device: mib for device, mib in limits.items() if mib > offer.memory_mib}
        if over:
            device, mib = next(iter(over.items()))
            raise Refusal(
                f"container {name!r} sets {MPS_LIMIT_ENV}={value!r}: {mib} MiB on device"
                f" {device} is more than the {offer.slot.describe()} slot its"
                f" {REQUEST_LABEL} label gets: {fix}",
                reason=MPS_LIMIT,
            )


def limit_value(request_mib: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for the request: device 0 (a slot shows its pod one
    GPU, as device 0), in the M suffix that the device plugin's own MPS daemon uses."""
    return f"0={request_mib}M"


def apply(pod: dict[str, Any], placement: Placement) -> list[str]:
    """Change ``pod`` (a body the caller owns) as ``placement`` says; returns warnings.

    The meaning of a placement, written as a mutation: ``patch`` says the same as a JSON
    patch, and a property test holds the two together."""
    offer = placement.offer
    spec = pod.setdefault("spec", {})
    container = spec["containers"][placement.container]
    resources = container["resources"] = dict(container.get("resources") or {})
    for section in ("requests", "limits"):
        resources[section] = {**(resources.get(section) or {}), offer.resource: "1"}
    existing = user_limits(container)
    if not existing:
        env = container.get("env") or []
        container["env"] = [*env, _limit_entry(placement)]
    spec["affinity"] = affinity_for(spec, placement)
    return [_kept_limit_warning(container, placement)] if existing else []


def patch(pod: Mapping[str, Any], placement: Placement) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON patch (RFC 6902) that ``apply`` would make of ``pod``, built from the
    placement without copying or diffing the pod, and its warnings.

    Only what changes is named: one container's resources (a whole section where it has
    none), one entry appended to its env (the whole list where it has none), and the pod's
    affinity, whose value ``affinity_for`` builds anew (an ``add`` of a member that exists
    replaces it)."""
    offer = placement.offer
    spec = pod["spec"]
    container = spec["containers"][placement.container]
    at = f"/spec/containers/{placement.container}"
    ops: list[dict[str, Any]] = []
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        one = {offer.resource: "1"}
        ops.append(_add(f"{at}/resources", {"requests": one, "limits": dict(one)}))
    else:
        for section in ("requests", "limits"):
            if isinstance(resources.get(section), Mapping):
                ops.append(_add(f"{at}/resources/{section}/{_pointer(offer.resource)}", "1"))
            else:
                ops.append(_add(f"{at}/resources/{section}", {offer.resource: "1"}))
    warnings: list[str] = []
    if user_limits(container):
        warnings.append(_kept_limit_warning(container, placement))
    elif isinstance(container.get("env"), list) and container["env"]:
        ops.append(_add(f"{at}/env/-", _limit_entry(placement)))
    else:
        ops.append(_add(f"{at}/env", [_limit_entry(placement)]))
    ops.append(_add("/spec/affinity", affinity_for(spec, placement)))
    return ops, warnings


def _add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


def _pointer(key: str) -> str:
    """``key`` as one reference token of a JSON pointer (RFC 6901: ``~`` and ``/`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def _limit_entry(placement: Placement) -> dict[str, str]:
    return {"name": MPS_LIMIT_ENV, "value": limit_value(placement.request_mib)}


def _kept_limit_warning(container: Mapping[str, Any], placement: Placement) -> str:
    # ``place`` refused every value above the slot: what is left is the user's own tighter
    # limit, which MPS obeys even below the request.
    return (
        f"container {container.get('name')!r} sets {MPS_LIMIT_ENV} itself: kept as it is"
        f" (at most the {quantities.describe_mib(placement.offer.memory_mib)} slot; under MPS a"
        f" value below the {quantities.describe_mib(placement.request_mib)} asked for"
        " caps the process below it)"
    )


def affinity_for(spec: Mapping[str, Any], placement: Placement) -> dict[str, Any]:
    """The pod's affinity with ours in it, as a new value (the pod's own is left as it is):
    our two expressions ANDed into every required term that can match (the user's own kept),
    and a preference for nodes of the chosen class over bigger ones.

    An empty term (no expressions, no fields) is left empty: Kubernetes reads it as matching
    no node (k8s.io/api core/v1 ``NodeSelectorTerm``: "A null or empty node selector term
    matches no objects"; kube-scheduler's nodeaffinity skips it), and ANDed with ours it would
    match every gpushare node, outside every term the user wrote.  It is kept, not dropped, so
    that a required affinity of empty terms alone stays one that no node meets, as written,
    instead of becoming ours alone.  A required affinity without terms is left as it is too:
    the API server refuses it ("must have at least one node selector term") after the
    webhooks, as it would without gpushare."""
    offer = placement.offer
    resource = slotclasses.encode_resource(offer.resource)
    ours: list[dict[str, Any]] = [
        {
            "key": slotclasses.MEMORY_LABEL,
            "operator": "Gt",
            "values": [str(placement.request_mib - 1)],
        },
        {"key": slotclasses.RESOURCE_LABEL, "operator": "In", "values": [resource]},
    ]
    affinity = spec.get("affinity") or {}
    node = affinity.get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:  # no requirement of the user's: ours alone
        required, terms = {}, [{"matchExpressions": ours}]
    else:
        terms = [_and(term or {}, ours) for term in required.get("nodeSelectorTerms") or []]
    preferred = list(node.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    smallest = {
        "key": slotclasses.MEMORY_LABEL,
        "operator": "Lt",
        "values": [str(offer.memory_mib + 1)],
    }
    preferred.append({"weight": PREFERENCE_WEIGHT, "preference": {"matchExpressions": [smallest]}})
    return {
        **affinity,
        "nodeAffinity": {
            **node,
            "requiredDuringSchedulingIgnoredDuringExecution": (
                {**required, "nodeSelectorTerms": terms} if terms else required
            ),
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
    }


def is_empty_term(term: Mapping[str, Any]) -> bool:
    """Whether a node selector term is empty, and so matches no node."""
    return not term.get("matchExpressions") and not term.get("matchFields")


def _and(term: Mapping[str, Any], ours: list[dict[str, Any]]) -> dict[str, Any]:
    if is_empty_term(term):
        return dict(term)
    return {**term, "matchExpressions": [*(term.get("matchExpressions") or []), *ours]}


def is_gpu_resource(name: str, *, known: AbstractSet[str]) -> bool:
    """Whether a pod's request of ``name`` is a GPU resource: anything of nvidia.com, or a
    resource some policy advertises."""
    return name.startswith("nvidia.com/") or name in known

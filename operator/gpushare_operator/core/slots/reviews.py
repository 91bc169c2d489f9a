"""An AdmissionReview of a new pod, answered: the review's bytes in, the answer's bytes out.

This is the whole of the memory-request webhook's work per pod, and it is kept at the floor:
one decoding of the review that keeps only what the decision reads (``_Review``: msgspec
skips every other field without making an object of it, so a 3.6 KB review costs a few KiB,
not the 53 KiB that decoding it whole takes), the decision (``memoryrequests.place``: a pure
function of the pod and the offers, which are an immutable tuple), a JSON patch built straight
from the placement (``memoryrequests.patch``: nothing is copied or diffed), and one
``orjson.dumps``.  Nothing here reads anything that changes while it runs, so it can answer on
a thread of its own while the informers and the writer work on the main loop.

What is kept is plain dicts and lists, in the pod's own order and length (containers, their
env entries), so the patch's paths index the pod the API server holds: a container keeps its
name, resources and env; an env entry its name, value and valueFrom; the pod its labels,
annotations and affinity (whole, since the answer rebuilds it).

What is answered, as kopf's ``@kopf.on.mutate(operations=["CREATE"], labels={label:
PRESENT})`` answered before (the field names and codes are kopf's ``build_response``):

- not a pod review, or one without a uid or an object: ``BadReview`` (HTTP 400: nothing the
  API server can be told in an AdmissionReview);
- an operation other than CREATE, or a pod without the label: allowed, unchanged, uncounted
  (the configuration's rules and objectSelector send none of them);
- caches not synced yet: refused with 503, "unavailable";
- a pod the decision refuses: refused with its code and message, "refused" with its reason;
- otherwise allowed with a ``JSONPatch``, "mutated", and any warnings.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final, TypedDict, cast

import msgspec
import orjson

from gpushare_operator.core.slots import memoryrequests
from gpushare_operator.core.slots.slotclasses import Offer

MUTATED: Final = "mutated"
REFUSED: Final = "refused"
UNAVAILABLE: Final = "unavailable"
OUTCOMES: Final = (MUTATED, REFUSED, UNAVAILABLE)
NOT_SYNCED: Final = "gpushare's caches are not synced yet: try again in a moment"
_POD: Final = {"group": "", "version": "v1", "resource": "pods"}


# -- what is decoded of a review (every other field is skipped unread) -----------------------


class _Resources(TypedDict, total=False):
    requests: dict[str, Any] | None
    limits: dict[str, Any] | None


class _EnvVar(TypedDict, total=False):
    name: Any
    value: Any
    valueFrom: Any


class _Container(TypedDict, total=False):
    name: Any
    resources: _Resources | None
    env: list[_EnvVar] | None


class _Spec(TypedDict, total=False):
    containers: list[_Container] | None
    initContainers: list[_Container] | None
    affinity: Any


class _Metadata(TypedDict, total=False):
    name: Any
    labels: dict[str, Any] | None
    annotations: dict[str, Any] | None


class _Pod(TypedDict, total=False):
    metadata: _Metadata | None
    spec: _Spec | None


class _Request(TypedDict, total=False):
    uid: Any
    operation: Any
    resource: dict[str, Any] | None
    object: _Pod | None


class _Review(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    request: _Request | None


_DECODER: Final = msgspec.json.Decoder(_Review)


class BadReview(Exception):
    """The body is not an AdmissionReview of a pod that can be answered (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Answer:
    body: bytes  # the AdmissionReview answered, as JSON
    outcome: str | None  # one of OUTCOMES; None for a review passed through uncounted
    reason: str | None = None  # a refusal's reason (memoryrequests.REASONS)


@dataclass(frozen=True, slots=True)
class Offers:
    """What an answer reads, all of it immutable: replaced whole, never changed in place."""

    synced: bool
    offers: Sequence[Offer]  # every enforced class on offer, smallest first (a tuple)
    gpu_resources: AbstractSet[str]  # the resources policies advertise (see is_gpu_resource)


def answer(raw: bytes, *, offers: Callable[[], Offers]) -> Answer:
    """Answer the review in ``raw``; raises ``BadReview``.  ``offers`` is asked once, and
    only for a pod that needs a decision."""
    try:
        review = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise BadReview(f"not an AdmissionReview of a pod: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadReview(f"not JSON: {exc}") from None
    request = review.get("request")
    if request is None:
        raise BadReview("not an AdmissionReview: no request")
    uid, pod = request.get("uid"), cast(dict[str, Any] | None, request.get("object"))
    if not isinstance(uid, str) or pod is None:
        raise BadReview("the review's request has no uid or no object")
    if request.get("resource") != _POD:
        raise BadReview(f"the webhook admits pods (v1), not {request.get('resource')}")
    wrap = (review.get("apiVersion") or "admission.k8s.io/v1", review.get("kind") or "")
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if request.get("operation") != "CREATE" or memoryrequests.REQUEST_LABEL not in labels:
        return Answer(_encode(wrap, {"uid": uid, "allowed": True}), None)
    now = offers()
    if not now.synced:
        return Answer(_refusal(wrap, uid, NOT_SYNCED, 503), UNAVAILABLE)
    known = now.gpu_resources
    try:
        placement = memoryrequests.place(
            pod,
            offers=now.offers,
            is_gpu_resource=lambda name: memoryrequests.is_gpu_resource(name, known=known),
        )
    except memoryrequests.Refusal as refusal:
        return Answer(_refusal(wrap, uid, refusal.message, refusal.code), REFUSED, refusal.reason)
    ops, warnings = memoryrequests.patch(pod, placement)
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = warnings
    response["patch"] = base64.b64encode(orjson.dumps(ops)).decode("ascii")
    response["patchType"] = "JSONPatch"
    return Answer(_encode(wrap, response), MUTATED)


def _refusal(wrap: tuple[str, str], uid: str, message: str, code: int) -> bytes:
    status = {"message": message, "code": code}
    return _encode(wrap, {"uid": uid, "allowed": False, "status": status})


def _encode(wrap: tuple[str, str], response: dict[str, Any]) -> bytes:
    api_version, kind = wrap
    return orjson.dumps(
        {"apiVersion": api_version, "kind": kind or "AdmissionReview", "response": response}
    )

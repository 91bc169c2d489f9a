"""The webhook's answer to an AdmissionReview (core.slots.reviews): bytes in, bytes out, no API.

What kopf's ``@kopf.on.mutate`` answered before is the reference: its response shape, its
filters (CREATE only, the label present) and its refusal codes."""

from __future__ import annotations

import base64
import copy
from typing import Any

import jsonpatch
import orjson
import pytest

from gpushare_operator.core.slots import memoryrequests, reviews
from gpushare_operator.core.slots.slotclasses import Isolation, Offer

MPS = Offer(20389, "nvidia.com/gpu", Isolation.MPS, "batch")
WHOLE = Offer(81559, "nvidia.com/gpu", Isolation.EXCLUSIVE, "training")
SYNCED = reviews.Offers(synced=True, offers=(MPS, WHOLE), gpu_resources=frozenset())


def review(pod: dict[str, Any], **request: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0e0b-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
        }
        | request,
    }


def labelled(memory: str = "10Gi", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": {memoryrequests.REQUEST_LABEL: memory}},
        "spec": {"containers": [{"name": "main", "image": "x"}]} | spec,
    }


def answered(body: dict[str, Any], offers: reviews.Offers = SYNCED) -> tuple[Any, reviews.Answer]:
    got = reviews.answer(orjson.dumps(body), offers=lambda: offers)
    return orjson.loads(got.body), got


def test_a_labelled_pod_gets_a_json_patch_that_makes_it_what_apply_makes() -> None:
    pod = labelled("10Gi")
    body, got = answered(review(pod))
    assert got.outcome == reviews.MUTATED and got.reason is None
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == "0e0b-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch" and "warnings" not in response
    ops = orjson.loads(base64.b64decode(response["patch"]))
    expected = copy.deepcopy(pod)
    placement = memoryrequests.place(pod, offers=SYNCED.offers, is_gpu_resource=lambda _: False)
    memoryrequests.apply(expected, placement)
    assert jsonpatch.apply_patch(pod, ops) == expected
    assert expected["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_a_kept_limit_is_answered_with_its_warning() -> None:
    env = [{"name": memoryrequests.MPS_LIMIT_ENV, "value": "0=5G"}]
    body, _ = answered(review(labelled("10Gi", containers=[{"name": "m", "env": env}])))
    assert body["response"]["allowed"] is True
    (warning,) = body["response"]["warnings"]
    assert memoryrequests.MPS_LIMIT_ENV in warning and "kept" in warning


@pytest.mark.parametrize(
    "request_fields",
    [{"operation": "UPDATE"}, {"operation": "DELETE"}, {"object": {"metadata": {"name": "p"}}}],
)
def test_what_kopfs_filters_passed_by_is_allowed_unchanged_and_uncounted(
    request_fields: dict[str, Any],
) -> None:
    asked: list[bool] = []

    def offers() -> reviews.Offers:
        asked.append(True)
        return SYNCED

    got = reviews.answer(orjson.dumps(review(labelled(), **request_fields)), offers=offers)
    assert orjson.loads(got.body)["response"] == {"uid": "0e0b-1", "allowed": True}
    assert got.outcome is None and not asked


def test_before_the_caches_are_synced_a_labelled_pod_is_refused_with_503() -> None:
    body, got = answered(review(labelled()), reviews.Offers(False, (MPS,), frozenset()))
    assert got.outcome == reviews.UNAVAILABLE
    assert body["response"]["allowed"] is False
    assert body["response"]["status"] == {"message": reviews.NOT_SYNCED, "code": 503}


def test_a_refusal_says_why_with_its_code_and_reason() -> None:
    body, got = answered(review(labelled("100Gi")))
    assert got.outcome == reviews.REFUSED and got.reason == memoryrequests.TOO_LARGE
    status = body["response"]["status"]
    assert status["code"] == 403 and "ask for at most" in status["message"]
    assert "patch" not in body["response"]


def test_a_resource_policies_advertise_counts_as_a_gpu_request() -> None:
    pod = labelled(containers=[{"name": "m", "resources": {"limits": {"example.com/vgpu": 1}}}])
    offers = reviews.Offers(True, (MPS,), frozenset({"example.com/vgpu"}))
    _, got = answered(review(pod), offers)
    assert got.reason == memoryrequests.ALREADY_GPU


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not an AdmissionReview"),
        (orjson.dumps({"request": {"object": {}}}), "no uid"),
        (orjson.dumps(review(labelled(), object=None)), "no uid or no object"),
        (
            orjson.dumps(
                review(labelled(), resource={"group": "", "version": "v1", "resource": "nodes"})
            ),
            "admits pods",
        ),
    ],
)
def test_what_is_not_a_pod_review_is_a_bad_review(raw: bytes, said: str) -> None:
    with pytest.raises(reviews.BadReview, match=said):
        reviews.answer(raw, offers=lambda: SYNCED)

"""The /metrics access cache: answers kept for the TTL only, bounded in number, failures never
kept (and answered 503).  The real TokenReview and SubjectAccessReview calls are exercised on
the control plane in tests/integration/test_metrics_auth.py; here the API's answers are scripted
to control the clock and the failures."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpushare_operator.app import serving
from gpushare_operator.kube import access, http


class Reviews:
    """Answers TokenReviews (token "good-*" is a user) and SubjectAccessReviews (user-a only)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.down = False

    async def request(self, api: object, *, method: str, path: str, body: Any, **_: Any) -> Any:
        self.calls.append(path.rsplit("/", 1)[1])
        if self.down:
            raise http.ApiError(status=503, reason="unavailable", body={})
        if path == access.TOKEN_REVIEWS:
            token = body["spec"]["token"]
            if not token.startswith("good-"):
                return {"status": {"authenticated": False}}
            return {"status": {"authenticated": True, "user": {"username": token[5:]}}}
        return {"status": {"allowed": body["spec"]["user"] == "user-a"}}


@pytest.fixture
def reviews(monkeypatch: pytest.MonkeyPatch) -> Reviews:
    fake = Reviews()
    monkeypatch.setattr(access.http, "request", fake.request)
    return fake


async def test_answers_are_kept_for_the_ttl_then_asked_again(reviews: Reviews) -> None:
    now = [0.0]
    reviewer = access.AccessReviewer(None, ttl=30.0, clock=lambda: now[0])  # type: ignore[arg-type]
    allowed = await reviewer.review("good-user-a", path="/metrics", verb="get")
    assert allowed.decision is access.Decision.ALLOWED
    assert reviews.calls == ["tokenreviews", "subjectaccessreviews"]
    now[0] = 29.0
    assert (await reviewer.review("good-user-a", path="/metrics", verb="get")) == allowed
    assert len(reviews.calls) == 2
    now[0] = 31.0
    await reviewer.review("good-user-a", path="/metrics", verb="get")
    assert len(reviews.calls) == 4
    forbidden = await reviewer.review("good-user-b", path="/metrics", verb="get")
    assert (forbidden.decision, forbidden.user) == (access.Decision.FORBIDDEN, "user-b")
    unknown = await reviewer.review("bad", path="/metrics", verb="get")
    assert unknown.decision is access.Decision.UNAUTHENTICATED
    assert reviews.calls[-1] == "tokenreviews"  # no access review for an unknown token
    none = await reviewer.review(None, path="/metrics", verb="get")
    assert none.decision is access.Decision.UNAUTHENTICATED


async def test_the_cache_is_bounded(reviews: Reviews) -> None:
    reviewer = access.AccessReviewer(None, max_entries=2)  # type: ignore[arg-type]
    for token in ("bad-1", "bad-2", "bad-3"):
        await reviewer.review(token, path="/metrics", verb="get")
    calls = len(reviews.calls)
    await reviewer.review("bad-3", path="/metrics", verb="get")  # still cached
    assert len(reviews.calls) == calls
    await reviewer.review("bad-1", path="/metrics", verb="get")  # evicted: asked again
    assert len(reviews.calls) == calls + 1


async def test_a_failed_review_is_a_503_and_is_not_kept(reviews: Reviews) -> None:
    reviewer = access.AccessReviewer(None)  # type: ignore[arg-type]
    app = serving.build_metrics_app(CollectorRegistry(), reviewer=reviewer)
    async with TestClient(TestServer(app)) as client:
        reviews.down = True
        response = await client.get("/metrics", headers={"Authorization": "Bearer good-user-a"})
        assert response.status == 503
        reviews.down = False
        response = await client.get("/metrics", headers={"Authorization": "Bearer good-user-a"})
        assert response.status == 200
        response = await client.get("/metrics", headers={"Authorization": "Basic abc"})
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"

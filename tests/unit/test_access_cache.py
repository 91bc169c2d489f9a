"""The /metrics access reviewer: answers cached (allowed and denied, each for its TTL, each
bounded), at most a few reviews at once, a rate limit beyond which a request is refused without a
review, failures never kept (and answered 503).  The reviews are a fake here, to control the
clock, the answers and when they come; the real TokenReview and SubjectAccessReview calls are
made on the control plane in tests/integration/test_metrics_auth.py and test_metrics_flood.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpushare_operator.app import serving
from gpushare_operator.kube import access, http

METRICS = {"path": "/metrics", "verb": "get"}
ALLOWED = access.Verdict(access.Decision.ALLOWED, user="user-a")


class FakeReviews:
    """access.Reviews: token "good-<user>" is <user>, and only user-a may read /metrics; any
    other token is unknown.  ``gate``, when set, holds every review until it is set."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.running = 0
        self.most_at_once = 0
        self.down = False
        self.gate: asyncio.Event | None = None
        self._started = asyncio.Condition()

    async def until_running(self, count: int) -> None:
        async with self._started:
            await asyncio.wait_for(self._started.wait_for(lambda: self.running >= count), 5)

    async def review(self, token: str, *, path: str, verb: str) -> access.Verdict:
        self.asked.append(token)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        async with self._started:
            self._started.notify_all()
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.down:
                raise http.ApiError(status=503, reason="unavailable", body={})
        finally:
            self.running -= 1
        if not token.startswith("good-"):
            return access.Verdict(access.Decision.UNAUTHENTICATED)
        user = token[5:]
        allowed = user == "user-a" and (path, verb) == ("/metrics", "get")
        decision = access.Decision.ALLOWED if allowed else access.Decision.FORBIDDEN
        return access.Verdict(decision, user=user)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def reviews() -> FakeReviews:
    return FakeReviews()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def reviewer(reviews: FakeReviews, clock: Clock, **limits: Any) -> access.AccessReviewer:
    return access.AccessReviewer(reviews, limits=access.ReviewLimits(**limits), clock=clock)


async def test_an_allowed_answer_is_kept_for_its_ttl_then_asked_again(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock, allowed_ttl=120.0, denied_ttl=30.0)
    assert await guard.review("good-user-a", **METRICS) == ALLOWED
    clock.now += 119.0  # a hit does not extend it: revocation takes effect within the TTL
    assert await guard.review("good-user-a", **METRICS) == ALLOWED
    assert reviews.asked == ["good-user-a"]
    clock.now += 2.0
    assert await guard.review("good-user-a", **METRICS) == ALLOWED
    assert reviews.asked == ["good-user-a"] * 2
    assert guard.outcomes == {"reviewed": 2, "cached": 1}


async def test_refusals_are_kept_too_for_their_shorter_ttl(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock, allowed_ttl=120.0, denied_ttl=30.0)
    forbidden = await guard.review("good-user-b", **METRICS)
    assert forbidden == access.Verdict(access.Decision.FORBIDDEN, user="user-b")
    unknown = await guard.review("made-up", **METRICS)
    assert unknown.decision is access.Decision.UNAUTHENTICATED
    clock.now += 29.0
    assert await guard.review("good-user-b", **METRICS) == forbidden
    assert await guard.review("made-up", **METRICS) == unknown
    assert reviews.asked == ["good-user-b", "made-up"]
    clock.now += 2.0  # e.g. user-b was bound to the role meanwhile: asked again
    await guard.review("good-user-b", **METRICS)
    await guard.review("made-up", **METRICS)
    assert reviews.asked == ["good-user-b", "made-up"] * 2
    # The answer is for this path and verb only.
    assert (await guard.review("good-user-a", path="/debug", verb="get")).decision is (
        access.Decision.FORBIDDEN
    )


async def test_no_token_costs_no_review(reviews: FakeReviews, clock: Clock) -> None:
    guard = reviewer(reviews, clock)
    for token in (None, ""):
        assert (await guard.review(token, **METRICS)).decision is access.Decision.UNAUTHENTICATED
    assert reviews.asked == []
    assert guard.outcomes == {"anonymous": 2}


async def test_the_cache_keeps_digests_of_tokens_never_the_tokens(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock)
    for token in ("good-user-a", "made-up-secret"):
        await guard.review(token, **METRICS)
    keys = [*guard.allowed._entries, *guard.denied._entries]
    assert len(keys) == 2
    for digest, path, verb in keys:
        assert (len(digest), path, verb) == (32, "/metrics", "get")
        assert b"user-a" not in digest and b"secret" not in digest


async def test_each_cache_is_bounded_and_denials_never_evict_an_allowed_scraper(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock, allowed_entries=2, denied_entries=3, burst=100)
    await guard.review("good-user-a", **METRICS)
    for i in range(10):
        await guard.review(f"made-up-{i}", **METRICS)
    assert (len(guard.allowed), len(guard.denied)) == (1, 3)
    asked = len(reviews.asked)
    assert await guard.review("good-user-a", **METRICS) == ALLOWED  # still cached
    await guard.review("made-up-9", **METRICS)  # among the 3 most recent: cached
    assert len(reviews.asked) == asked
    await guard.review("made-up-0", **METRICS)  # evicted: asked again
    assert len(reviews.asked) == asked + 1
    # The least recently *used* goes first: a hit keeps an answer in.
    await guard.review("made-up-8", **METRICS)  # hit: now the most recent
    for i in (20, 21):
        await guard.review(f"made-up-{i}", **METRICS)
    asked = len(reviews.asked)
    await guard.review("made-up-8", **METRICS)
    assert len(reviews.asked) == asked


async def test_past_the_rate_limit_a_token_is_refused_without_a_review(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock, qps=5.0, burst=3)
    for i in range(3):
        await guard.review(f"made-up-{i}", **METRICS)
    with pytest.raises(access.Throttled) as refused:
        await guard.review("made-up-3", **METRICS)
    assert refused.value.retry_after == pytest.approx(0.2)
    assert len(reviews.asked) == 3
    # Answers already cached are not limited.
    assert (await guard.review("made-up-0", **METRICS)).decision is (
        access.Decision.UNAUTHENTICATED
    )
    clock.now += 0.2  # one token back
    await guard.review("made-up-3", **METRICS)
    with pytest.raises(access.Throttled):
        await guard.review("made-up-4", **METRICS)
    assert reviews.asked == [f"made-up-{i}" for i in range(4)]
    assert guard.outcomes == {"reviewed": 4, "throttled": 2, "cached": 1}


async def test_a_scraper_allowed_before_is_re_reviewed_on_a_budget_of_its_own(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock, qps=1.0, burst=1, renewal_qps=1.0, renewal_burst=1)
    await guard.review("good-user-a", **METRICS)
    clock.now += access.ALLOWED_TTL + 1  # its answer expired...
    await guard.review("made-up-0", **METRICS)  # ...and a flood spends the bucket
    with pytest.raises(access.Throttled):
        await guard.review("made-up-1", **METRICS)
    assert await guard.review("good-user-a", **METRICS) == ALLOWED  # still reviewed
    assert reviews.asked == ["good-user-a", "made-up-0", "good-user-a"]
    # The renewal budget is for tokens allowed before only: made-up tokens cannot spend it.
    clock.now += access.ALLOWED_TTL + 1
    await guard.review("made-up-2", **METRICS)  # the fresh bucket's token
    with pytest.raises(access.Throttled):
        await guard.review("made-up-3", **METRICS)
    assert await guard.review("good-user-a", **METRICS) == ALLOWED


async def test_at_most_a_few_reviews_run_at_once_and_one_token_is_reviewed_once(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock, concurrency=4, burst=100)
    reviews.gate = asyncio.Event()
    tokens = [f"good-user-{i}" for i in range(10)]
    waiting = [asyncio.create_task(guard.review(t, **METRICS)) for t in tokens + tokens]

    await reviews.until_running(4)
    for _ in range(20):  # the others queue: none starts while four are running
        await asyncio.sleep(0)
    assert reviews.running == 4
    reviews.gate.set()
    verdicts = await asyncio.gather(*waiting)
    assert reviews.most_at_once == 4
    assert sorted(reviews.asked) == sorted(tokens)  # each token once, its twin shared it
    assert [v.user for v in verdicts] == [t[5:] for t in tokens + tokens]
    assert guard.outcomes == {"reviewed": 10, "shared": 10}


async def test_a_caller_that_goes_away_leaves_the_review_to_the_others(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock)
    reviews.gate = asyncio.Event()
    first = asyncio.create_task(guard.review("good-user-a", **METRICS))
    second = asyncio.create_task(guard.review("good-user-a", **METRICS))
    await reviews.until_running(1)
    first.cancel()
    reviews.gate.set()
    assert await second == ALLOWED
    assert first.cancelled()
    assert await guard.review("good-user-a", **METRICS) == ALLOWED  # cached by then
    assert reviews.asked == ["good-user-a"]


async def test_close_cancels_the_reviews_still_running(reviews: FakeReviews, clock: Clock) -> None:
    guard = reviewer(reviews, clock)
    reviews.gate = asyncio.Event()
    waiting = asyncio.create_task(guard.review("good-user-a", **METRICS))
    await reviews.until_running(1)
    await guard.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert reviews.running == 0


async def test_a_failed_review_is_not_kept(reviews: FakeReviews, clock: Clock) -> None:
    guard = reviewer(reviews, clock)
    reviews.down = True
    with pytest.raises(http.ApiError):
        await guard.review("good-user-a", **METRICS)
    reviews.down = False
    assert await guard.review("good-user-a", **METRICS) == ALLOWED
    assert guard.outcomes == {"reviewed": 2, "failed": 1}


async def test_the_metrics_server_says_401_403_429_and_503(
    reviews: FakeReviews, clock: Clock
) -> None:
    guard = reviewer(reviews, clock, qps=1.0, burst=3)
    registry = CollectorRegistry()
    registry.register(serving.AccessCounts(guard))
    app = serving.build_metrics_app(registry, reviewer=guard)

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async with TestClient(TestServer(app)) as client:
        reviews.down = True
        response = await client.get("/metrics", headers=bearer("good-user-a"))
        assert response.status == 503
        reviews.down = False
        response = await client.get("/metrics", headers=bearer("good-user-a"))
        assert response.status == 200
        response = await client.get("/metrics", headers={"Authorization": "Basic abc"})
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        response = await client.get("/metrics", headers=bearer("good-user-b"))
        assert response.status == 403
        assert "user-b may not get /metrics" in await response.text()
        response = await client.get("/metrics", headers=bearer("made-up"))
        assert response.status == 429  # the burst of 3 is spent: no review
        assert response.headers["Retry-After"] == "1"
        assert len(reviews.asked) == 3
        response = await client.get("/metrics", headers=bearer("good-user-a"))
        assert response.status == 200  # a cached scraper is never refused
        text = await response.text()
    samples = {
        (s.name, tuple(sorted(s.labels.values()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("gpushare_metrics_access_total", ("throttled",))] == 1
    assert samples[("gpushare_metrics_access_total", ("failed",))] == 1
    assert samples[("gpushare_metrics_access_cache_entries", ("allowed",))] == 1
    assert samples[("gpushare_metrics_access_cache_entries", ("denied",))] == 1


class ApiAnswers:
    """The API server's answers to ApiReviews' requests (http.request), as it gives them."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def request(self, api: object, *, method: str, path: str, body: Any, **_: Any) -> Any:
        assert method == "POST"
        self.bodies.append(body)
        if path == access.TOKEN_REVIEWS:
            if body["spec"]["token"] != "real":
                return {"status": {"authenticated": False}}
            user = {"username": "scraper", "uid": "u-1", "groups": ["g"], "extra": {"k": ["v"]}}
            return {"status": {"authenticated": True, "user": user}}
        assert path == access.ACCESS_REVIEWS
        return {"status": {"allowed": True}}


async def test_api_reviews_ask_who_it_is_then_whether_it_may(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = ApiAnswers()
    monkeypatch.setattr(access.http, "request", answers.request)
    reviews = access.ApiReviews(None)  # type: ignore[arg-type]
    unknown = await reviews.review("made-up", **METRICS)
    assert unknown.decision is access.Decision.UNAUTHENTICATED
    assert [b["kind"] for b in answers.bodies] == ["TokenReview"]  # no access review for it
    assert await reviews.review("real", **METRICS) == access.Verdict(
        access.Decision.ALLOWED, user="scraper"
    )
    assert answers.bodies[-1]["spec"] == {
        "user": "scraper",
        "uid": "u-1",
        "groups": ["g"],
        "extra": {"k": ["v"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    assert reviews.calls == 3


async def test_api_reviews_are_on_a_client_of_their_own() -> None:
    """A copy of the operator's configuration with a pool of REVIEW_CONCURRENCY connections and
    a user agent of its own (the flood test finds the reviews by it in the audit log)."""
    shared = client.Configuration(host="https://127.0.0.1:6443")
    shared.connection_pool_maxsize = 100
    reviews = access.api_reviews(shared)
    try:
        own = reviews._api
        assert own.configuration is not shared
        assert own.configuration.host == shared.host
        assert own.configuration.connection_pool_maxsize == access.REVIEW_CONCURRENCY
        assert shared.connection_pool_maxsize == 100
        assert own.user_agent == access.USER_AGENT
        assert own.default_headers["User-Agent"] == access.USER_AGENT
    finally:
        await reviews.close()

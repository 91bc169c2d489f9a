"""Who may read /metrics: TokenReview and SubjectAccessReview against the API server, cached,
capped and rate-limited so that no caller can turn /metrics into load on the API server.

The API server decides, as it does for its own endpoints: a bearer token is authenticated with
a TokenReview, and the user it names is authorized for a non-resource URL (``/metrics``, verb
``get``) with a SubjectAccessReview, so a ClusterRole with ``nonResourceURLs: ["/metrics"]`` is
what grants a scraper access.

Anyone who reaches the port can send a new made-up token with every request, and each would be
a review.  So (docs/operations.md, "Metrics", says the same for users):

- answers are cached by a digest of the token (never the token itself), allowed ones for
  ``ALLOWED_TTL`` and refusals for ``DENIED_TTL``, each in an LRU of its own, so that a flood
  of refused tokens can never evict a scraper that was allowed;
- a token not in the cache is reviewed only if the rate limit has room (``REVIEW_QPS``, bursts
  of ``REVIEW_BURST``); otherwise the request is refused at once (``Throttled``: 429), without
  a call to the API server.  A token that was allowed before and has merely expired is
  re-reviewed on a budget of its own (``RENEWAL_QPS``), which unknown tokens cannot spend;
- at most ``REVIEW_CONCURRENCY`` reviews run at once, requests for the same token share one,
  and they go through an API client of their own (connection.review_client, a pool of
  ``REVIEW_CONCURRENCY`` connections): they never queue behind the writer's requests, nor it
  behind them.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from kubernetes_asyncio import client

from gpushare_operator.kube import connection, http
from gpushare_operator.kube.ratelimit import TokenBucket

log = structlog.get_logger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

# How long a revoked token or binding may keep working here: the API server's own default for
# its webhook token authenticator's cache (2 min).  Prometheus scrapes every 15-30 s with one
# token, so a scraper costs a review every 2 minutes.
ALLOWED_TTL = 120.0
# How long a token must wait after it is bound to the metrics-reader role (or after a refused
# token has become valid): the API server's default for caching webhook authorization denials.
DENIED_TTL = 30.0
# Scrapers allowed at once: a few Prometheus replicas, each with a token rotated about hourly.
# 1,024 is far more, at ~300 bytes an entry.
ALLOWED_ENTRIES = 1024
# Denials are only made as fast as the rate limit admits reviews (REVIEW_QPS * DENIED_TTL +
# REVIEW_BURST = 170 alive at once): 4,096 never evicts a live one and bounds the memory (~1.5
# MB) all the same.
DENIED_ENTRIES = 4096
# A review is a TokenReview and a SubjectAccessReview of a few milliseconds each: four at once
# are more than the rate limit needs, and all that a slow API server ever sees from us.
REVIEW_CONCURRENCY = 4
# Unknown tokens reviewed per second (at most twice as many API calls): scrapers need one per
# ALLOWED_TTL each, so 5/s is hundreds of scrapers, and a tenth of the writer's default rate.
# The burst lets a fleet of 20 scrapers restart at once without a refusal.
REVIEW_QPS = 5.0
REVIEW_BURST = 20
# Re-reviews of tokens that were allowed before: rare (one per scraper per ALLOWED_TTL).
RENEWAL_QPS = 1.0
RENEWAL_BURST = 10
# Seconds per API call: two calls stay within a scrape timeout of Prometheus' default (10 s).
REVIEW_TIMEOUT = 5.0
# At most one warning in this many seconds while the rate limit refuses requests.
WARN_EVERY = 60.0
# The reviews' client says so in every request: the audit log tells them from the writer's.
USER_AGENT = "gpushare-operator (metrics access review)"


class Decision(enum.Enum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # no token, or one the API server does not accept: 401
    FORBIDDEN = "forbidden"  # a known user without the permission: 403


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    user: str | None = None  # for the access log of refusals


class Throttled(Exception):
    """Not reviewed: the rate limit is spent.  The caller says 429 with ``retry_after``."""

    def __init__(self, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(f"too many tokens to review; retry in {retry_after:.1f} s")


class Reviews(Protocol):
    """What decides, for a token, whether it may ``verb`` a non-resource ``path`` (the API
    server, through ApiReviews; a fake in the unit tests)."""

    async def review(self, token: str, *, path: str, verb: str) -> Verdict: ...


@dataclass(frozen=True, slots=True)
class ReviewLimits:
    allowed_ttl: float = ALLOWED_TTL
    denied_ttl: float = DENIED_TTL
    allowed_entries: int = ALLOWED_ENTRIES
    denied_entries: int = DENIED_ENTRIES
    concurrency: int = REVIEW_CONCURRENCY
    qps: float = REVIEW_QPS
    burst: int = REVIEW_BURST
    renewal_qps: float = RENEWAL_QPS
    renewal_burst: int = RENEWAL_BURST


Key = tuple[bytes, str, str]  # (SHA-256 of the token, path, verb)


class Answers:
    """Verdicts by key, each good for ``ttl`` from when it was made (a hit does not extend it:
    that is what bounds a revocation's delay); at most ``max_entries``, least recently used
    first out.  An expired entry is still *known* (``known``) until it is evicted."""

    def __init__(self, *, ttl: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[Key, tuple[float, Verdict]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Verdict | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] <= self._clock():
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def known(self, key: Key) -> bool:
        return key in self._entries

    def put(self, key: Key, verdict: Verdict) -> None:
        self._entries[key] = (self._clock() + self._ttl, verdict)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def drop(self, key: Key) -> None:
        self._entries.pop(key, None)


class AccessReviewer:
    """Decides whether a bearer token may ``verb`` a non-resource ``path``: from the cache when
    it can, else by ``reviews`` within the limits; raises Throttled past the rate limit, and
    whatever ``reviews`` raised when the review failed (never cached: the caller says 503)."""

    def __init__(
        self,
        reviews: Reviews,
        *,
        limits: ReviewLimits = ReviewLimits(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviews = reviews
        self._clock = clock
        self.allowed = Answers(
            ttl=limits.allowed_ttl, max_entries=limits.allowed_entries, clock=clock
        )
        self.denied = Answers(ttl=limits.denied_ttl, max_entries=limits.denied_entries, clock=clock)
        self._fresh = TokenBucket(qps=limits.qps, burst=limits.burst, clock=clock)
        self._renewals = TokenBucket(
            qps=limits.renewal_qps, burst=limits.renewal_burst, clock=clock
        )
        self._running = asyncio.Semaphore(limits.concurrency)
        self._pending: dict[Key, asyncio.Task[Verdict]] = {}
        # What became of each request, by outcome: cached, reviewed, shared (waited for the
        # same token's review), throttled, failed, anonymous (no token).  /metrics shows them.
        self.outcomes: collections.Counter[str] = collections.Counter()
        self._throttled_since_warning = 0
        self._warned_at = -math.inf

    async def review(self, token: str | None, *, path: str, verb: str) -> Verdict:
        if not token:
            self.outcomes["anonymous"] += 1
            return Verdict(Decision.UNAUTHENTICATED)
        # Only a digest of the token is kept in memory, never the token itself.
        key = (hashlib.sha256(token.encode()).digest(), path, verb)
        cached = self.allowed.get(key) or self.denied.get(key)
        if cached is not None:
            self.outcomes["cached"] += 1
            return cached
        task = self._pending.get(key)
        if task is not None:
            self.outcomes["shared"] += 1
        else:
            task = self._start(key, token, path=path, verb=verb)
        try:
            # Shielded: a caller that goes away does not waste a review the others wait for.
            return await asyncio.shield(task)
        except Exception:
            self.outcomes["failed"] += 1
            raise

    def _start(self, key: Key, token: str, *, path: str, verb: str) -> asyncio.Task[Verdict]:
        bucket = self._renewals if self.allowed.known(key) else self._fresh
        wait = bucket.try_take()
        if wait > 0:
            self._throttled(wait)
            raise Throttled(wait)
        self.outcomes["reviewed"] += 1
        task = asyncio.create_task(self._ask(key, token, path=path, verb=verb), name="review")
        self._pending[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        return task

    def _finished(self, key: Key, task: asyncio.Task[Verdict]) -> None:
        self._pending.pop(key, None)
        if not task.cancelled():
            task.exception()  # seen: all its callers may have gone away

    async def _ask(self, key: Key, token: str, *, path: str, verb: str) -> Verdict:
        async with self._running:
            verdict = await self._reviews.review(token, path=path, verb=verb)
        if verdict.decision is Decision.ALLOWED:
            self.denied.drop(key)
            self.allowed.put(key, verdict)
        else:
            self.allowed.drop(key)
            self.denied.put(key, verdict)
        return verdict

    def _throttled(self, wait: float) -> None:
        self.outcomes["throttled"] += 1
        self._throttled_since_warning += 1
        now = self._clock()
        if now - self._warned_at >= WARN_EVERY:
            log.warning(
                "too many unknown tokens on /metrics: refusing them without a review",
                refused=self._throttled_since_warning,
                retry_in=round(wait, 2),
            )
            self._warned_at = now
            self._throttled_since_warning = 0

    async def close(self) -> None:
        """Cancel the reviews still running (at stop, once the server answers no one)."""
        tasks = list(self._pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class ApiReviews:
    """Reviews by the API server: a TokenReview, then a SubjectAccessReview for the user it
    names.  ``api`` should be a client of its own (connection.review_client)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self.calls = 0  # API calls made, for tests and debugging

    async def close(self) -> None:
        await self._api.close()

    async def review(self, token: str, *, path: str, verb: str) -> Verdict:
        self.calls += 1
        review = await http.request(
            self._api,
            method="POST",
            path=TOKEN_REVIEWS,
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
            timeout=REVIEW_TIMEOUT,
        )
        status = (review or {}).get("status") or {}
        if not status.get("authenticated"):
            return Verdict(Decision.UNAUTHENTICATED)
        user: dict[str, Any] = status.get("user") or {}
        name = str(user.get("username", ""))
        spec: dict[str, Any] = {
            "user": name,
            "groups": list(user.get("groups") or ()),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        self.calls += 1
        access = await http.request(
            self._api,
            method="POST",
            path=ACCESS_REVIEWS,
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
            timeout=REVIEW_TIMEOUT,
        )
        allowed = bool(((access or {}).get("status") or {}).get("allowed"))
        return Verdict(Decision.ALLOWED if allowed else Decision.FORBIDDEN, user=name)


def api_reviews(configuration: client.Configuration) -> ApiReviews:
    """ApiReviews on a client of its own, one connection per review that may run at once.
    Call it on the loop that will use it; ``close()`` it after the reviewer."""
    api = connection.review_client(
        configuration, pool_size=REVIEW_CONCURRENCY, user_agent=USER_AGENT
    )
    return ApiReviews(api)

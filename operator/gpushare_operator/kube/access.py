"""Who may read /metrics: TokenReview and SubjectAccessReview against the API server.

The API server decides, as it does for its own endpoints: a bearer token is authenticated with
a TokenReview, and the user it names is authorized for a non-resource URL (``/metrics``, verb
``get``) with a SubjectAccessReview, so a ClusterRole with ``nonResourceURLs: ["/metrics"]`` is
what grants a scraper access.  Answers are cached briefly: Prometheus scrapes every 15-30 s with
the same token, and two API calls per scrape would cost more than the scrape itself.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes_asyncio import client

from gpushare_operator.kube import http

log = structlog.get_logger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Decision(enum.Enum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # no token, or one the API server does not accept: 401
    FORBIDDEN = "forbidden"  # a known user without the permission: 403


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    user: str | None = None  # for the access log of refusals


class AccessReviewer:
    """Decides, with the API server, whether a bearer token may ``verb`` a non-resource ``path``.

    ``ttl`` bounds how long a revoked token or binding keeps working here; ``max_entries``
    bounds the memory a flood of made-up tokens can take (the oldest answers go first).
    Failed reviews (the API server unreachable) are never cached: the caller says 503.
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        ttl: float = 30.0,
        max_entries: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._ttl = ttl
        self._max_entries = max_entries
        self._clock = clock
        self._answers: OrderedDict[tuple[str, str, str], tuple[float, Verdict]] = OrderedDict()
        self.reviews = 0  # API calls made, for tests and debugging

    async def review(self, token: str | None, *, path: str, verb: str) -> Verdict:
        if not token:
            return Verdict(Decision.UNAUTHENTICATED)
        # Only a digest of the token is kept in memory, never the token itself.
        key = (hashlib.sha256(token.encode()).hexdigest(), path, verb)
        now = self._clock()
        cached = self._answers.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        verdict = await self._ask(token, path=path, verb=verb)
        self._answers[key] = (now + self._ttl, verdict)
        self._answers.move_to_end(key)
        while len(self._answers) > self._max_entries:
            self._answers.popitem(last=False)
        return verdict

    async def _ask(self, token: str, *, path: str, verb: str) -> Verdict:
        self.reviews += 1
        review = await http.request(
            self._api,
            method="POST",
            path=TOKEN_REVIEWS,
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
            timeout=10.0,
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
        self.reviews += 1
        access = await http.request(
            self._api,
            method="POST",
            path=ACCESS_REVIEWS,
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
            timeout=10.0,
        )
        allowed = bool(((access or {}).get("status") or {}).get("allowed"))
        return Verdict(Decision.ALLOWED if allowed else Decision.FORBIDDEN, user=name)

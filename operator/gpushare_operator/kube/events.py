"""Kubernetes Events about policies and nodes, rate-limited so a flapping state cannot flood.

Events about a namespaced object go to its namespace.  Events about cluster-scoped objects
(policies, nodes) must be in ``default``: the API server refuses a core/v1 Event whose namespace
differs from its involved object's, and for a cluster-scoped object it accepts only ``default``.
That is where ``kubectl describe`` looks for them too.  The same
(object, reason, message) is posted at most once per ``dedupe_window``, and all events together
through a token bucket (``burst``, refilled at ``per_second``); what is over the limit is dropped
and counted, never queued, so a flapping condition costs the API server a bounded trickle.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import structlog
from kubernetes_asyncio import client

from gpushare_operator.kube import http

log = structlog.get_logger(__name__)


CLUSTER_SCOPED_EVENTS_NAMESPACE = "default"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str | None = None  # None: cluster-scoped


class EventRecorder:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        component: str = "gpushare-operator",
        dedupe_window: float = 600.0,
        per_second: float = 1.0,
        burst: int = 30,
        clock: Callable[[], float] = time.monotonic,
        allowed: Callable[[], bool] = lambda: True,
    ) -> None:
        self._api = api
        self._component = component
        self._window = dedupe_window
        self._rate = per_second
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._allowed = allowed  # the leader gate: a follower (or a fenced leader) posts nothing
        self._stamp = clock()
        self._last: dict[tuple[str, str, str], float] = {}
        self._prune_at = self._stamp + dedupe_window
        self.posted = 0
        self.dropped = 0

    def _admit(self, key: tuple[str, str, str]) -> bool:
        now = self._clock()
        self._forget_old(now)
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if now - self._last.get(key, float("-inf")) < self._window or self._tokens < 1:
            self.dropped += 1
            return False
        self._tokens -= 1
        self._last[key] = now
        return True

    @property
    def remembered(self) -> int:
        """How many recent events the dedupe window still holds."""
        return len(self._last)

    def _forget_old(self, now: float) -> None:
        """Drop what is past the dedupe window, once per window: an operator that runs for
        months sees every node come and go, and must not keep a key for each."""
        if now < self._prune_at:
            return
        self._prune_at = now + self._window
        self._last = {k: t for k, t in self._last.items() if now - t < self._window}

    async def post(self, *, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Post one Event; failures are logged, never raised (events are best effort)."""
        if not self._allowed() or not self._admit((ref.uid or ref.name, reason, message)):
            return
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = ref.namespace or CLUSTER_SCOPED_EVENTS_NAMESPACE
        involved = {
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "name": ref.name,
            "uid": ref.uid,
        }
        if ref.namespace:
            involved["namespace"] = ref.namespace
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            # Unique per post, like client-go's recorder: <object>.<unix nanoseconds in hex>.
            "metadata": {"name": f"{ref.name[:200]}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await http.request(
                self._api,
                method="POST",
                path=f"/api/v1/namespaces/{namespace}/events",
                body=body,
            )
            self.posted += 1
        except (http.ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning(
                "event not posted", kind=ref.kind, name=ref.name, reason=reason, error=str(exc)
            )

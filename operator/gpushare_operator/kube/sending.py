"""What every write request goes through: the loop's permit, the job's tokens, the counters.

Shared by ``patching`` (nodes and policies) and ``configuring`` (the device-plugin ConfigMap):
a request goes out only with a token of the write rate and while the write loop lets it (we
lead, and it is not stopping), with a timeout that ends before our lease could.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client

from gpushare_operator.core.api import models
from gpushare_operator.kube import http
from gpushare_operator.kube.events import EventRecorder, ObjectRef
from gpushare_operator.kube.streams import drop_managed_fields
from gpushare_operator.kube.telemetry import NoTelemetry, Telemetry

FIELD_MANAGER = models.FIELD_MANAGER
JSON_PATCH = "application/json-patch+json"
API = f"/apis/{models.GROUP}/{models.VERSION}"
# Answers that the same request will get again until someone changes something (RBAC, the CRD,
# the object): reported, and retried only on the object's back-off.
PERMANENT = frozenset({401, 403, 422})
FAILURES = (http.ApiError, aiohttp.ClientError, OSError, TimeoutError)


class Permit(Protocol):
    """Whether a write may be sent now (the write loop's: leading, and not stopping)."""

    def may_write(self) -> bool: ...
    def time_left(self) -> float: ...
    async def token(self) -> bool:
        """Wait for a token of the write rate; False when writing stopped meanwhile."""
        ...


class Tokens:
    """The tokens of one job: its first request's was taken before its final plan, so that
    planning again after the wait folds whatever arrived meanwhile into the same write."""

    def __init__(self, permit: Permit, *, prepaid: bool) -> None:
        self._permit = permit
        self._prepaid = prepaid

    async def take(self) -> bool:
        if self._prepaid:
            self._prepaid = False
            return True
        return await self._permit.token()


class NotSent(Exception):
    """Leadership ended (or the loop is stopping) before a request went out: the writers turn
    it into ``LeadershipLost``; it never reaches the write loop."""


@dataclass
class WriteCounters:
    ok: dict[str, int]
    failed: dict[str, int]

    def count(self, kind: str, *, ok: bool) -> None:
        bucket = self.ok if ok else self.failed
        bucket[kind] = bucket.get(kind, 0) + 1


class Sender:
    """Sends requests under the permit, counting and timing each."""

    def __init__(
        self,
        *,
        api: client.ApiClient,
        permit: Permit,
        recorder: EventRecorder,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._api = api
        self._permit = permit
        self.recorder = recorder
        self._telemetry: Telemetry = telemetry or NoTelemetry()
        self.counters = WriteCounters(ok={}, failed={})

    @property
    def telemetry(self) -> Telemetry:
        return self._telemetry

    async def send(self, tokens: Tokens, kind: str, **request: Any) -> Any:
        if not await tokens.take() or not self._permit.may_write():
            raise NotSent()
        started = time.perf_counter()
        # A write must not land after our lease could have passed to another replica.
        request.setdefault("timeout", max(0.1, min(30.0, self._permit.time_left())))
        try:
            result = await http.request(self._api, **request)
        except FAILURES as exc:
            self.counters.count(kind, ok=False)
            outcome = f"http_{exc.status}" if isinstance(exc, http.ApiError) else "error"
            self._telemetry.wrote(kind, outcome, time.perf_counter() - started)
            raise
        self.counters.count(kind, ok=True)
        self._telemetry.wrote(kind, "ok", time.perf_counter() - started)
        return result

    async def read(self, **request: Any) -> Any:
        """A read that a write of this job waits on (the idle check before a MIG layout):
        under the permit like a write, within the lease's time, but with no write token."""
        if not self._permit.may_write():
            raise NotSent()
        request.setdefault("timeout", max(0.1, min(30.0, self._permit.time_left())))
        return await http.request(self._api, method="GET", **request)

    async def report(self, ref: ObjectRef, problem: str) -> None:
        """A Warning Event for a refused write (the recorder rate-limits and de-duplicates)."""
        await self.recorder.post(ref=ref, type_="Warning", reason="WriteFailed", message=problem)


def slim(answer: Any) -> dict[str, Any] | None:
    """The object a write returned, without its managedFields (None: no object came back)."""
    return drop_managed_fields(answer) if isinstance(answer, dict) else None


def problem_of(exc: http.ApiError) -> str:
    body = exc.body if isinstance(exc.body, Mapping) else {}
    message = body.get("message") or exc.reason or ""
    return f"HTTP {exc.status} {body.get('reason') or exc.reason}: {message}".rstrip(": ")


def policy_ref(name: str, uid: str) -> ObjectRef:
    return ObjectRef(f"{models.GROUP}/{models.VERSION}", models.POLICY_KIND, name, uid)

"""Asking the API server to evict pods (``POST pods/NAME/eviction``, policy/v1), never to
delete them: the Eviction API checks each pod's PodDisruptionBudgets, and refuses with 429
while one allows no disruption now, naming it in the answer's ``details.causes``.

What each answer means to us: 201 (or 200) accepted, the pod is now terminating; 429 refused
for now (retried later with back-off, by ``reconcile.drains``); 404 the pod is gone, and 409 a
pod of that name with another uid (our uid precondition): nothing left to evict, so neither
is a failure.  Anything else is, and the node's job is retried.

An eviction never asks for ``gracePeriodSeconds: 0``: the API server would delete the pod's
record at once, while its containers still run, and the drain would take that for a free GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpushare_operator.core.api.models import eviction_grace_period
from gpushare_operator.kube import http
from gpushare_operator.kube.events import ObjectRef
from gpushare_operator.kube.sending import FAILURES, Sender, Tokens
from gpushare_operator.reconcile.drains import Eviction

log = structlog.get_logger(__name__)

# k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go words the cause so.
_BUDGET_RE = re.compile(r"disruption budget (\S+?)[ :]")


@dataclass(frozen=True, slots=True)
class Evicted:
    accepted: tuple[str, ...] = ()  # uids
    refused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # uid -> budgets
    failed: str | None = None  # the first failure that is neither of those


async def evict(
    sender: Sender, tokens: Tokens, evictions: tuple[Eviction, ...], *, node: str
) -> Evicted:
    accepted: list[str] = []
    refused: dict[str, tuple[str, ...]] = {}
    failed = None
    for eviction in evictions:
        try:
            await _post(sender, tokens, eviction)
        except http.ApiError as exc:
            if exc.status in (404, 409):
                continue  # gone already, or another pod of that name: nothing to evict
            if exc.status == 429 or _several_budgets(exc):
                refused[eviction.uid] = budgets_of(exc.body, namespace=eviction.namespace)
                log.info("eviction refused", pod=eviction.name, node=node, error=str(exc))
                continue
            failed = failed or str(exc)
            continue
        except FAILURES as exc:
            failed = failed or str(exc)
            continue
        accepted.append(eviction.uid)
        ref = ObjectRef("v1", "Pod", eviction.name, eviction.uid, eviction.namespace)
        await sender.recorder.post(
            ref=ref, type_="Normal", reason="Evicted", message=eviction.message
        )
    if accepted:
        sender.telemetry.evicted("started", len(accepted))
    return Evicted(tuple(accepted), refused, failed)


async def _post(sender: Sender, tokens: Tokens, eviction: Eviction) -> Any:
    options: dict[str, Any] = {"preconditions": {"uid": eviction.uid}}
    grace = eviction_grace_period(eviction.grace_period)  # 0 would delete the pod by force
    if grace is not None:
        options["gracePeriodSeconds"] = grace
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": eviction.name, "namespace": eviction.namespace},
        "deleteOptions": options,
    }
    return await sender.send(
        tokens,
        "pod-eviction",
        method="POST",
        path=f"/api/v1/namespaces/{eviction.namespace}/pods/{eviction.name}/eviction",
        body=body,
    )


def _several_budgets(exc: http.ApiError) -> bool:
    """The API server refuses (500) a pod that several PodDisruptionBudgets select."""
    message = exc.body.get("message") if isinstance(exc.body, Mapping) else None
    return exc.status == 500 and "more than one PodDisruptionBudget" in str(message or "")


def budgets_of(body: object, *, namespace: str) -> tuple[str, ...]:
    """The PodDisruptionBudgets (namespace/name) a refusal names, from its causes."""
    details = body.get("details") if isinstance(body, Mapping) else None
    causes = details.get("causes") if isinstance(details, Mapping) else None
    names = []
    for cause in causes or ():
        message = cause.get("message") if isinstance(cause, Mapping) else None
        match = _BUDGET_RE.search(str(message or ""))
        if match:
            names.append(f"{namespace}/{match.group(1)}")
    return tuple(sorted(set(names)))

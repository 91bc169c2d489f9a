"""Writing our DeviceClasses: server-side apply of each one wanted, delete of ours unwanted.

What is wanted is ``reconcile.classplan``'s; this module only compares it with what the
DeviceClass informer shows (``cache.dra.classes``) and sends the difference, through the
write loop's sender (its leadership permit, token bucket, metrics).  A class of another field
manager with our name is never taken over: the apply (without force) conflicts, 409, and is
tried again on its back-off; nodes wait meanwhile (``DeviceClassNotWritten``).
"""

from __future__ import annotations

from typing import Any

import structlog

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.dra import draclasses
from gpushare_operator.kube import http
from gpushare_operator.kube.sending import FAILURES, FIELD_MANAGER, NotSent, Sender, Tokens
from gpushare_operator.reconcile import classplan
from gpushare_operator.reconcile.outcomes import Done, LeadershipLost, Outcome, Retry

log = structlog.get_logger(__name__)

PATH = "/apis/resource.k8s.io/v1/deviceclasses"


def _differs(body: dict[str, Any], held: draclasses.ClassRecord | None) -> bool:
    return held is None or held != draclasses.class_record(body)


class DeviceClassWrites:
    def __init__(self, *, sender: Sender, cache: ClusterCache) -> None:
        self._sender = sender
        self._cache = cache

    async def sync(self, tokens: Tokens) -> Outcome:
        cache = self._cache
        wanted = classplan.wanted(cache)
        try:
            for name, body in wanted.items():
                if _differs(body, cache.dra.classes.get(name)):
                    answer = await self._sender.send(
                        tokens,
                        "deviceclass",
                        method="PATCH",
                        path=f"{PATH}/{name}",
                        query=[("fieldManager", FIELD_MANAGER)],
                        body=body,
                        content_type=http.APPLY_PATCH,
                    )
                    if isinstance(answer, dict):
                        cache.dra.upsert_class(answer)
                    log.info("device class applied", kind="DeviceClass", name=name)
            for name in classplan.unwanted(cache, wanted):
                try:
                    await self._sender.send(
                        tokens, "deviceclass", method="DELETE", path=f"{PATH}/{name}"
                    )
                except http.ApiError as exc:
                    if exc.status != 404:
                        raise
                cache.dra.delete_class(name)
                log.info("device class deleted", kind="DeviceClass", name=name)
        except NotSent:
            return LeadershipLost()
        except FAILURES as exc:
            log.warning("device class write failed; retrying", error=str(exc))
            return Retry(str(exc))
        return Done()

"""kopf handlers: policies in, lifecycle of the informers and the writer.

Policy handlers are ``@kopf.on.event`` handlers that return nothing, so kopf stores no progress,
annotations or finalizers on the policy: the only writes to a policy are our status writes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, cast

import kopf

from gpushare_operator.app.assembly import Assembly
from gpushare_operator.core.api import models

if TYPE_CHECKING:  # kopf.operator's parameter type, which kopf does not re-export
    from kopf._core.engines.peering import Identity

logger = logging.getLogger(__name__)


def build_registry(assembly: Assembly, *, stop: asyncio.Event) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return assembly.connection_info()

    @kopf.on.startup(registry=registry)
    async def start(**_: Any) -> None:
        await assembly.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await assembly.stop()
        # kopf stops on its own signal handlers; setting our flag too releases kopf's waiter on
        # it, which would otherwise hold the exit for kopf's 5-second hung-task grace period.
        stop.set()

    @kopf.on.event(models.GROUP, models.VERSION, models.POLICY_PLURAL, registry=registry)
    async def policy_event(*, event: kopf.RawEvent, **_: Any) -> None:
        # async on purpose: kopf runs sync handlers in a thread, and the caches are loop-only.
        obj: dict[str, Any] = dict(event.get("object") or {})
        if event.get("type") == "DELETED":
            metadata = obj.get("metadata") or {}
            assembly.cache.delete_policy(str(metadata.get("name")), uid=metadata.get("uid"))
        else:
            assembly.cache.upsert_policy(obj)

    return registry


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    settings.peering.standalone = True  # Lease-based election instead (docs/architecture.md)
    settings.posting.enabled = False  # our own rate-limited Events only
    settings.scanning.disabled = True  # no CRD/namespace scanning: less RBAC, nothing to find
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.networking.error_backoffs = [1, 2, 5, 10]


async def run_kopf(*, assembly: Assembly, stop: asyncio.Event) -> None:
    settings = kopf.OperatorSettings()
    configure_kopf(settings)
    await kopf.operator(
        registry=build_registry(assembly, stop=stop),
        settings=settings,
        standalone=True,
        clusterwide=True,
        stop_flag=stop,
        # Ours, not kopf's guess: that asks the passwd database for the user's name, and the
        # image's uid (65532, or whatever runAsUser a cluster sets) has no entry there.
        identity=cast("Identity", assembly.settings.identity),
    )

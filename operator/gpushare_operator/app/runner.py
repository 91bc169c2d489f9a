"""Connect, assemble the operator's parts, run kopf until told to stop, shut down cleanly."""

from __future__ import annotations

import asyncio

import structlog

from gpushare_operator import __version__
from gpushare_operator.app.assembly import Assembly
from gpushare_operator.app.handlers import run_kopf
from gpushare_operator.app.settings import Settings
from gpushare_operator.kube import connection

log = structlog.get_logger("gpushare")


async def run_operator(*, settings: Settings, stop: asyncio.Event) -> None:
    async with await connection.open_handle() as handle:
        cluster = await connection.server_version(handle.api)
        log.info(
            "starting",
            operator_version=__version__,
            cluster_version=cluster,
            server=handle.server,
            identity=settings.identity,
            event_loop=type(asyncio.get_running_loop()).__module__,
        )
        assembly = Assembly(settings=settings, handle=handle)
        await run_kopf(assembly=assembly, stop=stop)
    log.info("stopped cleanly")

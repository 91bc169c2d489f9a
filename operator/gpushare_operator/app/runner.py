"""Wiring: connect, run until told to stop, shut down cleanly."""

from __future__ import annotations

import asyncio

import structlog

from gpushare_operator import __version__
from gpushare_operator.app.settings import Settings
from gpushare_operator.kube import connection

log = structlog.get_logger("gpushare")


async def run_operator(*, settings: Settings, stop: asyncio.Event) -> None:
    configuration = await connection.load_configuration()
    async with connection.api_client(configuration) as api:
        cluster = await connection.server_version(api)
        log.info(
            "connected",
            operator_version=__version__,
            cluster_version=cluster,
            server=configuration.host,
            identity=settings.identity,
        )
        await stop.wait()
    log.info("stopped cleanly")

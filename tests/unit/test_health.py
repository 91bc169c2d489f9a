"""/healthz and /readyz decisions: dead tasks and stalled informers fail liveness."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpushare_operator.app import assembly as assembly_module
from gpushare_operator.app.assembly import Assembly
from gpushare_operator.app.settings import parse_settings
from gpushare_operator.kube.connection import ApiHandle


def build() -> Assembly:
    handle = ApiHandle(configuration=None, api=None)  # type: ignore[arg-type]  # never used here
    return Assembly(settings=parse_settings([], env={}), handle=handle)


async def test_healthy_until_an_informer_stalls() -> None:
    operator = build()
    now = time.monotonic()
    assert operator.health_problem(now=now) is None
    node_informer = operator.informers[0]
    node_informer.synced.set()
    node_informer.stats.last_activity = now - assembly_module.INFORMER_STALL_TIMEOUT - 1
    problem = operator.health_problem(now=now)
    assert problem is not None
    assert "Node informer silent" in problem


async def test_a_dead_task_fails_liveness() -> None:
    operator = build()

    async def crash() -> None:
        raise RuntimeError("watch loop died")

    task: asyncio.Task[Any] = asyncio.create_task(crash())
    await asyncio.gather(task, return_exceptions=True)
    operator._tasks["informer-Node"] = task
    problem = operator.health_problem(now=time.monotonic())
    assert problem is not None
    assert "watch loop died" in problem


async def test_ready_only_when_primed_and_every_cache_synced() -> None:
    operator = build()
    assert not operator.synced
    for informer in operator.informers:
        informer.synced.set()
    assert not operator.synced  # policies not primed yet
    operator._primed = True
    assert operator.synced

"""/healthz and /readyz: dead tasks and stalled informers fail liveness, readiness waits for
every cache, and the probes answer what the operator's health says."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gpushare_operator.app import assembly as assembly_module
from gpushare_operator.app import probes
from gpushare_operator.app.assembly import Assembly
from gpushare_operator.app.settings import parse_settings
from gpushare_operator.core import certificates
from gpushare_operator.kube.connection import ApiHandle


def build(args: list[str] | None = None) -> Assembly:
    handle = ApiHandle(configuration=None, api=None)  # type: ignore[arg-type]  # never used here
    return Assembly(settings=parse_settings(args or [], env={}), handle=handle)


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
    operator = build(["--webhook-port", "0"])
    assert not operator.synced
    for informer in operator.informers:
        informer.synced.set()
    assert not operator.synced  # policies not primed yet
    operator._primed = True
    assert operator.synced


async def test_a_replica_serving_the_webhook_is_ready_once_it_listens_with_a_certificate() -> None:
    operator = build()  # the webhook is on by default
    for informer in operator.informers:
        informer.synced.set()
    operator._primed = True
    assert operator.caches_synced and not operator.synced
    assert operator.webhook is not None
    now = datetime.datetime.now(datetime.UTC)
    made = certificates.plan(
        data=None, published=None, hosts=["localhost"], now=now, validity=datetime.timedelta(days=1)
    )
    assert made.data is not None
    operator.webhook.tls.secret_changed({"data": certificates.encoded(made.data)})
    assert not operator.synced  # a certificate, but nothing listening with it yet
    operator.webhook.server.listening.set()  # as the server's thread does once it listens
    assert operator.synced


class ScriptedHealth:
    """probes.Health with answers set by the test: the probes need nothing else."""

    def __init__(self) -> None:
        self.synced = False
        self.problem: str | None = None
        self.asked_at: list[float] = []

    def health_problem(self, *, now: float) -> str | None:
        self.asked_at.append(now)
        return self.problem


async def test_the_probes_answer_what_health_says() -> None:
    health = ScriptedHealth()
    async with TestClient(TestServer(probes.build_probe_app(health))) as client:
        healthz, readyz = await client.get("/healthz"), await client.get("/readyz")
        assert (healthz.status, await healthz.text()) == (200, "ok\n")
        assert readyz.status == 503
        assert await readyz.text() == (
            "caches not synced, or the webhook has no serving certificate yet\n"
        )
        health.problem, health.synced = "bootstrap stopped: boom", True
        healthz, readyz = await client.get("/healthz"), await client.get("/readyz")
        assert (healthz.status, await healthz.text()) == (503, "bootstrap stopped: boom\n")
        assert (readyz.status, await readyz.text()) == (200, "ok\n")
    # Asked on the monotonic clock, which the informers' last_activity is kept on.
    assert len(health.asked_at) == 2
    assert all(abs(at - time.monotonic()) < 60 for at in health.asked_at)

"""The token flood of tests/integration/test_metrics_flood.py sends what it says: every request
with a token of its own, at an even pace, at most so many at once, over HTTPS to loopback, and
never past twice its time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from gpushare_operator.app import servingcerts
from gpushare_testing import tokenflood


@dataclass
class Server:
    port: int = 0
    delay: float = 0.0  # seconds per answer
    tokens: list[str] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    running: int = 0
    most_at_once: int = 0

    async def metrics(self, request: web.Request) -> web.Response:
        self.tokens.append(request.headers["Authorization"])
        odd = len(self.tokens) % 2
        self.arrivals.append(time.monotonic())
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        await asyncio.sleep(self.delay)
        self.running -= 1
        return web.Response(status=429 if odd else 401)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    app = web.Application()
    app.router.add_get("/metrics", state.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=servingcerts.server_context())
    await site.start()
    state.port = runner.addresses[0][1]
    yield state
    await runner.cleanup()


async def test_the_flood_sends_distinct_tokens_at_its_pace(server: Server) -> None:
    server.delay = 0.002
    result = await tokenflood.flood(port=server.port, count=100, seconds=1.0, concurrency=4)
    assert (result.sent, result.errors) == (100, 0)
    assert result.statuses == {429: 50, 401: 50}
    assert len(set(server.tokens)) == 100
    assert all(t.startswith("Bearer flood-") for t in server.tokens)
    assert 0.9 <= server.arrivals[-1] - server.arrivals[0] <= 1.5, "evenly over the second"
    assert server.most_at_once <= 4


async def test_the_flood_is_bounded_in_concurrency_and_in_time(server: Server) -> None:
    server.delay = 0.05  # 4 at once: 80 a second, far below the 400 asked for
    started = time.monotonic()
    result = await tokenflood.flood(port=server.port, count=200, seconds=0.5, concurrency=4)
    assert server.most_at_once == 4
    assert 40 <= result.sent < 200, "it stops at twice its time, whatever is left"
    assert time.monotonic() - started < 1.5


def test_a_printed_result_parses_back() -> None:
    parsed = tokenflood.parse(
        '{"sent": 2, "statuses": {"401": 2}, "errors": 0, "started": 1.0, "ended": 3.0}'
    )
    assert (parsed.sent, parsed.statuses, parsed.seconds) == (2, {401: 2}, 2.0)

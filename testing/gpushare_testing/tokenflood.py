"""A flood of /metrics requests, each with a bearer token never sent before: what anyone who
reaches the metrics port can do, to make the operator review token after token.

Run as a process of its own (``python -m gpushare_testing.tokenflood``), so that the flood's CPU
is not taken from the test's event loop, where the GPU simulator plays the agents a rollout
waits for.  Requests go out at an even pace over ``--seconds``, at most ``--concurrency`` at once
over kept-alive connections, to a loopback port only; the run is bounded in count and in time
(twice ``--seconds``), and prints one JSON object: what was sent, and the answers by status.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import aiohttp


@dataclass
class FloodResult:
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)  # answers by HTTP status
    errors: int = 0  # no answer (connection refused or reset, timed out)
    started: float = 0.0  # wall-clock time.time() of the first request and of the last answer
    ended: float = 0.0

    @property
    def seconds(self) -> float:
        return self.ended - self.started


async def flood(*, port: int, count: int, seconds: float, concurrency: int) -> FloodResult:
    """``count`` GETs of https://127.0.0.1:``port``/metrics, evenly over ``seconds``."""
    nonce = uuid.uuid4().hex[:12]
    interval = seconds / count
    statuses: collections.Counter[int] = collections.Counter()
    result = FloodResult()
    indices = itertools.count()
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + 2 * seconds
    # The operator's certificate is self-signed: a flooder does not care who answers.
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=False)
    timeout = aiohttp.ClientTimeout(total=15)
    url = f"https://127.0.0.1:{port}/metrics"

    async def worker(session: aiohttp.ClientSession) -> None:
        while (index := next(indices)) < count:
            delay = start + index * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if loop.time() > deadline:
                return
            headers = {"Authorization": f"Bearer flood-{nonce}-{index:06d}"}
            result.sent += 1
            try:
                async with session.get(url, headers=headers) as response:
                    await response.read()
                    statuses[response.status] += 1
            except (aiohttp.ClientError, TimeoutError):
                result.errors += 1

    result.started = time.time()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    result.ended = time.time()
    result.statuses = dict(statuses)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    result = asyncio.run(
        flood(port=args.port, count=args.count, seconds=args.seconds, concurrency=args.concurrency)
    )
    json.dump(asdict(result), sys.stdout)
    return 0


def parse(output: str) -> FloodResult:
    """The FloodResult a ``main`` run printed."""
    raw = json.loads(output)
    raw["statuses"] = {int(status): n for status, n in raw["statuses"].items()}
    return FloodResult(**raw)


if __name__ == "__main__":
    sys.exit(main())

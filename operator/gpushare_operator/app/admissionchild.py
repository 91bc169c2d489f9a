"""The memory-request webhook's own process: ``python -m gpushare_operator.app.admissionchild``.

Why a process, and not a thread of the operator: a thread shares the operator's GIL, and the
ssl module lets go of the GIL at every TLS read and write.  Whenever the main loop had work (an
informer batch, a write, a collection of its caches) it took the GIL there, and the answer
waited a switch interval and a wake-up to get it back, once or twice per admission: at 5,000
nodes and 100 creates/s one answer in twenty took 1 to 3 ms, for 25 µs of work
(docs/performance.md).  Here nothing else runs: the answer waits for nothing but the machine.

Started, fed and watched by ``app.admissionprocess``: it hands over one end of a socket pair
(``--channel``), sends the certificate pair and the offers whole each time they change, and
reads a ``Report`` every ``REPORT_INTERVAL``.  The process ends when the channel does (the
operator closed it, or died); SIGINT and SIGTERM are left to the operator, which stops it in
order.  It imports no kopf, no API client and no cache (an import-linter contract): only the
pure answer, the TLS and the HTTP framing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import socket
import sys
from collections.abc import Sequence

import orjson
import structlog

from gpushare_operator.app import admissionwire, logs
from gpushare_operator.app.admission import AdmissionServer, MemoryRequests, ServingTLS
from gpushare_operator.app.admissionwire import Report
from gpushare_operator.app.lateness import Lateness
from gpushare_operator.app.loops import loop_factory
from gpushare_operator.core.slots import reviews

log = structlog.get_logger("gpushare.webhook")

# Until the operator sends its offers: not synced, so every labelled pod is told to try again.
_NOTHING_YET = reviews.Offers(synced=False, offers=(), gpu_resources=frozenset())


class Served:
    """What the process answers with, and what it did since its last report."""

    def __init__(self) -> None:
        self.offers = _NOTHING_YET  # replaced whole on each ``offers`` message
        self.report = Report()  # replaced whole on each report

    def count(self, outcome: str, reason: str | None = None) -> None:
        self.report.outcomes.append((outcome, reason))

    def observe(self, receiving: float, answering: float, waiting: float) -> None:
        self.report.answers.append((receiving, answering, waiting))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpushare-webhook", description=__doc__)
    parser.add_argument("--channel", type=int, required=True, help="the socket pair's fd")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--log-format", default="json")
    return parser


async def serve(*, channel: socket.socket, port: int, host: str) -> None:
    """Serve until the channel ends."""
    reader, writer = await asyncio.open_connection(sock=channel, limit=admissionwire.MAX_LINE)
    served = Served()
    tls = ServingTLS()
    server = AdmissionServer(
        port=port,
        tls=tls,
        handle=MemoryRequests(offers=lambda: served.offers, count=served.count),
        observe=served.observe,
        host=host,
    )
    lateness = Lateness()
    tasks = [
        asyncio.create_task(_read(reader, served=served, tls=tls), name="webhook-channel"),
        asyncio.create_task(server.run(), name="webhook-server"),
        asyncio.create_task(lateness.run(), name="webhook-loop-lag"),
        asyncio.create_task(
            _report(writer, served=served, tls=tls, server=server, lateness=lateness),
            name="webhook-report",
        ),
    ]
    try:
        # The channel's end ends the process; so does any other task's death (the operator
        # starts another process).
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()
    for task in done:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("webhook process stopping", task=task.get_name(), error=repr(error))
            raise error


async def _read(reader: asyncio.StreamReader, *, served: Served, tls: ServingTLS) -> None:
    while line := await reader.readline():
        sent = orjson.loads(line)
        if "pair" in sent:
            tls.use(sent["pair"])
        if "offers" in sent:
            served.offers = admissionwire.offers_of(sent["offers"])


async def _report(
    writer: asyncio.StreamWriter,
    *,
    served: Served,
    tls: ServingTLS,
    server: AdmissionServer,
    lateness: Lateness,
) -> None:
    while True:
        report, served.report = served.report, Report()
        report.listening = server.listening.is_set()
        report.serving = tls.fingerprint
        report.lag = (lateness.recent, lateness.worst)
        report.collections = tuple(g["collections"] for g in gc.get_stats())
        writer.write(report.line())
        await writer.drain()
        await asyncio.sleep(admissionwire.REPORT_INTERVAL)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    # The operator stops this process (it closes the channel) once it has stopped serving; a
    # Ctrl-C or SIGTERM sent to the whole group must not end it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logs.configure_logging(log_format=args.log_format)
    # Its lines go to the operator's own output: each says it is the webhook's process's.
    structlog.contextvars.bind_contextvars(process="webhook")
    channel = socket.socket(fileno=args.channel)
    # What the imports made lives as long as the process: out of the collector's way, so
    # a young collection walks only what an answer left.
    gc.freeze()
    with (
        asyncio.Runner(loop_factory=loop_factory()) as runner,
        contextlib.suppress(ConnectionError),
    ):
        runner.run(serve(channel=channel, port=args.port, host=args.host))
    return 0


if __name__ == "__main__":
    sys.exit(main())

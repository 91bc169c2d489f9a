"""The operator's side of the webhook's own process: start it, feed it, read it, restart it.

The process (``app.admissionchild``) answers the API server's admission reviews; this keeps it
supplied with what an answer depends on and turns its reports into the operator's metrics and
readiness.  What crosses the channel is in ``app.admissionwire``.

- Feeding: the certificate pair once the operator's ``ServingTLS`` took it, and the offers
  (``core.slots.reviews.Offers``) whole whenever one of their parts is replaced.  The cache
  says when (``ClusterCache.on_offers_changed``, the TLS's ``on_loaded``); until the caches are
  synced the offers are looked at every ``SYNC_POLL`` too, since nothing else says when that
  happens.  A new process gets everything at once.
- Reading: a report every ``REPORT_INTERVAL``.  The replica is ready only while the process
  listens and its last report is younger than ``REPORT_STALE``: one that hangs makes the replica
  unready, and the Service sends the API server elsewhere.
- Restarting: a process that ends while the operator runs is started again, after
  ``RESTART_MIN`` doubling to ``RESTART_MAX`` while it keeps failing, with an error in the log
  that says how it ended.
- Stopping: cancelling ``run`` closes the channel; the process closes its server and its
  connections and ends.  One still there after ``STOP_TIMEOUT`` is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Callable
from typing import Final

import structlog

from gpushare_operator.app import admissionwire
from gpushare_operator.app.admission import ServingTLS
from gpushare_operator.app.admissionwire import Report
from gpushare_operator.core.slots import reviews

log = structlog.get_logger(__name__)

SYNC_POLL: Final = 0.05
# 5 s: a main loop held up for a moment (a large re-list) does not make a live process stale.
REPORT_STALE: Final = 20 * admissionwire.REPORT_INTERVAL
RESTART_MIN: Final = 0.5
RESTART_MAX: Final = 30.0
STABLE: Final = 60.0  # a process that lived this long starts the backoff again from its least
STOP_TIMEOUT: Final = 5.0
CHILD_MODULE: Final = "gpushare_operator.app.admissionchild"


class AdmissionProcess:
    def __init__(
        self,
        *,
        port: int,
        tls: ServingTLS,
        offers: Callable[[], reviews.Offers],
        take: Callable[[Report, int | None], None],
        log_format: str,
        host: str = "0.0.0.0",
    ) -> None:
        self._port = port
        self._host = host
        self._tls = tls
        self._offers = offers
        self._take = take  # each report and the process's pid, for the metrics
        self._log_format = log_format
        # Set whenever something the process answers with was replaced; cleared by the feeder
        # just before it looks.
        self._changed = asyncio.Event()
        self._last_report = -float("inf")  # monotonic time of the last report read
        self._listening = False  # what the last report said
        self.pid: int | None = None  # of the process running now
        self.started = 0  # processes started, the first included

    @property
    def listening(self) -> bool:
        """The process says it listens, and said so recently."""
        fresh = time.monotonic() - self._last_report < REPORT_STALE
        return self._listening and fresh

    def changed(self) -> None:
        """What an answer depends on was replaced: send it again."""
        self._changed.set()

    async def run(self) -> None:
        backoff = RESTART_MIN
        while True:
            began = time.monotonic()
            code = await self._session()
            if time.monotonic() - began > STABLE:
                backoff = RESTART_MIN
            log.error(
                "the webhook's process ended; starting another",
                exit_code=code,
                restart_in_s=backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RESTART_MAX)

    async def _session(self) -> int | None:
        """One process, from its start to its end; its exit code."""
        ours, theirs = socket.socketpair()
        with theirs:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                CHILD_MODULE,
                f"--channel={theirs.fileno()}",
                f"--port={self._port}",
                f"--host={self._host}",
                f"--log-format={self._log_format}",
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
            )
        self.pid, self.started = process.pid, self.started + 1
        reader, writer = await asyncio.open_connection(sock=ours, limit=admissionwire.MAX_LINE)
        feeding = asyncio.create_task(self._feed(writer), name="webhook-feed")
        try:
            with contextlib.suppress(ConnectionError):
                while line := await reader.readline():
                    self._read(admissionwire.report_of(line))
        finally:
            self._listening = False
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
            writer.close()  # the process reads the end of its channel and stops
            await _ended(process)
            self.pid = None
        return process.returncode

    def _read(self, report: Report) -> None:
        self._last_report = time.monotonic()
        self._listening = report.listening
        self._take(report, self.pid)

    async def _feed(self, writer: asyncio.StreamWriter) -> None:
        sent_pair: str | None = None
        sent: reviews.Offers | None = None
        while True:
            self._changed.clear()
            tls = self._tls
            if tls.pair is not None and tls.fingerprint != sent_pair:
                writer.write(admissionwire.pair_line(tls.pair))
                sent_pair = tls.fingerprint
            now = self._offers()
            if sent is None or not _same(now, sent):
                writer.write(admissionwire.offers_line(now))
                sent = now
            await writer.drain()
            if now.synced:
                await self._changed.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), SYNC_POLL)


def _same(a: reviews.Offers, b: reviews.Offers) -> bool:
    """The same parts: each is replaced whole, never changed in place."""
    return a.synced == b.synced and a.offers is b.offers and a.gpu_resources is b.gpu_resources


async def _ended(process: asyncio.subprocess.Process) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), STOP_TIMEOUT)
    except TimeoutError:
        log.warning("the webhook's process did not stop; killing it", pid=process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()

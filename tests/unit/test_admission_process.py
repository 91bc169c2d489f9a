"""The webhook in its own process (app.admissionprocess, app.admissionchild, app.admissionwire):
a real child process serving real TLS on 127.0.0.1, fed and read by the operator's side as the
operator runs it; no API server.  What it answers with follows what the operator sends, what it
reports reaches the operator, it answers while the operator's loop is kept busy, one that dies
is started again, and stopping the operator stops it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gpushare_operator.app import admissionwire
from gpushare_operator.app.admission import ServingTLS
from gpushare_operator.app.admissionprocess import CHILD_MODULE, AdmissionProcess
from gpushare_operator.app.admissionwire import Report
from gpushare_operator.core.slots import reviews
from gpushare_operator.core.slots.slotclasses import Isolation, Offer
from gpushare_testing.webhookclient import client_context, free_port, post, review, secret

MPS = Offer(20389, "nvidia.com/gpu", Isolation.MPS, "batch")
SYNCED = reviews.Offers(synced=True, offers=(MPS,), gpu_resources=frozenset({"nvidia.com/gpu"}))
UNSYNCED = reviews.Offers(synced=False, offers=(), gpu_resources=frozenset())


class Operator:
    """The operator's side: its TLS, the offers it holds now, the reports it was given."""

    def __init__(self) -> None:
        self.tls = ServingTLS()
        self.offers = UNSYNCED
        self.reports: list[tuple[Report, int | None]] = []
        self.port = free_port()
        self.process = AdmissionProcess(
            port=self.port,
            tls=self.tls,
            offers=lambda: self.offers,
            take=lambda report, pid: self.reports.append((report, pid)),
            log_format="console",
            host="127.0.0.1",
        )
        self.tls.on_loaded = self.process.changed

    def post(self, body: bytes) -> tuple[int, Any, str]:
        """Status, decoded answer and the served certificate's digest, on a new connection."""
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=client_context(), timeout=30
        )
        with contextlib.closing(conn):
            status, raw = post(conn, body)
            assert conn.sock is not None
            der = conn.sock.getpeercert(binary_form=True)
            assert der is not None
        return status, orjson.loads(raw), hashlib.sha256(der).hexdigest()


async def until(what: Callable[[], bool], *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(operator: Operator) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(operator.process.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child that ended but is not yet reaped is a zombie: gone for our purpose.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_it_answers_with_what_the_operator_sends_and_reports_what_it_did() -> None:
    operator = Operator()
    async with running(operator):
        await asyncio.sleep(0.3)
        assert not operator.process.listening  # no certificate yet: nothing to serve with
        operator.tls.secret_changed(secret())
        await until(lambda: operator.process.listening)
        status, answer, _ = await asyncio.to_thread(operator.post, review())
        assert status == 200 and answer["response"]["status"]["code"] == 503  # not synced
        operator.offers = SYNCED
        operator.process.changed()
        await until(lambda: operator.process.listening)

        async def mutated() -> bool:
            _, answer, _ = await asyncio.to_thread(operator.post, review())
            return bool(answer["response"].get("patch"))

        deadline = time.monotonic() + 10
        while not await mutated():
            assert time.monotonic() < deadline, "the new offers never reached the process"
        await until(
            lambda: (
                {o for r, _ in operator.reports for o, _ in r.outcomes}
                >= {"unavailable", "mutated"}
            )
        )
    answers = [a for r, _ in operator.reports for a in r.answers]
    assert len(answers) >= 2 and all(0 <= took < 1 for pair in answers for took in pair)
    last, pid = operator.reports[-1]
    assert last.listening and last.serving == operator.tls.fingerprint and pid is not None
    assert len(last.collections) == 3


async def test_an_answer_does_not_wait_for_a_busy_operator_loop() -> None:
    """The operator's loop is kept busy in Python (as by a storm of node events) until a client
    on another thread has its answer, for at most 20 s: a server sharing that loop, or its GIL
    with no switch, could not answer before the deadline."""
    operator = Operator()
    operator.offers = SYNCED
    operator.tls.secret_changed(secret())
    async with running(operator):
        await until(lambda: operator.process.listening)
        answered = threading.Event()
        took: list[float] = []

        def client() -> None:
            started = time.monotonic()
            status, _, _ = operator.post(review())
            took.append(time.monotonic() - started)
            if status == 200:
                answered.set()

        thread = threading.Thread(target=client)
        thread.start()
        deadline = time.monotonic() + 20
        spins = 0
        while not answered.is_set() and time.monotonic() < deadline:  # holds the loop
            spins += 1
        thread.join()
    assert answered.is_set(), f"no answer while the operator's loop was busy (took {took})"
    assert spins > 0 and took[0] < 20


async def test_a_rotated_certificate_reaches_the_process() -> None:
    operator = Operator()
    operator.offers = SYNCED
    operator.tls.secret_changed(secret())
    async with running(operator):
        await until(lambda: operator.process.listening)
        _, _, before = await asyncio.to_thread(operator.post, review())
        operator.tls.secret_changed(secret())
        rotated = operator.tls.fingerprint
        await until(lambda: bool(operator.reports) and operator.reports[-1][0].serving == rotated)
        _, _, after = await asyncio.to_thread(operator.post, review())
    assert after != before


async def test_a_process_that_dies_is_started_again_and_stopping_stops_it() -> None:
    operator = Operator()
    operator.offers = SYNCED
    operator.tls.secret_changed(secret())
    async with running(operator):
        await until(lambda: operator.process.listening)
        first = operator.process.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await until(lambda: not operator.process.listening)
        await until(lambda: operator.process.listening and operator.process.pid != first)
        second = operator.process.pid
        assert second is not None and operator.process.started == 2
        status, answer, _ = await asyncio.to_thread(operator.post, review())
        assert status == 200 and answer["response"]["allowed"] is True
    assert not alive(first) and not alive(second)


async def test_a_process_that_stops_reporting_makes_the_replica_unready() -> None:
    """Stopped (SIGSTOP: it neither ends nor answers), it is not ready once its reports are
    older than the staleness bound; let go on, it is ready again."""
    operator = Operator()
    operator.offers = SYNCED
    operator.tls.secret_changed(secret())
    async with running(operator):
        await until(lambda: operator.process.listening)
        pid = operator.process.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            await until(lambda: not operator.process.listening)
        finally:
            os.kill(pid, signal.SIGCONT)
        await until(lambda: operator.process.listening)
        assert operator.process.pid == pid


def test_the_process_loads_none_of_the_operator_s_heavy_parts() -> None:
    """What its imports load, as Python loads them (import-linter's contract also counts the
    imports made for the type checker only): no kopf, no API client, no metrics library, no
    API models (pydantic alone is 20 MiB of the process's memory)."""
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, {CHILD_MODULE}; print(*sorted(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    heavy = ("kopf", "kubernetes_asyncio", "aiohttp", "prometheus_client", "pydantic")
    assert [m for m in loaded if m.split(".")[0] in heavy] == []
    assert CHILD_MODULE in loaded


def test_the_wire_carries_offers_and_reports_unchanged() -> None:
    offers = reviews.Offers(
        synced=True,
        offers=(MPS, Offer(8192, "nvidia.com/gpu.shared", Isolation.EXCLUSIVE, "p")),
        gpu_resources=frozenset({"nvidia.com/gpu", "nvidia.com/gpu.shared"}),
    )
    line = admissionwire.offers_line(offers)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert admissionwire.offers_of(orjson.loads(line)["offers"]) == offers
    report = Report(
        listening=True,
        serving="ab",
        answers=[(0.001, 0.0002, 0.0)],
        outcomes=[("refused", "too-large"), ("mutated", None)],
        lag=(0.003, 0.01),
        collections=(5, 1, 0),
    )
    assert admissionwire.report_of(report.line()) == report

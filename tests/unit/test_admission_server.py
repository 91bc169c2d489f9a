"""The webhook's HTTPS server (app.admission, app.reviewserver): a real server on 127.0.0.1 on
its own thread, real TLS, no API server.  How large a review it takes, how it frames HTTP/1.1,
what a Secret it cannot use does to it, a certificate rotated under open connections, and an
answer while the main event loop is kept busy."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives import serialization

from gpushare_operator.app.admission import (
    MAX_REVIEW_BYTES,
    AdmissionServer,
    MemoryRequests,
    ServingTLS,
)
from gpushare_operator.core import certificates
from gpushare_operator.core.slots import memoryrequests, reviews
from gpushare_operator.core.slots.slotclasses import Isolation, Offer

NOW = datetime.datetime.now(datetime.UTC)
MPS = Offer(20389, "nvidia.com/gpu", Isolation.MPS, "batch")


def secret(*, encrypted: bool = False) -> dict[str, Any]:
    made = certificates.plan(
        data=None, published=None, hosts=["127.0.0.1"], now=NOW, validity=datetime.timedelta(days=1)
    )
    assert made.data is not None
    data = dict(made.data)
    if encrypted:
        pair = certificates.read_pair(
            data["tls.crt"], data["tls.key"], names=("tls.crt", "tls.key")
        )
        assert isinstance(pair, certificates.Pair)
        data["tls.key"] = pair.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        ).decode()
    return {"data": certificates.encoded(data)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def client_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def review(size: int = 0) -> bytes:
    """An AdmissionReview of a labelled pod whose JSON is ``size`` bytes or a little more."""
    pod = {
        "metadata": {
            "name": "p",
            "labels": {memoryrequests.REQUEST_LABEL: "10Gi"},
            "annotations": {"blob": ""},
        },
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }
    body: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    body["request"] = {
        "uid": "u-1",
        "operation": "CREATE",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "object": pod,
    }
    pod["metadata"]["annotations"]["blob"] = "x" * max(0, size - len(orjson.dumps(body)))
    return orjson.dumps(body)


class Served:
    def __init__(self, tls: ServingTLS, port: int, counted: list[Any]) -> None:
        self.tls, self.port, self.counted = tls, port, counted

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=client_context(), timeout=30
        )


@contextlib.asynccontextmanager
async def serving(tls: ServingTLS | None = None) -> AsyncIterator[Served]:
    if tls is None:
        tls = ServingTLS()
        tls.secret_changed(secret())
    counted: list[Any] = []
    offers = reviews.Offers(synced=True, offers=(MPS,), gpu_resources=frozenset())
    handler = MemoryRequests(offers=lambda: offers, count=lambda *a: counted.append(a))
    port = free_port()
    server = AdmissionServer(port=port, tls=tls, handle=handler, host="127.0.0.1")
    task = asyncio.create_task(server.run())
    try:
        assert await asyncio.to_thread(server.listening.wait, 30), "the server never listened"
        yield Served(tls, port, counted)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def raw_exchange(port: int, sent: bytes) -> bytes:
    """Send ``sent`` over TLS and read until the server closes."""
    with (
        socket.create_connection(("127.0.0.1", port)) as sock,
        client_context().wrap_socket(sock) as tls,
    ):
        tls.sendall(sent)
        received = b""
        while chunk := tls.recv(65536):
            received += chunk
    return received


def post(conn: http.client.HTTPSConnection, body: bytes, path: str = "/gpu-memory") -> Any:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


async def test_a_review_up_to_the_limit_is_answered_and_a_larger_one_refused() -> None:
    async with serving() as served:

        def exchange() -> bytes:
            with contextlib.closing(served.connection()) as conn:
                # Over aiohttp's default of 1 MiB, within ours: answered.
                status, answer = post(conn, review(MAX_REVIEW_BYTES - 4096))
                assert status == 200, answer
                assert orjson.loads(answer)["response"]["allowed"] is True
            # Refused from its head alone, before a byte of the body is read.
            head = b"POST /gpu-memory HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (
                MAX_REVIEW_BYTES + 1
            )
            return raw_exchange(served.port, head)

        answer = await asyncio.to_thread(exchange)
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert f"{MAX_REVIEW_BYTES}".encode() in answer
    assert served.counted == [(reviews.MUTATED, None)]


async def test_one_connection_carries_request_after_request_and_bad_ones_say_why() -> None:
    async with serving() as served:

        def exchange() -> list[tuple[int, bytes]]:
            with contextlib.closing(served.connection()) as conn:
                got = [post(conn, review()) for _ in range(3)]  # kept alive: one connection
                sock = conn.sock
                got.append(post(conn, b"{not json"))
                got.append(post(conn, review(), path="/elsewhere"))
                assert conn.sock is sock  # still the same connection
                conn.request("GET", "/gpu-memory")
                response = conn.getresponse()
                got.append((response.status, response.read()))
            with contextlib.closing(served.connection()) as chunked:
                chunked.request("POST", "/gpu-memory", body=iter([review()]), encode_chunked=True)
                response = chunked.getresponse()
                got.append((response.status, response.read()))
            return got

        got = await asyncio.to_thread(exchange)
    assert [status for status, _ in got] == [200, 200, 200, 400, 404, 405, 411]
    assert b"not JSON" in got[3][1] and b"/gpu-memory" in got[4][1]
    assert served.counted == [(reviews.MUTATED, None)] * 3


async def test_two_requests_sent_at_once_are_answered_in_order() -> None:
    async with serving() as served:

        def exchange() -> bytes:
            one, two = review(), review().replace(b'"u-1"', b'"u-2"')
            raw = b"".join(
                b"POST /gpu-memory HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
                for body in (one, two)
            )
            with (
                socket.create_connection(("127.0.0.1", served.port)) as sock,
                client_context().wrap_socket(sock) as tls,
            ):
                tls.sendall(raw)
                received = b""
                while received.count(b'"uid":') < 2:
                    chunk = tls.recv(65536)
                    assert chunk, "closed before both answers"
                    received += chunk
            return received

        received = await asyncio.to_thread(exchange)
    assert received.index(b'"u-1"') < received.index(b'"u-2"')
    assert received.count(b"HTTP/1.1 200 OK") == 2


async def test_an_answer_does_not_wait_for_a_busy_main_loop() -> None:
    """The main loop is kept busy in Python (as by a storm of node events) until a client on
    another thread has its answer, for at most 20 s: a server on the main loop could not answer
    before the loop came back, so the answer would come only after the deadline."""
    async with serving() as served:
        answered = threading.Event()
        took: list[float] = []

        def client() -> None:
            started = time.monotonic()
            with contextlib.closing(served.connection()) as conn:
                status, _ = post(conn, review())
            took.append(time.monotonic() - started)
            if status == 200:
                answered.set()

        thread = threading.Thread(target=client)
        thread.start()
        deadline = time.monotonic() + 20
        spins = 0
        while not answered.is_set() and time.monotonic() < deadline:  # holds the main loop
            spins += 1
        thread.join()
    assert answered.is_set(), f"no answer while the main loop was busy (took {took})"
    assert spins > 0 and took[0] < 20


async def test_a_rotated_certificate_serves_new_connections_and_open_ones_go_on() -> None:
    tls = ServingTLS()
    tls.secret_changed(secret())
    first = tls.fingerprint
    async with serving(tls) as served:

        def peer(conn: http.client.HTTPSConnection) -> str:
            assert conn.sock is not None
            der = conn.sock.getpeercert(binary_form=True)
            assert der is not None
            return hashlib.sha256(der).hexdigest()

        def before() -> tuple[http.client.HTTPSConnection, str]:
            conn = served.connection()
            assert post(conn, review())[0] == 200
            return conn, peer(conn)

        old, old_peer = await asyncio.to_thread(before)
        tls.secret_changed(secret())  # on the main loop, as the Secret's informer calls it
        assert tls.fingerprint != first

        def after() -> tuple[int, str]:
            with contextlib.closing(old):
                assert post(old, review())[0] == 200  # the open connection goes on
            with contextlib.closing(served.connection()) as new:
                return post(new, review())[0], peer(new)

        status, new_peer = await asyncio.to_thread(after)
    assert status == 200 and new_peer != old_peer


def test_a_secret_it_cannot_read_leaves_the_server_as_it_was() -> None:
    """An encrypted key raised out of the Secret's watch (every replica's); now the replica
    keeps what it serves, and is not ready until it has a certificate."""
    tls = ServingTLS()
    tls.secret_changed(secret(encrypted=True))
    assert not tls.ready.is_set() and tls.fingerprint is None
    tls.secret_changed(secret())
    loaded = tls.fingerprint
    assert tls.ready.is_set() and loaded is not None
    tls.secret_changed(secret(encrypted=True))
    assert tls.fingerprint == loaded


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"BREW /gpu-memory HTTP/1.1\r\nContent-Length: 0", 405),
        (b"POST /gpu-memory HTTP/2.0\r\nContent-Length: 0", 505),
        (b"POST /gpu-memory HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1", 400),
        (b"POST /gpu-memory HTTP/1.1\r\nX: " + b"y" * 20000, 431),
        (b"POST /gpu-memory HTTP/1.1", 411),
        (b"nonsense", 400),
    ],
)
async def test_what_is_not_a_request_it_serves_is_refused_and_the_connection_closed(
    head: bytes, status: int
) -> None:
    async with serving() as served:
        sent = head + (b"" if status == 431 else b"\r\n\r\n")
        received = await asyncio.to_thread(raw_exchange, served.port, sent)
    assert received.startswith(b"HTTP/1.1 %d " % status), received
    assert b"Connection: close" in received


async def test_a_request_left_unfinished_behind_a_pipelined_one_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second of two requests sent at once never gets its whole body: it is given the
    request timeout, not the idle one, and answered 408."""
    from gpushare_operator.app import reviewserver

    monkeypatch.setattr(reviewserver, "REQUEST_TIMEOUT", 0.3)
    async with serving() as served:
        one = review()
        sent = b"POST /gpu-memory HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(one), one)
        sent += b"POST /gpu-memory HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"
        received = await asyncio.to_thread(raw_exchange, served.port, sent)
    assert received.startswith(b"HTTP/1.1 200 OK")
    assert b"HTTP/1.1 408 " in received and b"Connection: close" in received


class _Clocks:
    """perf_counter and thread_time, moved by hand: a write that takes 1 s of wall time and
    10 ms of CPU, as when the kernel runs the reader the write woke on this server's core."""

    def __init__(self) -> None:
        self.wall, self.cpu = 100.0, 5.0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu


class _SlowWrite(asyncio.Transport):
    def __init__(self, clocks: _Clocks) -> None:
        super().__init__()
        self.clocks, self.written = clocks, b""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)
        self.clocks.wall += 1.0
        self.clocks.cpu += 0.01


async def test_the_wait_for_the_core_after_a_write_is_kept_apart_from_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer's own time is the wall time to the write plus the write's CPU time; the rest
    of the write's wall time is reported as the wait it caused."""
    from gpushare_operator.app import reviewserver

    clocks = _Clocks()
    monkeypatch.setattr(reviewserver, "time", clocks)
    observed: list[tuple[float, float, float]] = []
    offers = reviews.Offers(synced=True, offers=(MPS,), gpu_resources=frozenset())
    protocol = reviewserver.ReviewProtocol(
        handle=MemoryRequests(offers=lambda: offers),
        observe=lambda *took: observed.append(took),
        max_body=MAX_REVIEW_BYTES,
        open_connections=set(),
    )
    transport = _SlowWrite(clocks)
    protocol.connection_made(transport)
    one = review()
    protocol.data_received(b"POST /gpu-memory HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(one))
    clocks.wall += 0.002  # the body arrives 2 ms after the head
    protocol.data_received(one)
    protocol.connection_lost(None)
    assert transport.written.startswith(b"HTTP/1.1 200 OK")
    [(receiving, answering, waiting)] = observed
    assert receiving == pytest.approx(0.002)
    assert answering == pytest.approx(0.01)
    assert waiting == pytest.approx(0.99)

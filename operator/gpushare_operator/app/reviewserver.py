"""HTTP/1.1 for one kind of request: a POST of an AdmissionReview, answered at once.

The memory-request webhook used to be served by aiohttp, with kopf's admission machinery in
between; a profile at 100 admissions/s put a fifth of the operator's CPU per admission in
aiohttp alone (docs/performance.md).  What the API server sends is narrow: a POST with a
``Content-Length`` body of at most a few MiB, on a connection it keeps alive (Go's HTTP/1.1
client: no chunked bodies for a body of known length, no pipelining it relies on).  This
protocol frames exactly that, one request after another on each connection, and hands the
body to a synchronous function that returns the answer: nothing waits, so nothing is
scheduled per request but the write.

Bounds, since anyone who reaches the port can send anything: a request head of at most
``MAX_HEAD`` bytes, a body of at most the server's limit (413 past it, before it is read), a
request completed within ``REQUEST_TIMEOUT`` of its first byte, and a connection idle for
``IDLE_TIMEOUT`` closed (aiohttp's keep-alive default, under the 90 s Go keeps an idle
connection).  Anything that is not such a request gets its status and the connection closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast

MAX_HEAD: Final = 16 * 1024
REQUEST_TIMEOUT: Final = 10.0
IDLE_TIMEOUT: Final = 75.0
_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    505: "HTTP Version Not Supported",
}


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    json: bool = False  # application/json, else text/plain


# (path without the query, body) -> the reply.  Runs on the server's loop: it must not block.
Handler = Callable[[str, bytes], Reply]
# Of each answered request, in seconds:
# - from its first byte to its last (what the client and the network took to deliver it);
# - from its last byte to the answer handed to the kernel (what this server took): the wall
#   time to the write, plus the CPU time of the write itself (TLS and the send);
# - how long the write kept this server off its core beyond that.  On loopback, the send wakes
#   the client's reader, and the kernel may run it on this very core before the write returns
#   (seen at 5,000 nodes: one write in nine returned 1 to 1.6 ms late on a quiet machine, for
#   0.05 ms of work).  The answer is the client's by then: that wait is not this server's
#   share of the admission, and is kept apart rather than hidden.
Observer = Callable[[float, float, float], None]


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class ReviewProtocol(asyncio.Protocol):
    """One connection's requests, in order."""

    def __init__(
        self,
        *,
        handle: Handler,
        observe: Observer,
        max_body: int,
        open_connections: set[ReviewProtocol],
    ) -> None:
        self._handle = handle
        self._observe = observe
        self._max_body = max_body
        self._transport: asyncio.Transport | None = None
        # Bytes received and not yet consumed: the head being read, then its body.
        self._buffer = bytearray()
        # Set once a head is read: (path, body length, close after it); None between requests.
        self._head: tuple[str, int, bool] | None = None
        # perf_counter() at the current request's first byte; None between requests.
        self._started: float | None = None
        # perf_counter() once the current request's body is whole; None until then.
        self._complete: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        # Every connection of the server that is open: this one from made to lost.
        self._open = open_connections

    def abort(self) -> None:
        """Drop the connection now (the server is stopping): no TLS goodbye to wait for."""
        if self._transport is not None:
            self._transport.abort()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses, hence the cast).
        self._transport = cast(asyncio.Transport, transport)
        self._open.add(self)
        self._arm(IDLE_TIMEOUT)

    def connection_lost(self, exc: Exception | None) -> None:
        self._open.discard(self)
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        if self._started is None:
            self._started = time.perf_counter()
            self._arm(REQUEST_TIMEOUT)
        self._buffer += data
        try:
            while self._transport is not None and self._step():
                pass
        except _Refused as refused:
            self._reply(Reply(refused.status, f"{refused.text}\n".encode()), close=True)

    # -- framing -----------------------------------------------------------------------------

    def _step(self) -> bool:
        """Consume one head or one body from the buffer; whether another step may follow."""
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    raise _Refused(431, f"request head over {MAX_HEAD} bytes")
                return False
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            self._head = self._read_head(head)
            return True
        path, length, close = self._head
        if len(self._buffer) < length:
            return False
        self._complete = time.perf_counter()
        body = bytes(self._buffer[:length])
        del self._buffer[:length]
        self._head = None
        self._reply(self._handle(path, body), close=close)
        if self._buffer and self._transport is not None:  # the next request came with it
            self._started = time.perf_counter()
            self._arm(REQUEST_TIMEOUT)
            return True
        return False

    def _read_head(self, head: bytes) -> tuple[str, int, bool]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise _Refused(400, "not an HTTP request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _Refused(505, f"{version} is not served: HTTP/1.1")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise _Refused(400, "a header line that is not name: value")
            key = name.lower()
            if key in headers and key in ("content-length", "transfer-encoding"):
                raise _Refused(400, f"{name} given twice")
            headers[key] = value.strip()
        if method != "POST":
            raise _Refused(405, "only POST is served")
        if "transfer-encoding" in headers:
            raise _Refused(411, "a chunked body is not accepted: send Content-Length")
        text = headers.get("content-length", "")
        if not text.isdigit():
            raise _Refused(411, "Content-Length required")
        length = int(text)
        if length > self._max_body:
            raise _Refused(
                413,
                f"Maximum request body size {self._max_body} exceeded, actual body size {length}",
            )
        connection = headers.get("connection", "").lower()
        close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        if headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return target.partition("?")[0], length, close

    def _reply(self, reply: Reply, *, close: bool) -> None:
        transport = self._transport
        if transport is None:
            return
        kind = b"application/json" if reply.json else b"text/plain; charset=utf-8"
        answered, cpu = time.perf_counter(), time.thread_time()
        transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s"
            % (
                reply.status,
                _REASONS.get(reply.status, "Error").encode(),
                kind,
                len(reply.body),
                b"Connection: close\r\n" if close else b"",
                reply.body,
            )
        )
        writing = time.thread_time() - cpu
        if self._started is not None and self._complete is not None:
            wall = time.perf_counter() - answered
            self._observe(
                self._complete - self._started,
                answered - self._complete + writing,
                max(0.0, wall - writing),
            )
        self._started = self._complete = None
        if close:
            transport.close()
            self._transport = None
        else:
            self._arm(IDLE_TIMEOUT)

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._timer = None
        if self._transport is None:
            return
        if self._started is None:  # idle between requests: close quietly
            self._transport.close()
            self._transport = None
        else:
            self._reply(Reply(408, b"request not completed in time\n"), close=True)

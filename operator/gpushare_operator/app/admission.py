"""The memory-request webhook: its HTTPS server, on a thread and event loop of its own.

Every replica serves it, the leader and its followers alike: the decision
(``core.slots.reviews``) reads only the slot classes the nodes' labels offer
(``cache.slotoffers``), which every replica's node informer keeps, so the answer does not
depend on who leads and survives a failover.

Why a thread of its own, and not kopf's ``@kopf.on.mutate`` on the main loop: an admission
is a few hundred microseconds of work, but on the main loop it waited behind every informer
batch (250 ms windows), every write and every collection there, and kopf's machinery (its
body diff, causes and handler execution) cost several times the decision itself
(docs/performance.md has the profile: 2.7 ms of CPU per admission, of which kopf 62 %,
aiohttp 19 %; kopf's own docs say high load is not expected for webhooks).  Here the
server's loop does nothing else, the answer reads one immutable snapshot of the offers
(``Offers``, replaced whole by the main loop), and the GIL is handed over often enough
(``SWITCH_INTERVAL``) that a busy main loop cannot hold an admission for longer than that.

The serving certificate comes from a Secret the leader rotates (``kube.rotating``).  Each pair
gets an ``SSLContext`` of its own, made on the main loop and never changed afterwards; the
context the server listens with picks the newest one at every handshake (its SNI callback,
which OpenSSL calls with or without a server name), so a rotation refuses no connection and no
context is ever changed while another thread uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final

import structlog
from cryptography import x509

from gpushare_operator.app.reviewserver import Reply, ReviewProtocol
from gpushare_operator.core import certificates
from gpushare_operator.core.slots import reviews

log = structlog.get_logger(__name__)

WEBHOOK_ID: Final = "gpu-memory"  # the path the configuration calls: /gpu-memory
# The largest AdmissionReview accepted (aiohttp's default is 1 MiB, which refused a labelled pod
# of a little more).  kube-apiserver decodes a write request of at most 3 MiB
# (MaxRequestBodyBytes in k8s.io/apiserver/pkg/server/config.go: twice etcd's default 1.5 MiB
# --max-request-bytes, since JSON is larger than the protobuf etcd stores; kube-apiserver has
# no flag for it).  A review carries the object and, for an update, the old object too, plus
# less than 1 MiB of the rest: 7 MiB, the bound controller-runtime's webhook server uses for the
# same reason.  Ours sees pod creations only (no old object), so this also leaves room for a
# protobuf request that grows as JSON.  Reviews come from anyone who reaches the port, and
# each is read whole into memory: it is a bound, not "no limit".
MAX_REVIEW_BYTES: Final = 7 * 1024 * 1024
# How long a thread that holds the GIL may keep another that wants it waiting (CPython's
# default is 5 ms).  The webhook's thread wants it only while it answers; the main loop, busy
# with a storm of node events, gives it up within this.  It costs nothing while only one
# thread wants the GIL.  Measured here (a pure-Python busy main loop, the server's loop timing
# a 10 ms timer): median lateness 5.2 ms at the default, 0.7 ms at 0.5 ms, 0.3 ms at 0.1 ms.
SWITCH_INTERVAL: Final = 0.0001


class ServingTLS:
    """The webhook's TLS: a context per certificate pair, the newest chosen at each handshake.

    ``secret_changed`` runs on the main loop; the server's thread only reads ``listening``
    (never changed after it is made) and ``_current`` (replaced whole)."""

    def __init__(self) -> None:
        # The context the server listens with: no certificate of its own; its SNI callback
        # hands each handshake to the newest pair's context.
        self.listening = _context()
        self.listening.sni_callback = self._choose
        self._current: ssl.SSLContext | None = None
        self.ready = threading.Event()  # set once a certificate is loaded
        self.fingerprint: str | None = None  # of the certificate loaded now
        # The loaded certificate's notBefore and notAfter (Unix seconds), for the metrics.
        self.validity: tuple[float, float] | None = None

    def _choose(self, connection: ssl.SSLObject, _name: str | None, _: ssl.SSLContext) -> None:
        current = self._current
        if current is not None:
            connection.context = current

    def secret_changed(self, secret: Mapping[str, Any] | None) -> None:
        data = certificates.decoded(secret) or {}
        fingerprint = certificates.serving_fingerprint(data)
        if fingerprint is None or fingerprint == self.fingerprint:
            return
        context = _context()
        # The ssl module loads only from files; a private directory, removed at once (the
        # chart's root filesystem is read-only, its /tmp is not).
        with tempfile.TemporaryDirectory(prefix="gpushare-webhook-tls-") as tmp:
            cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert.write_text(data[certificates.CERT_KEY])
            key.touch(mode=0o600)
            key.write_text(data[certificates.KEY_KEY])
            try:
                context.load_cert_chain(cert, key)
            except ssl.SSLError as exc:
                # A pair cryptography reads but OpenSSL will not serve: keep serving the one
                # loaded before (if any); the leader replaces what cannot be used.
                log.warning("webhook serving certificate not loaded", error=str(exc))
                return
        self._current = context
        self.fingerprint = fingerprint
        served = x509.load_pem_x509_certificate(data[certificates.CERT_KEY].encode())
        self.validity = (
            served.not_valid_before_utc.timestamp(),
            served.not_valid_after_utc.timestamp(),
        )
        self.ready.set()
        log.info("webhook serving certificate loaded", serving=fingerprint[:16])


def _context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class MemoryRequests:
    """What the server does with a request: answer a review on ``/gpu-memory`` and count it."""

    def __init__(
        self,
        *,
        offers: Callable[[], reviews.Offers],
        count: Callable[..., None] = lambda *_: None,
    ) -> None:
        self._offers = offers
        # Each answer's outcome (mutated, refused or unavailable), and a refusal's reason.
        self._count = count

    def __call__(self, path: str, body: bytes) -> Reply:
        if path != f"/{WEBHOOK_ID}":
            return Reply(404, f"no webhook at {path}: /{WEBHOOK_ID}\n".encode())
        try:
            answered = reviews.answer(body, offers=self._offers)
        except reviews.BadReview as exc:
            log.warning("admission review refused", error=str(exc))
            return Reply(400, f"{exc}\n".encode())
        if answered.outcome is not None:
            self._count(answered.outcome, answered.reason)
        return Reply(200, answered.body, json=True)


class AdmissionServer:
    """The HTTPS server, on a thread with an event loop of its own.

    ``run`` (a task on the main loop) starts the thread and waits for it; cancelling it
    closes the server, the thread's connections and its loop.  The loop is of the main
    loop's own kind (uvloop where the operator runs on it)."""

    def __init__(
        self,
        *,
        port: int,
        tls: ServingTLS,
        handle: Callable[[str, bytes], Reply],
        observe: Callable[[float, float, float], None] = lambda *_: None,
        host: str = "0.0.0.0",  # all interfaces: the Service routes to the pod IP
    ) -> None:
        self._port = port
        self._host = host
        self._tls = tls
        self._handle = handle
        self._observe = observe
        # Set by the thread once it listens; read by the main loop to stop it.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._finished: Future[None] = Future()
        self.listening = threading.Event()
        # Run on the server's loop beside it (the lag monitor); set before ``run``.
        self.also_run: Callable[[], Coroutine[Any, Any, None]] | None = None

    async def run(self) -> None:
        main = asyncio.get_running_loop()
        previous = sys.getswitchinterval()
        sys.setswitchinterval(min(previous, SWITCH_INTERVAL))
        thread = threading.Thread(
            target=self._thread_main, args=(type(main),), name="webhook-server", daemon=True
        )
        thread.start()
        try:
            await asyncio.shield(asyncio.wrap_future(self._finished))
        finally:
            self._request_stop()
            await asyncio.to_thread(thread.join)
            sys.setswitchinterval(previous)

    def _request_stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # closed: the thread is ending already
                loop.call_soon_threadsafe(stop.set)

    # -- the server's thread ---------------------------------------------------------------

    def _thread_main(self, kind: type[asyncio.AbstractEventLoop]) -> None:
        try:
            with asyncio.Runner(loop_factory=kind) as runner:
                runner.run(self._serve())
        except BaseException as exc:
            self._finished.set_exception(exc)
        else:
            self._finished.set_result(None)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._loop = loop
        while not self._tls.ready.is_set():  # no certificate yet: nothing to serve with
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=0.1)
                return
            except TimeoutError:
                continue
        connections: set[ReviewProtocol] = set()
        server = await loop.create_server(
            lambda: ReviewProtocol(
                handle=self._handle,
                observe=self._observe,
                max_body=MAX_REVIEW_BYTES,
                open_connections=connections,
            ),
            host=self._host,
            port=self._port,
            ssl=self._tls.listening,
            reuse_address=True,
            backlog=1024,
        )
        log.info("serving the memory-request webhook", port=self._port, path=f"/{WEBHOOK_ID}")
        self.listening.set()
        beside = None if self.also_run is None else asyncio.create_task(self.also_run())
        try:
            await self._stop.wait()
        finally:
            if beside is not None:
                beside.cancel()
                await asyncio.gather(beside, return_exceptions=True)
            server.close()
            for connection in list(connections):
                connection.abort()
            await server.wait_closed()
            for _ in range(100):  # an aborted transport says it is lost on the next turns
                if not connections:
                    break
                await asyncio.sleep(0.01)

"""The memory-request webhook's server: its TLS, its answer, its HTTPS listener.

Every replica serves it, the leader and its followers alike: the decision
(``core.slots.reviews``) reads only the slot classes the nodes' labels offer
(``cache.slotoffers``), which every replica's node informer keeps, so the answer does not
depend on who leads and survives a failover.

These parts run in the webhook's own process (``app.admissionchild``, started and fed by
``app.admissionprocess``), not on kopf's ``@kopf.on.mutate``: an admission is a few hundred
microseconds of work, but on the main loop it waited behind every informer batch (250 ms
windows), every write and every collection there, and kopf's machinery (its body diff, causes
and handler execution) cost several times the decision itself (docs/performance.md has the
profile: 2.7 ms of CPU per admission, of which kopf 62 %, aiohttp 19 %; kopf's own docs say high
load is not expected for webhooks).

The serving certificate comes from a Secret the leader rotates (``kube.rotating``).  Each pair
gets an ``SSLContext`` of its own, never changed afterwards; the context the server listens
with picks the newest one at every handshake (its SNI callback, which OpenSSL calls with or
without a server name), so a rotation refuses no connection.
"""

from __future__ import annotations

import asyncio
import ssl
import tempfile
from collections.abc import Callable, Mapping
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


class ServingTLS:
    """The webhook's TLS: a context per certificate pair, the newest chosen at each handshake.

    The operator's main process keeps one to check each pair (OpenSSL must take it), for the
    certificate's metrics and to forward the pair (``pair``, ``on_loaded``); the webhook's
    process keeps one to serve with."""

    def __init__(self) -> None:
        # The context the server listens with: no certificate of its own; its SNI callback
        # hands each handshake to the newest pair's context.
        self.listening = _context()
        self.listening.sni_callback = self._choose
        self._current: ssl.SSLContext | None = None
        self.ready = asyncio.Event()  # set once a certificate is loaded
        self.fingerprint: str | None = None  # of the certificate loaded now
        # The loaded certificate's notBefore and notAfter (Unix seconds), for the metrics.
        self.validity: tuple[float, float] | None = None
        # The loaded pair itself (decoded), to hand to the webhook's process.
        self.pair: dict[str, str] | None = None
        # Called on the loading thread after each pair is taken.
        self.on_loaded: Callable[[], None] | None = None

    def _choose(self, connection: ssl.SSLObject, _name: str | None, _: ssl.SSLContext) -> None:
        current = self._current
        if current is not None:
            connection.context = current

    def secret_changed(self, secret: Mapping[str, Any] | None) -> None:
        """Take the Secret's pair, if it is new and OpenSSL will serve it."""
        self.use(certificates.decoded(secret) or {})

    def use(self, data: Mapping[str, str]) -> bool:
        """Serve with this decoded pair (``tls.crt``, ``tls.key``) from the next handshake on,
        if it is new and OpenSSL will serve it; whether it was taken."""
        fingerprint = certificates.serving_fingerprint(data)
        if fingerprint is None or fingerprint == self.fingerprint:
            return False
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
                return False
        self._current = context
        self.fingerprint = fingerprint
        served = x509.load_pem_x509_certificate(data[certificates.CERT_KEY].encode())
        self.validity = (
            served.not_valid_before_utc.timestamp(),
            served.not_valid_after_utc.timestamp(),
        )
        self.pair = {
            certificates.CERT_KEY: data[certificates.CERT_KEY],
            certificates.KEY_KEY: data[certificates.KEY_KEY],
        }
        self.ready.set()
        log.info("webhook serving certificate loaded", serving=fingerprint[:16])
        if self.on_loaded is not None:
            self.on_loaded()
        return True


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
    """The HTTPS server, on the running loop: in the operator, the loop of the webhook's own
    process (``app.admissionchild``), which does nothing else.

    ``run`` serves until cancelled (once a certificate is loaded: there is nothing to serve with
    before), then closes the server and every connection it holds."""

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
        self.listening = asyncio.Event()  # set once the socket listens

    async def run(self) -> None:
        await self._tls.ready.wait()  # no certificate yet: nothing to serve with
        connections: set[ReviewProtocol] = set()
        server = await asyncio.get_running_loop().create_server(
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
        try:
            await asyncio.Future()  # until cancelled
        finally:
            self.listening.clear()
            server.close()
            for connection in list(connections):
                connection.abort()
            await server.wait_closed()
            for _ in range(100):  # an aborted transport says it is lost on the next turns
                if not connections:
                    break
                await asyncio.sleep(0.01)

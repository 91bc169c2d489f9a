"""The memory-request webhook: kopf's ``@kopf.on.mutate`` handler, and the server it runs on.

Every replica serves it, the leader and its followers alike: the decision
(``core.slots.memoryrequests``) reads only the slot classes the nodes' labels offer
(``cache.slotoffers``), which every replica's node informer keeps, so the answer does not
depend on who leads and survives a failover.  The server is our own implementation of kopf's
webhook-server protocol rather than ``kopf.WebhookServer``: the serving certificate comes from a
Secret the leader rotates (``kube.rotating``), and a new one is loaded into the same TLS
context, so no connection is refused while it changes (kopf's server restarts its site).
"""

from __future__ import annotations

import asyncio
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import kopf
import orjson
import structlog
from aiohttp import web
from cryptography import x509

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import certificates
from gpushare_operator.core.slots import memoryrequests

log = structlog.get_logger(__name__)

WEBHOOK_ID = "gpu-memory"  # the path the configuration calls: /gpu-memory
# The largest AdmissionReview accepted (aiohttp's default is 1 MiB, which refused a labelled pod
# of a little more).  kube-apiserver decodes a write request of at most 3 MiB
# (MaxRequestBodyBytes in k8s.io/apiserver/pkg/server/config.go: twice etcd's default 1.5 MiB
# --max-request-bytes, since JSON is larger than the protobuf etcd stores; kube-apiserver has
# no flag for it).  A review carries the object and, for an update, the old object too, plus
# less than 1 MiB of the rest: 7 MiB, the bound controller-runtime's webhook server uses for the
# same reason.  Ours sees pod creations only (no old object), so this also leaves room for a
# protobuf request that grows as JSON.  Reviews come from anyone who reaches the port, and
# each is read whole into memory: it is a bound, not "no limit".
MAX_REVIEW_BYTES = 7 * 1024 * 1024


class ServingTLS:
    """The webhook's TLS context: one for the server's whole life, its certificate reloaded in
    place whenever the Secret's pair changes (new handshakes get the new one)."""

    def __init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.ready = asyncio.Event()
        self.fingerprint: str | None = None  # of the certificate loaded now
        # The loaded certificate's notBefore and notAfter (Unix seconds), for the metrics.
        self.validity: tuple[float, float] | None = None

    def secret_changed(self, secret: Mapping[str, Any] | None) -> None:
        data = certificates.decoded(secret) or {}
        fingerprint = certificates.serving_fingerprint(data)
        if fingerprint is None or fingerprint == self.fingerprint:
            return
        # The ssl module loads only from files; a private directory, removed at once (the
        # chart's root filesystem is read-only, its /tmp is not).
        with tempfile.TemporaryDirectory(prefix="gpushare-webhook-tls-") as tmp:
            cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert.write_text(data[certificates.CERT_KEY])
            key.touch(mode=0o600)
            key.write_text(data[certificates.KEY_KEY])
            try:
                self.context.load_cert_chain(cert, key)
            except ssl.SSLError as exc:
                # A pair cryptography reads but OpenSSL will not serve: keep serving the one
                # loaded before (if any); the leader replaces what cannot be used.
                log.warning("webhook serving certificate not loaded", error=str(exc))
                return
        self.fingerprint = fingerprint
        served = x509.load_pem_x509_certificate(data[certificates.CERT_KEY].encode())
        self.validity = (
            served.not_valid_before_utc.timestamp(),
            served.not_valid_after_utc.timestamp(),
        )
        self.ready.set()
        log.info("webhook serving certificate loaded", serving=fingerprint[:16])


class AdmissionServer:
    """kopf's webhook-server protocol: serve ``fn`` over HTTPS on ``port`` once the first
    certificate is loaded, and tell kopf where (kopf does not manage the configuration here:
    the chart owns it, and the leader keeps its caBundle current)."""

    def __init__(
        self, *, port: int, tls: ServingTLS, observe: Callable[[float], None] = lambda _: None
    ) -> None:
        self._port = port
        self._tls = tls
        self._observe = observe

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def serve(request: web.Request) -> web.Response:
            return await self._serve(fn, request)

        await self._tls.ready.wait()
        app = web.Application(client_max_size=MAX_REVIEW_BYTES)
        app.router.add_post("/{id:.*}", serve)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            # All interfaces: the Service routes to the pod IP.
            site = web.TCPSite(
                runner, host="0.0.0.0", port=self._port, ssl_context=self._tls.context
            )
            await site.start()
            log.info("serving the memory-request webhook", port=self._port, path=f"/{WEBHOOK_ID}")
            yield kopf.WebhookClientConfig(url=f"https://127.0.0.1:{self._port}")
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    async def _serve(self, fn: kopf.WebhookFn, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            review = orjson.loads(await request.read())
            webhook = request.match_info.get("id") or None
            admitted = (review.get("request") or {}).get("object")
            if webhook == WEBHOOK_ID and isinstance(admitted, dict):
                # What the handler reads and changes, and no more: kopf diffs what it is given
                # (core.slots.memoryrequests.admission_view says why the patch is the same).
                review["request"]["object"] = memoryrequests.admission_view(admitted)
            answer = await fn(review, webhook=webhook)
        except orjson.JSONDecodeError as exc:
            return web.Response(status=400, text=f"not JSON: {exc}\n")
        except web.HTTPRequestEntityTooLarge as exc:
            log.warning("admission review too large", limit=MAX_REVIEW_BYTES, error=exc.text)
            return web.Response(status=413, text=f"{exc.text}\n")
        except Exception as exc:  # kopf's errors of a malformed review: not the pod's fault
            log.warning("admission review failed", error=repr(exc))
            return web.Response(status=400, text=f"{exc}\n")
        finally:
            self._observe(time.perf_counter() - started)
        return web.Response(body=orjson.dumps(answer), content_type="application/json")


class MemoryRequests:
    """The handler's logic over the cache: decide, or refuse with the reason."""

    def __init__(
        self,
        *,
        cache: ClusterCache,
        synced: Callable[[], bool],
        count: Callable[..., None] = lambda *_: None,
    ) -> None:
        self._cache = cache
        self._synced = synced
        # Each answer's outcome (mutated, refused or unavailable), and a refusal's reason.
        self._count = count

    def admit(self, body: Mapping[str, Any], patch: kopf.Patch, warnings: list[str]) -> None:
        """Mutate through ``patch`` (kopf turns it into the JSON patch it answers with), or
        raise ``kopf.AdmissionError``."""
        if not self._synced():
            self._count("unavailable")
            raise kopf.AdmissionError(
                "gpushare's caches are not synced yet: try again in a moment", code=503
            )
        known = self._cache.tracked_resources
        try:
            placement = memoryrequests.place(
                body,
                offers=self._cache.slot_offers.offers(),
                is_gpu_resource=lambda name: memoryrequests.is_gpu_resource(name, known=known),
            )
        except memoryrequests.Refusal as refusal:
            self._count("refused", refusal.reason)
            raise kopf.AdmissionError(refusal.message, code=refusal.code) from None

        def mutate(raw: Any) -> None:
            warnings.extend(memoryrequests.apply(raw, placement))

        patch.fns.append(mutate)
        self._count("mutated")


def register(registry: kopf.OperatorRegistry, handler: MemoryRequests) -> None:
    """The mutating handler, for pods created with the request label (the configuration's
    objectSelector sends only those; kopf checks the label again)."""

    @kopf.on.mutate(
        "",
        "v1",
        "pods",
        id=WEBHOOK_ID,
        operations=["CREATE"],
        labels={memoryrequests.REQUEST_LABEL: kopf.PRESENT},
        registry=registry,
    )
    async def gpu_memory(
        *, body: kopf.Body, patch: kopf.Patch, warnings: list[str], **_: Any
    ) -> None:
        # async: kopf runs sync handlers in a thread, and the cache is the loop's alone.
        handler.admit(body, patch, warnings)

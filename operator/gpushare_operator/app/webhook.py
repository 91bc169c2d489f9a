"""The memory-request webhook's parts, built once: what it serves with and what keeps it valid.

- the Secret and the MutatingWebhookConfiguration, each read by an informer of its own (narrowed
  to its name, so the RBAC can name it too);
- the TLS context every replica serves with, reloaded from the Secret (``app.admission``);
- the leader's certificate rotation (``kube.rotating``);
- the server, on a thread of its own (``app.admission.AdmissionServer``), and what it answers
  with: a snapshot of the offers (``core.slots.reviews.Offers``) made of parts the main loop
  replaces whole and never changes in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpushare_operator.app.admission import AdmissionServer, MemoryRequests, ServingTLS
from gpushare_operator.app.settings import Settings
from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.heldobject import HeldObject
from gpushare_operator.core.slots import reviews
from gpushare_operator.kube import reading, rotating
from gpushare_operator.kube.connection import ApiHandle
from gpushare_operator.kube.events import EventRecorder
from gpushare_operator.kube.informer import Informer
from gpushare_operator.kube.telemetry import Telemetry


class Webhook:
    def __init__(
        self,
        *,
        settings: Settings,
        handle: ApiHandle,
        cache: ClusterCache,
        telemetry: Telemetry,
        may_write: Callable[[], bool],
        recorder: EventRecorder,
        caches_synced: Callable[[], bool],
        admitted: Callable[..., None],
        admission_took: Callable[[float, float, float], None],
    ) -> None:
        s = settings
        self.tls = ServingTLS()
        self.secret = HeldObject(on_change=self._secret_changed)
        self.configuration = HeldObject(on_change=self._configuration_changed)
        self.rotator = rotating.CertRotator(
            api=handle.api,
            secret=self.secret,
            configuration=self.configuration,
            namespace=s.namespace,
            secret_name=s.webhook_secret,
            configuration_name=s.webhook_configuration,
            hosts=s.webhook_names(),
            validity=s.webhook_cert_validity,
            may_write=may_write,
            recorder=recorder,
        )
        self._cache = cache
        self._caches_synced = caches_synced
        self._synced = False  # once the caches are synced they stay so (a relist replaces)
        self.handler = MemoryRequests(offers=self.offers, count=admitted)
        self.server = AdmissionServer(
            port=s.webhook_port, tls=self.tls, handle=self.handler, observe=admission_took
        )
        read = [
            (
                reading.Collection(
                    path=rotating.secrets_path(s.namespace),
                    kind="Secret",
                    field_selector=f"metadata.name={s.webhook_secret}",
                    forbidden_is_empty=True,  # the leader says why it cannot write it
                ),
                self.secret,
            ),
            (
                reading.Collection(
                    path=rotating.CONFIGURATIONS,
                    kind="MutatingWebhookConfiguration",
                    field_selector=f"metadata.name={s.webhook_configuration}",
                    forbidden_is_empty=True,
                ),
                self.configuration,
            ),
        ]
        self.informers = [
            Informer(api=handle.api, collection=c, sink=k, telemetry=telemetry) for c, k in read
        ]

    def offers(self) -> reviews.Offers:
        """What an admission reads, from the server's thread: each part is an immutable
        object the main loop replaces whole (``cache.slotoffers``, ``tracked_resources``)."""
        if not self._synced:
            self._synced = self._caches_synced()
        cache = self._cache
        return reviews.Offers(
            synced=self._synced,
            offers=cache.slot_offers.offers(),
            gpu_resources=cache.tracked_resources,
        )

    @property
    def ready(self) -> bool:
        """Whether this replica can answer: a serving certificate loaded, and its server
        listening with it."""
        return self.tls.ready.is_set() and self.server.listening.is_set()

    def _secret_changed(self, body: Mapping[str, Any] | None) -> None:
        self.tls.secret_changed(body)
        self.rotator.changed()

    def _configuration_changed(self, _: Mapping[str, Any] | None) -> None:
        self.rotator.changed()

"""The memory-request webhook's parts, built once: what it serves with and what keeps it valid.

- the Secret and the MutatingWebhookConfiguration, each read by an informer of its own (narrowed
  to its name, so the RBAC can name it too);
- the TLS context every replica serves with, reloaded from the Secret (``app.admission``);
- the leader's certificate rotation (``kube.rotating``);
- the kopf handler's logic over the cache (``app.admission.MemoryRequests``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpushare_operator.app.admission import AdmissionServer, MemoryRequests, ServingTLS
from gpushare_operator.app.settings import Settings
from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.heldobject import HeldObject
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
        admission_took: Callable[[float], None],
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
        self.server = AdmissionServer(port=s.webhook_port, tls=self.tls, observe=admission_took)
        self.handler = MemoryRequests(cache=cache, synced=caches_synced, count=admitted)
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

    @property
    def ready(self) -> bool:
        """Whether this replica can answer: it has a serving certificate loaded."""
        return self.tls.ready.is_set()

    def _secret_changed(self, body: Mapping[str, Any] | None) -> None:
        self.tls.secret_changed(body)
        self.rotator.changed()

    def _configuration_changed(self, _: Mapping[str, Any] | None) -> None:
        self.rotator.changed()

"""The leader keeps the webhook's serving certificate and its CA bundle current.

``core.certificates.plan`` decides from the Secret, the webhook configuration and the clock;
this loop sends what it says, only while this replica leads (the write loop's gate), one write
a step: the Secret first (with its resourceVersion as a precondition, so two leaders a moment
apart cannot both write keys), then the configuration's ``caBundle``.  Every replica serves the
webhook with whatever the Secret holds (``app.admission``), so a follower needs nothing from
here; a new leader finds the same Secret and plans the same.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog
from kubernetes_asyncio import client

from gpushare_operator.cache.heldobject import HeldObject
from gpushare_operator.core import certificates
from gpushare_operator.kube import http
from gpushare_operator.kube.events import EventRecorder, ObjectRef
from gpushare_operator.kube.sending import FIELD_MANAGER, JSON_PATCH

log = structlog.get_logger(__name__)

CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
FOLLOWER_PAUSE = 5.0  # a follower looks again this often (a gained lease also wakes it)
RETRY_PAUSE = 5.0  # after a failed write
# The Warning Event on the Secret when what it held could not be used and was replaced.
REPLACED_EVENT = "WebhookCertificateReplaced"


def secrets_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets"


def bundle_of(configuration: Mapping[str, Any] | None) -> str | None:
    """The CA bundle the configuration's webhooks carry: the first one's; None when they do
    not all carry the same (so that every one of them is brought up to date)."""
    if configuration is None:
        return None
    bundles = {
        str((w.get("clientConfig") or {}).get("caBundle") or "")
        for w in configuration.get("webhooks") or []
    }
    if len(bundles) != 1:
        return None
    (encoded,) = bundles
    try:
        return base64.b64decode(encoded).decode()
    except (ValueError, UnicodeDecodeError):
        return None


class CertRotator:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        secret: HeldObject,
        configuration: HeldObject,
        namespace: str,
        secret_name: str,
        configuration_name: str,
        hosts: Sequence[str],
        validity: float,
        may_write: Callable[[], bool],
        recorder: EventRecorder | None = None,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._api = api
        self._secret = secret
        self._configuration = configuration
        self._namespace = namespace
        self._secret_name = secret_name
        self._configuration_name = configuration_name
        self._hosts = tuple(hosts)
        self._validity = datetime.timedelta(seconds=validity)
        self._may_write = may_write
        self._recorder = recorder
        self._now = now
        self._wake = asyncio.Event()
        self._missing_said = False
        self.writes = 0  # Secret writes and configuration patches sent (for the metrics)

    def changed(self) -> None:
        """Something it reads changed (either object, or our leadership): plan again now."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            pause = await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=pause)
            self._wake.clear()

    async def step(self) -> float:
        """One look: at most one write; returns how long to wait before the next look."""
        if not (self._secret.seen and self._configuration.seen) or not self._may_write():
            return FOLLOWER_PAUSE
        now = self._now()
        plan = certificates.plan(
            data=certificates.decoded(self._secret.body),
            published=bundle_of(self._configuration.body),
            hosts=self._hosts,
            now=now,
            validity=self._validity,
        )
        pause = max(0.5, (plan.recheck_at - now).total_seconds())
        try:
            if plan.data is not None:
                await self._write_secret(plan.data, reason=plan.reason, problem=plan.problem)
                return 0.0
            if await self._publish(plan.bundle):
                return 0.0
        except http.ApiError as exc:
            log.warning("cannot keep the webhook certificate current", error=str(exc))
            return RETRY_PAUSE
        except (TimeoutError, OSError) as exc:
            log.warning("cannot reach the API server for the webhook certificate", error=str(exc))
            return RETRY_PAUSE
        return pause

    async def _write_secret(
        self, data: Mapping[str, str], *, reason: str, problem: str = ""
    ) -> None:
        body = self._secret.body
        encoded = certificates.encoded(data)
        if body is None:
            answer = await http.request(
                self._api,
                method="POST",
                path=secrets_path(self._namespace),
                query=[("fieldManager", FIELD_MANAGER)],
                body={
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": self._secret_name,
                        "namespace": self._namespace,
                        "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
                    },
                    "type": "kubernetes.io/tls",
                    "data": encoded,
                },
            )
        else:
            version = (body.get("metadata") or {}).get("resourceVersion")
            answer = await http.request(
                self._api,
                method="PATCH",
                path=f"{secrets_path(self._namespace)}/{self._secret_name}",
                query=[("fieldManager", FIELD_MANAGER)],
                # The resourceVersion makes it a compare-and-swap: 409 if it moved meanwhile.
                body={"metadata": {"resourceVersion": version}, "data": encoded},
                content_type=http.MERGE_PATCH,
            )
        self.writes += 1
        (log.warning if problem else log.info)(
            reason or "rewrote the webhook's certificate Secret",
            secret=self._secret_name,
            serving=(certificates.serving_fingerprint(data) or "")[:16],
        )
        if isinstance(answer, dict):  # what we wrote is what we plan from next
            self._secret.apply("MODIFIED", answer)
            if problem:
                await self._tell(answer, reason=reason)

    async def _tell(self, secret: Mapping[str, Any], *, reason: str) -> None:
        """A Warning Event on the Secret: what it held could not be used (someone else put
        it there), and the leader replaced it."""
        if self._recorder is None:
            return
        metadata = secret.get("metadata") or {}
        ref = ObjectRef(
            api_version="v1",
            kind="Secret",
            name=self._secret_name,
            uid=str(metadata.get("uid") or ""),
            namespace=self._namespace,
        )
        await self._recorder.post(ref=ref, type_="Warning", reason=REPLACED_EVENT, message=reason)

    async def _publish(self, bundle: str) -> bool:
        """Bring the configuration's caBundle to ``bundle``; whether it sent a patch."""
        configuration = self._configuration.body
        if configuration is None:
            if not self._missing_said:
                log.warning(
                    "the MutatingWebhookConfiguration is missing: the API server cannot call the"
                    " webhook until it exists (the Helm chart creates it)",
                    name=self._configuration_name,
                )
                self._missing_said = True
            return False
        self._missing_said = False
        if bundle_of(configuration) == bundle:
            return False
        encoded = base64.b64encode(bundle.encode()).decode()
        patch: list[dict[str, Any]] = []
        for index, webhook in enumerate(configuration.get("webhooks") or []):
            patch.append(
                {"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]}
            )
            patch.append(
                {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded}
            )
        if not patch:
            return False
        answer = await http.request(
            self._api,
            method="PATCH",
            path=f"{CONFIGURATIONS}/{self._configuration_name}",
            query=[("fieldManager", FIELD_MANAGER)],
            body=patch,
            content_type=JSON_PATCH,
        )
        self.writes += 1
        log.info("published the webhook's CA bundle", configuration=self._configuration_name)
        if isinstance(answer, dict):
            self._configuration.apply("MODIFIED", answer)
        return True

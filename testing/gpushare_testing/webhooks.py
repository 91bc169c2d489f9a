"""The memory-request webhook in the integration tests: its configuration, as the chart makes
it, pointed at operator processes on 127.0.0.1, and what the API server and the operator show.

The chart's configuration calls a Service; here there is no kube-proxy, so the same webhook
calls ``https://127.0.0.1:<port>/gpu-memory`` instead (``test_chart`` checks that the two
differ in ``clientConfig`` alone).  The operator is told to put 127.0.0.1 in its serving
certificate (``--webhook-hosts``), as a cluster's would name the Service.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from gpushare_testing.operators import RunningOperator
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

REQUEST_LABEL: Final = "gpushare.dev/gpu-memory"
CONTAINER_ANNOTATION: Final = "gpushare.dev/gpu-container"
MPS_LIMIT_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
WEBHOOK_NAME: Final = "gpu-memory.gpushare.dev"
WEBHOOK_PATH: Final = "/gpu-memory"
CONFIGURATIONS: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
SLOT_MEMORY: Final = "gpushare.dev/slot-memory-mib"
SLOT_ISOLATION: Final = "gpushare.dev/slot-isolation"
SLOT_RESOURCE: Final = "gpushare.dev/slot-resource"
SLOT_LABELS: Final = (SLOT_MEMORY, SLOT_ISOLATION, SLOT_RESOURCE)
OFFER_NODES: Final = "gpushare_webhook_offer_nodes"


def webhook_entry(client_config: Mapping[str, Any], *, timeout: int = 5) -> dict[str, Any]:
    """The one webhook of the chart's configuration, calling ``client_config``."""
    return {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        # gpushare down: labelled pods are refused (their promise cannot be kept); the
        # objectSelector keeps every other pod away from the webhook, so they are admitted.
        "failurePolicy": "Fail",
        "timeoutSeconds": timeout,
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": "Never",
        "objectSelector": {"matchExpressions": [{"key": REQUEST_LABEL, "operator": "Exists"}]},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "clientConfig": dict(client_config),
    }


def configuration(name: str, *, port: int) -> dict[str, Any]:
    """The configuration, calling an operator on 127.0.0.1:``port``; no caBundle (the
    operator publishes it)."""
    url = f"https://127.0.0.1:{port}{WEBHOOK_PATH}"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [webhook_entry({"url": url})],
    }


@dataclass(frozen=True)
class WebhookFlags:
    """Names of one test's webhook objects, and the operator flags that name them."""

    configuration: str
    secret: str
    validity: float = 7776000.0

    def args(self, *, port: int) -> tuple[str, ...]:
        return (
            "--webhook-port",
            str(port),
            "--webhook-configuration",
            self.configuration,
            "--webhook-secret",
            self.secret,
            "--webhook-hosts",
            "127.0.0.1,localhost",
            "--webhook-cert-validity",
            f"{self.validity:g}",
        )


async def install(sim: GpuClusterSimulator, name: str, *, port: int) -> None:
    status, body = await sim.client.post(CONFIGURATIONS, configuration(name, port=port))
    assert status == 201, body


async def point_at(sim: GpuClusterSimulator, name: str, *, port: int) -> None:
    """Call the replica on ``port`` from now on, by URL (the caBundle kept; a chart's service
    reference replaced: there is no kube-proxy here to reach a Service)."""
    status, body = await sim.client.get(f"{CONFIGURATIONS}/{name}")
    assert status == 200, body
    client = {"url": f"https://127.0.0.1:{port}{WEBHOOK_PATH}"}
    bundle = body["webhooks"][0]["clientConfig"].get("caBundle")
    if bundle:
        client["caBundle"] = bundle
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig", "value": client}]
    status, body = await sim.client.patch(
        f"{CONFIGURATIONS}/{name}", patch, content_type="application/json-patch+json"
    )
    assert status == 200, body


async def remove(sim: GpuClusterSimulator, name: str, *, secret: str, namespace: str) -> None:
    status, body = await sim.client.delete(f"{CONFIGURATIONS}/{name}")
    assert status in (200, 404), body
    status, body = await sim.client.delete(f"/api/v1/namespaces/{namespace}/secrets/{secret}")
    assert status in (200, 404), body


async def ca_bundle(sim: GpuClusterSimulator, name: str) -> str:
    """The caBundle the configuration carries now (PEM; empty while none)."""
    status, body = await sim.client.get(f"{CONFIGURATIONS}/{name}")
    assert status == 200, body
    encoded = (body["webhooks"][0].get("clientConfig") or {}).get("caBundle") or ""
    return base64.b64decode(encoded).decode()


async def wait_published(sim: GpuClusterSimulator, name: str, *, timeout: float = 60) -> str:
    return await eventually(
        lambda: ca_bundle(sim, name),
        until=bool,
        timeout=timeout,
        what=f"the operator to publish the CA bundle of {name}",
    )


def served_certificate(port: int) -> x509.Certificate:
    """The certificate the webhook server on 127.0.0.1:``port`` presents now."""
    pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=5)
    return x509.load_pem_x509_certificate(pem.encode())


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def memory_pod(
    name: str,
    *,
    memory: str,
    affinity: Mapping[str, Any] | None = None,
    containers: int = 1,
    gpu_container: str | None = None,
    extra_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod asking for GPU memory by label, as a user writes it (no GPU resource)."""
    annotations = {CONTAINER_ANNOTATION: gpu_container} if gpu_container else {}
    spec: dict[str, Any] = {
        "containers": [
            {"name": f"c{i}", "image": "registry.example.com/inference:1.0"}
            for i in range(containers)
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if affinity is not None:
        spec["affinity"] = dict(affinity)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {REQUEST_LABEL: memory, **(extra_labels or {})},
            "annotations": annotations,
        },
        "spec": spec,
    }


async def offered(operator: RunningOperator) -> dict[tuple[str, int], float]:
    """Nodes offering each class, by (policy, memory MiB), as the replica's own node cache
    holds them (``gpushare_webhook_offer_nodes``)."""
    found: dict[tuple[str, int], float] = {}
    for labels, value in await operator.labelled(OFFER_NODES):
        key = (labels["policy"], int(labels["memory_mib"]))
        found[key] = found.get(key, 0.0) + value
    return found


async def wait_offered(
    operator: RunningOperator, nodes: Mapping[tuple[str, int], int], *, timeout: float = 60
) -> None:
    """Until the replica's webhook can place on ``nodes`` ((policy, memory MiB) -> nodes
    offering that class): the API server shows a label the leader wrote a moment before the
    replica's informer takes it in, and a pod created in between is fairly refused."""
    await eventually(
        lambda: offered(operator),
        until=lambda found: all(found.get(k, 0) >= n for k, n in nodes.items()),
        timeout=timeout,
        what=f"the webhook to offer {dict(nodes)}",
    )

"""The memory-request webhook through a leader's death and through certificate rotations.

Every replica serves the webhook from the same caches and the same Secret, so a follower
answers while the leader is gone; the leader rotates the serving certificate, and a certificate
is served only once the API server could trust its issuer.  Both are checked against the real
API server: pods created meanwhile, and the audit log of the Secret and configuration writes.
"""

from __future__ import annotations

import base64
import datetime
import time
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpushare_operator.core import certificates
from gpushare_testing import apiobjects as h
from gpushare_testing import webhooks as wh
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.operators import (
    OPERATOR_NAMESPACE,
    OperatorFactory,
    RunningOperator,
    ensure_namespace,
)
from gpushare_testing.replicas import LEASE_PATH, TIMING_FLAGS, USERS, delete_lease
from gpushare_testing.rolloutaudit import moment
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

GPU = "nvidia.com/gpu"
MUTATED = "gpushare_webhook_admissions_total{outcome=mutated}"


async def mps_pool(sim: GpuClusterSimulator, policies: list[str]) -> str:
    pool = h.unique("mps")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    await h.add_policy(sim, policies, h.policy(pool, pool=pool, strategy="MPS"))
    return node


async def wait_promised(sim: GpuClusterSimulator, node: str) -> int:
    """Until the node's slot labels are on it (in the API server); the MiB they promise."""

    async def labels() -> dict[str, str]:
        return dict((await h.node(sim.client, node))["metadata"].get("labels") or {})

    found = await eventually(
        labels, until=lambda found: wh.SLOT_MEMORY in found, timeout=60, what=f"{node}'s promise"
    )
    return int(found[wh.SLOT_MEMORY])


async def ready(operator: RunningOperator) -> bool:
    url = f"http://127.0.0.1:{operator.http_port}/readyz"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status == 200


async def holder(sim: GpuClusterSimulator) -> str:
    status, body = await sim.client.get(LEASE_PATH)
    return str((body.get("spec") or {}).get("holderIdentity") or "") if status == 200 else ""


async def create_memory_pod(sim: GpuClusterSimulator, namespace: str, name: str) -> dict[str, Any]:
    status, body = await sim.client.post(
        f"/api/v1/namespaces/{namespace}/pods", wh.memory_pod(name, memory="1Gi")
    )
    assert status == 201, (name, status, body)
    assert body["spec"]["containers"][0]["resources"]["requests"] == {GPU: "1"}, body
    return dict(body)


async def test_a_follower_answers_while_the_leader_is_gone(
    crds_installed: None,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
    control_plane: ControlPlane,
) -> None:
    node = await mps_pool(sim, policies)
    ports = {"a": free_port(), "b": free_port()}
    await wh.install(sim, webhook_flags.configuration, port=ports["a"])
    delete_lease(control_plane)
    replicas: dict[str, RunningOperator] = {}
    for identity in ("a", "b"):
        replicas[identity] = await start_operator(
            "--device-plugin-namespace",
            namespace,
            "--identity",
            identity,
            *TIMING_FLAGS,
            *webhook_flags.args(port=ports[identity]),
            user=USERS[identity],
        )
    await wh.wait_published(sim, webhook_flags.configuration)
    promised = await wait_promised(sim, node)
    leader = await eventually(lambda: holder(sim), until=bool, what="a leader")
    follower = "b" if leader == "a" else "a"
    await eventually(lambda: ready(replicas[follower]), what="the follower to be ready")
    # The leader's slot labels reach the follower's node cache a moment after the API server
    # has them; a pod created in between would fairly be refused (no node offers a slot).
    await wh.wait_offered(replicas[follower], {(policies[-1], promised): 1})
    # The configuration calls the follower from now on: it alone answers below, once the API
    # server has seen the change (the follower counts the admissions it answered).
    await wh.point_at(sim, webhook_flags.configuration, port=ports[follower])
    probes = 0

    async def follower_answers() -> float:
        nonlocal probes
        await create_memory_pod(sim, pods_ns, f"before-{probes}")
        probes += 1
        return (await replicas[follower].metrics())[MUTATED]

    await eventually(follower_answers, until=lambda count: count > 0, what="the follower called")

    replicas[leader].proc.kill()  # SIGKILL: no lease handed back, no goodbye
    killed = time.monotonic()
    created, leaderless = 0, 0
    while True:
        now_holder = await holder(sim)
        await create_memory_pod(sim, pods_ns, f"during-{created}")
        created += 1
        if now_holder == leader:
            leaderless += 1  # the lease still names the dead replica: nobody leads
        if now_holder == follower and created > leaderless + 2:
            break
        assert time.monotonic() - killed < 60, "the follower never took the lease"
    assert leaderless >= 3, f"only {leaderless} pods were created while nobody led"
    # Each was answered by the follower's webhook: the audit log says it mutated them all.
    mutated = [
        e
        for e in control_plane.audit_events()
        if e["verb"] == "create"
        and e["objectRef"].get("resource") == "pods"
        and e["objectRef"].get("namespace") == pods_ns
        and str(e["objectRef"].get("name")).startswith("during-")
        and not e["objectRef"].get("subresource")
        and any(
            wh.WEBHOOK_NAME in v and '"mutated":true' in v
            for k, v in (e.get("annotations") or {}).items()
            if k.startswith("mutation.webhook")
        )
    ]
    assert len(mutated) == created


def _certs(pem: str) -> list[x509.Certificate]:
    blocks = [b for b in pem.split("-----END CERTIFICATE-----") if "BEGIN CERTIFICATE" in b]
    return [
        x509.load_pem_x509_certificate((b + "-----END CERTIFICATE-----\n").encode()) for b in blocks
    ]


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def certificate_writes(
    plane: ControlPlane, flags: wh.WebhookFlags, *, since: float
) -> tuple[list[tuple[float, x509.Certificate]], list[tuple[float, list[x509.Certificate]]]]:
    """From the audit log: (when, serving certificate) of each Secret write that changed it,
    and (when, CA bundle) of each caBundle the operator published, in order."""
    served: list[tuple[float, x509.Certificate]] = []
    bundles: list[tuple[float, list[x509.Certificate]]] = []
    for event in plane.audit_events():
        ref, body = event["objectRef"], event.get("requestObject")
        if event["user"]["username"] != h.OPERATOR_USER or moment(event) < since:
            continue
        if not 200 <= event["responseStatus"]["code"] < 300:
            continue
        if ref.get("resource") == "secrets" and ref.get("name") in (flags.secret, None):
            data = (body or {}).get("data") or {}
            if "tls.crt" in data:
                pem = base64.b64decode(data["tls.crt"]).decode()
                cert = _certs(pem)[0]
                if not served or served[-1][1] != cert:
                    served.append((moment(event), cert))
        elif ref.get("resource") == "mutatingwebhookconfigurations":
            for op in body or ():
                if str(op.get("path", "")).endswith("/caBundle"):
                    pem = base64.b64decode(op["value"]).decode()
                    bundles.append((moment(event), _certs(pem)))
                    break
    return served, bundles


async def test_the_certificate_rotates_and_is_served_only_once_its_issuer_is_trusted(
    crds_installed: None,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    control_plane: ControlPlane,
) -> None:
    flags = wh.WebhookFlags(
        configuration=h.unique("gpu-memory"), secret=h.unique("webhook-tls"), validity=30
    )
    since = time.time()
    node = await mps_pool(sim, policies)
    port = free_port()
    await wh.install(sim, flags.configuration, port=port)
    try:
        operator = await start_operator(
            "--device-plugin-namespace", namespace, *flags.args(port=port)
        )
        await wh.wait_published(sim, flags.configuration)
        promised = await wait_promised(sim, node)
        await wh.wait_offered(operator, {(policies[-1], promised): 1})
        # Pods created through two rotations (every 20 s: two thirds of 30 s) are all admitted,
        # and the certificate the webhook presents changes twice.
        seen: list[str] = []
        started, created = time.monotonic(), 0
        while len(seen) < 3:
            fingerprint = wh.fingerprint(wh.served_certificate(port))
            if not seen or seen[-1] != fingerprint:
                seen.append(fingerprint)
            await create_memory_pod(sim, pods_ns, f"p-{created}")
            created += 1
            assert time.monotonic() - started < 90, f"served {len(seen)} certificates in 90 s"
        served, bundles = certificate_writes(control_plane, flags, since=since)
    finally:
        await wh.remove(sim, flags.configuration, secret=flags.secret, namespace=OPERATOR_NAMESPACE)
    assert len(served) >= 3, served
    assert {wh.fingerprint(cert) for _, cert in served} >= set(seen)
    for when, cert in served[1:]:  # the first was issued before any bundle could name it
        trusted = [b for at, b in bundles if at < when]
        assert trusted, f"{cert.serial_number} written before any bundle was published"
        assert any(_issued_by(cert, ca) for ca in trusted[-1]), (
            "a certificate was written to the Secret before the configuration trusted its issuer"
        )
    assert all(len(bundle) <= 5 for _, bundle in bundles)


async def healthy(operator: RunningOperator) -> bool:
    url = f"http://127.0.0.1:{operator.http_port}/healthz"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status == 200


def encrypted_pair() -> dict[str, str]:
    """A serving pair for the test's hosts whose key is encrypted (PKCS#8 with a password), as a
    restore or a hand-made Secret can leave it: the certificate is fine, the key unreadable."""
    made = certificates.plan(
        data=None,
        published=None,
        hosts=["127.0.0.1", "localhost"],
        now=datetime.datetime.now(datetime.UTC),
        validity=datetime.timedelta(days=90),
    )
    assert made.data is not None
    key = serialization.load_pem_private_key(made.data["tls.key"].encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    locked = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"a password gpushare never has"),
    )
    return {"tls.crt": made.data["tls.crt"], "tls.key": locked.decode()}


async def test_an_encrypted_key_in_the_secret_is_replaced_and_the_operator_stays_healthy(
    crds_installed: None,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
    control_plane: ControlPlane,
) -> None:
    """It used to raise out of the plan and out of every replica's Secret watch: /healthz
    failed, the pod restarted into the same Secret, and labelled pods were refused."""
    since = time.time()
    node = await mps_pool(sim, policies)
    ensure_namespace(control_plane, OPERATOR_NAMESPACE)  # before the operator, for its Secret
    secrets = f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/secrets"
    status, body = await sim.client.post(
        secrets,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": webhook_flags.secret},
            "type": "kubernetes.io/tls",
            "data": certificates.encoded(encrypted_pair()),
        },
    )
    assert status == 201, body
    port = free_port()
    await wh.install(sim, webhook_flags.configuration, port=port)
    operator = await start_operator(
        "--device-plugin-namespace", namespace, *webhook_flags.args(port=port)
    )
    await wh.wait_published(sim, webhook_flags.configuration)

    async def secret_data() -> dict[str, str]:
        status, body = await sim.client.get(f"{secrets}/{webhook_flags.secret}")
        assert status == 200, body
        return certificates.decoded(body) or {}

    replaced = await eventually(
        secret_data,
        until=lambda data: certificates.serving_fingerprint(data) is not None,
        timeout=60,
        what="the leader to replace the encrypted key",
    )
    await eventually(lambda: ready(operator), what="the operator to serve the new certificate")
    assert wh.fingerprint(wh.served_certificate(port)) == certificates.serving_fingerprint(replaced)
    promised = await wait_promised(sim, node)
    await wh.wait_offered(operator, {(policies[-1], promised): 1})
    await create_memory_pod(sim, pods_ns, "after")  # admitted and mutated
    assert await healthy(operator) and operator.proc.poll() is None
    # It said why, on the Secret.
    status, body = await sim.client.get(
        f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/events",
        params={"fieldSelector": f"involvedObject.name={webhook_flags.secret}"},
    )
    assert status == 200, body
    said = [(e["type"], e["reason"], e["message"]) for e in body["items"]]
    assert any(
        kind == "Warning"
        and reason == "WebhookCertificateReplaced"
        and "tls.key is an encrypted private key" in message
        for kind, reason, message in said
    ), said
    # One replacement, by the operator, with the resourceVersion precondition (a merge patch).
    writes = [
        e
        for e in control_plane.audit_events()
        if e["user"]["username"] == h.OPERATOR_USER
        and e["objectRef"].get("resource") == "secrets"
        and e["objectRef"].get("name") == webhook_flags.secret
        and e["verb"] in ("create", "patch", "update")
        and moment(e) >= since
        and 200 <= e["responseStatus"]["code"] < 300
    ]
    assert [e["verb"] for e in writes][:1] == ["patch"], writes

"""A client of the memory-request webhook's server, for tests that serve it on 127.0.0.1: a
serving Secret, a free port, a TLS context that trusts anything, a review, a POST."""

from __future__ import annotations

import datetime
import http.client
import socket
import ssl
from typing import Any

import orjson
from cryptography.hazmat.primitives import serialization

from gpushare_operator.core import certificates
from gpushare_operator.core.slots import memoryrequests

NOW = datetime.datetime.now(datetime.UTC)


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
    annotations = {"blob": ""}
    pod: dict[str, Any] = {
        "metadata": {
            "name": "p",
            "labels": {memoryrequests.REQUEST_LABEL: "10Gi"},
            "annotations": annotations,
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
    annotations["blob"] = "x" * max(0, size - len(orjson.dumps(body)))
    return orjson.dumps(body)


def post(
    conn: http.client.HTTPSConnection, body: bytes, path: str = "/gpu-memory"
) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()

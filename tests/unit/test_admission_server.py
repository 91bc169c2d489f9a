"""The webhook's HTTPS server (app.admission): how large a review it takes, and what a Secret it
cannot use does to it; a real server on 127.0.0.1, no API server."""

from __future__ import annotations

import datetime
import io
import socket
from typing import Any

import aiohttp
import orjson
from cryptography.hazmat.primitives import serialization

from gpushare_operator.app.admission import MAX_REVIEW_BYTES, AdmissionServer, ServingTLS
from gpushare_operator.core import certificates

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


def review(size: int) -> bytes:
    """An AdmissionReview of a labelled pod whose JSON is ``size`` bytes or a little more."""
    pod = {"metadata": {"name": "p", "annotations": {"blob": ""}}, "spec": {"containers": []}}
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    body["request"] = {"uid": "u-1", "object": pod}
    pod["metadata"]["annotations"]["blob"] = "x" * max(0, size - len(orjson.dumps(body)))
    return orjson.dumps(body)


async def test_a_review_up_to_the_limit_is_answered_and_a_larger_one_refused() -> None:
    tls = ServingTLS()
    tls.secret_changed(secret())
    answered: list[int] = []

    async def fn(request: dict[str, Any], **_: Any) -> dict[str, Any]:
        answered.append(len(orjson.dumps(request)))
        return {"response": {"uid": request["request"]["uid"], "allowed": True}}

    port = free_port()
    serving = AdmissionServer(port=port, tls=tls)(fn)  # type: ignore[arg-type]
    await anext(serving)
    url = f"https://127.0.0.1:{port}/gpu-memory"
    try:
        async with aiohttp.ClientSession() as session:
            # Over aiohttp's default of 1 MiB, within ours: answered.
            big = review(MAX_REVIEW_BYTES - 4096)
            async with session.post(url, data=io.BytesIO(big), ssl=False) as response:
                assert response.status == 200, await response.text()
                assert (await response.json())["response"]["allowed"] is True
            too_big = io.BytesIO(review(MAX_REVIEW_BYTES + 1))
            async with session.post(url, data=too_big, ssl=False) as response:
                assert response.status == 413
                assert f"{MAX_REVIEW_BYTES}" in await response.text()
    finally:
        await serving.aclose()
    assert len(answered) == 1 and answered[0] > 1024 * 1024


def test_a_secret_it_cannot_read_leaves_the_server_as_it_was() -> None:
    """An encrypted key raised out of the Secret's watch (every replica's); now the replica
    keeps what it serves, and is not ready until it has a certificate."""
    tls = ServingTLS()
    tls.secret_changed(secret(encrypted=True))
    assert not tls.ready.is_set() and tls.fingerprint is None
    tls.secret_changed(secret())
    loaded = tls.fingerprint
    assert tls.ready.is_set() and loaded is not None
    tls.secret_changed(secret(encrypted=True))
    assert tls.fingerprint == loaded

"""/metrics is for those the API server says may read it; the probes stay open to the kubelet.

The operator runs as a child process with its default (secure) metrics server.  Callers are
ServiceAccounts with real tokens: one bound to the chart's metrics-reader ClusterRole reads the
metrics, one without it gets 403, no token or a made-up one gets 401.  The audit log shows
the operator's TokenReviews, so the cache is checked on the API server's own record.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from gpushare_testing import certs
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.scraping import (
    Scraper,
    ca_context,
    fetch,
    make_service_account,
)

pytestmark = pytest.mark.usefixtures("crds_installed")

SECURE = "--no-metrics-insecure"


def reviews_by(plane: ControlPlane, user: str) -> dict[str, int]:
    """TokenReviews and SubjectAccessReviews ``user`` created, by resource."""
    counts = {"tokenreviews": 0, "subjectaccessreviews": 0}
    for event in plane.audit_events():
        resource = (event.get("objectRef") or {}).get("resource")
        if resource in counts and event["user"]["username"] == user:
            counts[resource] += 1
    return counts


async def test_metrics_need_a_token_allowed_to_get_metrics(
    control_plane: ControlPlane,
    namespace: str,
    metrics_reader: Scraper,
    start_operator: OperatorFactory,
) -> None:
    operator = await start_operator("--device-plugin-namespace", namespace, SECURE)
    port = operator.metrics_port
    stranger = make_service_account(control_plane, namespace, "stranger")

    assert (await fetch(port, "/metrics"))[0] == 401
    assert (await fetch(port, "/metrics", token="not-a-token"))[0] == 401
    status, text = await fetch(port, "/metrics", token=stranger.token)
    assert status == 403, text
    assert f"system:serviceaccount:{namespace}:stranger" in text
    status, text = await fetch(port, "/metrics", token=metrics_reader.token)
    assert status == 200, text
    assert "gpushare_cache_objects" in text

    # Only over TLS: a plain-HTTP request to the metrics port gets no metrics.
    with pytest.raises(aiohttp.ClientError):
        await fetch(port, "/metrics", token=metrics_reader.token, scheme="http")
    # The probes stay plain HTTP without credentials, and /metrics is not among them.
    assert await fetch(operator.http_port, "/healthz", scheme="http") == (200, "ok\n")
    assert (await fetch(operator.http_port, "/metrics", scheme="http"))[0] == 404

    # Scrapes with a token answered a moment ago cost no API call.
    before = reviews_by(control_plane, operator.user)
    assert before["tokenreviews"] >= 3  # made-up, stranger, reader: each reviewed once
    assert before["subjectaccessreviews"] >= 2  # stranger, reader
    for _ in range(3):
        assert (await fetch(port, "/metrics", token=metrics_reader.token))[0] == 200
        assert (await fetch(port, "/metrics", token=stranger.token))[0] == 403
    assert reviews_by(control_plane, operator.user) == before


async def test_metrics_are_served_with_the_certificate_given(
    namespace: str,
    metrics_reader: Scraper,
    start_operator: OperatorFactory,
    tmp_path: Path,
) -> None:
    ca = certs.CertificateAuthority()
    pair = ca.serving(hosts=["127.0.0.1", "localhost"])
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    operator = await start_operator(
        "--device-plugin-namespace",
        namespace,
        SECURE,
        "--metrics-cert-file",
        str(cert),
        "--metrics-key-file",
        str(key),
    )
    # Verified against the CA that signed the files: the operator serves them, not its own.
    verified = ca_context(ca.cert_pem, tmp_path)
    status, text = await fetch(
        operator.metrics_port, "/metrics", token=metrics_reader.token, tls=verified
    )
    assert status == 200, text
    # And a CA that signed nothing of it is refused: verification is real.
    (tmp_path / "other").mkdir()
    other = ca_context(certs.CertificateAuthority().cert_pem, tmp_path / "other")
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await fetch(operator.metrics_port, "/metrics", token=metrics_reader.token, tls=other)

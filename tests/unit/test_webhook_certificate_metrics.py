"""The webhook certificate's gauges (metrics.WebhookCertificate over admission.ServingTLS): what
the alerts GpushareWebhookCertificateMissing and GpushareWebhookCertificateNearExpiry read."""

from __future__ import annotations

import datetime

from prometheus_client import CollectorRegistry

from gpushare_operator.app import metrics
from gpushare_operator.app.admission import ServingTLS
from gpushare_operator.core import certificates

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


def secret(validity: datetime.timedelta) -> dict[str, object]:
    made = certificates.plan(
        data=None, published=None, hosts=["127.0.0.1"], now=NOW, validity=validity
    )
    assert made.data is not None
    return {"data": certificates.encoded(dict(made.data))}


def test_no_certificate_reads_not_loaded_and_no_validity() -> None:
    tls = ServingTLS()
    registry = CollectorRegistry()
    registry.register(metrics.WebhookCertificate(lambda: tls.validity))
    assert registry.get_sample_value("gpushare_webhook_certificate_loaded") == 0
    assert (
        registry.get_sample_value("gpushare_webhook_certificate_expiry_timestamp_seconds") is None
    )
    assert (
        registry.get_sample_value("gpushare_webhook_certificate_not_before_timestamp_seconds")
        is None
    )


def test_a_loaded_certificate_reads_its_own_validity() -> None:
    tls = ServingTLS()
    registry = CollectorRegistry()
    registry.register(metrics.WebhookCertificate(lambda: tls.validity))
    tls.secret_changed(secret(3 * DAY))
    assert registry.get_sample_value("gpushare_webhook_certificate_loaded") == 1
    not_before = registry.get_sample_value(
        "gpushare_webhook_certificate_not_before_timestamp_seconds"
    )
    not_after = registry.get_sample_value("gpushare_webhook_certificate_expiry_timestamp_seconds")
    assert not_before is not None and not_after is not None
    # The certificate's own dates (whole seconds in X.509), not the moment it was loaded.
    assert abs(not_after - (NOW + 3 * DAY).timestamp()) <= 1
    assert not_before <= NOW.timestamp() + 1
    # A new one (a rotation) is read at the next scrape.
    tls.secret_changed(secret(5 * DAY))
    later = registry.get_sample_value("gpushare_webhook_certificate_expiry_timestamp_seconds")
    assert later is not None and abs(later - (NOW + 5 * DAY).timestamp()) <= 1

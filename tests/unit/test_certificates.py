"""The webhook's certificate plan (core.certificates): issue, publish, rotate, prune; no API."""

from __future__ import annotations

import datetime

from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_operator.core import certificates
from gpushare_operator.core.certificates import CertPlan

HOSTS = ["svc.ns.svc", "svc.ns.svc.cluster.local", "127.0.0.1"]
DAY = datetime.timedelta(days=1)
T0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)


def serving(data: dict[str, str]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[certificates.CERT_KEY].encode())


def bundle(text: str) -> list[x509.Certificate]:
    return certificates.load_bundle(text)


def issued_by(cert: x509.Certificate, cas: list[x509.Certificate]) -> bool:
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except Exception:
            continue
        return True
    return False


def step(
    data: dict[str, str] | None, published: str | None, now: datetime.datetime, days: int = 90
) -> CertPlan:
    return certificates.plan(
        data=data, published=published, hosts=HOSTS, now=now, validity=days * DAY
    )


def test_a_first_plan_issues_a_certificate_for_the_hosts_and_a_next_ca_in_the_bundle() -> None:
    plan = step(None, None, T0)
    assert plan.data is not None and plan.reason == "issued the webhook's serving certificate"
    cert = serving(plan.data)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == set(HOSTS[:2])
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    cas = bundle(plan.bundle)
    assert len(cas) == 2 and issued_by(cert, cas)
    next_ca = x509.load_pem_x509_certificate(plan.data[certificates.NEXT_CA_KEY].encode())
    assert next_ca in cas and not issued_by(cert, [next_ca])
    # Looked at again once the next CA may sign, then at the renewal time.
    assert plan.recheck_at == T0 + certificates.PUBLISH_SETTLE
    settled = step(plan.data, plan.bundle, plan.recheck_at)
    assert settled.data is None and settled.recheck_at == certificates.renew_at(cert)


def test_a_settled_plan_changes_nothing_until_the_renewal_time() -> None:
    first = step(None, None, T0)
    assert first.data is not None
    again = step(first.data, first.bundle, T0 + DAY)
    assert again.data is None and again.bundle == first.bundle


def test_at_renewal_the_published_next_ca_signs_and_a_new_next_ca_is_published() -> None:
    first = step(None, None, T0)
    assert first.data is not None
    old_next = x509.load_pem_x509_certificate(first.data[certificates.NEXT_CA_KEY].encode())
    rotated = step(first.data, first.bundle, T0 + 61 * DAY)  # past two thirds of 90 days
    assert (
        rotated.data is not None and rotated.reason == "rotated the webhook's serving certificate"
    )
    cert = serving(rotated.data)
    assert issued_by(cert, [old_next])
    assert cert != serving(first.data)
    assert len(bundle(rotated.bundle)) == 3  # the old issuer stays until it expires


def test_no_rotation_onto_a_ca_the_configuration_does_not_show_yet() -> None:
    first = step(None, None, T0)
    assert first.data is not None
    held = step(first.data, "", T0 + 61 * DAY)  # the configuration shows no bundle (yet)
    assert held.data is None
    assert held.bundle == first.bundle  # what must be published first


def test_an_expired_next_ca_is_replaced_and_published_before_it_signs() -> None:
    first = step(None, None, T0)
    assert first.data is not None
    # The operator was down past the next CA's life (180 days), the certificate expired too:
    # a fresh pair at once, since nothing valid is left to serve.
    late = step(first.data, first.bundle, T0 + 200 * DAY)
    assert late.data is not None and late.reason == "issued the webhook's serving certificate"
    assert serving(late.data).not_valid_after_utc > T0 + 200 * DAY


def test_changed_hosts_are_reissued_at_once() -> None:
    first = step(None, None, T0)
    assert first.data is not None
    moved = certificates.plan(
        data=first.data, published=first.bundle, hosts=["other.ns.svc"], now=T0, validity=90 * DAY
    )
    assert moved.data is not None and moved.data[certificates.CERT_KEY] != first.data["tls.crt"]


def test_a_broken_secret_is_replaced_whole() -> None:
    plan = step({"tls.crt": "garbage", "tls.key": "junk"}, None, T0)
    assert plan.data is not None and serving(plan.data).not_valid_after_utc > T0


@settings(max_examples=25)
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=5, max_size=25))
def test_every_certificate_served_was_issued_by_a_ca_published_before(gaps: list[int]) -> None:
    """Whatever the pace of the leader's looks (days apart), a rotated certificate is signed
    by a CA the configuration showed before, the bundle stays small, and nothing served is
    expired while the leader looks at least every 40 days (a 90-day certificate)."""
    now, data, published = T0, None, None
    history: list[str] = []  # every bundle published so far
    for gap in gaps:
        plan = step(data, published, now)
        if plan.data is not None:
            cert = serving(plan.data)
            if data is not None and plan.reason == "rotated the webhook's serving certificate":
                assert any(issued_by(cert, bundle(b)) for b in history)
            data = plan.data
            plan = step(data, published, now)  # the write's echo: the same plan, no write
            assert plan.data is None
        published = plan.bundle  # the leader publishes it
        history.append(published)
        assert len(bundle(published)) <= certificates.MAX_BUNDLE
        assert data is not None and serving(data).not_valid_after_utc > now
        assert issued_by(serving(data), bundle(published))
        now += gap * DAY

"""The webhook's certificate plan (core.certificates): issue, publish, rotate, prune; no API."""

from __future__ import annotations

import base64
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID
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
    assert late.data is not None
    assert late.reason.startswith("replaced the webhook's serving certificate: tls.crt expired")
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


# -- whatever the Secret holds -------------------------------------------------------------------
# Someone (a restore from backup, a hand edit, another tool) may put anything in the Secret.
# Nothing in it may make the plan raise: that crash-loops every leader in turn.


def _self_signed(key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "other")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(T0 - DAY)
        .not_valid_after(T0 + 90 * DAY)
    )
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key: object, password: bytes | None = None) -> str:
    encryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(  # type: ignore[attr-defined,no-any-return]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    ).decode()


def _good() -> dict[str, str]:
    plan = step(None, None, T0)
    assert plan.data is not None
    return plan.data


def _broken(form: str) -> tuple[dict[str, str], str]:
    """A settled Secret with one part made unreadable in ``form``; what the problem says."""
    data = _good()
    pair = certificates.read_pair(data["tls.crt"], data["tls.key"], names=("tls.crt", "tls.key"))
    assert isinstance(pair, certificates.Pair)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ed_key = ed25519.Ed25519PrivateKey.generate()
    der = pair.cert.public_bytes(serialization.Encoding.DER)
    changes = {
        "encrypted key": ({"tls.key": _key_pem(pair.key, b"secret")}, "tls.key is an encrypted"),
        "garbage key": ({"tls.key": "junk"}, "tls.key is not a readable PEM private key"),
        "garbage cert": ({"tls.crt": "junk"}, "tls.crt is not a readable PEM certificate"),
        "a key of another cert": (
            {"tls.key": _key_pem(ec.generate_private_key(ec.SECP256R1()))},
            "tls.key is not the key of tls.crt",
        ),
        "a cert that is not PEM": (
            {"tls.crt": base64.b64encode(der).decode()},
            "tls.crt is not a readable PEM certificate",
        ),
        "an RSA pair": (
            {"tls.crt": _self_signed(rsa_key), "tls.key": _key_pem(rsa_key)},
            "tls.key is an RSA key",
        ),
        "an Ed25519 pair": (
            {"tls.crt": _self_signed(ed_key), "tls.key": _key_pem(ed_key)},
            "tls.key is an Ed25519 key",
        ),
        "a truncated key": (
            {"tls.key": data["tls.key"][: len(data["tls.key"]) // 2]},
            "tls.key is not a readable PEM private key",
        ),
        "a truncated cert": (
            {"tls.crt": data["tls.crt"][: len(data["tls.crt"]) // 2]},
            "tls.crt is not a readable PEM certificate",
        ),
        "no key": ({"tls.key": ""}, "tls.key is missing"),
        "an encrypted next CA key": (
            {"next-ca.key": _key_pem(ec.generate_private_key(ec.SECP256R1()), b"pw")},
            "next-ca.key is an encrypted",
        ),
        # Readable, but the API server would refuse what it signs, or what it serves.
        "a next CA that is no CA": (
            {"next-ca.crt": data["tls.crt"], "next-ca.key": data["tls.key"]},
            "next-ca.crt is not a CA certificate",
        ),
        "a pair no CA of the bundle signed": (
            {"ca.crt": data["next-ca.crt"]},
            "tls.crt is not signed by a CA in ca.crt",
        ),
    }
    change, said = changes[form]
    return {**data, **change}, said


FORMS = [
    "encrypted key",
    "garbage key",
    "garbage cert",
    "a key of another cert",
    "a cert that is not PEM",
    "an RSA pair",
    "an Ed25519 pair",
    "a truncated key",
    "a truncated cert",
    "no key",
    "an encrypted next CA key",
    "a next CA that is no CA",
    "a pair no CA of the bundle signed",
]


@pytest.mark.parametrize("form", FORMS)
def test_an_unreadable_part_is_replaced_saying_why(form: str) -> None:
    data, said = _broken(form)
    if "tls." in said:
        assert certificates.serving_fingerprint(data) is None or "signed" in said
    plan = step(data, None, T0 + DAY)
    assert plan.data is not None
    assert said in plan.problem and said in plan.reason, (plan.problem, plan.reason)
    assert plan.reason.startswith("replaced the ")
    # What replaces it is a usable pair and a usable next CA, and it stays as it is.
    assert certificates.serving_fingerprint(plan.data) is not None
    assert isinstance(
        certificates.read_pair(
            plan.data["next-ca.crt"], plan.data["next-ca.key"], names=("next-ca.crt", "next-ca.key")
        ),
        certificates.Pair,
    )
    again = step(plan.data, plan.bundle, T0 + DAY)
    assert again.data is None and again.problem == ""


KEYS = ["tls.crt", "tls.key", "ca.crt", "next-ca.crt", "next-ca.key"]


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(KEYS),
    cut=st.integers(min_value=0, max_value=2000),
    flip=st.integers(min_value=0, max_value=2000),
    junk=st.text(max_size=40),
    how=st.sampled_from(["truncate", "flip", "replace", "append"]),
)
def test_no_content_of_the_secret_makes_the_plan_raise(
    key: str, cut: int, flip: int, junk: str, how: str
) -> None:
    data = _good()
    text = data[key]
    if how == "truncate":
        text = text[: cut % (len(text) + 1)]
    elif how == "flip":
        i = flip % len(text)
        text = text[:i] + chr((ord(text[i]) + 1) % 128) + text[i + 1 :]
    elif how == "replace":
        text = junk
    else:
        text = text + junk
    broken = {**data, key: text}
    certificates.serving_fingerprint(broken)
    plan = step(broken, None, T0 + DAY)
    result = plan.data if plan.data is not None else broken
    assert certificates.serving_fingerprint(result) is not None


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

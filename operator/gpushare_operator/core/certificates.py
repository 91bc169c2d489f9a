"""The memory-request webhook's serving certificate and the CA bundle that trusts it: pure.

Every replica serves the webhook with the pair kept in one Secret; the leader issues it and
keeps the MutatingWebhookConfiguration's ``caBundle`` current.  A certificate can never be
served before the API server trusts its issuer: each CA signs one serving certificate only,
and is published in the bundle one whole rotation *before* it signs (the Secret keeps it as
``next-ca.crt``).  At a rotation the new certificate is issued by that CA, which the API server
has trusted for months (seconds, in tests), and a fresh next CA is added to the bundle.  CAs
leave the bundle when they expire; a CA outlives the certificate it signs.

``plan`` is a pure function of the Secret's data, the bundle the configuration shows, the
wanted host names and the clock: any leader, at any moment, decides the same.  Only the keys it
generates differ, which is why the Secret is written with a resourceVersion precondition.

Whatever the Secret holds, reading it never raises: a key or certificate that cannot be used
(encrypted, not PEM, truncated, of another key type, not matching its certificate) is reported
with the reason and replaced like a missing one.  A crash here would not fix it: every replica
would restart into the same Secret, and the webhook would refuse labelled pods everywhere.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_KEY: Final = "tls.crt"
KEY_KEY: Final = "tls.key"
BUNDLE_KEY: Final = "ca.crt"
NEXT_CA_KEY: Final = "next-ca.crt"
NEXT_CA_PRIVATE_KEY: Final = "next-ca.key"
# A serving certificate is replaced once this share of its life has passed.
RENEW_AT: Final = 2 / 3
# A CA lives this many times the serving validity: published a rotation ahead, then signing.
CA_LIFETIMES: Final = 2
MAX_BUNDLE: Final = 5  # never more than this many CAs, newest kept
# A next CA signs only once the bundle holding it has been out this long (normally it has
# been out for a whole rotation; this covers one that had to be published late).
PUBLISH_SETTLE: Final = datetime.timedelta(seconds=5)
RECHECK_SOON: Final = datetime.timedelta(seconds=5)
_SLACK: Final = datetime.timedelta(minutes=1)  # notBefore is set this far back


@dataclass(frozen=True, slots=True)
class Pair:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def key_pem(self) -> str:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()


@dataclass(frozen=True, slots=True)
class CertPlan:
    """What the Secret and the webhook configuration should say now."""

    data: dict[str, str] | None  # the Secret's whole data as it should be; None: as it is
    bundle: str  # the CA bundle (PEM) that the configuration's caBundle must carry
    reason: str  # why the data changes (empty when it does not), for the log and an Event
    recheck_at: datetime.datetime  # when time alone changes the plan: look again then
    # What the Secret held that could not be used, and is replaced (empty: nothing): a Warning
    # Event, since someone or something other than the leader put it there.
    problem: str = ""


def plan(
    *,
    data: Mapping[str, str] | None,
    published: str | None,
    hosts: Sequence[str],
    now: datetime.datetime,
    validity: datetime.timedelta,
) -> CertPlan:
    """``data``: the Secret's data (decoded); ``published``: the configuration's caBundle."""
    data = data or {}
    read = read_pair(data.get(CERT_KEY), data.get(KEY_KEY), names=(CERT_KEY, KEY_KEY))
    read_next = read_pair(
        data.get(NEXT_CA_KEY),
        data.get(NEXT_CA_PRIVATE_KEY),
        names=(NEXT_CA_KEY, NEXT_CA_PRIVATE_KEY),
    )
    if isinstance(read_next, Pair) and not _is_ca(read_next.cert):
        read_next = f"{NEXT_CA_KEY} is not a CA certificate"
    next_ca = read_next if isinstance(read_next, Pair) else None
    bundle = load_bundle(data.get(BUNDLE_KEY, ""))
    trusted = {_fingerprint(c) for c in load_bundle(published or "")}
    unusable = _unusable(read, hosts=hosts, now=now, bundle=bundle)
    problems = [p for p in (unusable, read_next) if isinstance(p, str) and p]
    reason = ""
    if isinstance(read, Pair) and unusable is None:
        serving = read
        if now >= renew_at(serving.cert):
            if next_ca is not None and _can_sign(next_ca, now, validity):
                if _fingerprint(next_ca.cert) in trusted and now >= _settled(next_ca):
                    serving = issue(next_ca, hosts=hosts, now=now, validity=validity)
                    next_ca, reason = None, "rotated the webhook's serving certificate"
            else:
                next_ca = None  # expired unused (the operator was down): a new one, published first
    else:
        # Nothing to serve (first start, or a broken, expired or misnamed pair): at once, with
        # a CA of its own; the API server trusts it once the configuration shows the bundle.
        signer = next_ca if next_ca is not None and _can_sign(next_ca, now, validity) else None
        signer = signer or new_ca(now, validity)
        serving = issue(signer, hosts=hosts, now=now, validity=validity)
        bundle.append(signer.cert)
        next_ca = None
        reason = "issued the webhook's serving certificate"
        if unusable:
            reason = f"replaced the webhook's serving certificate: {unusable}"
    if next_ca is None or not _can_sign(next_ca, renew_at(serving.cert), validity):
        next_ca = new_ca(now, validity)
        if isinstance(read_next, str):
            reason = reason or f"replaced the next serving certificate's CA: {read_next}"
        reason = reason or "published the CA of the next serving certificate"
    bundle = _pruned([*bundle, next_ca.cert], now)
    wanted = {
        CERT_KEY: serving.cert_pem(),
        KEY_KEY: serving.key_pem(),
        BUNDLE_KEY: dump_bundle(bundle),
        NEXT_CA_KEY: next_ca.cert_pem(),
        NEXT_CA_PRIVATE_KEY: next_ca.key_pem(),
    }
    changed = wanted != dict(data)
    moments = [
        renew_at(serving.cert),
        _settled(next_ca),
        *(c.not_valid_after_utc for c in bundle),
    ]
    later = [m for m in moments if m > now]
    recheck = min(later) if later else now + RECHECK_SOON
    problem = "; ".join(problems) if changed else ""
    return CertPlan(wanted if changed else None, wanted[BUNDLE_KEY], reason, recheck, problem)


def _unusable(
    read: Pair | str | None,
    *,
    hosts: Sequence[str],
    now: datetime.datetime,
    bundle: Sequence[x509.Certificate],
) -> str | None:
    """Why the Secret's serving pair cannot be served ("" when there is none), or None when it
    can.  One whose issuer is not in the Secret's bundle would be served until its renewal
    while the API server, given that bundle, refuses to talk to it."""
    if read is None:
        return ""
    if isinstance(read, str):
        return read
    if now >= read.cert.not_valid_after_utc:
        return f"{CERT_KEY} expired at {read.cert.not_valid_after_utc.isoformat()}"
    named = _hosts(read.cert)
    if named != _wanted(hosts):
        return f"{CERT_KEY} names {', '.join(sorted(named)) or 'no host'}, not {', '.join(hosts)}"
    if not any(_issued_by(read.cert, ca) for ca in bundle):
        return f"{CERT_KEY} is not signed by a CA in {BUNDLE_KEY}"
    return None


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:  # a wrong issuer, a bad signature, an algorithm it cannot check: not
        return False
    return _is_ca(ca)


def _is_ca(cert: x509.Certificate) -> bool:
    """Whether ``cert`` may sign certificates, as a TLS client checks it: a CA by its basic
    constraints (and by its key usage, when it has one)."""
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except Exception:
        return False
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return constraints.ca
    except Exception:
        return False
    return constraints.ca and usage.key_cert_sign


def _settled(ca: Pair) -> datetime.datetime:
    """When a CA published at its creation may sign: the configuration's watchers (the API
    servers among them) have had ``PUBLISH_SETTLE`` to see the bundle that holds it.  Read
    from the CA itself (its notBefore is its creation less the builder's slack)."""
    return ca.cert.not_valid_before_utc + _SLACK + PUBLISH_SETTLE


def renew_at(cert: x509.Certificate) -> datetime.datetime:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * RENEW_AT


def _can_sign(ca: Pair | None, at: datetime.datetime, validity: datetime.timedelta) -> bool:
    """Whether ``ca`` outlives a certificate it would sign at ``at``."""
    return ca is not None and ca.cert.not_valid_after_utc >= at + validity


def new_ca(now: datetime.datetime, validity: datetime.timedelta) -> Pair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpushare-operator webhook CA")])
    cert = (
        _builder(name, name, key.public_key(), now, validity * CA_LIFETIMES)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Pair(cert, key)


def issue(
    ca: Pair, *, hosts: Sequence[str], now: datetime.datetime, validity: datetime.timedelta
) -> Pair:
    """A serving certificate for ``hosts`` (DNS names and IP addresses), signed by ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "webhook")])
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    issuer_key = ca.key.public_key()
    cert = (
        _builder(subject, ca.cert.subject, key.public_key(), now, validity)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Pair(cert, key)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
    validity: datetime.timedelta,
) -> x509.CertificateBuilder:
    # A minute of slack back: a replica whose clock is a little behind still accepts it.
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _SLACK)
        .not_valid_after(now + validity)
    )


def _pair(cert_pem: str | None, key_pem: str | None) -> Pair | None:
    """The pair, or None when either is missing or it cannot be used."""
    read = read_pair(cert_pem, key_pem, names=(CERT_KEY, KEY_KEY))
    return read if isinstance(read, Pair) else None


def read_pair(
    cert_pem: str | None, key_pem: str | None, *, names: tuple[str, str]
) -> Pair | str | None:
    """The pair; None when both are missing; otherwise why it cannot be used (``names``: the
    Secret's keys they came from, for the message).  Never raises.

    cryptography says "cannot read" in several ways: ValueError (not PEM, truncated, bad
    structure), TypeError (an encrypted key given no password), UnsupportedAlgorithm (a key
    or curve it does not know), and errors of the parts it parses only when asked (the public
    key, the extensions, which are read here at once for that reason).  All of them mean the
    same thing here: the pair is replaced."""
    cert_name, key_name = names
    if not cert_pem and not key_pem:
        return None
    if not cert_pem or not key_pem:
        return f"{cert_name if not cert_pem else key_name} is missing"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        public = cert.public_key().public_bytes(*_SPKI)
        _ = cert.extensions
    except Exception:  # any failure to read is the same: see above
        return f"{cert_name} is not a readable PEM certificate"
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except TypeError:
        return f"{key_name} is an encrypted private key (gpushare has no password for it)"
    except Exception:
        return f"{key_name} is not a readable PEM private key"
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return f"{key_name} is {_kind(key)} key, not an EC key as gpushare issues"
    try:
        matches = key.public_key().public_bytes(*_SPKI) == public
    except Exception:
        matches = False
    if not matches:
        return f"{key_name} is not the key of {cert_name}"
    return Pair(cert, key)


def _kind(key: object) -> str:
    kinds = (
        (rsa.RSAPrivateKey, "an RSA"),
        (ed25519.Ed25519PrivateKey, "an Ed25519"),
        (ed448.Ed448PrivateKey, "an Ed448"),
    )
    found = next((name for kind, name in kinds if isinstance(key, kind)), None)
    if found is not None:
        return found
    # cryptography 51 deprecates DSA: naming ``dsa.DSAPrivateKey`` warns (an error under the
    # tests' filterwarnings), so a DSA key is told by its class's name.
    return "a DSA" if type(key).__name__ == "DSAPrivateKey" else "another kind of"


_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _hosts(cert: x509.Certificate) -> frozenset[str]:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    dns = names.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    return frozenset([*dns, *ips])


def _wanted(hosts: Collection[str]) -> frozenset[str]:
    normal = []
    for host in hosts:
        try:
            normal.append(str(ipaddress.ip_address(host)))
        except ValueError:
            normal.append(host)
    return frozenset(normal)


def load_bundle(pem: str) -> list[x509.Certificate]:
    """The certificates of a PEM bundle; a part that does not parse is dropped."""
    certs = []
    for block in pem.split("-----END CERTIFICATE-----"):
        start = block.find("-----BEGIN CERTIFICATE-----")
        if start < 0:
            continue
        try:
            text = block[start:] + "-----END CERTIFICATE-----\n"
            certs.append(x509.load_pem_x509_certificate(text.encode()))
        except Exception:  # whatever cryptography raises, the part is unreadable: dropped
            continue
    return certs


def dump_bundle(certs: Sequence[x509.Certificate]) -> str:
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)


def _fingerprint(cert: x509.Certificate) -> bytes:
    return cert.fingerprint(hashes.SHA256())


def _pruned(certs: Sequence[x509.Certificate], now: datetime.datetime) -> list[x509.Certificate]:
    """Unexpired, each once, oldest first, at most MAX_BUNDLE (the newest)."""
    unique = {_fingerprint(c): c for c in certs if c.not_valid_after_utc > now}
    ordered = sorted(unique.values(), key=lambda c: c.not_valid_before_utc)
    return ordered[-MAX_BUNDLE:]


def serving_fingerprint(data: Mapping[str, str] | None) -> str | None:
    """The SHA-256 of the serving certificate in the Secret's data (hex), for logs and tests."""
    pair = _pair((data or {}).get(CERT_KEY), (data or {}).get(KEY_KEY))
    return None if pair is None else _fingerprint(pair.cert).hex()


def decoded(secret: Mapping[str, object] | None) -> dict[str, str] | None:
    """A Secret's ``data`` decoded from base64; None for no Secret."""
    if secret is None:
        return None
    raw = secret.get("data")
    if not isinstance(raw, Mapping):
        return {}
    out = {}
    for key, value in raw.items():
        try:
            out[str(key)] = base64.b64decode(str(value)).decode()
        except (ValueError, UnicodeDecodeError):
            continue
    return out


def encoded(data: Mapping[str, str]) -> dict[str, str]:
    return {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}

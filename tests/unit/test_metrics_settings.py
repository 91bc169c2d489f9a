"""The /metrics flags: secure by default, each settable from GPUSHARE_<FLAG>, checked together."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from gpushare_operator.app import servingcerts
from gpushare_operator.app.settings import parse_settings


def test_metrics_are_https_on_their_own_port_by_default() -> None:
    settings = parse_settings([], env={})
    assert (settings.http_port, settings.metrics_port) == (8080, 8443)
    assert settings.metrics_insecure is False
    assert (settings.metrics_cert_file, settings.metrics_key_file) == ("", "")


@pytest.mark.parametrize(
    ("env", "argv", "insecure"),
    [
        ({"GPUSHARE_METRICS_INSECURE": "true"}, [], True),
        ({"GPUSHARE_METRICS_INSECURE": "1"}, [], True),
        ({"GPUSHARE_METRICS_INSECURE": "false"}, [], False),
        ({}, ["--metrics-insecure"], True),
        ({"GPUSHARE_METRICS_INSECURE": "true"}, ["--no-metrics-insecure"], False),
    ],
)
def test_insecure_comes_from_env_and_a_flag_wins(
    env: dict[str, str], argv: list[str], insecure: bool
) -> None:
    assert parse_settings(argv, env=env).metrics_insecure is insecure


def test_metrics_flags_read_their_environment_variables() -> None:
    env = {
        "GPUSHARE_METRICS_PORT": "9444",
        "GPUSHARE_METRICS_CERT_FILE": "/tls/tls.crt",
        "GPUSHARE_METRICS_KEY_FILE": "/tls/tls.key",
    }
    settings = parse_settings([], env=env)
    assert settings.metrics_port == 9444
    assert (settings.metrics_cert_file, settings.metrics_key_file) == (
        "/tls/tls.crt",
        "/tls/tls.key",
    )


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--metrics-port", "8080"], "must differ"),
        (["--metrics-cert-file", "/tls/tls.crt"], "both"),
        (["--metrics-key-file", "/tls/tls.key"], "both"),
    ],
)
def test_inconsistent_metrics_flags_are_refused(argv: list[str], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_settings(argv, env={})


def test_a_bad_boolean_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_settings([], env={"GPUSHARE_METRICS_INSECURE": "maybe"})


def test_self_signed_certificate_names_the_hosts_and_loads(tmp_path: Path) -> None:
    cert_pem, key_pem = servingcerts.self_signed(hosts=["localhost", "127.0.0.1", "localhost"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == cert.subject
    # Without files, a context with a fresh self-signed pair; with files, those.
    assert isinstance(servingcerts.server_context(), ssl.SSLContext)
    (tmp_path / "c.pem").write_bytes(cert_pem)
    (tmp_path / "k.pem").write_bytes(key_pem)
    context = servingcerts.server_context(
        cert_file=str(tmp_path / "c.pem"), key_file=str(tmp_path / "k.pem")
    )
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2

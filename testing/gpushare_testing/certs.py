"""Certificates for the local control plane: one CA, serving certs, client certs.

Made per control plane with ``trustme`` (so nothing secret is committed), and so that a test
can mint a client certificate for any user and group (RBAC tests need identities that are not
``system:masters``): the API server maps a client certificate's CN to the user name and its O
to a group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


class CertificateAuthority:
    """A throwaway CA that signs the serving certs (apiserver, scheduler) and every client cert."""

    def __init__(self) -> None:
        self._ca = trustme.CA(organization_name="gpushare-test-ca")

    @property
    def cert_pem(self) -> bytes:
        return self._ca.cert_pem.bytes()

    def serving(self, *, hosts: list[str], name: str = "kube-apiserver") -> KeyPair:
        return self._pair(self._ca.issue_cert(*hosts, common_name=name))

    def client(self, *, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client cert for ``user`` in at most one group (trustme writes one O)."""
        if len(groups) > 1:
            raise ValueError(f"one group per client certificate, not {groups}")
        # trustme wants a subject alternative name; an address no one resolves will do.
        alias = re.sub(r"[^a-z0-9.-]", "-", user.lower()) + "@clients.gpushare.test"
        # Without a group trustme names its own organization: a group no binding grants.
        organization = groups[0] if groups else None
        return self._pair(
            self._ca.issue_cert(alias, common_name=user, organization_name=organization)
        )

    @staticmethod
    def _pair(leaf: trustme.LeafCert) -> KeyPair:
        return KeyPair(leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes())


def write_service_account_key(directory: Path) -> tuple[Path, Path]:
    """The key pair the apiserver signs and verifies ServiceAccount tokens with (RS256)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = directory / "sa.key"
    public = directory / "sa.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public

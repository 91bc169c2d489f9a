"""Kubeconfig files for the local control plane's identities."""

from __future__ import annotations

import json
from pathlib import Path


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_path: Path,
    user: str,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token: str | None = None,
) -> Path:
    """Write a one-context kubeconfig (JSON is valid YAML, and every client reads it)."""
    credentials: dict[str, str] = {}
    if client_cert is not None and client_key is not None:
        credentials = {
            "client-certificate": str(client_cert),
            "client-key": str(client_key),
        }
    if token is not None:
        credentials["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpushare-local",
                "cluster": {"server": server, "certificate-authority": str(ca_path)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {"name": "gpushare-local", "context": {"cluster": "gpushare-local", "user": user}}
        ],
        "current-context": "gpushare-local",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path

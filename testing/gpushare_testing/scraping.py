"""Reading a running operator's /metrics as Prometheus does: HTTPS with a ServiceAccount token.

The ``metrics_reader`` fixture is a ServiceAccount bound to the chart's own ``metrics-reader``
ClusterRole (rendered by the real ``helm``), so the tests prove the role the chart ships is
the one that grants access.
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.paths import CHART

RBAC = "/apis/rbac.authorization.k8s.io/v1"


@dataclass(frozen=True)
class Scraper:
    """A ServiceAccount and a fresh token for it."""

    namespace: str
    name: str
    token: str


async def fetch(
    port: int,
    path: str,
    *,
    token: str | None = None,
    tls: ssl.SSLContext | bool = False,
    scheme: str = "https",
) -> tuple[int, str]:
    """GET ``path``; ``tls=False`` skips verification (the operator's self-signed cert)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{scheme}://127.0.0.1:{port}{path}"
    timeout = aiohttp.ClientTimeout(total=15)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, headers=headers, ssl=tls if scheme == "https" else True) as response,
    ):
        return response.status, await response.text()


def chart_metrics_reader_role(plane: ControlPlane, release: str) -> dict[str, object]:
    """The chart's metrics-reader ClusterRole, rendered with the real helm for ``release``."""
    rendered = subprocess.run(
        [str(plane.bin_dir / "helm"), "template", release, str(CHART), "--namespace", "default"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    [role] = [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "ClusterRole" and doc["metadata"]["name"].endswith("-reader")
    ]
    return dict(role)


def make_service_account(plane: ControlPlane, namespace: str, name: str) -> Scraper:
    body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    status, raw = plane.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body=body
    )
    assert status == 201, raw
    return Scraper(namespace, name, plane.service_account_token(namespace=namespace, name=name))


def bind_metrics_reader(plane: ControlPlane, namespace: str, release: str) -> tuple[Scraper, str]:
    """A ServiceAccount ``prometheus`` in ``namespace``, bound to the chart's metrics-reader
    ClusterRole as rendered for ``release``; and that role's name, for
    ``unbind_metrics_reader`` to take both away."""
    role = chart_metrics_reader_role(plane, release)
    role_name = str(role["metadata"]["name"])  # type: ignore[index]
    scraper = make_service_account(plane, namespace, "prometheus")
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": role_name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role_name,
        },
        "subjects": [{"kind": "ServiceAccount", "name": scraper.name, "namespace": namespace}],
    }
    for kind, body in (("clusterroles", role), ("clusterrolebindings", binding)):
        status, raw = plane.request("POST", f"{RBAC}/{kind}", body=body)
        assert status == 201, raw
    return scraper, role_name


def unbind_metrics_reader(plane: ControlPlane, role_name: str) -> None:
    for kind in ("clusterrolebindings", "clusterroles"):
        plane.request("DELETE", f"{RBAC}/{kind}/{role_name}")


def ca_context(ca_pem: bytes, directory: Path) -> ssl.SSLContext:
    path = directory / "metrics-ca.crt"
    path.write_bytes(ca_pem)
    return ssl.create_default_context(cafile=str(path))

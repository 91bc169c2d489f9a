"""The operator's container image, run for real: ``make image-test`` (not part of ``make test``,
which does not build the image; ``.ci/run`` runs both).

The image ``make image`` built (``$GPUSHARE_IMAGE``) runs under ``buildah run`` on the host
network, as its own non-root user, with nothing but its entrypoint, a kubeconfig holding the
chart's ServiceAccount token, and the chart's environment.  Against the local control plane and
the GPU node simulator it must start, take the Lease, configure a simulated node to Verified,
serve /metrics over HTTPS to the scraper the chart binds and to no one else, and stop cleanly
on SIGTERM.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import webhooks
from gpushare_testing.apiobjects import create_namespace
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.helm import Helm
from gpushare_testing.paths import CHART
from gpushare_testing.scraping import fetch
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

IMAGE = os.environ.get("GPUSHARE_IMAGE", "localhost/gpushare-operator:0.1.0")
BUILDAH = ["buildah", "--storage-driver", "vfs"]
IDENTITY = "image-operator"


def buildah(*args: str) -> str:
    result = subprocess.run([*BUILDAH, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"buildah {' '.join(args)}: {result.stderr}"
    return result.stdout.strip()


@pytest.fixture
def container() -> Iterator[str]:
    """A working container from the image (`make image` must have built it)."""
    found = subprocess.run([*BUILDAH, "inspect", "--type", "image", IMAGE], capture_output=True)
    if found.returncode != 0:
        pytest.fail(f"no image {IMAGE}: run `make image` first")
    name = buildah(
        "from", "--pull-never", "--name", f"gpushare-smoke-{uuid.uuid4().hex[:6]}", IMAGE
    )
    try:
        yield name
    finally:
        buildah("rm", name)


def descendant(root: int, marker: bytes) -> int | None:
    """The deepest process under ``root`` whose command line contains ``marker``: the container's
    own process, not the buildah helpers above it that carry the same command line."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found: list[tuple[int, int]] = []  # (depth under root, pid)
    for pid in parents:
        ancestor, depth = pid, 0
        while ancestor in parents and ancestor != root:
            ancestor, depth = parents[ancestor], depth + 1
        if ancestor == root and pid != root:
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append((depth, pid))
            except OSError:
                continue
    return max(found)[1] if found else None


def token_kubeconfig(plane: ControlPlane, token: str, path: Path) -> Path:
    """Self-contained (CA inline), readable by the image's non-root user."""
    cluster = {
        "server": plane.server,
        "certificate-authority-data": base64.b64encode(plane.ca_path.read_bytes()).decode(),
    }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "operator"}}],
        "current-context": "local",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o644)
    return path


async def test_the_image_runs_the_operator(
    control_plane: ControlPlane,
    helm: Helm,
    namespaces: list[str],
    policies: list[str],
    container: str,
    tmp_path: Path,
) -> None:
    release_ns = create_namespace(control_plane, namespaces, "img")
    plugin_ns = create_namespace(control_plane, namespaces, "gpu-operator")
    release = h.unique("img")
    account = f"{release}-gpushare-operator"
    scraper = "prometheus"
    status, raw = control_plane.request(
        "POST",
        f"/api/v1/namespaces/{release_ns}/serviceaccounts",
        body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": scraper}},
    )
    assert status == 201, raw
    subject = {"kind": "ServiceAccount", "name": scraper, "namespace": release_ns}
    reader = ",".join(f"rbac.metricsReaderSubjects[0].{k}={v}" for k, v in subject.items())
    helm.run(
        "install",
        release,
        str(CHART),
        "-n",
        release_ns,
        "--set",
        f"devicePlugin.namespace={plugin_ns},{reader}",
    )
    token = control_plane.service_account_token(namespace=release_ns, name=account)
    kubeconfig = token_kubeconfig(control_plane, token, tmp_path / "kubeconfig")
    http_port, metrics_port, webhook_port = free_port(), free_port(), free_port()
    configuration = account  # the chart names its webhook objects after the release
    env = {
        "KUBECONFIG": "/etc/gpushare/kubeconfig",
        "GPUSHARE_NAMESPACE": release_ns,
        "GPUSHARE_IDENTITY": IDENTITY,
        "GPUSHARE_DEVICE_PLUGIN_NAMESPACE": plugin_ns,
        "GPUSHARE_HTTP_PORT": str(http_port),
        "GPUSHARE_METRICS_PORT": str(metrics_port),
        "GPUSHARE_CONFIG_PROPAGATION_DELAY": "1",
        # The chart's webhook names (its RBAC names them), and 127.0.0.1: no Service here.
        "GPUSHARE_WEBHOOK_PORT": str(webhook_port),
        "GPUSHARE_WEBHOOK_SECRET": f"{account}-webhook-tls",
        "GPUSHARE_WEBHOOK_CONFIGURATION": configuration,
        "GPUSHARE_WEBHOOK_SERVICE": f"{account}-webhook",
        "GPUSHARE_WEBHOOK_HOSTS": "127.0.0.1",
    }
    config = json.loads(buildah("inspect", "--type", "image", IMAGE))["OCIv1"]["config"]
    assert config["User"] == "65532:65532"
    command = [
        *BUILDAH,
        "run",
        "--isolation",
        "chroot",
        "--network",
        "host",
        "--volume",
        f"{kubeconfig}:/etc/gpushare/kubeconfig:ro",
        *(arg for key, value in env.items() for arg in ("--env", f"{key}={value}")),
        container,
        "--",
        *config["Entrypoint"],
    ]
    log = tmp_path / "image.log"
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_ns
    ) as sim:
        pool = h.unique("pool")
        [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=4)
        policy = h.unique("p")
        await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=4))
        started = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once; we never wait here
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:

            async def node_state() -> dict[str, Any] | None:
                if proc.poll() is not None:
                    raise AssertionError(f"the image exited {proc.returncode}:\n{log.read_text()}")
                return await h.node_state(sim.client, node)

            await eventually(
                node_state,
                until=lambda s: (s or {}).get("status", {}).get("phase") == "Verified",
                timeout=120,
                interval=0.5,
                what=f"{node} Verified by the image's operator",
            )
            print(f"image: node Verified {time.monotonic() - started:.1f} s after start")
            lease = await h.ok(
                sim.client,
                "GET",
                f"/apis/coordination.k8s.io/v1/namespaces/{release_ns}/leases/gpushare-operator",
            )
            assert lease["spec"]["holderIdentity"] == IDENTITY
            labels = (await h.node(sim.client, node))["metadata"]["labels"]
            assert labels[h.POLICY_LABEL] == policy
            lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
            assert any(line.get("event") == "caches synced" for line in lines), log.read_text()

            reader_token = control_plane.service_account_token(namespace=release_ns, name=scraper)
            status, text = await fetch(metrics_port, "/metrics", token=reader_token)
            assert status == 200, text
            assert "gpushare_leader 1.0" in text
            assert (await fetch(metrics_port, "/metrics"))[0] == 401
            assert (await fetch(metrics_port, "/metrics", token=token))[0] == 403
            assert await fetch(http_port, "/readyz", scheme="http") == (200, "ok\n")
            # The image serves the memory-request webhook with the certificate it made: called
            # on 127.0.0.1 (the chart's configuration calls a Service; no kube-proxy here), it
            # answers a request no time-sliced node can enforce with its refusal.
            await webhooks.wait_published(sim, configuration)
            await webhooks.point_at(sim, configuration, port=webhook_port)

            async def ask() -> tuple[int, Any]:
                return await sim.client.post(
                    f"/api/v1/namespaces/{plugin_ns}/pods",
                    webhooks.memory_pod("asks", memory="1Gi"),
                )

            # (500 "failed calling webhook" until the API server has seen the new URL)
            status, body = await eventually(ask, until=lambda answer: answer[0] != 500)
            assert status == 403, body
            assert "no node gpushare governs offers a slot that enforces" in body["message"]
        finally:
            # SIGTERM to the operator itself, as the kubelet sends it to the container's main
            # process: buildah run, signalled, would kill its child without a graceful stop.
            operator_pid = descendant(proc.pid, b"gpushare_operator")
            if operator_pid is not None:
                os.kill(operator_pid, signal.SIGTERM)
            elif proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            print(f"--- image log ---\n{log.read_text()[-20000:]}")
            helm.run("uninstall", release, "-n", release_ns, "--wait", "--timeout", "60s")
    assert code == 0, log.read_text()
    assert "stopped cleanly" in log.read_text()

"""A real etcd + kube-apiserver (+ kube-controller-manager) on loopback, for tests and ``make run``.

In the spirit of ``kopf.testing``: the thing under test talks to a real API server, with real
admission, RBAC, server-side apply, watches and audit, not to a mock.  Binaries come from
``make controlplane`` (built from the Go module proxy).

Every child is started with ``PR_SET_PDEATHSIG`` so that it dies with the process that
started it, even when that process is SIGKILLed; ``stop()`` additionally terminates and
reaps them in reverse order on normal teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare_operator.testing import certs
from gpushare_operator.testing.kubeconfigs import write_kubeconfig

logger = logging.getLogger(__name__)

ADMIN_USER = "gpushare-admin"

# Writes are logged with who made them; reads are not (a watch-heavy test would drown the log).
_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {
            "level": "None",
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
            "users": ["system:kube-controller-manager", "system:apiserver"],
        },
        # With their bodies: what a label, taint or phase was at each moment (rollout tests).
        {
            "level": "Request",
            "resources": [
                {"group": "", "resources": ["nodes"]},
                {"group": "gpushare.dev", "resources": ["gpunodestates/status"]},
                {"group": "gpushare.dev", "resources": ["gpusharingpolicies"]},
            ],
        },
        {"level": "Metadata"},
    ],
}


def default_bin_dir() -> Path:
    """Where ``make controlplane`` puts the binaries (overridable for CI caches)."""
    env = os.environ.get("GPUSHARE_CONTROLPLANE_BIN")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[3]
    versions = (root / "tests/controlplane/versions.mk").read_text()
    pins = dict(
        line.split(" := ", 1)
        for line in versions.splitlines()
        if " := " in line and "$" not in line
    )
    return (
        root
        / ".cache/controlplane"
        / f"{pins['KUBERNETES_VERSION']}-etcd{pins['ETCD_VERSION']}"
        / "bin"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the parent thread exits."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclass
class ControlPlane:
    """etcd, kube-apiserver with RBAC and audit, and the controller manager's GC/namespace loops."""

    bin_dir: Path = field(default_factory=default_bin_dir)
    workdir: Path | None = None
    extra_apiserver_args: tuple[str, ...] = ()
    audit_policy: Mapping[str, Any] = field(default_factory=lambda: _AUDIT_POLICY)
    etcd_port: int = 0
    apiserver_port: int = 0
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _owns_workdir: bool = False
    _ca: certs.CertificateAuthority | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="gpushare-cp-"))
            self._owns_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
            if not (self.bin_dir / name).exists():
                raise FileNotFoundError(f"{self.bin_dir / name} missing: run `make controlplane`")
        self.etcd_port = self.etcd_port or free_port()
        self.apiserver_port = self.apiserver_port or free_port()
        self._write_pki()
        try:
            self._start_etcd()
            self._start_apiserver()
            self._wait_ready(deadline=time.monotonic() + 90)
            self._start_controller_manager()
        except BaseException:
            self.stop()
            raise
        logger.info(
            "control plane ready in %.1f s: %s (workdir %s)",
            time.monotonic() - started,
            self.server,
            self.workdir,
        )

    def stop(self) -> None:
        for name, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    logger.warning("%s ignored SIGTERM; killing it", name)
                    proc.kill()
                    proc.wait()
        self._procs.clear()
        if self._owns_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self._procs}

    # -- chaos -------------------------------------------------------------------------------

    def restart_apiserver(self, *, down_for: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM, as kubelet would) and start it again; etcd stays up.

        It stays down ``down_for`` seconds in between (a crash loop, a reschedule).  Same port,
        certificates, flags and audit log (appended to), so clients reconnect with the
        kubeconfigs they already have.  Returns once ``/readyz`` answers 200 again.  Call it from
        the thread that started the plane: children die with the thread that spawned them.
        Open watches hold a graceful shutdown for up to a minute unless the plane was started
        with ``--shutdown-watch-termination-grace-period``; after 30 s it is killed.
        """
        [index] = [i for i, (name, _) in enumerate(self._procs) if name == "kube-apiserver"]
        _, proc = self._procs.pop(index)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            logger.warning("kube-apiserver ignored SIGTERM; killing it")
            proc.kill()
            proc.wait()
        time.sleep(down_for)
        self._start_apiserver()
        self._procs.insert(index, self._procs.pop())  # keep stop()'s reverse order
        self._wait_ready(deadline=time.monotonic() + 90)

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what the apiserver does every 5 min).

        Watches that resume from an older resourceVersion then get 410 Gone, unless the
        apiserver's watch cache still holds it.  Returns the revision compacted at.
        """

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.etcd_port}{path}",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                return dict(json.loads(resp.read()))

        # Any range answer carries the store's current revision in its header; "\0" finds nothing.
        revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        logger.info("etcd compacted at revision %d", revision)
        return revision

    # -- processes ---------------------------------------------------------------------------

    @property
    def _dir(self) -> Path:
        assert self.workdir is not None, "start() first"
        return self.workdir

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self._dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [str(self.bin_dir / name), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        log.close()
        self._procs.append((name, proc))

    def _write_pki(self) -> None:
        pki = self._dir / "pki"
        pki.mkdir(exist_ok=True)
        self._ca = certs.CertificateAuthority()
        (pki / "ca.crt").write_bytes(self._ca.cert_pem)
        serving = self._ca.serving(
            hosts=[
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
        )
        (pki / "apiserver.crt").write_bytes(serving.cert_pem)
        (pki / "apiserver.key").write_bytes(serving.key_pem)
        certs.write_service_account_key(pki)
        (self._dir / "audit-policy.json").write_text(json.dumps(self.audit_policy))
        self.admin_kubeconfig = self.kubeconfig_for_user(ADMIN_USER, groups=("system:masters",))

    def _start_etcd(self) -> None:
        peer = free_port()
        client = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                "--name=default",
                f"--data-dir={self._dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=8589934592",
            ],
        )

    def _start_apiserver(self) -> None:
        pki = self._dir / "pki"
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                # Pods in tests are bound by hand and never run; requiring each namespace's default
                # ServiceAccount to exist first would only add a race to every test.
                "--disable-admission-plugins=ServiceAccount",
                f"--audit-policy-file={self._dir / 'audit-policy.json'}",
                f"--audit-log-path={self.audit_log_path}",
                "--audit-log-mode=blocking",
                "--profiling=false",
                f"--cert-dir={pki}",
                *self.extra_apiserver_args,
            ],
        )

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.admin_kubeconfig}",
                "--controllers=garbage-collector-controller,namespace-controller",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--concurrent-gc-syncs=5",
            ],
        )

    def _wait_ready(self, *, deadline: float) -> None:
        last: str = ""
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    tail = (self._dir / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")
            try:
                status, body = self.request("GET", "/readyz")
                if status == 200:
                    return
                last = body.decode(errors="replace")[-500:]
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready: {last}")

    # -- access ------------------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def ca_path(self) -> Path:
        return self._dir / "pki" / "ca.crt"

    @property
    def audit_log_path(self) -> Path:
        return self._dir / "audit.log"

    def kubeconfig_for_user(self, user: str, *, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` with a CA-signed client cert."""
        assert self._ca is not None
        pair = self._ca.client(user=user, groups=groups)
        safe = user.replace(":", "_").replace("/", "_")
        cert = self._dir / "pki" / f"user-{safe}.crt"
        key = self._dir / "pki" / f"user-{safe}.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        return write_kubeconfig(
            self._dir / f"kubeconfig-{safe}",
            server=self.server,
            ca_path=self.ca_path,
            user=user,
            client_cert=cert,
            client_key=key,
        )

    def kubeconfig_for_token(self, token: str, *, name: str) -> Path:
        safe = name.replace(":", "_").replace("/", "_")
        return write_kubeconfig(
            self._dir / f"kubeconfig-token-{safe}",
            server=self.server,
            ca_path=self.ca_path,
            user=name,
            token=token,
        )

    def service_account_token(
        self, *, namespace: str, name: str, expiration_seconds: int = 3600
    ) -> str:
        """Mint a bound token for a ServiceAccount through the TokenRequest API."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        status, raw = self.request("POST", path, body=body)
        if status != 201:
            raise RuntimeError(f"TokenRequest for {namespace}/{name}: {status} {raw!r}")
        return str(json.loads(raw)["status"]["token"])

    def request(
        self, method: str, path: str, *, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """A synchronous admin request, for fixtures that must not need an event loop."""
        ctx = ssl.create_default_context(cafile=str(self.ca_path))
        pki = self._dir / "pki"
        ctx.load_cert_chain(pki / f"user-{ADMIN_USER}.crt", pki / f"user-{ADMIN_USER}.key")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as err:
            return int(err.code), bytes(err.read())

    def audit_events(self) -> list[dict[str, Any]]:
        """Every audit event logged so far (writes only; see the policy above)."""
        if not self.audit_log_path.exists():
            return []
        lines = self.audit_log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[ControlPlane]:
    plane = ControlPlane(**kwargs)
    with plane:
        yield plane

"""etcd, kube-apiserver, controller manager and scheduler on loopback, for tests and ``make run``.

In the spirit of ``kopf.testing``: the thing under test talks to a real API server, with real
admission, RBAC, server-side apply, watches and audit, not to a mock; and pods created without
``spec.nodeName`` are placed by the real kube-scheduler.  Binaries come from
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare_testing import certs
from gpushare_testing.components import (
    AUDIT_POLICY,
    apiserver_args,
    controller_manager_args,
    etcd_args,
    scheduler_args,
)
from gpushare_testing.kubeconfigs import write_kubeconfig
from gpushare_testing.paths import ROOT

logger = logging.getLogger(__name__)

ADMIN_USER = "gpushare-admin"
# The bootstrap RBAC binds the system:kube-scheduler and system:volume-scheduler roles to it.
SCHEDULER_USER = "system:kube-scheduler"


def default_bin_dir() -> Path:
    """Where ``make controlplane`` puts the binaries (overridable for CI caches)."""
    env = os.environ.get("GPUSHARE_CONTROLPLANE_BIN")
    if env:
        return Path(env)
    versions = (ROOT / "tests/controlplane/versions.mk").read_text()
    pins = dict(
        line.split(" := ", 1)
        for line in versions.splitlines()
        if " := " in line and "$" not in line
    )
    return (
        ROOT
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
    """etcd, kube-apiserver with RBAC and audit, the controller manager's GC/namespace loops,
    and kube-scheduler (``scheduler=False`` leaves it out, for runs that must not pay its
    informers, such as benchmarks of tens of thousands of pods)."""

    bin_dir: Path = field(default_factory=default_bin_dir)
    workdir: Path | None = None
    extra_apiserver_args: tuple[str, ...] = ()
    audit_policy: Mapping[str, Any] = field(default_factory=lambda: AUDIT_POLICY)
    scheduler: bool = True
    etcd_port: int = 0
    apiserver_port: int = 0
    scheduler_port: int = 0
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _owns_workdir: bool = False
    _ca: certs.CertificateAuthority | None = None
    # The audit log read so far: tests poll it, and it grows all session long.
    _audit: list[dict[str, Any]] = field(default_factory=list)
    _audit_read: int = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="gpushare-cp-"))
            self._owns_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        names = ["etcd", "kube-apiserver", "kube-controller-manager"]
        for name in names + ["kube-scheduler"] * self.scheduler:
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
            if self.scheduler:
                self._start_scheduler()
                self._wait_for(self._scheduler_ready, "kube-scheduler", time.monotonic() + 60)
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
        if self.scheduler:
            # Its own serving cert from our CA, so that start() can verify its /readyz.
            pair = self._ca.serving(hosts=["127.0.0.1"], name="kube-scheduler")
            (pki / "scheduler.crt").write_bytes(pair.cert_pem)
            (pki / "scheduler.key").write_bytes(pair.key_pem)

    def _start_etcd(self) -> None:
        args = etcd_args(data_dir=self._dir / "etcd", port=self.etcd_port, peer_port=free_port())
        self._spawn("etcd", args)

    def _start_apiserver(self) -> None:
        args = apiserver_args(
            workdir=self._dir,
            etcd_port=self.etcd_port,
            port=self.apiserver_port,
            audit_log=self.audit_log_path,
            extra=self.extra_apiserver_args,
        )
        self._spawn("kube-apiserver", args)

    def _start_controller_manager(self) -> None:
        args = controller_manager_args(kubeconfig=self.admin_kubeconfig, port=free_port())
        self._spawn("kube-controller-manager", args)

    def _start_scheduler(self) -> None:
        """Started once the apiserver is ready; ``start()`` then waits for its ``/readyz``, so
        that a pod created right after ``start()`` is scheduled without a start-up race."""
        self.scheduler_port = self.scheduler_port or free_port()
        kubeconfig = self.kubeconfig_for_user(SCHEDULER_USER)
        args = scheduler_args(
            kubeconfig=kubeconfig, port=self.scheduler_port, pki=self._dir / "pki"
        )
        self._spawn("kube-scheduler", args)

    def _apiserver_ready(self) -> tuple[bool, str]:
        status, body = self.request("GET", "/readyz")
        return status == 200, body.decode(errors="replace")[-500:]

    def _scheduler_ready(self) -> tuple[bool, str]:
        ctx = ssl.create_default_context(cafile=str(self.ca_path))
        url = f"https://127.0.0.1:{self.scheduler_port}/readyz"
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
                return int(resp.status) == 200, ""
        except urllib.error.HTTPError as err:
            return False, bytes(err.read()).decode(errors="replace")[-500:]

    def _wait_ready(self, *, deadline: float) -> None:
        self._wait_for(self._apiserver_ready, "kube-apiserver", deadline)

    def _wait_for(self, probe: Callable[[], tuple[bool, str]], what: str, deadline: float) -> None:
        """Poll ``probe`` (ready?, why not) until it says ready; fail early if a child exited."""
        last: str = ""
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    tail = (self._dir / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")
            try:
                ready, last = probe()
                if ready:
                    return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise TimeoutError(f"{what} not ready: {last}")

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
        """Every audit event logged so far (writes, and the reads of the READS_AUDITED group;
        see the audit policy).

        Only what was appended since the last call is parsed: a test that polls the log would
        otherwise parse the whole session's log (tens of MB with request bodies) each time.
        """
        if not self.audit_log_path.exists():
            return []
        with self.audit_log_path.open("rb") as log:
            log.seek(self._audit_read)
            data = log.read()
        whole = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self._audit_read += whole
        self._audit.extend(json.loads(line) for line in data[:whole].splitlines() if line.strip())
        return list(self._audit)


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[ControlPlane]:
    plane = ControlPlane(**kwargs)
    with plane:
        yield plane

"""``make run CLUSTER=current`` against a cluster reached through a kubeconfig, as a user's is.

A control plane of its own (no CRDs, no operator namespace: a fresh cluster) and the real
``make``: the target must use the kubectl on PATH, say which context it acts on, create the
namespace, apply the CRDs, and run an operator that takes the Lease there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.paths import ROOT

NAMESPACE = "gpushare-make-run"
IDENTITY = "make-run-operator"
CRDS = ("gpusharingpolicies.gpushare.dev", "gpunodestates.gpushare.dev")


@pytest.fixture
def fresh_cluster() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


def wait_for(check: object, *, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        if proc.poll() is not None:
            raise AssertionError(f"make run exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-5000:]}")


def test_make_run_on_the_current_context(fresh_cluster: ControlPlane, tmp_path: Path) -> None:
    plane = fresh_cluster
    # A kubectl of the user's own on PATH: the one make must use (it builds none).
    user_bin = tmp_path / "bin"
    user_bin.mkdir()
    (user_bin / "kubectl").symlink_to(plane.bin_dir / "kubectl")
    env = {
        **os.environ,
        "PATH": f"{user_bin}:{os.environ['PATH']}",
        "KUBECONFIG": str(plane.admin_kubeconfig),
    }
    flags = (
        f"--identity {IDENTITY} --http-port {free_port()} --metrics-port {free_port()}"
        " --device-plugin-namespace gpu-operator"
    )
    log = tmp_path / "make-run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                "make",
                "--no-print-directory",
                "-C",
                str(ROOT),
                "-o",
                ".venv/.installed",  # the test's interpreter stands in for .venv's
                "run",
                "CLUSTER=current",
                f"NAMESPACE={NAMESPACE}",
                f"VPY={sys.executable}",
                f"CURRENT_RUN_FLAGS={flags}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C goes to the whole group, as in a terminal
        )
    try:

        def lease_holder() -> str | None:
            status, raw = plane.request(
                "GET",
                f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/gpushare-operator",
            )
            return json.loads(raw)["spec"].get("holderIdentity") if status == 200 else None

        wait_for(
            lambda: lease_holder() == IDENTITY, what="the operator to lead", proc=proc, log=log
        )
        output = log.read_text()
        assert f"kubectl:   {user_bin / 'kubectl'}" in output
        assert f"context:   gpushare-local ({plane.server})" in output
        assert f"namespace: {NAMESPACE}" in output
        assert "controlplane: building" not in output
        assert "caches synced" in output
        status, _ = plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}")
        assert status == 200
        for crd in CRDS:
            status, raw = plane.request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
            )
            assert status == 200, raw
            conditions = {c["type"]: c["status"] for c in json.loads(raw)["status"]["conditions"]}
            assert conditions["Established"] == "True"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(f"--- make run log ---\n{log.read_text()[-20000:]}")
    # Ctrl-C: the operator hands its Lease back on the way out.
    assert "stopped cleanly" in log.read_text()
    assert not lease_holder()


def test_without_a_kubectl_on_path_make_builds_and_uses_its_own(tmp_path: Path) -> None:
    # `make -n` prints what would run; PATH_KUBECTL= is what `command -v kubectl` finds on a
    # machine without one.
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            "-C",
            str(ROOT),
            "run",
            "CLUSTER=current",
            "PATH_KUBECTL=",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "tests/controlplane/build.sh" in result.stdout  # the control plane is built first
    assert re.search(
        r"/\.cache/controlplane/[^/]+/bin/kubectl config current-context", result.stdout
    )
    assert "apply --server-side --force-conflicts -f crds/" in result.stdout

"""``make dev-cluster``: the test control plane, kept running in the background for humans.

``up`` starts a detached supervisor process that owns etcd, kube-apiserver, the controller
manager and kube-scheduler (they die with it), and returns once they are ready and the
kubeconfig is at ``<dir>/kubeconfig``.  ``down`` stops the supervisor, which stops the rest.
Each ``up`` after a ``down`` is a fresh, empty cluster.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpushare_testing.controlplane import ControlPlane


def _pid(directory: Path) -> int | None:
    try:
        pid = int((directory / "supervisor.pid").read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def up(*, directory: Path, bin_dir: Path, timeout: float = 120.0) -> int:
    if _pid(directory) is not None and (directory / "kubeconfig").exists():
        print(f"dev cluster already running (kubeconfig {directory / 'kubeconfig'})")
        return 0
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    with (directory / "supervisor.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpushare_testing.devcluster",
                "serve",
                "--dir",
                str(directory),
                "--bin",
                str(bin_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the shell that ran `make dev-cluster`
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (directory / "kubeconfig").exists():
            print(f"dev cluster up (supervisor pid {proc.pid})")
            return 0
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    print((directory / "supervisor.log").read_text()[-4000:], file=sys.stderr)
    return 1


def down(*, directory: Path, timeout: float = 30.0) -> int:
    pid = _pid(directory)
    if pid is None:
        print("dev cluster not running")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _pid(directory) is not None:
        time.sleep(0.2)
    if _pid(directory) is not None:
        os.kill(pid, signal.SIGKILL)
    (directory / "kubeconfig").unlink(missing_ok=True)
    print("dev cluster stopped")
    return 0


def serve(*, directory: Path, bin_dir: Path) -> int:
    """The supervisor: run the control plane until SIGTERM/SIGINT."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    plane = ControlPlane(bin_dir=bin_dir, workdir=(directory / "state").resolve())
    plane.start()
    try:
        (directory / "supervisor.pid").write_text(str(os.getpid()))
        ready = directory / "kubeconfig.tmp"
        shutil.copyfile(plane.admin_kubeconfig, ready)
        ready.rename(directory / "kubeconfig")
        stop.wait()
    finally:
        plane.stop()
        (directory / "supervisor.pid").unlink(missing_ok=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devcluster")
    parser.add_argument("command", choices=["up", "down", "serve"])
    parser.add_argument("--dir", type=Path, default=Path(".dev-cluster"))
    parser.add_argument("--bin", type=Path, default=None)
    args = parser.parse_args(argv)
    directory: Path = args.dir.resolve()
    if args.command == "down":
        return down(directory=directory)
    bin_dir = args.bin.resolve() if args.bin else ControlPlane().bin_dir
    if args.command == "up":
        return up(directory=directory, bin_dir=bin_dir)
    return serve(directory=directory, bin_dir=bin_dir)


if __name__ == "__main__":
    raise SystemExit(main())

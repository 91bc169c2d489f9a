"""The shipped artefacts: the wheel installs into a clean venv and runs; the image recipe is sane.

The image itself is built and run by ``make image`` and ``make image-test``
(``tests/integration/image_smoke.py``); here the Dockerfile is checked for what must hold on any
base (a conventional public default, multi-stage, non-root numeric user, the operator as
entrypoint, no build tools in the final stage), and the same package the image installs is
built as a wheel, installed and started for real.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.paths import ROOT


def _stages(dockerfile: str) -> list[list[str]]:
    stages: list[list[str]] = []
    for line in dockerfile.splitlines():
        line = line.strip()
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages and line and not line.startswith("#"):
            stages[-1].append(line)
    return stages


def test_dockerfile_is_multistage_non_root_and_runs_the_operator() -> None:
    stages = _stages((ROOT / "Dockerfile").read_text())
    assert len(stages) >= 2
    final = "\n".join(stages[-1])
    dockerfile = (ROOT / "Dockerfile").read_text()
    # A conventional public base by default; `make image` overrides it with a local one.
    assert re.search(r"^ARG BASE_IMAGE=python:3\.1[1-9]-slim$", dockerfile, re.M)
    assert stages[0][0] == "FROM ${BASE_IMAGE} AS build"
    assert final.startswith("FROM ${BASE_IMAGE}\n")
    user = re.search(r"^USER (\S+)", final, re.M)
    assert user is not None
    assert user.group(1).split(":")[0] not in ("0", "root")
    assert user.group(1).split(":")[0].isdigit()  # numeric, so runAsNonRoot can check it
    assert 'ENTRYPOINT ["python", "-m", "gpushare_operator", "run"]' in final
    for tool in ("gcc", "build-essential", "apt-get install"):
        assert tool not in final
    assert "COPY --from=build" in final


def test_wheel_installs_into_a_clean_venv_and_connects(
    control_plane: ControlPlane, crds_installed: None, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
    )
    [wheel] = wheels.glob("gpushare_operator-*.whl")
    env_dir = tmp_path / "venv"
    # Without a pip of its own (ensurepip costs seconds): this pip installs into it, run by the
    # venv's interpreter (--python), as the venv's own pip would.
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            str(wheel),
        ],
        check=True,
    )

    version = subprocess.run(
        [str(env_dir / "bin" / "gpushare-operator"), "version"], capture_output=True, text=True
    )
    assert version.returncode == 0
    assert version.stdout.strip() == "0.1.0"
    # The kubectl plugin: kubectl finds `kubectl-gpushare` on PATH and runs it as a subcommand.
    on_path = {**os.environ, "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    kubectl = str(control_plane.bin_dir / "kubectl")
    plugins = subprocess.run(
        [kubectl, "plugin", "list"], capture_output=True, text=True, env=on_path
    )
    assert str(env_dir / "bin" / "kubectl-gpushare") in plugins.stdout, plugins
    via_kubectl = subprocess.run(
        [kubectl, "gpushare", "version"], capture_output=True, text=True, env=on_path
    )
    assert (via_kubectl.returncode, via_kubectl.stdout.strip()) == (0, "0.1.0"), via_kubectl

    kubeconfig = control_plane.kubeconfig_for_user("gpushare-wheel", groups=("system:masters",))
    log = tmp_path / "operator.log"
    env = {
        "PATH": os.environ["PATH"],
        "KUBECONFIG": str(kubeconfig),
        "GPUSHARE_HTTP_PORT": str(free_port()),
        "GPUSHARE_METRICS_PORT": str(free_port()),
        "GPUSHARE_NAMESPACE": "default",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(python), "-m", "gpushare_operator", "run", "--log-format", "json"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,  # not the source tree: the installed wheel must be what runs
        )
    try:
        deadline = time.monotonic() + 60
        while "caches synced" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        assert "caches synced" in log.read_text(), log.read_text()
        assert (
            str(env_dir)
            in subprocess.run(
                [str(python), "-c", "import gpushare_operator; print(gpushare_operator.__file__)"],
                capture_output=True,
                text=True,
                check=True,
                cwd=tmp_path,
            ).stdout
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    assert "stopped cleanly" in log.read_text()

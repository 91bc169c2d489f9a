"""tests/controlplane/build.sh: cached binaries are reused, a version bump rebuilds them.

A stand-in ``go`` on PATH records what would be built, so this runs in milliseconds.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "controlplane" / "build.sh"
FAKE_GO = """#!/usr/bin/env bash
if [[ "$1" == list ]]; then echo v0.35.4; exit 0; fi
out=""; while [[ $# -gt 0 ]]; do [[ "$1" == -o ]] && out="$2"; shift; done
echo "$out" >> "$GO_LOG"; printf '#!/bin/sh\\n' > "$out"; chmod +x "$out"
"""


def build(tmp_path: Path, *, helm: str) -> list[str]:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    log = tmp_path / "go.log"
    log.write_text("")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", GO_LOG=str(log))
    subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), "v1.35.4", "v3.6.16", helm],
        check=True,
        env=env,
        capture_output=True,
    )
    return [Path(line).name.removesuffix(".tmp") for line in log.read_text().split()]


def test_a_warm_cache_builds_nothing_and_a_helm_bump_rebuilds_only_helm(tmp_path: Path) -> None:
    everything = ["etcd", "kube-apiserver", "kubectl", "kube-controller-manager"]
    everything += ["kube-scheduler", "helm"]
    assert build(tmp_path, helm="v3.22.0") == everything
    assert build(tmp_path, helm="v3.22.0") == []
    assert build(tmp_path, helm="v3.23.1") == ["helm"]
    assert (tmp_path / "out/bin/.helm.version").read_text().strip() == "v3.23.1"


def test_a_cache_from_before_the_scheduler_builds_only_the_scheduler(tmp_path: Path) -> None:
    build(tmp_path, helm="v3.22.0")
    for name in ("kube-scheduler", ".kube-scheduler.version"):
        (tmp_path / "out/bin" / name).unlink()
    assert build(tmp_path, helm="v3.22.0") == ["kube-scheduler"]

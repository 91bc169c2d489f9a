"""The ``helm`` binary that ``make controlplane`` builds, run against a local control plane with
its state in a folder of the test's own."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.paths import CHART

INSTANCE = "app.kubernetes.io/instance"  # the label every object of a release carries

Manifest = dict[str, Any]


@dataclass
class Helm:
    """The ``helm`` binary from ``make controlplane``, with its state kept in a temporary dir."""

    binary: Path
    kubeconfig: Path
    home: Path
    kube_version: str  # what `helm template` renders for: the control plane's version

    @classmethod
    def for_plane(cls, plane: ControlPlane, home: Path) -> Helm:
        binary = plane.bin_dir / "helm"
        if not binary.exists():
            pytest.fail(f"{binary} missing: run `make controlplane`")
        status, raw = plane.request("GET", "/version")
        assert status == 200, raw
        version = str(json.loads(raw)["gitVersion"])
        return cls(
            binary=binary, kubeconfig=plane.admin_kubeconfig, home=home, kube_version=version
        )

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        env.pop("KUBECONFIG", None)
        result = subprocess.run(
            [str(self.binary), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result

    def render(
        self,
        *args: str,
        release: str = "gs",
        namespace: str = "gpushare-system",
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        return self.run(
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            self.kube_version,
            *args,
            check=check,
        )

    def template(
        self, *args: str, release: str = "gs", namespace: str = "gpushare-system"
    ) -> list[Manifest]:
        out = self.render(*args, release=release, namespace=namespace).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]

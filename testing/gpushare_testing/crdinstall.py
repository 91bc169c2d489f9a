"""The repository's CRDs on a local control plane: installed with the real kubectl, as users do,
and the relaxed schema of an older release, under which objects our CRDs refuse get stored."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from gpushare_operator.core.api import crds
from gpushare_testing.apiobjects import API
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.paths import CRDS
from gpushare_testing.rawclient import RawClient
from gpushare_testing.waiting import eventually

POLICY_CRD = CRDS / "gpushare.dev_gpusharingpolicies.yaml"


def kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> str:
    """Run the real kubectl as admin; fail with its stderr unless it succeeds."""
    result = subprocess.run(
        [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.admin_kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def install_crds(plane: ControlPlane, path: Path = CRDS) -> None:
    """``kubectl apply`` the CRDs, and wait until the API server serves them."""
    kubectl(plane, "apply", "-f", str(path))
    names = ("crd/gpusharingpolicies.gpushare.dev", "crd/gpunodestates.gpushare.dev")
    deadline = time.monotonic() + 60
    while True:
        # kubectl wait fails at once ("accessor error: <nil>") on a CRD the API server has not
        # yet given any condition: that is "not established yet", so ask again.
        wait = ["wait", "--for=condition=established", "--timeout=60s", *names]
        result = subprocess.run(
            [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.admin_kubeconfig), *wait],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode == 0:
            return
        assert "accessor error" in result.stderr, result.stderr
        assert time.monotonic() < deadline, result.stderr
        time.sleep(0.2)


def relaxed_policy_crd() -> dict[str, Any]:
    """The policy CRD as an older release had it: no replicas maximum, no rule on selector
    expressions, none refusing labels our own configuration rewrites, an eviction grace period
    of 0 let in."""
    crd: dict[str, Any] = yaml.safe_load(POLICY_CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema["properties"]["replicas"].pop("maximum")
    rollout = schema["properties"]["rollout"]["properties"]
    grace = rollout["eviction"]["properties"]["gracePeriodSeconds"]
    grace["minimum"] = 0
    grace.pop("x-kubernetes-validations", None)
    selector = schema["properties"]["nodeSelector"]["properties"]
    selector["matchExpressions"]["items"].pop("x-kubernetes-validations")
    stable = [dict(rule) for rule in crds.STABLE_MATCH_LABELS_RULES]
    rules = selector["matchLabels"]["x-kubernetes-validations"]
    selector["matchLabels"]["x-kubernetes-validations"] = [r for r in rules if r not in stable]
    return crd


async def create_until_accepted(client: RawClient, body: dict[str, Any]) -> None:
    """Create a policy only a relaxed CRD accepts: a changed CRD takes a moment to be served,
    and until then the old schema still refuses it."""

    async def attempt() -> int:
        status, _ = await client.post(f"{API}/gpusharingpolicies", body)
        return int(status)

    await eventually(attempt, until=lambda s: s in (201, 409), timeout=30, what="relaxed CRD")

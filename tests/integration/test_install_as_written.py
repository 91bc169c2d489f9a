"""The README's install and the chart's uninstall, run as written, leave nothing behind.

The commands are read from the pages a user reads: the README's install block (the CRDs, then
``helm install``; the image build and push aside, which need a registry), and the uninstall
commands the chart prints in its NOTES (``helm get notes``).  They run with the real kubectl
and helm on a control plane of this module's own (the uninstall deletes the CRDs), with
simulated GPU nodes.  No kubelet runs the chart's Deployment here, so the operator runs as a
process with the chart's ServiceAccount token, as its pod would.  Afterwards no policy, node
state, CRD, ConfigMap or Secret of ours is left, and no node carries a label of ours.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.helm import Helm
from gpushare_testing.operators import RunningOperator, spawn
from gpushare_testing.paths import ROOT
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

README = ROOT / "README.md"
FENCE = re.compile(r"^```(?:sh|console)?\n(.*?)^```", re.M | re.S)
MANAGER = "gpushare-operator"  # the operator's field manager for node labels


def commands(text: str) -> list[list[str]]:
    """The kubectl and helm command lines of a text (backslash continuations joined, trailing
    comments dropped), as argument lists; prose and other commands are left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        if line.strip().startswith(("kubectl ", "helm ")):
            found.append(shlex.split(line, comments=True))
    return found


def readme_install() -> list[list[str]]:
    """The README's install block: what it runs against the cluster (kubectl and helm)."""
    section = README.read_text().split("## Install on a cluster", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in FENCE.findall(section) if "helm install" in b)
    return commands(block)


def notes_uninstall(notes: str) -> list[list[str]]:
    """The uninstall commands of the chart's NOTES, in their order."""
    section = notes.split("To uninstall", 1)[1].split("\n\nthen", 1)[0]
    return commands(section)


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    own = ControlPlane()
    own.start()
    try:
        yield own
    finally:
        own.stop()


def run(plane: ControlPlane, helm: Helm, argv: list[str]) -> str:
    """One documented command, with this control plane's kubectl or helm, from the repository
    root (the README's paths are relative to a checkout)."""
    if argv[0] == "helm":
        result = helm.run(*argv[1:], check=False)
    else:
        kubectl = [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.admin_kubeconfig)]
        result = subprocess.run(
            [*kubectl, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
    assert result.returncode == 0, f"{shlex.join(argv)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
async def sim(plane: ControlPlane) -> AsyncIterator[GpuClusterSimulator]:
    # The GPU Operator's namespace, as the README's install names it (--set devicePlugin...).
    status, raw = plane.request(
        "POST", "/api/v1/namespaces", body={"metadata": {"name": "gpu-operator"}}
    )
    assert status in (201, 409), raw
    async with GpuClusterSimulator(
        kubeconfig=plane.admin_kubeconfig, namespace="gpu-operator"
    ) as simulator:
        yield simulator


def labels_of_ours(metadata: dict[str, Any]) -> list[str]:
    """The node labels the operator's field manager holds, and any gpushare.dev/ label (the
    MIG manager's own nvidia.com/mig.config on MIG-capable GPUs is not ours)."""
    labels = metadata.get("labels", {})
    held = {
        key.removeprefix("f:")
        for entry in metadata.get("managedFields", [])
        if entry.get("manager") == MANAGER
        for key in entry.get("fieldsV1", {}).get("f:metadata", {}).get("f:labels", {})
    }
    return sorted(key for key in labels if key in held or key.startswith("gpushare.dev/"))


def leftovers(plane: ControlPlane) -> dict[str, object]:
    """What of ours is still in the cluster."""
    found: dict[str, object] = {}
    status, raw = plane.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    assert status == 200, raw
    crds = [c["metadata"]["name"] for c in json.loads(raw)["items"]]
    found["crds"] = [name for name in crds if name.endswith(".gpushare.dev")]
    status, raw = plane.request("GET", "/api/v1/nodes")
    assert status == 200, raw
    found["labels"] = {
        node["metadata"]["name"]: ours
        for node in json.loads(raw)["items"]
        if (ours := labels_of_ours(node["metadata"]))
    }
    found["taints"] = {
        node["metadata"]["name"]: node["spec"]["taints"]
        for node in json.loads(raw)["items"]
        if any(t.get("key", "").startswith("gpushare.dev/") for t in node["spec"].get("taints", []))
    }
    status, raw = plane.request("GET", "/api/v1/namespaces/gpu-operator/configmaps")
    assert status == 200, raw
    found["configmaps"] = [
        c["metadata"]["name"]
        for c in json.loads(raw)["items"]
        if c["metadata"]["name"].startswith("gpushare-")
    ]
    status, raw = plane.request("GET", "/api/v1/namespaces/gpushare-system/secrets")
    assert status in (200, 404), raw
    items = json.loads(raw).get("items", []) if status == 200 else []
    found["secrets"] = [s["metadata"]["name"] for s in items if "gpushare" in s["metadata"]["name"]]
    status, raw = plane.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles")
    assert status == 200, raw
    found["clusterroles"] = [
        r["metadata"]["name"]
        for r in json.loads(raw)["items"]
        if r["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "gpushare"
    ]
    return found


async def test_readme_install_then_notes_uninstall_leaves_nothing(
    plane: ControlPlane, sim: GpuClusterSimulator, tmp_path: Path
) -> None:
    helm = Helm.for_plane(plane, tmp_path / "helm")
    install = readme_install()
    assert [c[:2] for c in install] == [["kubectl", "apply"], ["helm", "install"]], install
    for argv in install:
        run(plane, helm, argv)
    release = install[1][2]
    namespace = install[1][install[1].index("-n") + 1]
    account = f"{release}-gpushare-operator"

    admin = sim.client
    pool = h.unique("written")
    nodes = await sim.create_gpu_nodes(pool=pool, count=3, gpus=2)
    policy = h.unique("p")
    await h.create_policy(admin, h.policy(policy, pool=pool, replicas=4))

    token = plane.service_account_token(namespace=namespace, name=account)
    operator: RunningOperator = spawn(
        plane,
        tmp_path / "operator.log",
        "--namespace",
        namespace,
        "--device-plugin-namespace",
        "gpu-operator",
        kubeconfig=plane.kubeconfig_for_token(token, name=account),
        user=f"system:serviceaccount:{namespace}:{account}",
    )
    try:
        await operator.wait_synced()
        for node in nodes:
            await eventually(
                functools.partial(h.node_state, admin, node),
                until=lambda s: (s or {}).get("status", {}).get("phase") == "Verified",
                timeout=90,
                what=f"{node} Verified",
            )
        before = leftovers(plane)
        # The check below sees our labels where they are: the config and policy labels.
        labelled = before["labels"]
        assert isinstance(labelled, dict) and set(labelled) == set(nodes), before
        for node in nodes:
            assert {"gpushare.dev/policy", "nvidia.com/device-plugin.config"} <= set(
                labelled[node]
            ), before

        notes = helm.run("get", "notes", release, "-n", namespace).stdout
        uninstall = notes_uninstall(notes)
        assert [c[:2] for c in uninstall][:3] == [
            ["kubectl", "delete"],
            ["helm", "uninstall"],
            ["kubectl", "delete"],
        ], uninstall
        for argv in uninstall:
            run(plane, helm, argv)
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.logs()[-20000:]}")

    after = leftovers(plane)
    assert after == {
        "crds": [],
        "labels": {},
        "taints": {},
        "configmaps": [],
        "secrets": [],
        "clusterroles": [],
    }

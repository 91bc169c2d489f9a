"""The chart's ClusterRoles for people do what docs/access.md says, on the real API server.

``gpushare-policy-admin`` writes policies and reads node states, and nothing else (no status,
no node state writes); ``gpushare-viewer`` reads both and writes nothing, and the cluster's own
``view`` role gathers it (the controller manager's ClusterRole aggregation runs here), so a
ClusterRoleBinding to ``view`` reads policies too.  Each identity is a real client certificate
checked by the API server's RBAC, through the real kubectl, as a person would be.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import kubectl
from gpushare_testing.helm import Helm
from gpushare_testing.paths import CHART
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

POLICY = {
    "apiVersion": "gpushare.dev/v1alpha1",
    "kind": "GPUSharingPolicy",
    "metadata": {"name": "PLACEHOLDER"},
    "spec": {
        "nodeSelector": {"matchLabels": {"pool": "nobody-has-this"}},
        "strategy": "TimeSlicing",
        "replicas": 2,
    },
}


@pytest.fixture
def roles(helm: Helm, namespace: str, plugin_namespace: str) -> Iterator[dict[str, str]]:
    """The chart installed with roles named for this test (two releases never share them)."""
    release = f"roles-{uuid.uuid4().hex[:6]}"
    names = {"admin": f"{release}-policy-admin", "viewer": f"{release}-viewer"}
    helm.run(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        f"devicePlugin.namespace={plugin_namespace}",
        "--set",
        f"rbac.userRoles.policyAdmin={names['admin']},rbac.userRoles.viewer={names['viewer']}",
    )
    yield names
    helm.run("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s")


def as_user(plane: ControlPlane, kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """kubectl as that user; returns stdout, or the refusal on stderr (prefixed)."""
    result = subprocess.run(
        [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout if result.returncode == 0 else "REFUSED: " + result.stderr


def can_i(plane: ControlPlane, kubeconfig: Path, verb: str, resource: str) -> bool:
    """``kubectl auth can-i``; ``resource`` may end in ``/status`` (a subresource: kubectl
    would read ``a/b`` as object b of resource a)."""
    resource, _, subresource = resource.partition("/")
    extra = [f"--subresource={subresource}"] if subresource else []
    answer = as_user(plane, kubeconfig, "auth", "can-i", verb, resource, *extra).strip()
    return answer == "yes"


def bind(plane: ControlPlane, *, role: str, user: str) -> str:
    name = f"{user}-{uuid.uuid4().hex[:6]}"
    kubectl(plane, "create", "clusterrolebinding", name, f"--clusterrole={role}", f"--user={user}")
    return name


async def test_policy_admin_writes_policies_and_nothing_else(
    control_plane: ControlPlane, roles: dict[str, str]
) -> None:
    user = f"alice-{uuid.uuid4().hex[:6]}"
    binding = bind(control_plane, role=roles["admin"], user=user)
    alice = control_plane.kubeconfig_for_user(user)
    name = f"p-{uuid.uuid4().hex[:6]}"
    body = yaml.safe_dump({**POLICY, "metadata": {"name": name}})
    try:
        created = as_user(control_plane, alice, "apply", "-f", "-", stdin=body)
        assert f"gpusharingpolicy.gpushare.dev/{name}" in created, created
        listed = as_user(control_plane, alice, "get", "gpunodestates")
        assert not listed.startswith("REFUSED"), listed
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
            assert can_i(control_plane, alice, verb, "gpusharingpolicies.gpushare.dev"), verb
        refused = {
            ("patch", "gpusharingpolicies.gpushare.dev/status"),
            ("patch", "gpunodestates.gpushare.dev"),
            ("create", "gpunodestates.gpushare.dev"),
            ("patch", "gpunodestates.gpushare.dev/status"),
            ("patch", "nodes"),
            ("list", "pods"),
        }
        for verb, resource in sorted(refused):
            assert not can_i(control_plane, alice, verb, resource), (verb, resource)
        status = as_user(
            control_plane,
            alice,
            "patch",
            "gsp",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status": {"matchedNodes": 99}}',
        )
        assert status.startswith("REFUSED") and "forbidden" in status, status
        deleted = as_user(control_plane, alice, "delete", "gsp", name, "--wait=false")
        assert "deleted" in deleted, deleted
    finally:
        kubectl(control_plane, "delete", "clusterrolebinding", binding)
        kubectl(control_plane, "delete", "gsp", name, "--ignore-not-found", "--wait=false")


async def test_viewer_reads_and_view_gathers_it(
    control_plane: ControlPlane, roles: dict[str, str]
) -> None:
    viewer = f"bob-{uuid.uuid4().hex[:6]}"
    cluster_viewer = f"carol-{uuid.uuid4().hex[:6]}"
    bindings = [
        bind(control_plane, role=roles["viewer"], user=viewer),
        bind(control_plane, role="view", user=cluster_viewer),
    ]
    try:
        for user in (viewer, cluster_viewer):
            config = control_plane.kubeconfig_for_user(user)
            for resource in ("gpusharingpolicies.gpushare.dev", "gpunodestates.gpushare.dev"):
                # view gathers the viewer's rules through the aggregation controller: wait.
                async def may_list(c: Path = config, r: str = resource) -> bool:
                    return can_i(control_plane, c, "list", r)

                await eventually(
                    may_list, timeout=60, interval=0.5, what=f"{user} lists {resource}"
                )
                for verb in ("create", "patch", "delete"):
                    assert not can_i(control_plane, config, verb, resource), (user, verb)
            body = yaml.safe_dump({**POLICY, "metadata": {"name": f"v-{uuid.uuid4().hex[:6]}"}})
            refused = as_user(control_plane, config, "create", "-f", "-", stdin=body)
            assert refused.startswith("REFUSED") and "forbidden" in refused, refused
    finally:
        for name in bindings:
            kubectl(control_plane, "delete", "clusterrolebinding", name)


def test_a_release_without_user_roles_makes_none(helm: Helm) -> None:
    rendered = helm.template("--set", "rbac.userRoles.enabled=false")
    names = {doc["metadata"]["name"] for doc in rendered if doc["kind"] == "ClusterRole"}
    assert not {"gpushare-policy-admin", "gpushare-viewer"} & names
    default = helm.template()
    roles = {doc["metadata"]["name"]: doc for doc in default if doc["kind"] == "ClusterRole"}
    viewer = roles["gpushare-viewer"]
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    admin = roles["gpushare-policy-admin"]
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in admin["metadata"]["labels"]
    assert "rbac.authorization.k8s.io/aggregate-to-admin" not in admin["metadata"]["labels"]

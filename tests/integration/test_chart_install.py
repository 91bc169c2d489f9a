"""The chart's life on a cluster, with the real ``helm``: before the GPU Operator, upgrades, and
uninstall.

The operator runs as the chart's ServiceAccount (a token from the TokenRequest API), so what it
can and cannot do is what the chart grants.  Without the device-plugin namespace the install
succeeds, the NOTES say what is missing, and the operator reports it in every policy; once the
namespace exists, ``helm upgrade --reuse-values`` creates the Role there and the same operator
process converges.
"""

from __future__ import annotations

import json
import uuid

import pytest

from gpushare_operator.testing.controlplane import ControlPlane
from gpushare_operator.testing.simulator import GpuClusterSimulator
from tests.integration import helpers as h
from tests.integration.conftest import OperatorFactory
from tests.integration.test_chart import (
    CHART,
    Helm,
    create_namespace,
    helm,
    namespaces,
    release_objects,
)
from tests.waiting import eventually

__all__ = ["helm", "namespaces"]  # fixtures, used by name

pytestmark = pytest.mark.usefixtures("crds_installed")

CRDS = ("gpusharingpolicies.gpushare.dev", "gpunodestates.gpushare.dev")


def ready(body: dict[str, object]) -> dict[str, object]:
    return dict(h.condition(body.get("status"), "Ready"))  # type: ignore[arg-type]


async def test_installs_before_the_gpu_operator_and_converges_after_an_upgrade(
    control_plane: ControlPlane,
    helm: Helm,
    namespaces: list[str],
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    release_ns = create_namespace(control_plane, namespaces, "gs")
    plugin_ns = f"gpu-operator-{uuid.uuid4().hex[:6]}"  # not there yet
    release = h.unique("early")
    helm.run(
        "install",
        release,
        str(CHART),
        "-n",
        release_ns,
        "--set",
        f"devicePlugin.namespace={plugin_ns}",
    )
    full = f"{release}-gpushare-operator"
    notes = helm.run("get", "notes", release, "-n", release_ns).stdout
    assert f'MISSING: namespace "{plugin_ns}" does not exist yet' in notes
    assert (
        f"helm upgrade {release} charts/gpushare-operator -n {release_ns} --reuse-values" in notes
    )
    assert not [o for o in release_objects(control_plane, release) if o[1] == plugin_ns]

    token = control_plane.service_account_token(namespace=release_ns, name=full)
    kubeconfig = control_plane.kubeconfig_for_token(token, name=f"{release_ns}-{full}")
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_ns
    ) as sim:
        pool = h.unique("pool")
        [node] = await sim.create_gpu_nodes(pool=pool, count=1)
        policy = h.unique("p")
        await h.add_policy(sim, policies, h.policy(policy, pool=pool))
        operator = await start_operator(
            "--device-plugin-namespace",
            plugin_ns,
            "--namespace",
            release_ns,
            kubeconfig=kubeconfig,
            user=f"system:serviceaccount:{release_ns}:{full}",
        )
        # It syncs without its ConfigMap Role, and every policy says what is missing.
        body = await eventually(
            lambda: h.get_policy(sim.client, policy),
            until=lambda b: ready(b).get("reason") == "DevicePluginConfigUnavailable",
            timeout=60,
            what="the policy to say the device-plugin ConfigMap cannot be written",
        )
        message = str(ready(body)["message"])
        assert plugin_ns in message and "helm upgrade --reuse-values" in message, message

        # The GPU Operator arrives; an upgrade creates the Role; the same process converges.
        create_namespace_named(control_plane, namespaces, plugin_ns)
        helm.run("upgrade", release, str(CHART), "-n", release_ns, "--reuse-values")
        assert ("roles", plugin_ns, f"{full}-device-plugin-config") in release_objects(
            control_plane, release
        )
        assert "MISSING" not in helm.run("get", "notes", release, "-n", release_ns).stdout
        await eventually(
            lambda: h.node_state(sim.client, node),
            until=lambda s: (s or {}).get("status", {}).get("phase") == "Verified",
            timeout=90,
            interval=0.5,
            what="the node to be Verified after the upgrade",
        )
        # The policy's status follows once its nodes have settled.
        await eventually(
            lambda: h.get_policy(sim.client, policy),
            until=lambda b: ready(b).get("reason") == "Applied",
            timeout=90,
            interval=0.5,
            what="the policy to be Ready after the upgrade",
        )
        assert operator.proc.poll() is None
        starts = [line for line in operator.log_lines() if line.get("event") == "starting"]
        assert len(starts) == 1, "no restart was needed"
        operator.stop()

        # Uninstall: the release's objects go, the CRDs and the policies stay, and nothing
        # holds a policy back (the operator puts no finalizer on them).
        helm.run("uninstall", release, "-n", release_ns, "--wait", "--timeout", "60s")
        assert release_objects(control_plane, release) == []
        for crd in CRDS:
            status, _ = control_plane.request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
            )
            assert status == 200, f"{crd} must outlive the release"
        kept = await h.get_policy(sim.client, policy)
        assert not kept["metadata"].get("finalizers"), kept["metadata"]


def create_namespace_named(plane: ControlPlane, created: list[str], name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    status, raw = plane.request("POST", "/api/v1/namespaces", body=body)
    assert status == 201, raw
    created.append(name)


def test_upgrade_changes_the_release_in_place(
    control_plane: ControlPlane, helm: Helm, namespaces: list[str]
) -> None:
    release_ns = create_namespace(control_plane, namespaces, "gs")
    plugin_ns = create_namespace(control_plane, namespaces, "plugin")
    release = h.unique("up")
    full = f"{release}-gpushare-operator"
    helm.run(
        "install",
        release,
        str(CHART),
        "-n",
        release_ns,
        "--set",
        f"devicePlugin.namespace={plugin_ns}",
    )
    before = release_objects(control_plane, release)
    deployment_path = f"/apis/apps/v1/namespaces/{release_ns}/deployments/{full}"
    status, raw = control_plane.request("GET", deployment_path)
    assert status == 200, raw
    uid = json.loads(raw)["metadata"]["uid"]
    try:
        helm.run(
            "upgrade",
            release,
            str(CHART),
            "-n",
            release_ns,
            "--reuse-values",
            "--set",
            "replicaCount=3,operator.writeQps=50,operator.metricsInsecure=true",
        )
        status, raw = control_plane.request("GET", deployment_path)
        deployment = json.loads(raw)
        assert deployment["metadata"]["uid"] == uid  # changed in place, not recreated
        assert deployment["spec"]["replicas"] == 3
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["GPUSHARE_WRITE_QPS"] == "50"
        assert env["GPUSHARE_METRICS_INSECURE"] == "true"
        assert env["GPUSHARE_DEVICE_PLUGIN_NAMESPACE"] == plugin_ns  # reused
        assert release_objects(control_plane, release) == before
        # Plain-HTTP metrics need no reviews: the upgrade took that permission away.
        status, raw = control_plane.request(
            "GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{full}"
        )
        resources = {r for rule in json.loads(raw)["rules"] for r in rule["resources"]}
        assert "tokenreviews" not in resources
        history = json.loads(helm.run("history", release, "-n", release_ns, "-o", "json").stdout)
        assert [(r["revision"], r["status"]) for r in history] == [
            (1, "superseded"),
            (2, "deployed"),
        ]
    finally:
        helm.run("uninstall", release, "-n", release_ns, "--wait", "--timeout", "60s")
    assert release_objects(control_plane, release) == []


def test_a_certificate_secret_is_mounted_and_named_to_the_operator(helm: Helm) -> None:
    manifests = helm.template("--set", "metricsCertSecret=gpushare-metrics-tls")
    [deployment] = [m for m in manifests if m["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUSHARE_METRICS_CERT_FILE"] == "/etc/gpushare/metrics-tls/tls.crt"
    assert env["GPUSHARE_METRICS_KEY_FILE"] == "/etc/gpushare/metrics-tls/tls.key"
    assert {"name": "metrics-tls", "secret": {"secretName": "gpushare-metrics-tls"}} in pod[
        "volumes"
    ]
    assert {
        "name": "metrics-tls",
        "mountPath": "/etc/gpushare/metrics-tls",
        "readOnly": True,
    } in container["volumeMounts"]
    # Without it: no such volume, and the operator makes its own certificate.
    [plain] = [m for m in helm.template() if m["kind"] == "Deployment"]
    [container] = plain["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUSHARE_METRICS_CERT_FILE"] == env["GPUSHARE_METRICS_KEY_FILE"] == ""
    assert [v["name"] for v in plain["spec"]["template"]["spec"]["volumes"]] == ["tmp"]

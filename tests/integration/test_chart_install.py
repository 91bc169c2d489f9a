"""The chart's life on a cluster, with the real ``helm``: a server-side dry run, install and
uninstall, before the GPU Operator, upgrades, and upgrades that keep the webhook's CA bundle.

The operator runs as the chart's ServiceAccount (a token from the TokenRequest API), so what it
can and cannot do is what the chart grants.  Without the device-plugin namespace the install
succeeds, the NOTES say what is missing, and the operator reports it in every policy; once the
namespace exists, ``helm upgrade --reuse-values`` creates the Role there and the same operator
process converges.
"""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from typing import Any

import pytest
import yaml

from gpushare_operator.core import certificates
from gpushare_testing import apiobjects as h
from gpushare_testing import webhooks
from gpushare_testing.apiobjects import create_namespace
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import kubectl
from gpushare_testing.helm import INSTANCE, Helm
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.paths import CHART
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

CRDS = ("gpusharingpolicies.gpushare.dev", "gpunodestates.gpushare.dev")


def test_rendered_manifests_pass_server_side_dry_run(
    control_plane: ControlPlane, helm: Helm, namespaces: list[str]
) -> None:
    release_ns = create_namespace(control_plane, namespaces, "gs")
    plugin_ns = create_namespace(control_plane, namespaces, "plugin")
    rendered = helm.render(
        "--set",
        f"devicePlugin.namespace={plugin_ns},grafanaDashboard.enabled=true",
        release="dry",
        namespace=release_ns,
    ).stdout
    out = kubectl(
        control_plane,
        "apply",
        "--server-side",
        "--field-manager=helm-dry-run",
        "--dry-run=server",
        "-f",
        "-",
        stdin=rendered,
    )
    applied = [line for line in out.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len([d for d in yaml.safe_load_all(rendered) if d]) == 27, out
    # A dry run: nothing was created.
    status, _ = control_plane.request(
        "GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/dry-gpushare-operator"
    )
    assert status == 404


# Every kind the chart can create, as (API path prefix, plural, namespaced).
CHART_KINDS = [
    ("/apis/apps/v1", "deployments", True),
    ("/api/v1", "serviceaccounts", True),
    ("/api/v1", "services", True),
    ("/api/v1", "configmaps", True),
    ("/apis/policy/v1", "poddisruptionbudgets", True),
    ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", False),
    ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
]


def release_objects(plane: ControlPlane, release: str) -> list[tuple[str, str, str]]:
    """(plural, namespace, name) of every object labelled with the release, in any namespace."""
    found = []
    for prefix, plural, _ in CHART_KINDS:
        status, raw = plane.request(
            "GET", f"{prefix}/{plural}?labelSelector={INSTANCE}%3D{release}"
        )
        assert status == 200, raw
        for item in json.loads(raw)["items"]:
            meta = item["metadata"]
            found.append((plural, meta.get("namespace", ""), meta["name"]))
    return sorted(found)


def test_install_creates_everything_and_uninstall_leaves_nothing(
    control_plane: ControlPlane, helm: Helm, namespaces: list[str], crds_installed: None
) -> None:
    release_ns = create_namespace(control_plane, namespaces, "gs")
    plugin_ns = create_namespace(control_plane, namespaces, "plugin")
    release = f"gs-{uuid.uuid4().hex[:6]}"
    helm.run(
        "install",
        release,
        str(CHART),
        "--namespace",
        release_ns,
        "--set",
        f"devicePlugin.namespace={plugin_ns},grafanaDashboard.enabled=true",
    )
    try:
        full = f"{release}-gpushare-operator"
        assert release_objects(control_plane, release) == sorted(
            [
                ("deployments", release_ns, full),
                ("serviceaccounts", release_ns, full),
                ("services", release_ns, f"{full}-metrics"),
                ("services", release_ns, f"{full}-webhook"),
                ("configmaps", release_ns, f"{full}-dashboard"),
                ("poddisruptionbudgets", release_ns, full),
                ("networkpolicies", release_ns, full),
                ("roles", release_ns, f"{full}-leader-election"),
                ("roles", release_ns, f"{full}-webhook-certificate"),
                ("roles", plugin_ns, f"{full}-device-plugin-config"),
                ("rolebindings", release_ns, f"{full}-leader-election"),
                ("rolebindings", release_ns, f"{full}-webhook-certificate"),
                ("rolebindings", plugin_ns, f"{full}-device-plugin-config"),
                ("clusterroles", "", full),
                ("clusterroles", "", f"{full}-metrics-reader"),
                ("clusterroles", "", "gpushare-policy-admin"),  # roles for people
                ("clusterroles", "", "gpushare-viewer"),
                ("clusterrolebindings", "", full),
                ("validatingadmissionpolicies", "", f"{full}-dra-sharing"),
                ("validatingadmissionpolicybindings", "", f"{full}-dra-sharing"),
                ("validatingadmissionpolicies", "", f"{full}-node-guard"),
                ("validatingadmissionpolicybindings", "", f"{full}-node-guard"),
                ("validatingadmissionpolicies", "", f"{full}-node-guard-labels"),
                ("validatingadmissionpolicybindings", "", f"{full}-node-guard-labels"),
                ("validatingadmissionpolicies", "", f"{full}-webhook-guard"),
                ("validatingadmissionpolicybindings", "", f"{full}-webhook-guard"),
                ("mutatingwebhookconfigurations", "", full),
            ]
        )
        status, raw = control_plane.request(
            "GET", f"/apis/apps/v1/namespaces/{release_ns}/deployments/{full}"
        )
        assert status == 200
        assert json.loads(raw)["spec"]["replicas"] == 2
        # The API server took the token as a projected volume, with no automatic mount.
        pod = json.loads(raw)["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        [access] = [v for v in pod["volumes"] if "projected" in v]
        [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == access["name"]]
        assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
        listed = json.loads(helm.run("list", "--namespace", release_ns, "-o", "json").stdout)
        assert [(r["name"], r["status"]) for r in listed] == [(release, "deployed")]
        notes = helm.run("get", "notes", release, "--namespace", release_ns).stdout
        assert "devicePlugin.config.name=gpushare-device-plugin-configs" in notes
        assert "label gpushare.dev/gpu-memory: <quantity>" in notes
    finally:
        helm.run("uninstall", release, "--namespace", release_ns, "--wait", "--timeout", "60s")

    assert release_objects(control_plane, release) == []
    status, raw = control_plane.request(
        "GET", f"/api/v1/namespaces/{release_ns}/secrets?labelSelector=owner%3Dhelm"
    )
    assert json.loads(raw)["items"] == []  # Helm's own release record is gone too
    for crd in ("gpusharingpolicies.gpushare.dev", "gpunodestates.gpushare.dev"):
        status, _ = control_plane.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
        )
        assert status == 200, f"{crd} must outlive the release"


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

        # The documented uninstall: policies first, while the operator runs (it releases the
        # node and lifts its finalizer), then the release.
        finalized = await h.get_policy(sim.client, policy)
        assert finalized["metadata"]["finalizers"] == ["gpushare.dev/release-nodes"]
        await h.delete_policy(sim.client, policy)
        await eventually(
            lambda: sim.client.get(f"{h.API}/gpusharingpolicies/{policy}"),
            until=lambda answer: answer[0] == 404,
            timeout=60,
            what="the policy gone once its node is released",
        )
        labels = (await h.node(sim.client, node))["metadata"]["labels"]
        assert h.CONFIG_LABEL not in labels and h.POLICY_LABEL not in labels
        operator.stop()

        # Uninstall: the release's objects go, the CRDs stay.
        helm.run("uninstall", release, "-n", release_ns, "--wait", "--timeout", "60s")
        assert release_objects(control_plane, release) == []
        for crd in CRDS:
            status, _ = control_plane.request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
            )
            assert status == 200, f"{crd} must outlive the release"


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


CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def webhook_configuration(plane: ControlPlane, name: str) -> dict[str, Any]:
    status, raw = plane.request("GET", f"{CONFIGURATIONS}/{name}")
    assert status == 200, raw
    body: dict[str, Any] = json.loads(raw)
    return body


def test_helm_upgrade_keeps_the_ca_bundle_the_operator_published(
    control_plane: ControlPlane, helm: Helm, namespaces: list[str]
) -> None:
    release_ns = create_namespace(control_plane, namespaces, "gs")
    plugin_ns = create_namespace(control_plane, namespaces, "plugin")
    release = h.unique("ca")
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
    try:
        # As rendered: the one webhook, calling the Service, with no CA bundle; the API server
        # adds only the default it has for the field the chart leaves out.
        service = {
            "service": {
                "name": f"{full}-webhook",
                "namespace": release_ns,
                "path": webhooks.WEBHOOK_PATH,
                "port": 443,
            }
        }
        configuration = webhook_configuration(control_plane, full)
        [webhook] = configuration["webhooks"]
        assert webhook.pop("namespaceSelector") == {}
        assert configuration["webhooks"] == [webhooks.webhook_entry(service)]

        # The operator's leader publishes its CA bundle so (kube.rotating): a JSON patch.
        now = datetime.datetime.now(datetime.UTC)
        ca = certificates.new_ca(now, datetime.timedelta(days=90))
        bundle = base64.b64encode(certificates.dump_bundle([ca.cert]).encode()).decode()
        patch = [
            {"op": "test", "path": "/webhooks/0/name", "value": webhooks.WEBHOOK_NAME},
            {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle},
        ]
        status, raw = control_plane.request(
            "PATCH",
            f"{CONFIGURATIONS}/{full}?fieldManager=gpushare-operator",
            body=patch,
            content_type="application/json-patch+json",
        )
        assert status == 200, raw

        def upgrade(setting: str) -> dict[str, Any]:
            helm.run(
                "upgrade", release, str(CHART), "-n", release_ns, "--reuse-values", "--set", setting
            )
            [webhook] = webhook_configuration(control_plane, full)["webhooks"]
            return dict(webhook)

        # An upgrade that changes something else leaves the bundle as the operator wrote it...
        webhook = upgrade("operator.writeQps=50")
        assert webhook["clientConfig"].get("caBundle") == bundle
        # ...and so does one that changes the webhook itself.
        webhook = upgrade("webhook.timeoutSeconds=7")
        assert webhook["timeoutSeconds"] == 7
        assert webhook["clientConfig"] == {**service, "caBundle": bundle}
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
    volumes = [v["name"] for v in plain["spec"]["template"]["spec"]["volumes"]]
    assert volumes == ["tmp", "api-access"]  # scratch space and the API token: no certificate

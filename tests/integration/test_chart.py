"""The Helm chart, rendered with the real ``helm``: lint, template, values, RBAC, refusals.

On a cluster (dry run, install, upgrade, uninstall): test_chart_install.py.

Values reach the operator as ``GPUSHARE_<FLAG>`` variables; the rendered environment is parsed
back by the operator's own argument parser, so a chart value the operator would refuse, or an
operator flag the chart cannot set, fails here rather than in a cluster.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import urllib.request
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.config import incluster_config

from gpushare_operator.app import settings
from gpushare_testing import webhooks
from gpushare_testing.controlplane import free_port
from gpushare_testing.helm import INSTANCE, Helm, Manifest
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.paths import CHART

DASHBOARD = CHART / "dashboards" / "gpushare-operator.json"


def only(manifests: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    found = [
        m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)
    ]
    assert len(found) == 1, f"{kind} *{name_suffix}: {[m['metadata']['name'] for m in found]}"
    return found[0]


def container_env(deployment: Manifest) -> dict[str, Any]:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def plain_env(deployment: Manifest) -> dict[str, str]:
    return {k: v for k, v in container_env(deployment).items() if isinstance(v, str)}


def operator_flags() -> list[str]:
    """Every ``run`` flag the operator declares, without the leading dashes."""
    parser = argparse.ArgumentParser()
    settings.add_run_arguments(parser, env={})
    return sorted(
        option[2:]
        for action in parser._actions
        for option in action.option_strings
        # --no-metrics-insecure is the negation of a flag that has its value already.
        if option.startswith("--") and option != "--help" and not option.startswith("--no-")
    )


# Every operator flag, its chart value and a value unlike any default (a string for --set).
FLAG_VALUES: dict[str, tuple[str, str]] = {
    "namespace": ("operator.namespace", "ops-leases"),
    "identity": ("operator.identity", "replica-seven"),
    "device-plugin-namespace": ("devicePlugin.namespace", "nvidia-ops"),
    "device-plugin-configmap": ("devicePlugin.configMap", "sharing-configs"),
    "mig-parted-configmap": ("devicePlugin.migConfigMap", "mig-layouts"),
    "http-port": ("operator.httpPort", "9123"),
    "metrics-port": ("operator.metricsPort", "9444"),
    "metrics-insecure": ("operator.metricsInsecure", "true"),
    "metrics-cert-file": ("operator.metricsCertFile", "/tls/metrics.crt"),
    "metrics-key-file": ("operator.metricsKeyFile", "/tls/metrics.key"),
    "write-qps": ("operator.writeQps", "7.5"),
    "write-burst": ("operator.writeBurst", "77"),
    "write-concurrency": ("operator.writeConcurrency", "5"),
    "policy-status-max-delay": ("operator.policyStatusMaxDelay", "12.5"),
    "write-backoff-cap": ("operator.writeBackoffCap", "45"),
    "config-propagation-delay": ("operator.configPropagationDelay", "11"),
    "config-key-grace-period": ("operator.configKeyGracePeriod", "222"),
    "mismatch-timeout": ("operator.mismatchTimeout", "333"),
    "max-unavailable": ("operator.maxUnavailable", "25%"),
    "lease-duration": ("operator.leaseDuration", "44"),
    "renew-deadline": ("operator.renewDeadline", "33"),
    "retry-period": ("operator.retryPeriod", "3.5"),
    "log-format": ("operator.logFormat", "console"),
    "dra-sharing": ("operator.draSharing", "true"),
    "webhook-port": ("webhook.port", "9445"),
    "webhook-secret": ("webhook.secretName", "gpu-admission-tls"),
    "webhook-configuration": ("webhook.configurationName", "gpu-admission"),
    "webhook-service": ("webhook.serviceName", "gpu-admission"),
    "webhook-hosts": ("webhook.hosts", "{admission.ops.example}"),  # a list: {a,b} for --set
    "webhook-cert-validity": ("webhook.certValidity", "86400"),
}


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names the API server may call a Service by."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def test_helm_lint_passes(helm: Helm) -> None:
    monitored = (
        "serviceMonitor.enabled=true,metricsCertSecret=metrics-tls,grafanaDashboard.enabled=true,"
        "prometheusRule.enabled=true"
    )
    for extra in ([], ["--set", monitored]):
        result = helm.run("lint", "--strict", str(CHART), *extra)
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout
        assert "[WARNING]" not in result.stdout, result.stdout


def test_every_operator_flag_is_a_value_that_reaches_the_container(helm: Helm) -> None:
    assert sorted(FLAG_VALUES) == operator_flags(), "a flag without a chart value, or vice versa"
    values = (CHART / "values.yaml").read_text()
    undocumented = [f for f in FLAG_VALUES if not re.search(rf"^\s*# --{f}\b", values, re.M)]
    assert undocumented == [], "values.yaml says which flag each value is"
    sets = ",".join(f"{path}={value}" for path, value in FLAG_VALUES.values())
    manifests = helm.template("--set", sets)

    deployment = only(manifests, "Deployment")
    env = plain_env(deployment)
    expected = {flag: value for flag, (_, value) in FLAG_VALUES.items()}
    # A list reaches the container comma-separated. With the Lease in a namespace other than the
    # release's, the chart adds the webhook Service's names: the operator would name the Service
    # in --namespace, and it is in the release namespace, with the pods it selects.
    hosts = ["admission.ops.example", *service_names("gpu-admission", "gpushare-system")]
    expected["webhook-hosts"] = ",".join(hosts)
    for flag, value in expected.items():
        name = "GPUSHARE_" + flag.upper().replace("-", "_")
        assert env.get(name) == value, (flag, env.get(name))
    # What the chart renders is what the operator itself parses, flag for flag.
    parsed = settings.parse_settings([], env=env)
    assert parsed == settings.Settings(
        namespace="ops-leases",
        device_plugin_namespace="nvidia-ops",
        device_plugin_configmap="sharing-configs",
        mig_parted_configmap="mig-layouts",
        http_port=9123,
        metrics_port=9444,
        metrics_insecure=True,
        metrics_cert_file="/tls/metrics.crt",
        metrics_key_file="/tls/metrics.key",
        identity="replica-seven",
        write_qps=7.5,
        write_burst=77,
        write_concurrency=5,
        policy_status_max_delay=12.5,
        write_backoff_cap=45.0,
        config_propagation_delay=11.0,
        config_key_grace_period=222.0,
        mismatch_timeout=333.0,
        max_unavailable="25%",
        log_format="console",
        lease_duration=44.0,
        renew_deadline=33.0,
        retry_period=3.5,
        webhook_port=9445,
        webhook_secret="gpu-admission-tls",
        webhook_configuration="gpu-admission",
        webhook_service="gpu-admission",
        webhook_hosts=tuple(hosts),
        webhook_cert_validity=86400.0,
        dra_sharing=True,
    )
    # The certificate holds the name the API server calls (the Service's, in its namespace).
    assert "gpu-admission.gpushare-system.svc" in parsed.webhook_names()
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [
        {"name": "http", "containerPort": 9123, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9444, "protocol": "TCP"},
        {"name": "webhook", "containerPort": 9445, "protocol": "TCP"},
    ]
    # The namespaced permissions follow the namespaces the flags name.
    leases = only(manifests, "Role", "-leader-election")
    assert leases["metadata"]["namespace"] == "ops-leases"
    config = only(manifests, "Role", "-device-plugin-config")
    assert config["metadata"]["namespace"] == "nvidia-ops"
    assert config["rules"][0]["resourceNames"] == ["sharing-configs", "mig-layouts"]
    certificate = only(manifests, "Role", "-webhook-certificate")
    assert certificate["metadata"]["namespace"] == "ops-leases"  # where the operator keeps it
    assert certificate["rules"][1]["resourceNames"] == ["gpu-admission-tls"]
    configuration = only(manifests, "MutatingWebhookConfiguration")
    assert configuration["metadata"]["name"] == "gpu-admission"
    [webhook] = configuration["webhooks"]
    assert webhook["clientConfig"]["service"]["name"] == "gpu-admission"
    assert only(manifests, "Service", "gpu-admission")["metadata"]["namespace"] == "gpushare-system"
    rules = only(manifests, "ClusterRole", "-operator")["rules"]
    [rule] = [r for r in rules if r.get("resourceNames")]
    assert rule["resourceNames"] == ["gpu-admission"]


def test_defaults_match_the_operator_and_are_hardened(helm: Helm) -> None:
    manifests = helm.template(release="gs", namespace="gpushare-system")
    kinds = sorted((m["kind"], m["metadata"].get("namespace", "")) for m in manifests)
    assert kinds == [
        ("ClusterRole", ""),
        ("ClusterRole", ""),
        ("ClusterRole", ""),  # gpushare-policy-admin, for people
        ("ClusterRole", ""),  # gpushare-viewer, for people
        ("ClusterRoleBinding", ""),
        ("Deployment", "gpushare-system"),
        ("MutatingWebhookConfiguration", ""),
        ("NetworkPolicy", "gpushare-system"),
        ("PodDisruptionBudget", "gpushare-system"),
        ("Role", "gpu-operator"),
        ("Role", "gpushare-system"),
        ("Role", "gpushare-system"),
        ("RoleBinding", "gpu-operator"),
        ("RoleBinding", "gpushare-system"),
        ("RoleBinding", "gpushare-system"),
        ("Service", "gpushare-system"),
        ("Service", "gpushare-system"),
        ("ServiceAccount", "gpushare-system"),
        ("ValidatingAdmissionPolicy", ""),  # TimeSlicing and MPS under DRA refused
        ("ValidatingAdmissionPolicy", ""),  # the node guard
        ("ValidatingAdmissionPolicy", ""),  # the node label guard
        ("ValidatingAdmissionPolicy", ""),  # the webhook guard
        ("ValidatingAdmissionPolicyBinding", ""),
        ("ValidatingAdmissionPolicyBinding", ""),
        ("ValidatingAdmissionPolicyBinding", ""),
        ("ValidatingAdmissionPolicyBinding", ""),
    ]
    for manifest in manifests:
        assert manifest["metadata"]["labels"][INSTANCE] == "gs"

    deployment = only(manifests, "Deployment")
    env = container_env(deployment)
    # Same defaults as the operator's (the pod's own name is its identity; the webhook's objects
    # are named after the release, like all the chart makes).
    assert env["GPUSHARE_IDENTITY"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    chart = settings.parse_settings([], env={**plain_env(deployment), "GPUSHARE_IDENTITY": "p"})
    operator = settings.parse_settings([], env={"POD_NAMESPACE": "gpushare-system"})
    assert chart == dataclasses.replace(
        operator,
        identity="p",
        webhook_secret="gs-gpushare-operator-webhook-tls",
        webhook_configuration="gs-gpushare-operator",
        webhook_service="gs-gpushare-operator-webhook",
    )
    assert env["GPUSHARE_LOG_FORMAT"] == "json"

    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == only(manifests, "ServiceAccount")["metadata"]["name"]
    [container] = pod["containers"]
    assert container["image"] == "localhost/gpushare-operator:0.1.0"  # what `make image` names
    assert container["imagePullPolicy"] == "Always"  # a tag can move
    assert "command" not in container  # the image's entrypoint runs the operator
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["runAsNonRoot"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][bound])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8443, "protocol": "TCP"},
        {"name": "webhook", "containerPort": 9443, "protocol": "TCP"},
    ]
    assert env["GPUSHARE_METRICS_INSECURE"] == "false"

    budget = only(manifests, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = only(manifests, "Service", "-metrics")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "https-metrics", "port": 8443, "targetPort": "metrics", "protocol": "TCP"}
    ]


def granted_by(role: Manifest) -> dict[tuple[str, str], list[str]]:
    return {
        (group, resource): sorted(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_rbac_is_least_privilege(helm: Helm) -> None:
    manifests = helm.template(release="gs", namespace="gpushare-system")
    cluster = only(manifests, "ClusterRole", "-operator")
    granted = granted_by(cluster)
    # Asking the API server who a /metrics caller is and what it may do: nothing is read.
    assert granted.pop(("authentication.k8s.io", "tokenreviews")) == ["create"]
    assert granted.pop(("authorization.k8s.io", "subjectaccessreviews")) == ["create"]
    # The memory-request webhook's configuration: the leader keeps its caBundle, by name.
    webhook_rules = [r for r in cluster["rules"] if "resourceNames" in r]
    assert webhook_rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": ["gs-gpushare-operator"],
            "verbs": ["get", "list", "watch", "patch"],
        }
    ]
    granted.pop(("admissionregistration.k8s.io", "mutatingwebhookconfigurations"))
    assert granted == {
        ("", "nodes"): ["get", "list", "patch", "watch"],
        ("", "pods"): ["get", "list", "watch"],
        ("", "pods/eviction"): ["create"],  # podPolicy Evict: never a delete
        ("policy", "poddisruptionbudgets"): ["get", "list", "watch"],  # its choice of victims
        ("", "events"): ["create"],
        ("gpushare.dev", "gpusharingpolicies"): ["get", "list", "patch", "watch"],
        ("gpushare.dev", "gpusharingpolicies/status"): ["patch"],
        ("gpushare.dev", "gpunodestates"): ["create", "get", "list", "watch"],
        ("gpushare.dev", "gpunodestates/status"): ["patch"],
        ("resource.k8s.io", "resourceslices"): ["get", "list", "watch"],  # backend DRA: read
        ("resource.k8s.io", "resourceclaims"): ["get", "list", "watch"],  # its allocations
        # Backend DRA's DeviceClasses: applied, and deleted once no policy wants one (the only
        # delete the operator is granted; its owner policies may outlive its use).
        ("resource.k8s.io", "deviceclasses"): ["create", "delete", "get", "list", "patch", "watch"],
    }
    reader = only(manifests, "ClusterRole", "-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    insecure = helm.template("--set", "operator.metricsInsecure=true")
    assert not {"tokenreviews", "subjectaccessreviews"} & {
        resource for _, resource in granted_by(only(insecure, "ClusterRole", "-operator"))
    }, "plain-HTTP metrics need no reviews"
    # Every rule the operator's own identity is granted (the roles for people, bound by the
    # admin to whoever owns GPU sharing, are docs/access.md's: test_user_roles.py).
    people = {"gpushare-policy-admin", "gpushare-viewer"}
    every_rule = [
        r
        for m in manifests
        if m["kind"] in ("Role", "ClusterRole") and m["metadata"]["name"] not in people
        for r in m["rules"]
    ]
    for rule in every_rule:
        names = rule["verbs"] + rule.get("resources", []) + rule.get("apiGroups", [])
        assert "*" not in names + rule.get("nonResourceURLs", []), rule
        forbidden = {"delete", "deletecollection", "escalate", "bind", "impersonate"}
        if rule.get("resources") == ["deviceclasses"]:
            forbidden -= {"delete"}
        assert not forbidden & set(rule["verbs"]), rule
    # Secrets: the webhook's serving certificate alone, in the operator's namespace. Creating
    # one cannot be narrowed by name (the name is in the body); the rest is by name.
    certificate = only(manifests, "Role", "-webhook-certificate")
    assert certificate["metadata"]["namespace"] == "gpushare-system"
    assert certificate["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["gs-gpushare-operator-webhook-tls"],
            "verbs": ["get", "list", "watch", "patch"],
        },
    ]
    assert [
        m["metadata"]["name"]
        for m in manifests
        if m["kind"] in ("Role", "ClusterRole")
        and any("secrets" in r.get("resources", []) for r in m["rules"])
    ] == [certificate["metadata"]["name"]]
    binding = only(manifests, "RoleBinding", "-webhook-certificate")
    assert binding["metadata"]["namespace"] == "gpushare-system"
    assert binding["roleRef"]["name"] == certificate["metadata"]["name"]
    assert not [
        m for m in manifests if m["kind"] == "Role" and m["metadata"]["name"].endswith("-events")
    ], "Events are created under the ClusterRole: no Role repeats it"
    config = only(manifests, "Role", "-device-plugin-config")
    assert config["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["gpushare-device-plugin-configs", "gpushare-mig-parted-config"],
            "verbs": ["get", "list", "watch", "create", "patch"],
        }
    ]
    account = only(manifests, "ServiceAccount")["metadata"]["name"]
    for binding in (m for m in manifests if m["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": "gpushare-system"}
        ]


def test_service_monitor_and_dashboard_are_optional(helm: Helm) -> None:
    manifests = helm.template(
        "--set",
        "serviceMonitor.enabled=true,serviceMonitor.labels.release=prom,grafanaDashboard.enabled=true",
        "--set",
        "metricsCertSecret=metrics-tls",
    )
    monitor = only(manifests, "ServiceMonitor")
    service = only(manifests, "Service", "-metrics")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpushare-system"]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    # Prometheus scrapes over HTTPS with its own token (bound to the metrics-reader role).
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    # ...to an endpoint it verified: by default with the CA of the certificate's own Secret
    # (cert-manager puts it in ca.crt), for the name of the Service it scrapes.
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "metrics-tls", "key": "ca.crt"}},
        "serverName": "gs-gpushare-operator-metrics.gpushare-system.svc",
        "insecureSkipVerify": False,
    }

    dashboard = only(manifests, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboard["data"]["gpushare-operator.json"])
    assert board == json.loads(DASHBOARD.read_text())
    assert dashboard_metrics(board)  # it charts something


def monitor_tls(helm: Helm, *settings: str) -> Any:
    manifests = helm.template("--set", ",".join(("serviceMonitor.enabled=true", *settings)))
    [endpoint] = only(manifests, "ServiceMonitor")["spec"]["endpoints"]
    return endpoint.get("tlsConfig")


def test_the_service_monitor_verifies_the_certificate_unless_told_not_to(helm: Helm) -> None:
    # The default: the operator's certificate is self-signed, which Prometheus cannot verify,
    # and the chart refuses to send Prometheus' token there unverified.
    result = helm.render("--set", "serviceMonitor.enabled=true", check=False)
    assert result.returncode != 0, result.stdout
    assert "cannot verify the self-signed certificate" in result.stderr, result.stderr
    assert "metricsCertSecret" in result.stderr and "insecureSkipVerify=true" in result.stderr
    # A CA of one's own (in the ServiceMonitor's namespace), and a name of one's own.
    assert monitor_tls(
        helm,
        "serviceMonitor.namespace=monitoring",
        "serviceMonitor.tlsConfig.ca.configMap.name=metrics-ca",
        "serviceMonitor.tlsConfig.ca.configMap.key=ca.crt",
        "serviceMonitor.tlsConfig.serverName=ops.example",
    ) == {
        "ca": {"configMap": {"name": "metrics-ca", "key": "ca.crt"}},
        "serverName": "ops.example",
        "insecureSkipVerify": False,
    }
    # Prometheus reads the CA in the ServiceMonitor's namespace: the certificate's Secret is
    # not there when the ServiceMonitor lives elsewhere.
    result = helm.render(
        "--set",
        "serviceMonitor.enabled=true,metricsCertSecret=tls,serviceMonitor.namespace=monitoring",
        check=False,
    )
    assert result.returncode != 0, result.stdout
    assert "ServiceMonitor's namespace (monitoring)" in result.stderr, result.stderr
    # Other TLSConfig fields pass as given: a CA file in Prometheus' pod is a CA too.
    assert monitor_tls(helm, "serviceMonitor.tlsConfig.caFile=/etc/prometheus/ca.crt") == {
        "caFile": "/etc/prometheus/ca.crt",
        "serverName": "gs-gpushare-operator-metrics.gpushare-system.svc",
        "insecureSkipVerify": False,
    }
    # Skipping verification only when a value says so, and then nothing else is claimed.
    assert monitor_tls(helm, "serviceMonitor.tlsConfig.insecureSkipVerify=true") == {
        "insecureSkipVerify": True
    }
    # Plain HTTP metrics (no token, no TLS): nothing to verify.
    assert monitor_tls(helm, "operator.metricsInsecure=true") is None


def dashboard_metrics(board: Mapping[str, Any]) -> set[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    return {name for expr in exprs for name in re.findall(r"\bgpushare_[a-z_]+", expr)}


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("operator.logFormat=xml", "logFormat"),
        ("operator.writeQps=-1", "writeQps"),
        ("operator.httpPort=0", "httpPort"),
        ("operator.retryPeriod=0", "retryPeriod"),
        ("operator.writeQpss=5", "writeQpss"),
        ("operator.renewDeadline=20", "renewDeadline"),
        ("devicePlugin.namespace=Not_A_Namespace", "namespace"),
        ("podDisruptionBudget.minAvailable=2", "minAvailable"),
        ("operator.metricsPort=8080", "must differ"),
        ("operator.metricsCertFile=/tls/c.crt", "metricsKeyFile"),
        ("operator.metricsInsecure=yes", "metricsInsecure"),
        ("webhook.port=8080", "must differ"),
        ("webhook.port=8443", "must differ"),
        ("webhook.timeoutSeconds=31", "timeoutSeconds"),
        ("webhook.certValidity=10", "certValidity"),
        ("webhook.certValidity=12.5", "at least 30 seconds"),  # a string, for the template
        ("webhook.hosts={a b}", "hosts"),
        ("webhook.serviceName=9lives", "serviceName"),
        ("webhook.enable=false", "enable"),
    ],
)
def test_bad_values_are_refused(helm: Helm, setting: str, complaint: str) -> None:
    result = helm.render("--set", setting, check=False)
    assert result.returncode != 0, result.stdout
    assert complaint in result.stderr, result.stderr


async def test_the_dashboard_charts_metrics_the_operator_exports(
    crds_installed: None,
    namespace: str,
    start_operator: OperatorFactory,
    webhook_flags: webhooks.WebhookFlags,
) -> None:
    # With the webhook on, as the chart runs it: its certificate's gauges are charted too.
    operator = await start_operator(
        "--device-plugin-namespace", namespace, *webhook_flags.args(port=free_port())
    )
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"  # insecure: see conftest
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: ASYNC210 - one local read
        text = response.read().decode()
    families = dict(re.findall(r"^# TYPE (gpushare_[a-z_]+) ([a-z]+)$", text, re.M))
    assert "gpushare_writes_total" in families  # labelled families show before any sample
    missing = []
    for name in sorted(dashboard_metrics(json.loads(DASHBOARD.read_text()))):
        base, _, suffix = name.rpartition("_")
        if name in families or (families.get(base) == "histogram" and suffix in HISTOGRAM):
            continue
        missing.append(name)
    assert not missing, f"the dashboard charts metrics the operator lacks: {missing}"


HISTOGRAM = {"bucket", "sum", "count"}


def guard_of(manifests: list[Manifest], suffix: str = "-node-guard") -> tuple[Manifest, Manifest]:
    """A guard's policy and binding among the manifests (by default, the node guard)."""
    return (
        only(manifests, "ValidatingAdmissionPolicy", suffix),
        only(manifests, "ValidatingAdmissionPolicyBinding", suffix),
    )


def test_the_node_guard_is_rendered_for_the_chart_service_account_and_can_be_turned_off(
    helm: Helm,
) -> None:
    policy, binding = guard_of(helm.template(release="gs", namespace="gpushare-system"))
    assert policy["metadata"]["name"] == "gs-gpushare-operator-node-guard"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    [condition] = policy["spec"]["matchConditions"]
    account = "system:serviceaccount:gpushare-system:gs-gpushare-operator"
    assert condition["expression"] == f'request.userInfo.username in ["{account}"]'
    assert policy["spec"]["failurePolicy"] == "Fail"
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"]
    assert rule["apiVersions"] == ["v1"]  # a wildcard would turn off the type check
    assert rule["resources"] == ["nodes", "nodes/status"]
    owned = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["ownedKeys"]
    assert yaml.safe_load(owned) == [
        "nvidia.com/device-plugin.config",
        "nvidia.com/mig.config",
        "nvidia.com/gpu.deploy.device-plugin",  # backend DRA takes the device plugin off a node
    ]

    # Extra label keys and other identities are values; the keys are checked as label keys.
    policy, _ = guard_of(
        helm.template(
            "--set",
            "nodeGuard.extraLabelKeys={nvidia.com/gpu.workload.config},nodeGuard.users={alice,bob}",
        )
    )
    owned = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["ownedKeys"]
    assert yaml.safe_load(owned) == [
        "nvidia.com/device-plugin.config",
        "nvidia.com/mig.config",
        "nvidia.com/gpu.deploy.device-plugin",
        "nvidia.com/gpu.workload.config",
    ]
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"] == 'request.userInfo.username in ["alice","bob"]'
    bad = helm.render("--set", "nodeGuard.extraLabelKeys={not a key}", check=False)
    assert bad.returncode != 0 and "extraLabelKeys" in bad.stderr, bad.stderr

    # Off: none of the guards is rendered. Older than 1.30: refused unless it is off.
    off = helm.template("--set", "nodeGuard.enabled=false")
    assert not {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} & {
        m["kind"] for m in off if not m["metadata"]["name"].endswith("-dra-sharing")
    }
    old = helm.render("--kube-version", "1.29.9", check=False)
    assert old.returncode != 0
    assert "needs Kubernetes 1.30" in old.stderr and "nodeGuard.enabled=false" in old.stderr
    helm.render("--kube-version", "1.29.9", "--set", "nodeGuard.enabled=false")


def test_the_label_and_webhook_guards_are_rendered_for_the_operator(helm: Helm) -> None:
    manifests = helm.template(release="gs", namespace="gpushare-system")
    account = "system:serviceaccount:gpushare-system:gs-gpushare-operator"

    # The label guard: everyone but the operator and the exempt groups, on create and update.
    labels, binding = guard_of(manifests, "-node-guard-labels")
    assert binding["spec"] == {
        "policyName": labels["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert labels["spec"]["failurePolicy"] == "Fail"
    [rule] = labels["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert rule["apiVersions"] == ["v1"]
    assert rule["resources"] == ["nodes", "nodes/status"]
    conditions = {c["name"]: c["expression"] for c in labels["spec"]["matchConditions"]}
    assert conditions["not-the-operator"] == f'!(request.userInfo.username in ["{account}"])'
    assert 'g in ["system:masters"]' in conditions["not-exempt"]
    nobody = guard_of(
        helm.template("--set-json", "nodeGuard.exemptGroups=[]"), "-node-guard-labels"
    )[0]
    assert [c["name"] for c in nobody["spec"]["matchConditions"]] == ["not-the-operator"]
    ops = guard_of(
        helm.template("--set-json", 'nodeGuard.exemptGroups=["ops:admins"]'), "-node-guard-labels"
    )[0]
    assert 'g in ["ops:admins"]' in ops["spec"]["matchConditions"][1]["expression"]
    # A group that would let kubelets (or everyone) through is refused.
    for group in ("system:nodes", "system:authenticated", "system:serviceaccounts"):
        bad = helm.render("--set-json", f'nodeGuard.exemptGroups=["{group}"]', check=False)
        assert bad.returncode != 0 and "exemptGroups" in bad.stderr, (group, bad.stderr)

    # The webhook guard: the operator's identity, on every write of webhook configurations.
    webhook, binding = guard_of(manifests, "-webhook-guard")
    assert binding["spec"] == {
        "policyName": webhook["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert webhook["spec"]["failurePolicy"] == "Fail"
    [rule] = webhook["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {
        "apiGroups": ["admissionregistration.k8s.io"],
        "apiVersions": ["v1"],  # a wildcard would turn off the type check
        "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": ["mutatingwebhookconfigurations"],
    }
    [condition] = webhook["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username in ["{account}"]'
    others = guard_of(helm.template("--set", "nodeGuard.users={alice}"), "-webhook-guard")[0]
    assert others["spec"]["matchConditions"][0]["expression"] == (
        'request.userInfo.username in ["alice"]'
    )
    # Without the webhook the ClusterRole grants nothing on webhook configurations: no guard.
    for off in ("webhook.enabled=false", "nodeGuard.enabled=false"):
        names = [m["metadata"]["name"] for m in helm.template("--set", off)]
        assert not [n for n in names if n.endswith("-webhook-guard")], (off, names)


def test_the_token_is_a_projected_volume_where_the_in_cluster_config_reads_it(
    helm: Helm,
) -> None:
    """No automatic mount (a scanner's CKV_K8S_38): the pod mounts the token, CA and namespace
    itself, as the automatic mount would lay them out, where the operator's in-cluster
    configuration (kubernetes_asyncio's, which kopf's login is given) reads them."""
    manifests = helm.template()
    assert only(manifests, "ServiceAccount")["automountServiceAccountToken"] is False
    pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    [volume] = [v for v in pod["volumes"] if "projected" in v]
    files: dict[str, Any] = {}
    for source in volume["projected"]["sources"]:
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            files[token["path"]] = token
        for kind in ("configMap", "downwardAPI"):
            for item in source.get(kind, {}).get("items", ()):
                files[item["path"]] = {kind: source[kind].get("name"), **item}
    assert files == {
        # The lifetime the automatic mount gives; the kubelet renews it before it expires.
        "token": {"path": "token", "expirationSeconds": 3607},
        "ca.crt": {"configMap": "kube-root-ca.crt", "key": "ca.crt", "path": "ca.crt"},
        "namespace": {
            "downwardAPI": None,
            "path": "namespace",
            "fieldRef": {"fieldPath": "metadata.namespace"},
        },
    }
    [container] = pod["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    directory = PurePosixPath(mount["mountPath"])
    assert str(directory / "token") == incluster_config.SERVICE_TOKEN_FILENAME
    assert str(directory / "ca.crt") == incluster_config.SERVICE_CERT_FILENAME


def test_the_image_is_pinned_by_digest_when_one_is_given(helm: Helm) -> None:
    digest = "sha256:" + "ab" * 32

    def image(*extra: str) -> tuple[str, str, dict[str, str]]:
        deployment = only(helm.template(*extra), "Deployment")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        annotations = deployment["metadata"].get("annotations") or {}
        return container["image"], container["imagePullPolicy"], annotations

    # By digest: exactly that image, and no need to ask the registry again.
    assert image("--set", f"image.digest={digest}") == (
        f"localhost/gpushare-operator@{digest}",
        "IfNotPresent",
        {},
    )
    # By tag: the tag may move, so it is pulled each time, and the scanner is told why it is
    # not a digest.
    name, policy, annotations = image()
    assert (name, policy) == ("localhost/gpushare-operator:0.1.0", "Always")
    assert annotations["checkov.io/skip1"].startswith("CKV_K8S_43=image.digest is empty")
    # A policy of one's own wins.
    assert image("--set", "image.pullPolicy=IfNotPresent")[1] == "IfNotPresent"


def test_the_network_policy_admits_the_webhook_and_metrics_and_lets_out_the_api_server(
    helm: Helm,
) -> None:
    manifests = helm.template()
    policy = only(manifests, "NetworkPolicy")
    deployment = only(manifests, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    # In: the webhook and /metrics, by the container's port names, from anywhere (the API
    # server's address depends on the cluster; every scrape is authenticated). Not the probes'
    # port: traffic from the pod's own node is always allowed.
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": "webhook", "protocol": "TCP"}]},
        {"ports": [{"port": "metrics", "protocol": "TCP"}]},
    ]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert {"webhook", "metrics"} <= {p["name"] for p in container["ports"]}
    # Out: the API server alone (before or after the kubernetes Service's translation).
    assert policy["spec"]["egress"] == [
        {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    ]

    # Narrowed by values; without the webhook, its port stays closed.
    monitoring = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    control_plane = {"ipBlock": {"cidr": "10.0.0.10/32"}}
    dns = {"ports": [{"port": 53, "protocol": "UDP"}]}
    values = {
        "apiServer": {"to": [control_plane], "ports": [6443]},
        "metricsFrom": [monitoring],
        "extraEgress": [dns],
    }
    narrowed = only(
        helm.template(
            "--set-json", f"networkPolicy={json.dumps(values)}", "--set", "webhook.enabled=false"
        ),
        "NetworkPolicy",
    )
    assert narrowed["spec"]["ingress"] == [
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [monitoring]}
    ]
    assert narrowed["spec"]["egress"] == [
        {"ports": [{"port": 6443, "protocol": "TCP"}], "to": [control_plane]},
        dns,
    ]
    off = helm.template("--set", "networkPolicy.enabled=false")
    assert not [m for m in off if m["kind"] == "NetworkPolicy"]


def test_every_scanner_skip_says_why_and_holds_only_where_its_reason_does(helm: Helm) -> None:
    """A checkov skip is an annotation with the check and why; each is rendered only where
    the chart makes its reason true."""
    digest = "image.digest=sha256:" + "0" * 64
    for extra in ([], ["--set", "webhook.enabled=false"], ["--set", "nodeGuard.enabled=false"]):
        for pinned in ([], ["--set", digest]):
            manifests = helm.template(*extra, *pinned)
            skips = {
                (m["kind"], value.split("=", 1)[0])
                for m in manifests
                for key, value in (m["metadata"].get("annotations") or {}).items()
                if key.startswith("checkov.io/skip")
                and re.fullmatch(r"CKV2?_K8S_\d+=\S.{40,}", value)
            }
            every = [
                key
                for m in manifests
                for key in m["metadata"].get("annotations") or {}
                if key.startswith("checkov.io/")
            ]
            assert len(every) == len(skips), (extra, pinned, every)
            guarded = any(m["metadata"]["name"].endswith("-webhook-guard") for m in manifests)
            expected = {("ClusterRole", "CKV_K8S_155")} if guarded else set()
            if not pinned:
                expected.add(("Deployment", "CKV_K8S_43"))
            assert skips == expected, (extra, pinned)


# The webhook's clientConfig as the chart renders it for release "gs" in gpushare-system.
SERVICE_CONFIG: dict[str, Any] = {
    "service": {
        "name": "gs-gpushare-operator-webhook",
        "namespace": "gpushare-system",
        "path": webhooks.WEBHOOK_PATH,
        "port": 443,
    }
}


def test_the_webhook_is_the_one_the_integration_tests_call_by_url(helm: Helm) -> None:
    manifests = helm.template(release="gs", namespace="gpushare-system")
    configuration = only(manifests, "MutatingWebhookConfiguration")
    assert configuration["metadata"]["name"] == "gs-gpushare-operator"
    assert configuration["webhooks"] == [webhooks.webhook_entry(SERVICE_CONFIG)]
    # The operator's integration tests install the same webhook calling a process by URL: what
    # they prove of it holds for the chart's, which differs in clientConfig alone.
    by_url = webhooks.configuration("tested", port=9443)["webhooks"]
    assert [{**w, "clientConfig": SERVICE_CONFIG} for w in by_url] == configuration["webhooks"]
    tuned = only(
        helm.template("--set", "webhook.timeoutSeconds=12"), "MutatingWebhookConfiguration"
    )
    assert tuned["webhooks"] == [webhooks.webhook_entry(SERVICE_CONFIG, timeout=12)]

    # The operator is told the names the chart gave: the configuration it keeps the caBundle
    # of, and the Service whose names its certificate must hold, even with its Lease elsewhere.
    service = SERVICE_CONFIG["service"]["name"]
    for extra in ([], ["--set", "operator.namespace=ops-leases"]):
        deployment = only(helm.template(*extra), "Deployment")
        parsed = settings.parse_settings(
            [], env={**plain_env(deployment), "GPUSHARE_IDENTITY": "p"}
        )
        assert parsed.webhook_enabled
        assert parsed.webhook_configuration == configuration["metadata"]["name"]
        assert parsed.webhook_service == service
        assert set(service_names(service, "gpushare-system")) <= set(parsed.webhook_names())


def test_the_webhook_service_sends_to_every_replica(helm: Helm) -> None:
    manifests = helm.template(release="gs", namespace="gpushare-system")
    service = only(manifests, "Service", "-webhook")
    deployment = only(manifests, "Deployment")
    assert service["metadata"]["name"] == SERVICE_CONFIG["service"]["name"]
    assert service["metadata"]["namespace"] == "gpushare-system"
    # Every replica, followers too: the Deployment's own selector, nothing that singles one out.
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "https-webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [port] = [p for p in container["ports"] if p["name"] == "webhook"]
    assert port == {"name": "webhook", "containerPort": 9443, "protocol": "TCP"}
    assert plain_env(deployment)["GPUSHARE_WEBHOOK_PORT"] == "9443"
    # Only ready replicas get calls, and /readyz waits for the serving certificate.
    assert "publishNotReadyAddresses" not in service["spec"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # The metrics ServiceMonitor selects its own Service, not this one.
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"


def test_the_webhook_can_be_turned_off(helm: Helm) -> None:
    on = helm.template(release="gs", namespace="gpushare-system")
    off = helm.template("--set", "webhook.enabled=false", release="gs", namespace="gpushare-system")
    full = "gs-gpushare-operator"
    names = {(m["kind"], m["metadata"]["name"]) for m in on} - {
        (m["kind"], m["metadata"]["name"]) for m in off
    }
    assert names == {
        ("MutatingWebhookConfiguration", full),
        ("Service", f"{full}-webhook"),
        ("Role", f"{full}-webhook-certificate"),
        ("RoleBinding", f"{full}-webhook-certificate"),
        ("ValidatingAdmissionPolicy", f"{full}-webhook-guard"),
        ("ValidatingAdmissionPolicyBinding", f"{full}-webhook-guard"),
    }
    deployment = only(off, "Deployment")
    env = plain_env(deployment)
    assert {k: v for k, v in env.items() if "WEBHOOK" in k} == {"GPUSHARE_WEBHOOK_PORT": "0"}
    assert not settings.parse_settings([], env=env).webhook_enabled
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert [p["name"] for p in container["ports"]] == ["http", "metrics"]
    # No permission of its own: no Secret anywhere, no webhook configuration.
    granted = granted_by(only(on, "ClusterRole", "-operator"))
    del granted[("admissionregistration.k8s.io", "mutatingwebhookconfigurations")]
    assert granted_by(only(off, "ClusterRole", "-operator")) == granted
    rules = [r for m in off if m["kind"] in ("Role", "ClusterRole") for r in m["rules"]]
    webhook_resources = {"secrets", "mutatingwebhookconfigurations"}
    assert not [r for r in rules if webhook_resources & set(r.get("resources", []))]
    # Nothing else of it is rendered: the variable that turns it off is all that names it.
    assert re.findall(r"(?i)[\w.-]*webhook[\w.-]*", json.dumps(off)) == ["GPUSHARE_WEBHOOK_PORT"]


def keys_of(value: Any) -> set[str]:
    """Every mapping key anywhere in ``value``."""
    if isinstance(value, dict):
        return set(value).union(*(keys_of(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(keys_of(v) for v in value))
    return set()


def test_the_ca_bundle_is_never_rendered(helm: Helm) -> None:
    """The operator's leader writes the caBundle; a rendered one (even empty) would have every
    helm upgrade overwrite it, and the API server refuse labelled pods until the next publish."""
    for extra in (
        [],
        ["--set", "webhook.timeoutSeconds=9,webhook.hosts={gpushare.example}"],
        ["--set", "webhook.configurationName=other,operator.namespace=ops-leases"],
    ):
        manifests = helm.template(*extra)
        assert any(m["kind"] == "MutatingWebhookConfiguration" for m in manifests)
        for manifest in manifests:
            assert "caBundle" not in keys_of(manifest), manifest["metadata"]["name"]
    for source in sorted((CHART / "templates").iterdir()):
        assert not re.search(r"^\s*caBundle\s*:", source.read_text(), re.M), source.name

"""The chart's PrometheusRule: off by default, and when on, the rule groups of
rules/gpushare-alerts.yaml exactly (the plain rules file is its one source), where and with the
labels the values say."""

from __future__ import annotations

import pytest
import yaml

from gpushare_testing import prometheus as prom
from gpushare_testing.helm import Helm


def test_no_prometheus_rule_by_default(helm: Helm) -> None:
    kinds = {m["kind"] for m in helm.template()}
    assert "PrometheusRule" not in kinds and "Deployment" in kinds


def test_the_prometheus_rule_is_the_rules_file_with_the_labels_asked_for(helm: Helm) -> None:
    manifests = helm.template(
        "--set",
        "prometheusRule.enabled=true,prometheusRule.labels.release=prom,"
        "prometheusRule.namespace=monitoring,prometheusRule.annotations.team=gpu",
    )
    [rule] = [m for m in manifests if m["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "gs-gpushare-operator-alerts"
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "gpushare-operator"
    assert rule["metadata"]["annotations"] == {"team": "gpu"}
    # The alerts' own templates ({{ $labels.policy }}) come through untouched by Helm's.
    assert rule["spec"] == yaml.safe_load(prom.RULES.read_text())
    assert len(prom.alert_rules(rule["spec"])) >= 15
    default = helm.template("--set", "prometheusRule.enabled=true")
    [rule] = [m for m in default if m["kind"] == "PrometheusRule"]
    assert rule["metadata"]["namespace"] == "gpushare-system"  # the release's


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("prometheusRule.enable=true", "enable"),
        ("prometheusRule.enabled=yes", "enabled"),
        ("prometheusRule.labels.release=1", "release"),
    ],
)
def test_bad_prometheus_rule_values_are_refused(helm: Helm, setting: str, complaint: str) -> None:
    result = helm.render("--set", setting, check=False)
    assert result.returncode != 0, result.stdout
    assert complaint in result.stderr, result.stderr

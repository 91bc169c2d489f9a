"""The alert rules (charts/gpushare-operator/rules/gpushare-alerts.yaml) and the dashboard: valid
for promtool, unit-tested alert by alert (tests/alerts/gpushare-alerts.test.yaml), each with a
runbook in docs/operations.md, and naming only metrics the operator exports.

promtool comes from `make prometheus` (GPUSHARE_PROMETHEUS_BIN, which the Makefile exports); a
missing one fails these tests, saying so, rather than skipping them.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import yaml
from prometheus_client.exposition import generate_latest

from gpushare_operator.app import serving
from gpushare_operator.app.assembly import Assembly
from gpushare_operator.app.settings import parse_settings
from gpushare_operator.kube.connection import ApiHandle
from gpushare_testing import prometheus as prom

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
RUNBOOKS = "https://github.com/gpushare/gpushare-operator/blob/main/docs/operations.md#"
SEVERITIES = {"critical", "warning", "info"}
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def anchors(path: Path) -> set[str]:
    """The heading anchors a Markdown renderer makes (the rule of test_docs_links.py, which
    checks the docs' own links with it): lowercase, punctuation dropped, spaces to dashes."""
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            title = match.group(1).replace("`", "").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.fixture(scope="module")
def promtool() -> Path:
    try:
        return prom.binary("promtool")
    except FileNotFoundError as exc:
        pytest.fail(str(exc))


def run(promtool: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


RULES = prom.load_rules()
ALERTS = prom.alert_rules(RULES)
BOARD = json.loads(prom.DASHBOARD.read_text())


def test_the_rules_pass_promtool_check(promtool: Path) -> None:
    done = run(promtool, "check", "rules", str(prom.RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_every_alert_passes_its_unit_tests(promtool: Path) -> None:
    done = run(promtool, "test", "rules", str(prom.RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _cases(alert: str, *, fires: bool) -> list[dict[str, Any]]:
    """The test groups that evaluate ``alert``, each cut to its evaluations where the alert
    fires (``fires``) or where it must not."""
    tests = yaml.safe_load(prom.RULE_TESTS.read_text())
    found = []
    for group in tests["tests"]:
        cases = [
            case
            for case in group.get("alert_rule_test", ())
            if case["alertname"] == alert and bool(case.get("exp_alerts")) == fires
        ]
        if cases:
            found.append({**group, "alert_rule_test": cases})
    return found


def test_every_alert_is_tested_both_firing_and_not(promtool: Path, tmp_path: Path) -> None:
    """Each alert has evaluations where it fires and near misses where it must not, and they
    test its expression: replaced by one that never fires, its firing cases fail; replaced by
    one that always does, its near misses fail.  One promtool run over both mutants of every
    alert, each test file holding only those cases."""
    files = []
    for alert in ALERTS:
        name = alert["alert"]
        for kind, expr, fires in (
            ("never", "vector(1) == 0", True),
            ("always", "vector(1)", False),
        ):
            cases = _cases(name, fires=fires)
            assert cases, f"{name} has no test where it {'fires' if fires else 'must not'}"
            rules = json.loads(json.dumps(RULES))
            for rule in prom.alert_rules(rules):
                if rule["alert"] == name:
                    rule["expr"] = expr
            (tmp_path / f"{name}-{kind}.rules.yaml").write_text(yaml.safe_dump(rules))
            test = {
                "rule_files": [f"{name}-{kind}.rules.yaml"],
                "evaluation_interval": "1m",
                "tests": cases,
            }
            path = tmp_path / f"{name}-{kind}.test.yaml"
            path.write_text(yaml.safe_dump(test))
            files.append(path.name)
    done = run(promtool, "test", "rules", "--junit=junit.xml", *files, cwd=tmp_path)
    suites = ElementTree.parse(tmp_path / "junit.xml").getroot().findall("testsuite")
    outcome = {
        suite.get("name"): int(suite.get("failures") or 0) + int(suite.get("errors") or 0)
        for suite in suites
    }
    assert sorted(outcome) == sorted(files), done.stdout + done.stderr
    passed = sorted(f for f, failures in outcome.items() if failures == 0)
    assert passed == [], f"these mutants pass the tests (an untested side): {passed}"


def test_every_alert_says_how_bad_what_which_object_and_where_its_runbook_is() -> None:
    headings = anchors(OPERATIONS)
    for alert in ALERTS:
        name = alert["alert"]
        assert re.fullmatch(r"Gpushare[A-Z]\w+", name), name
        assert alert["labels"]["severity"] in SEVERITIES, name
        notes = alert["annotations"]
        assert set(notes) == {"summary", "description", "runbook_url"}, name
        # The object it is about, by name: a label the expression keeps.
        assert re.search(r"\{\{ \$labels\.(policy|instance|job|kind) \}\}", notes["description"])
        assert notes["runbook_url"] == RUNBOOKS + name.lower(), name
        assert name.lower() in headings, f"docs/operations.md has no heading {name}"


def test_every_runbook_heading_is_an_alert() -> None:
    """The runbooks section holds one heading per alert and nothing else."""
    text = OPERATIONS.read_text()
    section = text.split("\n## Alerts and runbooks\n", 1)[1].split("\n## ", 1)[0]
    headings = re.findall(r"^### (\S+)$", section, re.M)
    assert headings == [a["alert"] for a in ALERTS]


def test_time_scaling_divides_every_duration_and_nothing_else() -> None:
    rules = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "A",
                        "expr": 'rate(x{a="[5m]"}[15m]) > 0 and y[1h30m:]',
                        "for": "10m",
                    },
                    {"alert": "B", "expr": "max_over_time(z[2m]) > 0.5"},
                ],
            }
        ]
    }
    scaled = prom.time_scaled(rules, 60)
    a, b = scaled["groups"][0]["rules"]
    assert a["for"] == "10s" and "for" not in b
    # A label value that looks like a window is a string, yet [5m] inside it changes too:
    # the shipped rules hold no such string (asserted below).
    assert a["expr"] == 'rate(x{a="[5s]"}[15s]) > 0 and y[1h30m:]'
    assert b["expr"] == "max_over_time(z[2s]) > 0.5"
    assert rules["groups"][0]["rules"][0]["for"] == "10m"  # a copy
    assert prom.scaled_duration("1m", 600) == "1s"  # never 0
    with pytest.raises(ValueError, match="duration"):
        prom.seconds("5 minutes")
    for alert in ALERTS:
        strings = re.findall(r'"(?:[^"\\]|\\.)*"', alert["expr"])
        assert not any("[" in string for string in strings), alert["alert"]
        assert ":" not in "".join(re.findall(r"\[[^\]]*\]", alert["expr"])), "a subquery"


def test_the_crude_metric_reader_reads_what_it_should() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, kind) (rate(a_seconds_bucket{job=~"$job"}'
        "[$__rate_interval]))) / on (pod) group_left b_total * 1e3 > bool 2"
        ' or label_replace(c, "x", "y", "", "") unless absent(d) offset 5m or vector(0)'
    )
    assert sorted(set(prom.metric_names([expr]))) == ["a_seconds_bucket", "b_total", "c", "d"]


def _exported() -> dict[str, str]:
    """Family name -> type, from the exposition of an operator assembled with the defaults
    (the webhook on), with a policy whose status it rendered: what /metrics serves."""
    handle = ApiHandle(configuration=None, api=None)  # type: ignore[arg-type]  # never called
    operator = Assembly(settings=parse_settings([], env={}), handle=handle)
    operator.cache.upsert_policy(
        {
            "metadata": {"name": "p", "uid": "u", "generation": 1},
            "spec": {"strategy": "TimeSlicing", "replicas": 2},
        }
    )
    operator.reconciler.memory.rendered_policies["p"] = {"matchedNodes": 0}
    text = generate_latest(operator.registry).decode()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def _exists(name: str, families: dict[str, str]) -> bool:
    if name in families:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix)
        if base != name and families.get(base) == "histogram":
            return True
    return False


def test_every_metric_the_rules_and_the_dashboard_name_is_exported() -> None:
    families = _exported()
    assert families["gpushare_writes_total"] == "counter"
    exprs = [a["expr"] for a in ALERTS] + [q.expr for q in prom.panel_queries(BOARD)]
    for variable in BOARD["templating"]["list"]:
        if variable.get("type") == "query":  # label_values(<selector>, <label>)
            query = variable["query"]["query"]
            exprs.append(re.fullmatch(r"label_values\((.+), *\w+\)", query).group(1))  # type: ignore[union-attr]
    names = set(prom.metric_names(exprs))
    assert {"gpushare_leader", "gpushare_writes_total", "gpushare_rollout_stalled"} <= names
    unknown = sorted(n for n in names if not _exists(n, families))
    assert unknown == [], f"named in the rules or the dashboard, not exported: {unknown}"


class _Reviews:
    """What serving.AccessCounts reads of the /metrics access reviewer."""

    outcomes = {"cached": 3, "reviewed": 1}
    allowed = {"digest": object()}
    denied: dict[str, object] = {}


def test_the_whole_exposition_passes_promtool_check_metrics(promtool: Path) -> None:
    """Every family the operator can serve (the webhook's and the /metrics access review's
    too), each with samples: names, units, _total and help as promtool's linter wants them.
    The integration test checks a live operator's scrape the same way."""
    handle = ApiHandle(configuration=None, api=None)  # type: ignore[arg-type]  # never called
    operator = Assembly(settings=parse_settings([], env={}), handle=handle)
    operator.registry.register(serving.AccessCounts(_Reviews()))  # type: ignore[arg-type]
    telemetry = operator.telemetry
    telemetry.wrote("configmap", "http_403", 0.01)
    telemetry.event_ingested("Node", 0.001)
    telemetry.reconciled("Node", 0.001)
    telemetry.informer_failed("Pod", "connection")
    telemetry.admission_took(0.0004, 0.002, 0.001)
    text = generate_latest(operator.registry).decode()
    assert "gpushare_metrics_access_total" in text and "gpushare_webhook_certificate" in text
    done = subprocess.run(
        [str(promtool), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")

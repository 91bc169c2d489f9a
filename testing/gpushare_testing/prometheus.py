"""A real Prometheus for the tests: the ``prometheus`` and ``promtool`` that ``make prometheus``
builds from their Go module, the chart's alert rules and dashboard, and a small client of
Prometheus' HTTP API.

The alert rules are the shipped ones (``charts/gpushare-operator/rules/gpushare-alerts.yaml``).
Their ``for:`` durations and range windows are minutes long, which a test cannot wait out: a
test loads them through ``time_scaled``, which divides every duration in them (``for:`` and the
range selectors of each expression, nothing else) by one factor, and is itself unit-tested.
The expressions, thresholds, labels and annotations stay exactly as shipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpushare_testing.controlplane import free_port
from gpushare_testing.paths import CHART, ROOT

RULES = CHART / "rules" / "gpushare-alerts.yaml"
DASHBOARD = CHART / "dashboards" / "gpushare-operator.json"
RULE_TESTS = ROOT / "tests" / "alerts" / "gpushare-alerts.test.yaml"

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
# A range selector's duration: ``[15m]``, ``[1h30m]`` (no subqueries in the rules).
_RANGE = re.compile(r"\[((?:\d+(?:ms|s|m|h|d|w|y))+)\]")


def default_bin_dir() -> Path:
    """Where ``make prometheus`` puts the binaries (``GPUSHARE_PROMETHEUS_BIN`` overrides it)."""
    env = os.environ.get("GPUSHARE_PROMETHEUS_BIN")
    if env:
        return Path(env)
    versions = (ROOT / "tests/prometheus/versions.mk").read_text()
    pins = dict(line.split(" := ", 1) for line in versions.splitlines() if " := " in line)
    return ROOT / ".cache/prometheus" / pins["PROMETHEUS_VERSION"] / "bin"


def binary(name: str) -> Path:
    """``prometheus`` or ``promtool``; FileNotFoundError, saying how to build it, if absent."""
    path = default_bin_dir() / name
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path} missing: run `make prometheus`")
    return path


# -- the rules, time-scaled ---------------------------------------------------------------------


def seconds(duration: str) -> float:
    """A Prometheus duration (``90s``, ``1h30m``) in seconds."""
    if not _DURATION.match(duration):
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(duration))


def scaled_duration(duration: str, factor: float) -> str:
    """``duration`` divided by ``factor``, in whole seconds, at least 1 s."""
    return f"{max(1, round(seconds(duration) / factor))}s"


def time_scaled(groups: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """The rule groups with every ``for:`` and every range window divided by ``factor``: the
    same alerts, on a clock ``factor`` times faster (``[15m]`` and ``for: 15m`` become 15 s at
    60).  Nothing else changes; a rule without ``for`` keeps none."""
    scaled: dict[str, Any] = json.loads(json.dumps(groups))  # a deep copy of plain data
    for group in scaled["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = scaled_duration(rule["for"], factor)
            rule["expr"] = _RANGE.sub(
                lambda m: f"[{scaled_duration(m.group(1), factor)}]", rule["expr"]
            )
    return scaled


def load_rules(path: Path = RULES) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def alert_rules(groups: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in groups["groups"] for rule in group["rules"] if "alert" in rule]


# -- the dashboard's queries --------------------------------------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str  # as the dashboard says it, with Grafana's variables


def panel_queries(board: Mapping[str, Any]) -> list[PanelQuery]:
    """Every query of every panel (rows hold none; a collapsed row's panels are inside it)."""
    found = []

    def walk(panels: Iterable[Mapping[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", ()):
                found.append(PanelQuery(panel["title"], target.get("refId", ""), target["expr"]))
            walk(panel.get("panels", ()))

    walk(board["panels"])
    return found


def grafana_expanded(expr: str, *, rate_interval: str, variables: Mapping[str, str]) -> str:
    """``expr`` as Grafana sends it: ``$__rate_interval`` and ``$__interval`` replaced, and each
    ``$name`` / ``${name}`` by ``variables[name]`` (an All of a regex variable: ``.*``)."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)

    def var(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise KeyError(f"the dashboard uses ${name}, which the test does not set")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", var, expr)


# -- the server ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One scrape target: ``host:port`` with the labels Prometheus gives its series."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


class PrometheusAPI:
    """Prometheus' HTTP API at ``url`` (``http://host:port``)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; its ``data``, or AssertionError with Prometheus' error."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector: one entry per series)."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def query_range(
        self, expr: str, *, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=f"{start}", end=f"{end}", step=f"{step}")
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now, as /api/v1/alerts lists them."""
        return list(self.api("alerts")["alerts"])

    def targets_up(self) -> list[dict[str, Any]]:
        return [t for t in self.api("targets")["activeTargets"] if t.get("health") == "up"]


class PrometheusServer(PrometheusAPI):
    """A ``prometheus`` process on 127.0.0.1 with its TSDB in ``workdir``, scraping ``targets``
    (job ``job``) and evaluating ``rules``; stop it with ``stop``."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[Target],
        *,
        rules: Mapping[str, Any] | None = None,
        job: str = "gpushare",
        interval: str = "1s",
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        super().__init__(f"http://127.0.0.1:{self.port}")
        workdir.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": job,
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [
                        {"targets": [t.address], "labels": dict(t.labels)} for t in targets
                    ],
                }
            ],
        }
        if rules is not None:
            (workdir / "rules.yaml").write_text(yaml.safe_dump(dict(rules), sort_keys=False))
            config["rule_files"] = [str(workdir / "rules.yaml")]
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(binary("prometheus")),
                    f"--config.file={workdir / 'prometheus.yaml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.logs()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready in {timeout:.0f} s:\n{self.logs()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def firing(alerts: Iterable[Mapping[str, Any]], name: str, **labels: str) -> bool:
    """Whether an alert ``name`` with (at least) ``labels`` is firing."""
    return any(
        a["labels"].get("alertname") == name
        and a.get("state") == "firing"
        and all(a["labels"].get(k) == v for k, v in labels.items())
        for a in alerts
    )


def active(alerts: Iterable[Mapping[str, Any]], name: str, **labels: str) -> bool:
    """Whether an alert ``name`` with ``labels`` is pending or firing."""
    return any(
        a["labels"].get("alertname") == name
        and all(a["labels"].get(k) == v for k, v in labels.items())
        for a in alerts
    )


def check_metrics(text: str) -> tuple[int, str]:
    """``promtool check metrics`` on one scrape's text: its exit status and what it said."""
    done = subprocess.run(
        [str(binary("promtool")), "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).decode()


def metric_names(exprs: Iterable[str]) -> Iterator[str]:
    """The metric names PromQL expressions select, read crudely but strictly: strings, label
    matchers, range windows and grouping clauses removed, what is left that is an identifier
    and not a function call, a keyword or a number is a metric name."""
    for expr in exprs:
        text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
        text = re.sub(r"\{[^}]*\}", " ", text)
        text = re.sub(r"\[[^\]]*\]", " ", text)
        text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
        for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)\b(?!\s*\()", text):
            name = match.group(1)
            if name in _KEYWORDS or re.fullmatch(r"\d\w*|[eE]\d+|Inf|NaN", name):
                continue
            yield name


_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
    }
)

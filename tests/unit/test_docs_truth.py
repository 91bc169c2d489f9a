"""The reference pages say what the code does.

Every flag, metric, node label, phase, condition, reason and status field the operator defines is
named in docs/api.md or docs/operations.md; every metric, flag and ``gpushare.dev/`` label those
pages (and the README) name exists; and every Markdown table renders as one.  The names are read
from the code itself (the argument parser, the enums, the pydantic models, and a walk over the
package's syntax tree), never from a list kept in this file, so that a new name without its
documentation, or a page naming something that is gone, fails here.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from gpushare_operator.app import settings
from gpushare_operator.core.api import models, statuses

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "gpushare_operator"
API = ROOT / "docs" / "api.md"
OPERATIONS = ROOT / "docs" / "operations.md"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)

# prometheus_client's constructors, and the families collectors build at scrape time.
_METRIC_CALLS = {
    "Counter",
    "Gauge",
    "Histogram",
    "Summary",
    "Info",
    "CounterMetricFamily",
    "GaugeMetricFamily",
    "HistogramMetricFamily",
    "SummaryMetricFamily",
    "InfoMetricFamily",
}
_COUNTERS = {"Counter", "CounterMetricFamily"}
_CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]+$")
_LABEL = re.compile(r"^gpushare\.dev/[a-z0-9][a-z0-9.-]*$")
# What is named gpushare.dev/ but is no label: the API group's version and the finalizer are
# documented as such.
_NOT_LABELS = {"gpushare.dev/v1alpha1"}


# -- reading the code ---------------------------------------------------------------------------


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _callee(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


@cache
def _constants() -> dict[str, str]:
    """Every module-level ``NAME = "text"`` (or ``NAME: Final = "text"``) of the package, by
    name: reasons are often such constants."""
    found: dict[str, str] = {}
    for _, tree in _modules():
        for node in tree.body:
            target, value = None, None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            literal = isinstance(value, ast.Constant) and isinstance(value.value, str)
            if isinstance(target, ast.Name) and literal:
                found[target.id] = value.value  # type: ignore[union-attr]
    return found


def _text(node: ast.AST | None) -> str | None:
    """A string literal, or a module constant named by ``NAME`` or ``module.NAME``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return _constants().get(node.id)
    if isinstance(node, ast.Attribute):
        return _constants().get(node.attr)
    return None


@cache
def metrics() -> dict[str, bool]:
    """Metric name -> whether it is a counter (exposed with ``_total``)."""
    found: dict[str, bool] = {}
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _callee(node) in _METRIC_CALLS and node.args:
                name = _text(node.args[0])
                if name is not None and name.startswith("gpushare_"):
                    found[name] = _callee(node) in _COUNTERS
    return found


@cache
def flags() -> set[str]:
    parser = argparse.ArgumentParser()
    settings.add_run_arguments(parser, env={})
    return {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


@cache
def labels() -> set[str]:
    found = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and _LABEL.match(text) and text not in _NOT_LABELS:
                found.add(text)
    return found


def _reason_nodes(tree: ast.Module) -> Iterator[tuple[str, ast.AST | None]]:
    """(what, expression) for every place the package states a condition type or a reason."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = _callee(node)
            if callee == "Cond" and len(node.args) >= 3:
                yield "condition", node.args[0]
                yield "reason", node.args[2]
            elif callee == "NodeDecision" and len(node.args) >= 3:
                yield "reason", node.args[2]
            elif callee == "Announcement" and len(node.args) >= 2:
                yield "event", node.args[1]
            elif callee == "post":  # the Event recorder, posting one of its own
                for keyword in node.keywords:
                    if keyword.arg == "reason":
                        yield "event", keyword.value
            # An HTTP error's reason ("Gone", "Not Found") is the API server's, not ours.
            if callee in ("ApiError", "__init__"):
                continue
            for keyword in node.keywords:
                if keyword.arg in ("reason", "error_reason"):
                    yield "reason", keyword.value
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and _text(target.slice) == "reason":
                    yield "reason", node.value
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            # ``return "InvalidNodeLabel", message``: the (reason, message) of unsupported().
            elements = node.value.elts
            if len(elements) == 2 and isinstance(
                elements[1], (ast.Name, ast.JoinedStr, ast.Constant)
            ):
                yield "reason", elements[0]


def _rule_tables(tree: ast.Module) -> Iterator[tuple[str, ast.AST | None]]:
    """The event rules of core.announcements: the values of its policy table, and the reasons
    of its node table."""
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = getattr(node, "value", None)
        if not isinstance(target, ast.Name) or not isinstance(value, ast.Dict):
            continue
        if target.id == "_POLICY_RULES":
            for item in value.values:
                yield "event", item
        elif target.id == "_NODE_RULES":
            # A node's Ready reasons are posted as themselves; another condition as its type.
            for key, item in zip(value.keys, value.values, strict=True):
                if _text(key) != "Ready":
                    yield "event", key
                for element in getattr(item, "elts", ()):
                    yield "reason", element
                    if _text(key) == "Ready":
                        yield "event", element
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if names == ["_NODE_NORMAL"]:
                for element in node.value.elts:
                    yield "event", element


@cache
def stated() -> dict[str, frozenset[str]]:
    """Condition types, reasons and Event reasons the package states, by what they are."""
    found: dict[str, set[str]] = {"condition": set(), "reason": set(), "event": set()}
    for _, tree in _modules():
        for what, expression in (*_reason_nodes(tree), *_rule_tables(tree)):
            text = _text(expression)
            if text is not None and _CAMEL.match(text):
                found[what].add(text)
    return {what: frozenset(names) for what, names in found.items()}


def _fields(model: type[BaseModel]) -> Iterator[str]:
    """The names a status shows: fields (by alias) and computed fields, nested ones too."""
    for name, field in model.model_fields.items():
        yield field.alias or name
        for kind in _nested(field.annotation):
            yield from _fields(kind)
    for name, computed in model.model_computed_fields.items():
        yield computed.alias or name


def _nested(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in getattr(annotation, "__args__", ()):
        yield from _nested(argument)


def status_fields() -> set[str]:
    return {
        *_fields(statuses.GPUSharingPolicyStatus),
        *_fields(statuses.GPUNodeStateStatus),
    } - {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}


# -- reading the pages --------------------------------------------------------------------------


def _prose(path: Path) -> str:
    return FENCE.sub("", path.read_text())


def _reference() -> str:
    return API.read_text() + "\n" + OPERATIONS.read_text()


def _named(name: str, text: str) -> bool:
    """Whether the pages name ``name`` as a word of its own (in code, a table or prose)."""
    return re.search(rf"(?<![\w/-]){re.escape(name)}(?![\w/-])", text) is not None


# -- the code's names are documented ------------------------------------------------------------


def test_the_code_is_read() -> None:
    """The readers find what they look for: a change of how the code states a name must not
    leave these tests checking nothing."""
    assert {"--namespace", "--write-qps", "--metrics-insecure"} <= flags()
    assert {"gpushare_writes", "gpushare_leader", "gpushare_rollout_nodes"} <= set(metrics())
    assert metrics()["gpushare_writes"] and not metrics()["gpushare_leader"]
    assert {"gpushare.dev/policy", "gpushare.dev/reconfiguring"} <= labels()
    found = stated()
    assert {"Ready", "Overcommitted", "Conflicting"} <= found["condition"]
    assert {"Verified", "WaitingForPods", "DisablingMIG", "InvalidNodeLabel"} <= found["reason"]
    assert {"InvalidPolicy", "RolloutHalted", "RolloutComplete"} <= found["event"]
    assert {"rollout", "eviction", "configKey", "slotsSummary", "idleWait"} <= status_fields()


def test_every_flag_is_documented() -> None:
    missing = sorted(flag for flag in flags() if not _named(flag, OPERATIONS.read_text()))
    assert missing == [], f"flags missing from docs/operations.md#flags: {missing}"


def test_every_metric_is_documented() -> None:
    text = OPERATIONS.read_text()
    missing = sorted(
        name + ("_total" if counter else "")
        for name, counter in metrics().items()
        if not _named(name + ("_total" if counter else ""), text)
    )
    assert missing == [], f"metrics missing from docs/operations.md#metrics: {missing}"


def test_every_label_is_documented() -> None:
    missing = sorted(label for label in labels() if not _named(label, _reference()))
    assert missing == [], (
        f"gpushare.dev/ names missing from docs/api.md and operations.md: {missing}"
    )


def test_every_phase_is_documented() -> None:
    text = _reference()
    names = [*models.NodePhase, *models.RolloutPhase]
    missing = sorted(str(phase) for phase in names if not _named(f"`{phase}`", text))
    assert missing == []


def _events_section() -> str:
    return OPERATIONS.read_text().split("\n## Events", 1)[1].split("\n## ", 1)[0]


def test_every_event_is_listed_with_the_events() -> None:
    text = _events_section()
    missing = sorted(name for name in stated()["event"] if not _named(f"`{name}`", text))
    assert missing == [], f"Events missing from docs/operations.md#events: {missing}"


@pytest.mark.parametrize("what", ["condition", "reason", "event"])
def test_every_condition_and_reason_is_documented(what: str) -> None:
    text = _reference()
    missing = sorted(name for name in stated()[what] if not _named(f"`{name}`", text))
    assert missing == [], f"{what}s missing from docs/api.md and operations.md: {missing}"


def test_every_status_field_is_documented() -> None:
    text = API.read_text()
    missing = sorted(field for field in status_fields() if not _named(field, text))
    assert missing == [], f"status fields missing from docs/api.md: {missing}"


# -- the pages' names exist ---------------------------------------------------------------------


_DOC_METRIC = re.compile(r"(?<![\w.])gpushare_[a-z0-9_]+")
_NOT_METRICS = {"gpushare_operator", "gpushare_testing"}
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _metric_exists(name: str) -> bool:
    if name in metrics():
        return True
    for suffix in _SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and base in metrics():
            return suffix != "_total" or metrics()[base]
    return False


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_metric_a_page_names_exists(path: Path) -> None:
    named = set(_DOC_METRIC.findall(path.read_text())) - _NOT_METRICS
    unknown = sorted(name for name in named if not _metric_exists(name))
    assert unknown == [], f"{path.name} names metrics the operator does not have: {unknown}"


# A key, or a family of them (``gpushare.dev/slot-*``); not the group of a resource name
# (``gpunodestate.gpushare.dev/gpu-0`` in kubectl's output).
_DOC_LABEL = re.compile(r"(?<![\w.])gpushare\.dev/[a-z0-9][a-z0-9.-]*[a-z0-9](?:-\*)?")


def _label_exists(name: str) -> bool:
    if name.endswith("-*"):
        return any(label.startswith(name[:-1]) for label in labels())
    return name in labels()


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_label_a_page_names_exists(path: Path) -> None:
    named = set(_DOC_LABEL.findall(path.read_text())) - _NOT_LABELS
    unknown = sorted(name for name in named if not _label_exists(name))
    assert unknown == [], (
        f"{path.name} names gpushare.dev/ keys the operator does not use: {unknown}"
    )


def _section_rows(heading: str) -> list[list[str]]:
    """The cells of each row of the first table under ``heading`` in docs/api.md."""
    section = API.read_text().split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    rows = next(_tables(section))
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows[2:]]


def test_every_phase_the_api_page_names_exists() -> None:
    phases = {str(p) for p in (*models.NodePhase, *models.RolloutPhase)}
    rows = _section_rows("### Phases")
    assert len(rows) >= 8
    named = [re.fullmatch(r"`([A-Za-z]+)`", row[0]) for row in rows]
    unknown = [row[0] for row, match in zip(rows, named, strict=True) if not match]
    unknown += [m.group(1) for m in named if m and m.group(1) not in phases]
    assert unknown == [], f"docs/api.md#phases names phases the code does not have: {unknown}"


@pytest.mark.parametrize("heading", ["### Status", "## GPUNodeState"])
def test_every_status_field_the_api_page_names_exists(heading: str) -> None:
    # The names status_fields() leaves out as a condition's keys are fields of ours too.
    fields = status_fields() | {"conditions", "lastTransitionTime", "observedGeneration", "message"}
    rows = _section_rows(heading)
    assert len(rows) >= 8
    unknown = [
        part
        for row in rows
        for name in re.findall(r"`([A-Za-z.]+)`", row[0])
        for part in name.split(".")
        if part not in fields
    ]
    assert unknown == [], (
        f"docs/api.md ({heading}) names status fields that do not exist: {unknown}"
    )


def _flags_table() -> list[str]:
    text = OPERATIONS.read_text()
    section = text.split("\n## Flags", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `--")]
    return [flag for row in rows for flag in re.findall(r"`(--[a-z-]+)`", row.split("|")[1])]


def test_every_flag_the_flags_table_names_exists() -> None:
    named = _flags_table()
    assert len(named) > 10
    unknown = sorted(set(named) - flags())
    assert unknown == [], f"docs/operations.md#flags names flags `run` does not have: {unknown}"


def _conditions_table() -> list[tuple[str, str]]:
    section = API.read_text().split("\n### Conditions", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ")]
    return [(row[1], row[2]) for row in rows[1:] if len(row) > 3]


def test_every_condition_and_reason_the_api_page_names_exists() -> None:
    rows = _conditions_table()
    assert len(rows) > 8
    known = stated()
    unknown = []
    for kind, reasons in rows:
        for name in re.findall(r"`([A-Za-z]+)`", kind):
            if name not in known["condition"]:
                unknown.append(name)
        for name in re.findall(r"`([A-Z][A-Za-z]+)`", reasons):
            if name not in ("True", "False", "Unknown") and name not in known["reason"]:
                unknown.append(name)
    assert unknown == [], f"docs/api.md#conditions names what the operator never states: {unknown}"


def test_every_event_the_operations_page_names_exists() -> None:
    section = _events_section()
    named = set(re.findall(r"`([A-Z][A-Za-z]+)`", section))
    known = stated()
    every = known["event"] | known["reason"] | known["condition"]
    unknown = sorted(
        name for name in named if name not in every and name not in ("Normal", "Warning")
    )
    assert len(named) > 10
    assert unknown == [], (
        f"docs/operations.md#events names Events the operator never posts: {unknown}"
    )


# -- tables render ------------------------------------------------------------------------------


def _tables(text: str) -> Iterator[list[str]]:
    """Runs of consecutive table lines, outside code fences."""
    run: list[str] = []
    for line in FENCE.sub("", text).splitlines():
        if line.lstrip().startswith("|"):
            run.append(line)
        elif run:
            yield run
            run = []
    if run:
        yield run


_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_table_renders_as_one(path: Path) -> None:
    """A table is a header, a separator, then rows: a blank line inside one ends it, and the
    rows after it show as plain text with their bars."""
    broken = [
        run[0][:60]
        for run in _tables(path.read_text())
        if len(run) < 2 or not _SEPARATOR.match(run[1])
    ]
    assert broken == [], f"{path.name}: table lines that render as text: {broken}"

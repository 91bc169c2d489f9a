"""Our label-selector matcher against kube-apiserver's own ``labelSelector`` filtering.

Hypothesis draws selectors; for each one, the API server lists a fixed fleet of Nodes with the
selector's query form and our :meth:`CompiledSelector.matches` decides over the same label
sets.  The two must agree on every selector, which checks the matcher and ``to_query`` at once.

The fleet is created once per module (40 Node creations per example would be far too slow), so
hypothesis cannot draw it: ``label_sets().example()`` is meant for the REPL (it warns, and is not
reproducible).  Instead a seeded ``random.Random`` builds label sets of the same shape as
:func:`tests.strategies.label_sets` from the same pools (``KEY_POOL``, ``VALUE_POOL``,
``RARE_VALUES``), plus keys and values that exercise the rest of the grammar.  The fleet is thus
identical on every run, and hypothesis explores the selector side, where the variety matters.
"""

from __future__ import annotations

import json
import random
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import example, given, settings

from gpushare_operator.core.labelling.selectors import compile_selector
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.strategies import KEY_POOL, RARE_VALUES, VALUE_POOL, selectors

FLEET_SIZE = 40
FLEET_SEED = 20250303
RUN_LABEL = "selprop"
EXAMPLES = 150
# Keys and values no pool has: prefixes, dots, underscores, dashes, upper case, digits.
ODD_KEYS = ("example.com/Under_score.dot-1", "A", "x.y-z.io/9n", "gpushare.dev/TEAM_x")
ODD_VALUES = ("Z-9_z.0", "1", "aB", "a.b")
# Edge cases every run checks first, whatever hypothesis draws: the empty value in each form.
EDGE_CASES: tuple[dict[str, Any], ...] = (
    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["", "a"]}]},
    {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["b", ""]}]},
    {"matchLabels": {"pool": ""}},
    {
        "matchLabels": {"zone": "b"},
        "matchExpressions": [
            {"key": "A", "operator": "Exists"},
            {"key": "example.com/Under_score.dot-1", "operator": "DoesNotExist", "values": []},
        ],
    },
)


def fleet_labels(rng: random.Random) -> dict[str, str]:
    """One node's labels: 5-6 of the pooled keys (as ``label_sets``), then 0-3 odd ones."""

    def value() -> str:
        roll = rng.randrange(10)
        if roll < 8:
            return rng.choice(VALUE_POOL)
        return rng.choice(RARE_VALUES if roll == 8 else ODD_VALUES)

    labels = {key: value() for key in rng.sample(KEY_POOL, rng.choice((5, 6)))}
    for key in rng.sample(ODD_KEYS, rng.randrange(4)):
        labels[key] = value()
    return labels


@dataclass(frozen=True)
class Fleet:
    plane: ControlPlane
    run_id: str
    labels: Mapping[str, Mapping[str, str]]  # node name → its labels, as created

    def list_labels(self, query: str) -> dict[str, dict[str, str]]:
        """The API server's answer to ``labelSelector=selprop=<run>,<query>``: name → labels."""
        selector = ",".join(part for part in (f"{RUN_LABEL}={self.run_id}", query) if part)
        path = "/api/v1/nodes?labelSelector=" + urllib.parse.quote(selector, safe="")
        status, raw = self.plane.request("GET", path)
        assert status == 200, f"labelSelector {selector!r} refused: {status} {raw[:500]!r}"
        items: list[dict[str, Any]] = json.loads(raw)["items"]
        return {item["metadata"]["name"]: item["metadata"].get("labels") or {} for item in items}

    def select(self, query: str) -> set[str]:
        return set(self.list_labels(query))


@pytest.fixture(scope="module")
def fleet(control_plane: ControlPlane) -> Iterator[Fleet]:
    run_id = uuid.uuid4().hex[:8]
    rng = random.Random(FLEET_SEED)
    labels = {
        f"sel-{run_id}-{i}": {**fleet_labels(rng), RUN_LABEL: run_id} for i in range(FLEET_SIZE)
    }
    made = Fleet(plane=control_plane, run_id=run_id, labels=labels)
    try:
        for name, node_labels in labels.items():
            metadata = {"name": name, "labels": node_labels}
            body = {"apiVersion": "v1", "kind": "Node", "metadata": metadata}
            status, raw = control_plane.request("POST", "/api/v1/nodes", body=body)
            assert status == 201, f"{name}: {status} {raw[:500]!r}"
        yield made
    finally:
        selector = urllib.parse.quote(f"{RUN_LABEL}={run_id}", safe="")
        status, raw = control_plane.request("DELETE", f"/api/v1/nodes?labelSelector={selector}")
        assert status == 200, f"cleanup: {status} {raw[:500]!r}"


def test_the_fleet_is_stored_as_drawn(fleet: Fleet) -> None:
    assert fleet.list_labels("") == fleet.labels
    distinct = {frozenset(labels.items()) for labels in fleet.labels.values()}
    assert len(distinct) == FLEET_SIZE
    for key in KEY_POOL:  # every pooled key is present on some nodes and absent on others
        present = sum(key in labels for labels in fleet.labels.values())
        assert 0 < present < FLEET_SIZE, key
    # The edge cases are decided on nodes that have them: some nodes say pool="".
    assert any(labels.get("pool") == "" for labels in fleet.labels.values())
    for raw in EDGE_CASES:
        assert 0 < sum(compile_selector(raw).matches(x) for x in fleet.labels.values()) < FLEET_SIZE


def test_the_api_server_and_our_matcher_select_the_same_nodes(fleet: Fleet) -> None:
    """For every drawn selector: the API server's selection == ours, and the test is not vacuous.

    The property is an inner ``@given`` function (fixtures stay outside hypothesis), so that
    this test can check afterwards what the examples covered.
    """
    outcomes: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None)
    @given(raw=selectors())
    @example(raw=EDGE_CASES[0])
    @example(raw=EDGE_CASES[1])
    @example(raw=EDGE_CASES[2])
    @example(raw=EDGE_CASES[3])
    def agree(raw: dict[str, Any]) -> None:
        compiled = compile_selector(raw)
        ours = {name for name, labels in fleet.labels.items() if compiled.matches(labels)}
        theirs = fleet.select(compiled.to_query())
        assert theirs == ours, (
            f"selector {raw} as {compiled.to_query()!r}: "
            f"only the API server selects {sorted(theirs - ours)}, "
            f"only we select {sorted(ours - theirs)}"
        )
        if compiled.selects_everything:
            outcomes["selects everything"] += 1
        elif not ours:
            outcomes["none"] += 1
        elif len(ours) == FLEET_SIZE:
            outcomes["all"] += 1
        else:
            outcomes["some"] += 1

    agree()
    print(f"selector outcomes over the fleet: {dict(outcomes)}")
    assert outcomes.total() >= EXAMPLES // 2, outcomes
    # Most selectors split the fleet: those are the ones that can disagree node by node.
    assert outcomes["some"] >= outcomes.total() // 4, outcomes
    assert outcomes["none"] > 0, outcomes

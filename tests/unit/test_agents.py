"""The simulated NVIDIA agents' pure rules (``testing.agents``) and per-node state machine."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_testing.agents import (
    MISSING,
    NO_SHARING,
    Sharing,
    backoff_delay,
    gfd_labels,
    parse_device_plugin_config,
    plugin_resources,
    resolve_config_key,
)
from gpushare_testing.nodeagents import NodeAgents, Timing

GPU, SHARED = "nvidia.com/gpu", "nvidia.com/gpu.shared"
PRODUCT = "nvidia.com/gpu.product"


def plugin_config(
    strategy: str | None, replicas: int = 0, *, rename: bool = False, **resource: Any
) -> str:
    """A device-plugin config v1, as the operator renders it."""
    config: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if strategy is not None:
        entry = {"name": GPU, "replicas": replicas, **resource}
        config["sharing"] = {
            strategy: {
                "renameByDefault": rename,
                "failRequestsGreaterThanOne": True,
                "resources": [entry],
            }
        }
    return yaml.safe_dump(config)


TS4 = Sharing("time-slicing", 4)
MPS8R = Sharing("mps", 8, rename_by_default=True)


# -- parse_device_plugin_config -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (plugin_config(None), NO_SHARING),
        ("", NO_SHARING),  # the config manager's empty config (/dev/null)
        ("flags: {migStrategy: none}\n", NO_SHARING),  # no version: the parser assumes v1
        (plugin_config("timeSlicing", 4), TS4),
        (plugin_config("mps", 8, rename=True), MPS8R),
        (plugin_config("timeSlicing", 2, rename=True), Sharing("time-slicing", 2, True)),
        (plugin_config("timeSlicing", 4, devices=[0, "1", "0:1"]), TS4),
        # an explicit rename is dropped by DisableResourceNamingInConfig
        (
            "version: v1\nsharing:\n  timeSlicing:\n"
            "    resources: [{name: nvidia.com/gpu, replicas: 4, rename: gpu.slice}]\n",
            TS4,
        ),
        ("version: v1\nsharing: {mps: null}\n", NO_SHARING),
        (  # a sharing section for another resource only leaves nvidia.com/gpu whole
            "version: v1\nsharing:\n  timeSlicing:\n"
            "    resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}]\n",
            NO_SHARING,
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 3}]\n",
            Sharing("time-slicing", 3),
        ),  # a bare name gets the nvidia.com/ prefix
        # refusals
        (plugin_config("timeSlicing", 1), None),  # replicas must be >= 2
        (plugin_config("mps", 1), None),
        (plugin_config("timeSlicing", 0), None),
        ("version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu}]\n", None),
        ("version: v1\nsharing:\n  timeSlicing:\n    resources: []\n", None),
        ("version: v1\nsharing:\n  timeSlicing: {}\n", None),
        ("version: v1\nsharing:\n  timeSlicing:\n    resources: [{replicas: 2}]\n", None),
        (plugin_config("timeSlicing", 4, devices="some"), None),
        (plugin_config("timeSlicing", 4, devices=0), None),
        (plugin_config("timeSlicing", 4, devices=["GPU-nope"]), None),
        (plugin_config("timeSlicing", "4"), None),  # type: ignore[arg-type]
        (plugin_config("timeSlicing", True), None),
        (
            "version: v1\nsharing:\n  timeSlicing:\n"
            "    resources: [{name: Bad_Name, replicas: 2}]\n",
            None,
        ),
        ("version: v2\n", None),
        ("- a list\n", None),
        ("{not yaml", None),
        ("version: v1\nsharing: [1]\n", None),
        (  # both strategies at once
            "version: v1\nsharing:\n"
            "  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
            "  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
            None,
        ),
        (  # MPS refuses the mixed MIG strategy
            "version: v1\nflags: {migStrategy: mixed}\n"
            "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n",
            None,
        ),
    ],
)
def test_configs_parse_as_the_plugin_reads_them(text: str, expected: Sharing | None) -> None:
    assert parse_device_plugin_config(text) == expected


@given(
    strategy=st.sampled_from(["timeSlicing", "mps"]),
    replicas=st.integers(min_value=-3, max_value=500),
    rename=st.booleans(),
)
def test_any_replica_count_below_two_is_refused_and_the_rest_run(
    strategy: str, replicas: int, rename: bool
) -> None:
    parsed = parse_device_plugin_config(plugin_config(strategy, replicas, rename=rename))
    if replicas < 2:
        assert parsed is None
    else:
        name = "mps" if strategy == "mps" else "time-slicing"
        assert parsed == Sharing(name, replicas, rename)


@given(st.text(max_size=200))
def test_the_parser_never_raises(text: str) -> None:
    assert parse_device_plugin_config(text) is None or isinstance(
        parse_device_plugin_config(text), Sharing
    )


# -- gfd_labels -----------------------------------------------------------------------------

BASE = {
    PRODUCT: "Tesla-T4",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/gfd.timestamp": "1700000000",
    "pool": "a",
}


@pytest.mark.parametrize(
    ("sharing", "product", "replicas", "strategy", "mps"),
    [
        (NO_SHARING, "Tesla-T4", "1", "none", "false"),
        (TS4, "Tesla-T4-SHARED", "4", "time-slicing", "false"),
        (Sharing("mps", 2), "Tesla-T4-SHARED", "2", "mps", "true"),
        (
            Sharing("time-slicing", 4, rename_by_default=True),
            "Tesla-T4",
            "4",
            "time-slicing",
            "false",
        ),
        (MPS8R, "Tesla-T4", "8", "mps", "true"),
    ],
)
def test_gfd_labels_follow_the_sharing(
    sharing: Sharing, product: str, replicas: str, strategy: str, mps: str
) -> None:
    for start in (BASE, {**BASE, PRODUCT: "Tesla-T4-SHARED"}):
        labels = gfd_labels(start, sharing)
        assert labels == {
            **BASE,
            PRODUCT: product,
            "nvidia.com/gpu.replicas": replicas,
            "nvidia.com/gpu.sharing-strategy": strategy,
            "nvidia.com/mps.capable": mps,
        }


sharings = st.builds(
    Sharing,
    strategy=st.sampled_from(["time-slicing", "mps"]),
    replicas=st.integers(min_value=2, max_value=64),
    rename_by_default=st.booleans(),
) | st.just(NO_SHARING)
label_sets = st.dictionaries(
    st.text(min_size=1, max_size=20), st.text(max_size=20), max_size=8
).map(lambda extra: {**extra, **BASE})


@given(labels=label_sets, first=sharings, second=sharings)
def test_gfd_passes_depend_only_on_the_last_sharing_and_touch_nothing_else(
    labels: dict[str, str], first: Sharing, second: Sharing
) -> None:
    once = gfd_labels(labels, second)
    assert gfd_labels(gfd_labels(labels, first), second) == once
    assert gfd_labels(once, second) == once
    untouched = set(labels) - {
        PRODUCT,
        "nvidia.com/gpu.replicas",
        "nvidia.com/gpu.sharing-strategy",
        "nvidia.com/mps.capable",
    }
    assert {k: once[k] for k in untouched} == {k: labels[k] for k in untouched}
    assert once[PRODUCT].endswith("-SHARED") == (second.shared and not second.rename_by_default)


# -- plugin_resources -----------------------------------------------------------------------


def test_plugin_resources_with_and_without_rename() -> None:
    assert plugin_resources(gpus=8, sharing=NO_SHARING) == {GPU: "8", SHARED: None}
    assert plugin_resources(gpus=8, sharing=TS4) == {GPU: "32", SHARED: None}
    # Renamed: nvidia.com/gpu was registered before, so kubelet zeroes it rather than drop it.
    assert plugin_resources(gpus=8, sharing=MPS8R) == {GPU: "0", SHARED: "64"}
    assert plugin_resources(gpus=8, sharing=NO_SHARING, registered=(GPU, SHARED)) == {
        GPU: "8",
        SHARED: "0",
    }
    assert plugin_resources(gpus=8, sharing=MPS8R, registered=()) == {GPU: None, SHARED: "64"}
    assert plugin_resources(gpus=0, sharing=TS4) == {GPU: "0", SHARED: None}


@given(gpus=st.integers(min_value=1, max_value=16), sharing=sharings)
def test_the_advertised_resource_has_gpus_times_replicas(gpus: int, sharing: Sharing) -> None:
    resources = plugin_resources(gpus=gpus, sharing=sharing)
    advertised = SHARED if sharing.shared and sharing.rename_by_default else GPU
    assert resources[advertised] == str(gpus * sharing.replicas)
    assert all(v in (None, "0") for k, v in resources.items() if k != advertised)


# -- the config manager's key and back-off ------------------------------------------------


@pytest.mark.parametrize(
    ("label", "keys", "expected"),
    [
        (None, {"default", "a"}, "default"),
        (None, {"a"}, None),
        ("", {"a"}, None),
        ("default", {"a"}, None),
        ("default", {"default"}, "default"),
        ("a", {"a"}, "a"),
        ("b", {"a", "default"}, MISSING),
    ],
)
def test_config_keys_resolve_as_the_config_manager_does(
    label: str | None, keys: set[str], expected: object
) -> None:
    assert resolve_config_key(label, keys) == expected


def test_backoff_doubles_up_to_its_cap() -> None:
    delays = [backoff_delay(n, initial=10, cap=300) for n in range(1, 9)]
    assert delays == [10, 20, 40, 80, 160, 300, 300, 300]
    assert backoff_delay(10_000, initial=0.5, cap=8) == 8


# -- one node's agents ------------------------------------------------------------------------

VIEW = {"default": plugin_config(None), "ts4": plugin_config("timeSlicing", 4)}
TIMING = Timing(restart_window=2.0, backoff_initial=1.0, backoff_cap=4.0)


def fresh(label: str | None = None, view: dict[str, str] = VIEW) -> NodeAgents:
    return NodeAgents.start(
        gpus=8, capacity={GPU: "8", "cpu": "96"}, label=label, view=view, timing=TIMING, now=0.0
    )


def test_a_new_unshared_node_is_already_configured() -> None:
    agents = fresh()
    assert agents.next_deadline() is None and agents.restarts == 0
    assert agents.status() == {"capacity": {GPU: "8"}, "allocatable": {GPU: "8"}}


def test_a_label_change_restarts_the_plugin_then_gfd_follows() -> None:
    agents = fresh()
    agents.see_label("ts4", now=10.0, view=VIEW)
    assert agents.status() == {"capacity": {GPU: "8"}, "allocatable": {GPU: "0"}}
    assert agents.next_deadline() == 12.0 and not agents.settled(VIEW)
    agents.advance(now=11.9, view=VIEW)
    assert agents.gfd_passes == 0
    agents.advance(now=12.0, view=VIEW)
    assert agents.status()["allocatable"] == {GPU: "32", SHARED: None}
    assert (agents.gfd_sharing, agents.gfd_passes, agents.restarts) == (TS4, 1, 1)
    assert agents.settled(VIEW)
    agents.see_label("ts4", now=13.0, view=VIEW)  # the same value again: nothing
    assert agents.next_deadline() is None


def test_a_content_change_under_the_same_label_does_nothing() -> None:
    agents = fresh("ts4")
    agents.advance(now=2.0, view=VIEW)
    changed = {**VIEW, "ts4": plugin_config("timeSlicing", 2)}
    agents.see_label("ts4", now=5.0, view=changed)
    agents.advance(now=100.0, view=changed)
    assert agents.sharing == TS4 and agents.restarts == 1


def test_a_missing_key_crash_loops_with_backoff_and_keeps_the_old_config() -> None:
    agents = fresh("ts4")
    agents.advance(now=2.0, view=VIEW)
    agents.see_label("gone", now=10.0, view=VIEW)
    for now in (11.0, 13.0, 17.0, 21.0, 25.0):
        agents.advance(now=now, view=VIEW)
    assert agents.cm_failures == [10.0, 11.0, 13.0, 17.0, 21.0, 25.0]
    assert agents.status()["allocatable"] == {GPU: "32", SHARED: None}
    assert agents.settled(VIEW)  # the next run would fail just the same
    healed = {**VIEW, "gone": plugin_config("mps", 2)}
    assert not agents.settled(healed)
    agents.advance(now=29.0, view=healed)
    agents.advance(now=31.0, view=healed)
    assert agents.sharing == Sharing("mps", 2) and agents.cm_failures == []


def test_a_refused_config_leaves_the_plugin_down_until_a_good_one() -> None:
    view = {**VIEW, "bad": plugin_config("timeSlicing", 1)}
    agents = fresh("ts4", view)
    agents.advance(now=2.0, view=view)
    agents.see_label("bad", now=10.0, view=view)
    agents.advance(now=12.0, view=view)
    assert agents.plugin_failures == 1 and agents.settled(view)
    assert agents.status() == {
        "capacity": {GPU: "32", SHARED: None},
        "allocatable": {GPU: "0", SHARED: None},
    }
    assert (agents.gfd_sharing, agents.gfd_passes) == (TS4, 1)  # GFD refuses it too
    agents.see_label("ts4", now=13.0, view=view)
    agents.advance(now=20.0, view=view)
    assert agents.plugin_up and agents.sharing == TS4 and agents.plugin_failures == 0


KEYS = ["default", "ts4", "mps2", "bad", "gone"]
CONTENTS = {
    "ts4": plugin_config("timeSlicing", 4),
    "mps2": plugin_config("mps", 2, rename=True),
    "bad": plugin_config("timeSlicing", 1),
    "default": plugin_config(None),
}
steps = st.lists(
    st.one_of(
        st.tuples(st.just("label"), st.sampled_from([*KEYS, None])),
        st.tuples(st.just("write"), st.sampled_from(KEYS), st.sampled_from(sorted(CONTENTS))),
        st.tuples(st.just("delete"), st.sampled_from(KEYS)),
        st.tuples(st.just("wait"), st.floats(min_value=0.0, max_value=20.0)),
    ),
    max_size=25,
)


@settings(max_examples=500)
@given(history=steps, final=st.sampled_from(["ts4", "mps2", "default"]))
def test_whatever_happened_a_new_label_for_a_good_key_wins_in_the_end(
    history: list[tuple[Any, ...]], final: str
) -> None:
    """Any mix of label changes, ConfigMap edits and waits; then a label change to a good key.

    Between steps the node always shows either the plugin up (allocatable = capacity) or down
    (allocatable 0, capacity kept); in the end it runs exactly the final key's config.
    """
    view = dict(VIEW)
    agents, now = fresh(), 0.0
    for step in history:
        if step[0] == "label":
            agents.see_label(step[1], now=now, view=view)
        elif step[0] == "write":
            view[step[1]] = CONTENTS[step[2]]
        elif step[0] == "delete":
            view.pop(step[1], None)
        else:
            now += step[1]
            agents.advance(now=now, view=view)
        status = agents.status()
        zeros = {k: (None if v is None else "0") for k, v in status["capacity"].items()}
        assert status["allocatable"] in (status["capacity"], zeros)
    view[final] = CONTENTS[final]
    detour = "ts4" if final != "ts4" else "mps2"
    view[detour] = CONTENTS[detour]
    # Through another good key first: the config manager does nothing for the key it already
    # links, even if that key's content changed since, so the final label must be a change.
    for label in (detour, final):
        agents.see_label(label, now=now, view=view)
        for _ in range(3):
            now += 1000.0  # longer than any back-off: every pending timer runs
            agents.advance(now=now, view=view)
    expected = parse_device_plugin_config(CONTENTS[final])
    assert expected is not None
    assert agents.plugin_up and agents.sharing == expected and agents.gfd_sharing == expected
    assert agents.status()["allocatable"][expected.advertised] == str(8 * expected.replicas)
    assert agents.settled(view) and agents.next_deadline() is None

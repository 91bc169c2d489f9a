"""The kubectl plugin without a cluster: manifests, the plan's report and text, output helpers."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.kube import objectpaths
from gpushare_operator.kube.http import ApiError
from gpushare_operator.kubectl import (
    cli,
    cluster,
    explain,
    manifests,
    migexplanations,
    output,
    planview,
)
from gpushare_operator.kubectl.forecast import Forecaster
from gpushare_operator.kubectl.permissions import MissingPermission, Permission, needing
from gpushare_operator.kubectl.plan import PlanOptions, report
from gpushare_operator.kubectl.standings import RolloutPace
from gpushare_testing.builders import config_texts, converged, node, on, pod, policy

# -- manifests -------------------------------------------------------------------------------


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": name},
        "spec": {"strategy": "TimeSlicing", "replicas": 2, **spec},
    }


def test_policies_are_read_from_files_directories_lists_and_stdin(tmp_path: Path) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "a.yaml").write_text(yaml.safe_dump_all([manifest("a"), manifest("b")]))
    listed = {"apiVersion": "v1", "kind": "List", "items": [manifest("c")]}
    (folder / "c.json").write_text(json.dumps(listed))
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    (folder / "other.yml").write_text(yaml.safe_dump(other))
    (folder / "notes.txt").write_text("not a manifest")
    stdin = io.StringIO(yaml.safe_dump(manifest("d")))
    found, skipped = manifests.read_policies([str(folder), "-"], stdin=stdin)
    assert [p["metadata"]["name"] for p in found] == ["a", "b", "c", "d"]
    assert skipped == [f"ConfigMap x ({folder / 'other.yml'})"]


def test_unreadable_manifests_say_which_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    with pytest.raises(manifests.ManifestError, match=r"broken\.yaml: not valid YAML"):
        manifests.read_policies([str(broken)])
    with pytest.raises(manifests.ManifestError, match=r"missing\.yaml"):
        manifests.read_policies([str(tmp_path / "missing.yaml")])
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text(yaml.safe_dump({**manifest("x"), "metadata": {}}))
    with pytest.raises(manifests.ManifestError, match=r"without metadata\.name"):
        manifests.read_policies([str(nameless)])


def test_a_replacement_keeps_the_current_version_and_the_operators_finalizer() -> None:
    current = {
        "metadata": {
            "name": "a",
            "resourceVersion": "42",
            "finalizers": ["gpushare.dev/release-nodes"],
        }
    }
    replaced = manifests._replacement(manifest("a"), current)
    assert replaced["metadata"]["resourceVersion"] == "42"
    assert replaced["metadata"]["finalizers"] == ["gpushare.dev/release-nodes"]
    assert replaced["spec"] == manifest("a")["spec"]


# -- the report and its text ---------------------------------------------------------------------


def planned(body: dict[str, Any], action: str, current: dict[str, Any] | None) -> Any:
    return manifests.Planned(body["metadata"]["name"], action, current, body)


def test_the_report_counts_per_policy_and_pool_and_exits_2_on_an_overcommit() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=RolloutPace())
    converged(forecaster, 2, rollout={"maxUnavailable": 1, "canary": 1})
    forecaster.cache.upsert_pod(pod("big", "n0", 7))
    current = dict(forecaster.cache.policies)
    old = policy("p", replicas=2, rollout={"maxUnavailable": 1, "canary": 1})
    new = policy("p", replicas=1, generation=2, strategy="Exclusive")
    forecast = forecaster.run([new])
    plan = report(
        forecast=forecast,
        planned=[planned(new, "update", old)],
        current=current,
        after=dict(forecaster.cache.policies),
        options=PlanOptions(),
    )
    [entry] = plan["policies"]
    assert entry["action"] == "update"
    assert entry["spec"]["strategy"] == {"before": "TimeSlicing", "after": "Exclusive"}
    [pool] = entry["pools"]
    assert pool["changed"] == ["n0", "n1"]
    assert pool["capacity"] == {"before": 16, "after": 8}
    assert entry["rollout"]["held"][0]["reason"] == "WaitingForPods"
    assert plan["exitCode"] == 2 and plan["overcommitted"][0]["node"] == "n0"
    text = planview.render(plan, output.Style())
    assert "Result: blocked (exit 2)" in text
    assert "a: changes n0, n1 (new config)" in text
    assert "ns/big" in text and "held (WaitingForPods): n0" in text
    json.dumps(plan)  # -o json: plain data only


def test_a_new_overlapping_policy_shows_who_loses_which_nodes_to_it() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=RolloutPace(propagation_delay=5))
    converged(forecaster, 2)
    current = dict(forecaster.cache.policies)
    greedy = policy("greedy", priority=9, replicas=8, rollout={"canary": 0})
    forecast = forecaster.run([greedy])
    plan = report(
        forecast=forecast,
        planned=[planned(greedy, "create", None)],
        current=current,
        after=dict(forecaster.cache.policies),
        options=PlanOptions(),
    )
    by_name = {p["name"]: p for p in plan["policies"]}
    assert by_name["p"]["action"] == "affected"
    assert by_name["p"]["pools"][0]["lost"] == [
        {"node": "n0", "to": "greedy"},
        {"node": "n1", "to": "greedy"},
    ]
    assert by_name["greedy"]["capacity"] == {"before": 0, "after": 64}
    assert plan["exitCode"] == 0 and plan["rollout"]["propagationDelaySeconds"] == 5
    text = planview.render(plan, output.Style())
    assert "a: loses n0, n1 (won by greedy)" in text
    assert "Result: clean (exit 0)." in text


# -- explain: who wins and why -------------------------------------------------------------------


def test_the_ranking_says_why_each_policy_wins_loses_or_is_skipped() -> None:
    cache = ClusterCache()
    cache.upsert_policy(policy("high", priority=9, strategy="MPS"))
    cache.upsert_policy(policy("mid", priority=5))
    cache.upsert_policy(policy("also-mid", priority=5))
    cache.upsert_node(node("n", **{"nvidia.com/mig.strategy": "mixed"}))
    winner = cache.governing("n")
    assert winner is not None and winner.name == "also-mid"
    ranking = explain._ranking(cache, cache.nodes["n"], winner)
    assert [(r["name"], r["outcome"]) for r in ranking] == [
        ("high", "skipped"),
        ("also-mid", "governs"),
        ("mid", "outranked"),
    ]
    assert "mixed" in ranking[0]["why"]
    assert ranking[1]["why"] == "the first by rank that can work here (high cannot)"
    assert ranking[2]["why"] == "same priority as also-mid (5), whose name sorts first"


# -- output --------------------------------------------------------------------------------------


def test_tables_align_and_bars_show_use_and_overcommit() -> None:
    assert output.table(("A", "LONG"), [("xx", 1), ("y", None)]).splitlines() == [
        "A   LONG",
        "xx  1",
        "y",
    ]
    assert output.bar(0, 10, width=4) == "░░░░"
    assert output.bar(1, 100, width=4) == "█░░░"  # something in use is never an empty bar
    assert output.bar(5, 4, width=4) == "!███"
    assert output.slots(3, 8, output.Style(bars=True)).endswith(" 3/8")
    assert output.slots(3, 8, output.Style()) == "3/8"


def test_durations_and_long_lists_read_as_people_write_them() -> None:
    assert [output.duration(s) for s in (45, 375, 3720)] == ["45s", "6m15s", "1h02m"]
    assert output.names(["a", "b", "c"], limit=2) == "a, b and 1 more"


def test_a_terminal_gets_bars_and_no_colour_is_honoured() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert output.Style.for_stream(Tty(), env={}) == output.Style(bars=True, bold=True)
    assert output.Style.for_stream(Tty(), env={"NO_COLOR": "1"}) == output.Style(bars=True)
    assert output.Style.for_stream(io.StringIO(), env={}) == output.Style()


# -- the command line ----------------------------------------------------------------------------


def test_connection_flags_are_taken_before_or_after_the_command() -> None:
    parser = cli.build_parser()
    before = parser.parse_args(["--context", "c", "-o", "json", "status"])
    after = parser.parse_args(["status", "--context", "c", "-o", "json"])
    assert (before.context, before.output) == (after.context, after.output) == ("c", "json")
    plan = parser.parse_args(["plan", "-f", "x.yaml", "--max-unavailable", "25%"])
    assert (plan.filename, plan.max_unavailable, plan.context) == (["x.yaml"], "25%", None)
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "--max-unavailable", "0"])


def test_version_needs_no_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == "0.1.0"


def test_a_missing_kubeconfig_is_an_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["status", "--kubeconfig", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err.startswith("error: kubeconfig ")


def test_recent_events_come_last_and_name_their_object() -> None:
    def event(reason: str, when: str, kind: str = "Node") -> dict[str, Any]:
        return {
            "reason": reason,
            "type": "Warning",
            "lastTimestamp": when,
            "message": reason.lower(),
            "involvedObject": {"kind": kind, "name": "n"},
        }

    events = [event(f"R{i:02d}", f"2026-12-01T00:00:{i:02d}Z") for i in range(12)]
    events.append(event("Late", "2026-12-01T00:01:00Z", kind="GPUNodeState"))
    shown = explain._events(events[::-1])
    assert len(shown) == explain.EVENTS_SHOWN
    assert [e["reason"] for e in shown][-2:] == ["R11", "Late"]
    assert shown[-1]["object"] == "GPUNodeState/n"


def _options(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """(command, option) for every option of the plugin, its subcommands' too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((name, option) for _, option in _options(sub))
        for option in action.option_strings:
            if option not in ("-h", "--help"):
                yield "", option


def test_the_plugins_page_names_every_command_and_option_it_has() -> None:
    """docs/kubectl-gpushare.md's reference tables name each command and option of the
    plugin's own parser, and nothing else, so that a changed option cannot leave the page
    describing the old one."""
    page = (Path(__file__).parents[2] / "docs" / "kubectl-gpushare.md").read_text()
    reference = page.split("\n## Reference", 1)[1]
    named = {
        option
        for row in reference.splitlines()
        if row.startswith("| `-")
        for option in re.findall(r"`(-[-a-z]+)`", row.split("|")[1])
    }
    parser = cli.build_parser()
    have = {option for _, option in _options(parser)}
    assert named == have
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for command in commands:
        assert f"`kubectl gpushare {command}" in reference, command


def test_explain_names_slots_held_of_a_resource_the_target_does_not_advertise() -> None:
    """A node held back for its pods still runs the old config: its pods hold
    ``nvidia.com/gpu.shared`` while the target advertises ``nvidia.com/gpu``."""
    cache = ClusterCache()
    cache.tracked_resources.add("nvidia.com/gpu.shared")
    cache.upsert_node(node("n"))
    cache.upsert_pod(pod("etl", "n", 4, resource="nvidia.com/gpu.shared"))
    cache.upsert_pod(pod("web", "n", 1))
    record = cache.nodes["n"]
    usage = explain._slots(cache, record, None, "nvidia.com/gpu", 8)
    assert (usage["allocated"], usage["otherResources"]) == (1, {"nvidia.com/gpu.shared": 4})
    text = explain._render_slots(usage, output.Style())
    assert text.splitlines()[:2] == [
        "Slots (nvidia.com/gpu): 1/8",
        "  also held by its pods: 4 nvidia.com/gpu.shared",
    ]


# -- names and permissions -------------------------------------------------------------------

HOSTILE = ("inference#", "a?b", "a/b", "a%2Fb", "..", "ünïcode", "a" * 300)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_bad_name_exits_1_before_the_kubeconfig_is_even_read(
    name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A kubeconfig that does not exist would be an error of its own: each name is refused
    first, with its rule, so no request can have been made."""
    missing = ("--kubeconfig", str(tmp_path / "none"))
    manifest_file = tmp_path / "hostile.yaml"
    manifest_file.write_text(yaml.safe_dump(manifest(name)))
    runs = {
        "GPUSharingPolicy": (["plan", "--delete", name], ["plan", "-f", str(manifest_file)]),
        "Node": (["explain", "node", name],),
        "Namespace": (["status", "--device-plugin-namespace", name],),
        "ConfigMap": (["plan", "--delete", "ok", "--device-plugin-configmap", name],),
    }
    for kind, argvs in runs.items():
        for argv in argvs:
            assert cli.main([*argv, *missing]) == 1, argv
            err = capsys.readouterr().err
            assert err.startswith("error: ") and "kubeconfig" not in err, err
            assert f"{kind} name {name[:60]!r}" in err, err
            assert "must be a DNS-1123" in err, err


def test_a_manifests_bad_name_names_the_file_and_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump_all([manifest("fine.name"), manifest("inference#")]))
    with pytest.raises(manifests.ManifestError) as refused:
        manifests.read_policies([str(path)])
    assert str(refused.value).startswith(f"{path}: GPUSharingPolicy name 'inference#' is not")
    assert "('#' is not allowed)" in str(refused.value)
    assert manifests.checked_deletions(["a", "b.c"]) == ["a", "b.c"]


def test_a_403_names_the_permission_missing_and_a_404_goes_through() -> None:
    configmap = Permission(
        verb="get",
        resource=cluster.CONFIGMAPS,
        name="cm",
        namespace="gpu-operator",
        purpose="the keys",
    )
    said = 'configmaps "cm" is forbidden: User "u" cannot get resource "configmaps"'
    forbidden = ApiError(status=403, reason="Forbidden", body={"message": said})
    with pytest.raises(MissingPermission) as refused, needing(configmap):
        raise forbidden
    assert str(refused.value).splitlines() == [
        'missing permission: get configmaps "cm" in namespace "gpu-operator" (needed for the keys)',
        "  check with: kubectl auth can-i get configmaps/cm -n gpu-operator",
        f"Error from server (Forbidden): {said}",
    ]
    assert cli._failure(refused.value) == f"error: {refused.value}"
    missing = ApiError(status=404, reason="Not Found", body=None)
    with pytest.raises(ApiError) as passed, needing(configmap):
        raise missing
    assert passed.value is missing
    pods = Permission(verb="list", resource=cluster.PODS, purpose="p")
    policies = Permission(verb="list", resource=cluster.POLICIES, purpose="p")
    assert (str(pods), pods.can_i()) == (
        "list pods in every namespace",
        "kubectl auth can-i list pods --all-namespaces",
    )
    assert (str(policies), policies.can_i()) == (
        "list gpusharingpolicies.gpushare.dev",
        "kubectl auth can-i list gpusharingpolicies.gpushare.dev",
    )


# -- MIG: plan by resource and layout, explain the layout ----------------------------------------

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200-141GB-HBM3e"


def mig_plan(*, pods: int) -> dict[str, Any]:
    """Policy p, time-slicing 4 replicas on two H100 nodes and one H200, becomes 1g.10gb MIG
    devices (mixed); ``pods`` one-slot pods on n0."""
    forecaster = Forecaster(max_unavailable="100%", pace=RolloutPace())
    cache = forecaster.cache
    rollout = {"maxUnavailable": "100%", "canary": 0}
    old = policy("p", replicas=4, rollout=rollout)
    cache.upsert_policy(old)
    key = str(cache.policies["p"].config_key)
    cache.set_config_data(config_texts(cache), initial=True)
    cache.set_mig_config(None, initial=True)
    for name, product in (("n0", H100), ("n1", H100), ("x", H200)):
        labels = {**on(key, "p", 4), "nvidia.com/gpu.product": product}
        cache.upsert_node(node(name, count="2", **labels))
    for i in range(pods):
        cache.upsert_pod(pod(f"job-{i}", "n0", 1))
    current = dict(cache.policies)
    mig = {"profile": "1g.10gb", "migStrategy": "mixed"}
    new = policy("p", generation=2, strategy="MIG", mig=mig, rollout=rollout)
    del new["spec"]["replicas"]
    forecast = forecaster.run([new])
    return report(
        forecast=forecast,
        planned=[planned(new, "update", old)],
        current=current,
        after=dict(cache.policies),
        options=PlanOptions(),
    )


def test_a_mig_plan_shows_the_layout_per_model_and_the_slots_by_resource() -> None:
    plan = mig_plan(pods=0)
    [entry] = plan["policies"]
    [pool] = entry["pools"]
    assert pool["slotsByResource"] == {
        "nvidia.com/gpu": {"before": 24, "after": 0},
        "nvidia.com/mig-1g.10gb": {"before": 0, "after": 28},
    }
    [layout] = pool["layouts"]["after"]
    assert (layout["product"], layout["layout"], layout["nodes"]) == (H100, "7x 1g.10gb", 2)
    assert layout["config"] in plan["migLayouts"]["written"]
    [unsupported] = plan["unsupported"]
    assert (unsupported["node"], unsupported["reason"]) == ("x", "MIGLayoutDoesNotFit")
    assert plan["exitCode"] == 2  # the H200 cannot hold the layout
    text = planview.render(plan, output.Style())
    assert (
        f"a: layout on {H100}: 7x 1g.10gb per GPU (mig-parted config {layout['config']}; 2 nodes)"
    ) in text
    assert "a: slots by resource: nvidia.com/gpu: 24 -> 0, nvidia.com/mig-1g.10gb: 0 -> 28" in text
    assert f"  layout written: {layout['config']} (7x 1g.10gb)" in text
    assert "x     a     p       MIGLayoutDoesNotFit" in text
    json.dumps(plan)


def test_a_mig_plan_lists_the_pods_the_change_waits_for_apart_from_overcommits() -> None:
    plan = mig_plan(pods=2)
    [waits] = plan["overcommitted"]
    assert (waits["node"], waits["migChange"], waits["waitsForPods"]) == ("n0", True, True)
    assert [p["name"] for p in waits["pods"]] == ["job-0", "job-1"]
    text = planview.render(plan, output.Style())
    assert "Pods a MIG change waits for" in text
    assert "more slots than their node's new config" not in text
    assert "node n0 would wait for 2 GPU pod(s) to end before its MIG layout changes" in text
    assert "held (WaitingForPods): n0" in text


def mig_node_cache(**labels: str) -> ClusterCache:
    cache = ClusterCache()
    spec = {"strategy": "MIG", "mig": {"profile": "1g.10gb"}}
    body = policy("m", **spec)
    del body["spec"]["replicas"]
    cache.upsert_policy(body)
    cache.upsert_node(node("n", count="2", **labels))
    return cache


def test_explain_shows_the_layout_published_and_the_policy_and_model_it_comes_from() -> None:
    cache = mig_node_cache(**{"nvidia.com/gpu.product": H100})
    mig = cache.policies["m"].mig
    assert mig is not None
    name = mig.names[H100]
    published = {
        "mig": {
            "config": name,
            "layout": "7x 1g.10gb",
            "state": "success",
            "slotsPerGPU": {"nvidia.com/gpu": 7},
        }
    }
    record = cache.nodes["n"]
    decision = explain.new_planner(cache).decide(record)
    shown = migexplanations.explain(cache, record, decision, published=published)
    assert shown is not None
    assert shown["published"] == published["mig"]
    assert shown["wanted"]["config"] == name and shown["wanted"]["inConfigMap"] is False
    assert shown["why"] == (
        f"policy m governs it: every {H100} GPU gets 7x 1g.10gb (mig-parted config {name},"
        " migStrategy single)"
    )
    text = migexplanations.render(shown, output.Style())
    assert text.splitlines()[:2] == [
        f"MIG layout: 7x 1g.10gb per GPU ({name})",
        "  state success; slots per GPU: 7 nvidia.com/gpu",
    ]
    assert f"to become: 7x 1g.10gb ({name}, not in the mig-parted ConfigMap yet)" in text


@pytest.mark.parametrize(
    ("labels", "owners", "reason"),
    [
        ({"nvidia.com/gpu.product": H200}, (), "MIGLayoutDoesNotFit"),
        ({"nvidia.com/gpu.product": "Tesla-T4"}, (), "MIGModelUnknown"),
        (
            {"nvidia.com/gpu.product": H100, "nvidia.com/mig.config": "all-balanced"},
            ("gpu-operator",),
            "MIGConfigOwnedByOther",
        ),
    ],
)
def test_explain_names_why_a_mig_policy_cannot_work_on_the_node(
    labels: dict[str, str], owners: tuple[str, ...], reason: str
) -> None:
    cache = mig_node_cache(**labels)
    record = dataclasses.replace(cache.nodes["n"], mig_config_owners=owners)
    decision = explain.new_planner(cache).decide(record)
    shown = migexplanations.explain(cache, record, decision, published={})
    assert shown is not None
    [refusal] = shown["unsupported"]
    assert (refusal["policy"], refusal["reason"]) == ("m", reason)
    text = migexplanations.render(shown, output.Style())
    assert text.splitlines()[0] == "MIG layout: none published"
    assert f"  m: {reason}: {refusal['message']}" in text
    if owners:
        assert "set by gpu-operator" in text and "gpushare never changes" in shown["why"]
    else:
        assert shown["why"].startswith(f"policy m is MIG but cannot work here ({reason})")
    ranking = explain._ranking(cache, record, decision.policy)
    assert f"({reason})" in ranking[0]["why"]


def test_explain_has_no_mig_section_for_a_node_mig_has_nothing_to_do_with() -> None:
    cache = ClusterCache()
    cache.upsert_policy(policy("p"))
    cache.upsert_node(node("n"))
    record = cache.nodes["n"]
    decision = explain.new_planner(cache).decide(record)
    assert migexplanations.explain(cache, record, decision, published={}) is None


def test_the_plugin_reads_the_mig_parted_configmap_the_operator_writes() -> None:
    from gpushare_operator.app.settings import parse_settings

    operator = parse_settings([], env={})
    plugin = cli.build_parser().parse_args(["plan"])
    assert plugin.mig_parted_configmap == operator.mig_parted_configmap
    assert cluster.ClusterRef().mig_parted_configmap == operator.mig_parted_configmap
    with pytest.raises(objectpaths.BadName):
        cluster.ClusterRef(mig_parted_configmap="a/b")

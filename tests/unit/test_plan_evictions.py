"""``kubectl gpushare plan`` under podPolicy Evict: the pods a change evicts (the operator's
choice), the PodDisruptionBudgets that would refuse them now, and an exit status that an
eviction does not change."""

from __future__ import annotations

import json
from typing import Any

from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.kubectl import disruptions, explain, manifests, output, planview, status
from gpushare_operator.kubectl.disruptions import DetailSink, PodDetails
from gpushare_operator.kubectl.forecast import Forecaster
from gpushare_operator.kubectl.plan import PlanOptions, report
from gpushare_operator.kubectl.standings import RolloutPace
from gpushare_testing.builders import converged, pod, policy

PACE = RolloutPace(propagation_delay=75, write_qps=100, verify_seconds=60)
EVICT = {"maxUnavailable": "100%", "canary": 0, "podPolicy": "Evict"}


def gpu_pod(name: str, node: str, slots: int, *, priority: int = 0, day: int = 1) -> dict[str, Any]:
    body = pod(f"uid-{name}", node, slots)
    body["metadata"].update(
        name=name, creationTimestamp=f"2026-01-{day:02d}T00:00:00Z", labels={"app": name}
    )
    body["spec"]["priority"] = priority
    body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return body


def daemon_pod(name: str, node: str, slots: int) -> dict[str, Any]:
    body = gpu_pod(name, node, slots)
    owner = {"kind": "DaemonSet", "name": "ds", "uid": "ds", "controller": True}
    body["metadata"]["ownerReferences"] = [owner]
    return body


def budget(name: str, labels: dict[str, str], allowed: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "generation": 1},
        "spec": {"selector": {"matchLabels": labels}, **spec},
        "status": {"observedGeneration": 1, "disruptionsAllowed": allowed},
    }


def with_budgets(forecaster: Forecaster, *bodies: dict[str, Any]) -> None:
    """The PodDisruptionBudgets as the plan reads them: before the pods, into its state."""
    for body in bodies:
        forecaster.cache.budgets.upsert(body)


def with_pods(forecaster: Forecaster, *bodies: dict[str, Any]) -> None:
    """The pods as the plan lists them: through the sink that keeps their details."""
    sink = forecaster.keep_pod_details(_CacheSink(forecaster))
    sink.begin_relist()
    for body in bodies:
        sink.relist_item(body)
    sink.end_relist()


class _CacheSink:
    def __init__(self, forecaster: Forecaster) -> None:
        self.cache = forecaster.cache

    def begin_relist(self) -> None: ...
    def relist_item(self, obj: dict[str, Any]) -> None:
        self.cache.upsert_pod(obj)

    def end_relist(self) -> None: ...
    def apply(self, event_type: str, obj: dict[str, Any]) -> None: ...


def plan_of(forecaster: Forecaster, new: dict[str, Any], budgets: Any = ()) -> dict[str, Any]:
    current = dict(forecaster.cache.policies)
    forecast = forecaster.run([new])
    return report(
        forecast=forecast,
        planned=[manifests.Planned("p", "update", None, new)],
        current=current,
        after=dict(forecaster.cache.policies),
        options=PlanOptions(pace=PACE),
        budgets=budgets,
        details=forecaster.pod_details,
    )


# -- the forecast ---------------------------------------------------------------------------------


def test_under_evict_the_operators_victims_are_listed_and_the_node_is_no_misfit() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 2, rollout=EVICT)  # replicas 2: 8 slots; 1 replica: 4
    with_pods(
        forecaster,
        gpu_pod("old", "n0", 2, day=1),
        gpu_pod("young", "n0", 2, day=3),  # lowest priority, youngest: goes first
        gpu_pod("important", "n0", 3, priority=100, day=5),  # stays: it fits
    )
    new = policy("p", replicas=1, generation=2, strategy="Exclusive", rollout=EVICT)
    assert forecaster.may_evict([new])
    forecast = forecaster.run([new])
    assert forecast.misfits == [] and not forecast.blocking
    evictions = forecast.evictions["n0"]
    assert [p.name for p in evictions.pods] == ["young", "old"]  # 7 slots; 3 left of 4
    assert evictions.drains and evictions.policy == "p" and evictions.timeout == "10m"
    assert "n1" not in forecast.evictions  # no pods: nothing to evict
    # It changes: in a batch, once its pods are gone (which takes their grace periods).
    [batch] = forecast.batches
    assert sorted(n for n, _ in batch.nodes) == ["n0", "n1"]
    drain = 3 / 100 + 30  # the taint and two evictions; the pods' default grace period
    assert batch.ends_at == round(75 + drain + PACE.batch_seconds(2), 2)
    assert forecast.held == []


def test_the_same_change_under_wait_for_pods_stays_a_misfit_that_blocks() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    rollout = {**EVICT, "podPolicy": "WaitForPods"}
    converged(forecaster, 1, rollout=rollout)
    with_pods(forecaster, gpu_pod("a", "n0", 6))
    new = policy("p", replicas=1, generation=2, strategy="Exclusive", rollout=rollout)
    assert not forecaster.may_evict([new])
    plan = plan_of(forecaster, new)
    assert plan["exitCode"] == 2 and plan["overcommitted"][0]["waitsForPods"]
    assert plan["nodes"][0]["evictions"] == [] and plan["rollout"]["evictions"] == 0


def test_a_grace_period_in_the_policy_times_the_drain() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    rollout = {**EVICT, "eviction": {"gracePeriodSeconds": 5, "timeout": "2m"}}
    converged(forecaster, 1, rollout=rollout)
    body = gpu_pod("slow", "n0", 6)
    body["spec"]["terminationGracePeriodSeconds"] = 600
    with_pods(forecaster, body)
    forecast = forecaster.run(
        [policy("p", replicas=1, generation=2, strategy="Exclusive", rollout=rollout)]
    )
    assert forecast.evictions["n0"].grace_period == 5
    assert forecast.batches[0].ends_at == round(75 + 2 / 100 + 5 + PACE.batch_seconds(1), 2)
    # Without it, the pod's own.
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 1, rollout=EVICT)
    with_pods(forecaster, body)
    forecast = forecaster.run(
        [policy("p", replicas=1, generation=2, strategy="Exclusive", rollout=EVICT)]
    )
    assert forecast.batches[0].ends_at == round(75 + 2 / 100 + 600 + PACE.batch_seconds(1), 2)


def test_the_plan_keeps_a_pod_its_budget_protects_and_evicts_one_none_protects() -> None:
    """The operator's choice, kube-scheduler's: with one pod to go, the older pod no budget
    protects goes rather than the younger one whose budget allows nothing."""
    new = policy("p", replicas=1, generation=2, strategy="Exclusive", rollout=EVICT)
    pods = (gpu_pod("older", "n0", 3, day=1), gpu_pod("younger", "n0", 3, day=2))
    chosen = {}
    for budgets in ((), (budget("guard", {"app": "younger"}, 0),)):
        forecaster = Forecaster(max_unavailable="100%", pace=PACE)
        converged(forecaster, 1, rollout=EVICT)  # 8 slots; 4 after the change
        with_budgets(forecaster, *budgets)
        with_pods(forecaster, *pods)
        plan = plan_of(forecaster, new, budgets)
        [node] = plan["nodes"]
        chosen[len(budgets)] = [(e["name"], e["blockedBy"]) for e in node["evictions"]]
    assert chosen == {0: [("younger", [])], 1: [("older", [])]}


def test_budgets_are_read_only_when_a_policy_as_planned_may_evict() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 1, rollout=EVICT)
    waiting = {**EVICT, "podPolicy": "WaitForPods"}
    assert forecaster.may_evict([policy("p", replicas=2, generation=2, rollout=EVICT)])
    # The one Evict policy planned to wait instead: nothing is charged to an Evict spec.
    assert not forecaster.may_evict([policy("p", replicas=2, generation=2, rollout=waiting)])
    assert forecaster.may_evict([policy("q", replicas=2, rollout=waiting)])  # p stays Evict


def test_a_grace_period_of_0_is_timed_as_the_operator_asks_it_1() -> None:
    """A 0 an older CRD let in: the operator asks for 1 s (never a forced deletion), and the
    plan times the drain by what it asks."""
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    rollout = {**EVICT, "eviction": {"gracePeriodSeconds": 0}}
    converged(forecaster, 1, rollout=rollout)
    body = gpu_pod("slow", "n0", 6)
    body["spec"]["terminationGracePeriodSeconds"] = 600
    with_pods(forecaster, body)
    forecast = forecaster.run(
        [policy("p", replicas=1, generation=2, strategy="Exclusive", rollout=rollout)]
    )
    assert forecast.evictions["n0"].grace_period == 1
    assert forecast.batches[0].ends_at == round(75 + 2 / 100 + 1 + PACE.batch_seconds(1), 2)


def test_a_node_whose_pods_are_never_evicted_is_held_and_blocks_the_plan() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 1, rollout=EVICT)
    with_pods(forecaster, daemon_pod("agent", "n0", 6), gpu_pod("job", "n0", 1))
    plan = plan_of(
        forecaster, policy("p", replicas=1, generation=2, strategy="Exclusive", rollout=EVICT)
    )
    assert plan["exitCode"] == 2
    [problem] = plan["problems"]
    assert problem.startswith("node n0 cannot be drained (podPolicy Evict): pods that are never")
    [item] = plan["overcommitted"]
    assert "ns/agent" in item["notEvictable"]
    [held] = plan["policies"][0]["rollout"]["held"]
    assert (held["node"], held["reason"]) == ("n0", "NotEvictable")  # as the operator holds it
    assert plan["rollout"]["batches"] == 0
    assert "podPolicy Evict cannot drain it" in planview.render(plan, output.Style())


# -- the report -----------------------------------------------------------------------------------


def test_the_report_lists_each_eviction_with_the_budgets_that_refuse_it_and_exits_0() -> None:
    forecaster = Forecaster(max_unavailable="100%", pace=PACE)
    converged(forecaster, 1, rollout=EVICT)
    budgets = [
        budget("guard", {"app": "guarded"}, 0),
        budget("loose", {"app": "free"}, 1),
        {**budget("other-ns", {"app": "free"}, 0), "metadata": {"namespace": "x", "name": "o"}},
    ]
    with_budgets(forecaster, *budgets)
    with_pods(forecaster, gpu_pod("free", "n0", 2, day=5), gpu_pod("guarded", "n0", 5, priority=-5))
    plan = plan_of(
        forecaster,
        policy("p", replicas=1, generation=2, strategy="Exclusive", rollout=EVICT),
        budgets,
    )
    assert plan["exitCode"] == 0 and plan["problems"] == [] and plan["overcommitted"] == []
    [node] = plan["nodes"]
    assert node["evictions"] == [
        {
            "namespace": "ns",
            "name": "guarded",
            "requests": {"nvidia.com/gpu": 5},
            "priority": -5,
            "blockedBy": ["ns/guard"],
        },
    ]  # 7 slots of 4: kept first (its budget allows nothing), it still cannot stay
    assert plan["rollout"]["evictions"] == 1
    text = planview.render(plan, output.Style())
    assert "Pods evicted before their node changes (podPolicy Evict):" in text
    assert "ns/guarded" in text and "ns/guard" in text and "EvictionBlocked" in text
    assert "1 pod evicted first (podPolicy Evict)" in text
    assert "Result: clean (exit 0)." in text
    json.dumps(plan)


# -- the budgets, by the API server's rules ----------------------------------------------------


def record(phase: str = "Running", *, terminating: bool = False) -> PodRecord:
    return PodRecord("u", "ns", "p", "n", phase, (("nvidia.com/gpu", 1),), terminating=terminating)


READY = PodDetails(labels={"app": "a"}, ready=True, grace_period=30)
UNREADY = PodDetails(labels={"app": "a"}, ready=False, grace_period=30)


def test_a_budget_refuses_only_pods_it_selects_when_it_allows_no_disruption() -> None:
    assert disruptions.blocking(record(), READY, [budget("b", {"app": "a"}, 0)]) == ["ns/b"]
    assert disruptions.blocking(record(), READY, [budget("b", {"app": "a"}, 1)]) == []
    assert disruptions.blocking(record(), READY, [budget("b", {"app": "z"}, 0)]) == []
    everything = {**budget("all", {}, 0), "spec": {"selector": {}}}
    nothing = {**budget("none", {}, 0), "spec": {}}
    assert disruptions.blocking(record(), READY, [everything, nothing]) == ["ns/all"]


def test_a_budget_the_controller_has_not_seen_yet_refuses() -> None:
    unseen = budget("b", {"app": "a"}, 3)
    unseen["metadata"]["generation"] = 2
    assert disruptions.blocking(record(), READY, [unseen]) == ["ns/b"]
    no_status = {**budget("c", {"app": "a"}, 3), "status": {}}
    assert disruptions.blocking(record(), READY, [no_status]) == ["ns/c"]


def test_pending_terminating_and_unready_pods_pass_as_the_api_server_lets_them() -> None:
    shut = [budget("b", {"app": "a"}, 0)]
    assert disruptions.blocking(record("Pending"), READY, shut) == []
    assert disruptions.blocking(record(terminating=True), READY, shut) == []
    assert disruptions.blocking(record(), UNREADY, shut) == ["ns/b"]
    always = [budget("b", {"app": "a"}, 0, unhealthyPodEvictionPolicy="AlwaysAllow")]
    assert disruptions.blocking(record(), UNREADY, always) == []
    healthy = budget("b", {"app": "a"}, 0)
    healthy["status"].update(currentHealthy=2, desiredHealthy=2)
    assert disruptions.blocking(record(), UNREADY, [healthy]) == []
    assert disruptions.blocking(record(), READY, [healthy]) == ["ns/b"]


def test_a_pod_under_two_budgets_is_refused_by_both() -> None:
    both = [budget("b", {"app": "a"}, 5), budget("c", {"app": "a"}, 5)]
    assert disruptions.blocking(record(), READY, both) == ["ns/b", "ns/c"]


def test_the_detail_sink_keeps_only_pods_the_state_keeps() -> None:
    forecaster = Forecaster()
    sink = DetailSink(_CacheSink(forecaster), forecaster.cache)
    kept = gpu_pod("kept", "n0", 1)
    plain = gpu_pod("plain", "n0", 1)
    plain["spec"]["containers"] = [{"resources": {}}]
    sink.relist_item(kept)
    sink.relist_item(plain)
    assert sink.details == {
        "uid-kept": PodDetails(labels={"app": "kept"}, ready=True, grace_period=30)
    }


# -- status and explain ----------------------------------------------------------------------------


def test_explain_shows_the_pods_left_to_evict_and_what_follows_them() -> None:
    published = {
        "phase": "Evicting",
        "eviction": {
            "policy": "p",
            "generation": 2,
            "startedAt": "2026-12-01T00:00:00Z",
            "pods": ["ns/young", "ns/old"],
            "blockedBy": ["ns/guard"],
        },
    }
    eviction = status.eviction_of(published)
    assert eviction is not None and not eviction["blocked"]
    phase = {
        "published": "Evicting",
        "conditions": [],
        "now": {"phase": "Pending", "reason": "ConfigKeyPending"},
        "eviction": eviction,
    }
    text = explain._render_phase({"phase": phase, "events": []}, output.Style())
    assert (
        "  podPolicy Evict: evicting ns/young, ns/old; refused by PodDisruptionBudget(s) ns/guard"
        in text.splitlines()
    )
    assert "  once its pods are gone: Pending (ConfigKeyPending)" in text.splitlines()
    assert "from the cluster as it is now" not in text
    published["eviction"].update(blockedAt="2026-12-01T00:10:00Z", reason="EvictionTimedOut")
    blocked = status.eviction_of(published)
    assert blocked is not None
    assert status.eviction_line("n0", blocked) == (
        "n0: eviction given up (EvictionTimedOut), keeps its config; pods: ns/young, ns/old;"
        " refused by PodDisruptionBudget(s) ns/guard"
    )
    assert status.eviction_of({"phase": "Verified"}) is None

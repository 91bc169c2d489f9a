"""A MIG layout label waits for our taint in the node cache and asks for an idle check; a node
that waits to join a MIG pool keeps our taint (its startup taint too) until it is Verified.

Planning alone (``PlanningLoop``): what each write would have done is played through the cache,
the informer's deliveries and a write's answers told apart as the operator tells them.
"""

from __future__ import annotations

from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import ConfigMapSink
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.records.nodes import CONFIG_LABEL, MIG_CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.reconcile.drains import CONFIRMING_IDLE
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.plans import NodePlan
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, config_texts, node, pod, policy, sync_config
from gpushare_testing.writepath import PlanningLoop, take_nodes

H100 = "NVIDIA-H100-80GB-HBM3"
MIG = {"strategy": "MIG", "mig": {"profile": "1g.10gb"}}


def mig_policy(name: str = "m", *, generation: int = 1, **spec: Any) -> dict[str, Any]:
    body = policy(name, generation=generation, **{**MIG, "rollout": {"canary": 0}, **spec})
    del body["spec"]["replicas"]
    return body


def loop(*bodies: dict[str, Any]) -> PlanningLoop:
    cache = ClusterCache(clock=Clock())
    timings = Timings(propagation_delay=0.0, key_grace_period=60.0, mismatch_timeout=60.0)
    planner = PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="100%"))
    for body in bodies:
        cache.upsert_policy(body)
    sync_config(cache, config_texts(cache), initial=True)
    entries = {k: v for p in cache.policies.values() if p.mig for k, v in p.mig.entries.items()}
    sink = ConfigMapSink(cache, mig=True)
    sink.begin_relist()
    sink.relist_item({"data": {migconfigs.CONFIGMAP_KEY: migconfigs.render_text(entries)}})
    sink.end_relist()
    return planner


def h100(
    name: str = "n1", *, version: str = "1", tainted: bool = False, **labels: str
) -> dict[str, Any]:
    body = node(name, count="2", **{"nvidia.com/gpu.product": H100, **labels})
    body["metadata"]["resourceVersion"] = version
    if tainted:
        body["spec"] = {"taints": [{"key": "other", "effect": "NoSchedule"}, dict(rollouts.TAINT)]}
    return body


def layout_of(planner: PlanningLoop, name: str = "m") -> str:
    compiled = planner.cache.policies[name]
    assert compiled.mig is not None
    return compiled.mig.names[H100]


def labelled(planner: PlanningLoop, **labels: str) -> dict[str, str]:
    """Our three labels as the policy m wants them, and what the agents said since."""
    compiled = planner.cache.policies["m"]
    ours = {CONFIG_LABEL: str(compiled.config_key), POLICY_LABEL: "m"}
    return {**ours, MIG_CONFIG_LABEL: layout_of(planner), **labels}


def reason(plan: NodePlan) -> str | None:
    return plan.facts.decision.reason if plan.facts.decision is not None else None


STATE = "nvidia.com/mig.config.state"
VERIFIED = {
    STATE: "success",
    "nvidia.com/mig.strategy": "single",
    "nvidia.com/gpu.count": "14",
    "nvidia.com/gpu.product": f"{H100}-MIG-1g.10gb",
}


def test_an_idle_node_is_tainted_first_and_labelled_once_the_watch_shows_the_taint() -> None:
    planner = loop(mig_policy())
    cache = planner.cache
    cache.upsert_node(h100(version="10"))
    first = planner.plan_admitted("n1")
    assert first.taint is not None and first.labels is None and not first.idle_check
    assert reason(first) == CONFIRMING_IDLE
    assert first.status is not None and first.status["phase"] == NodePhase.PENDING
    assert first.status["idleWait"]["policy"] == "m"  # the admission, for a new leader

    # The taint patch's answer enters the cache: not yet what the API server's watchers saw.
    cache.upsert_node(h100(version="11", tainted=True), answer=True)
    assert not cache.watch_shows("n1")
    answered = planner.plan_node("n1")
    assert answered.taint is None and answered.labels is None
    assert reason(answered) == CONFIRMING_IDLE
    take_nodes(cache.queue)

    # The informer delivers that Node: planned again, labelled, on an idle check.
    cache.upsert_node(h100(version="11", tainted=True))
    assert cache.watch_shows("n1") and take_nodes(cache.queue) == ["n1"]
    go = planner.plan_node("n1")
    assert go.taint is None and go.idle_check
    assert go.labels is not None and go.labels[MIG_CONFIG_LABEL] == layout_of(planner)


def test_a_pod_the_cache_shows_after_our_taint_sends_the_node_back_to_waiting() -> None:
    planner = loop(mig_policy())
    cache = planner.cache
    cache.upsert_node(h100())
    first = planner.plan_admitted("n1")
    since = first.status["idleWait"]["since"] if first.status else None
    cache.upsert_node(h100(version="2", tainted=True))
    assert planner.plan_node("n1").idle_check
    cache.upsert_pod(pod("late", "n1", 1))  # bound after the taint, seen now
    held = planner.plan_node("n1")
    assert held.labels is None and held.taint is None and not held.idle_check  # kept tainted
    assert reason(held) == "WaitingForPods"
    assert held.status is not None and held.status["idleWait"]["since"] == since
    cache.delete_pod("late")
    assert planner.plan_node("n1").idle_check


def test_a_new_leader_halfway_keeps_the_taint_and_checks_again() -> None:
    """Our taint on the node, its GPUNodeState saying so: a leader with no memory of it
    neither lifts the taint nor labels without a check of its own."""
    body = mig_policy(rollout={"canary": 0, "maxUnavailable": 1})
    first = loop(body)
    first.cache.upsert_node(h100())
    tainting = first.plan_admitted("n1")
    assert tainting.status is not None

    new = loop(body)
    new.cache.upsert_node(h100(version="2", tainted=True))
    new.cache.upsert_node(h100("n2"))  # idle, and first in order: not admitted in its place
    new.cache.upsert_node_state({"metadata": {"name": "n1"}, "status": tainting.status})
    go = new.plan_admitted("n1")
    assert go.taint is None and go.idle_check and go.labels is not None
    other = new.plan_node("n2")
    assert other.taint is None and other.labels is None and reason(other) == "RolloutWaiting"


def test_a_node_registered_with_our_taint_keeps_it_until_its_layout_is_verified() -> None:
    planner = loop(mig_policy(paused=True))
    cache = planner.cache
    cache.upsert_node(h100(tainted=True))  # Karpenter's startupTaints, say
    held = planner.plan_admitted("n1")
    assert held.taint is None and held.labels is None and reason(held) == "Paused"

    cache.upsert_policy(mig_policy(generation=2))
    clock = cache.clock
    assert isinstance(clock, Clock)
    clock.now += 10.0  # the next admission pass
    go = planner.plan_admitted("n1")
    assert go.taint is None and go.idle_check and go.labels is not None  # no taint to add

    cache.upsert_node(h100(version="3", tainted=True, **labelled(planner)))
    cache.upsert_node(h100(version="4", tainted=True, **labelled(planner, **{STATE: "pending"})))
    assert planner.plan_node("n1").taint is None  # the MIG manager at work: kept
    done = h100(version="5", tainted=True, allocatable="14", **labelled(planner, **VERIFIED))
    cache.upsert_node(done)
    lifted = planner.plan_node("n1")
    assert lifted.facts.decision is not None
    assert lifted.facts.decision.phase is NodePhase.VERIFIED
    assert lifted.taint == [
        {"op": "test", "path": "/spec/taints", "value": done["spec"]["taints"]},
        {"op": "remove", "path": "/spec/taints/1"},
    ]


def test_our_taint_goes_from_a_node_no_mig_policy_waits_for() -> None:
    """A node registered with our taint that no policy selects, or that a policy without MIG
    takes, loses it: the taint only ever holds a node for a MIG layout to come."""
    sharing = policy("ts", pool="b", replicas=2)
    planner = loop(mig_policy(), sharing)
    cache = planner.cache
    cache.upsert_node(h100("lone", pool="c", tainted=True))
    cache.upsert_node(h100("shared", pool="b", tainted=True))
    lone = planner.plan_admitted("lone")
    assert lone.taint is not None and lone.taint[-1] == {"op": "remove", "path": "/spec/taints/1"}
    shared = planner.plan_admitted("shared")
    assert shared.taint is not None and shared.taint[-1]["op"] == "remove"
    assert shared.labels is not None and not shared.idle_check


def test_the_node_cache_tells_a_writes_answer_from_what_the_watch_delivered() -> None:
    cache = ClusterCache(clock=Clock())
    cache.upsert_node(h100(version="5"))
    assert cache.watch_shows("n1")
    take_nodes(cache.queue)
    cache.upsert_node(h100(version="7", tainted=True), answer=True)
    assert not cache.watch_shows("n1")
    take_nodes(cache.queue)
    cache.upsert_node(h100(version="6"))  # older than the answer: left out, nothing new
    assert not cache.watch_shows("n1") and take_nodes(cache.queue) == []
    cache.upsert_node(h100(version="7", tainted=True))  # the watch catches up
    assert cache.watch_shows("n1") and take_nodes(cache.queue) == ["n1"]
    cache.upsert_node(h100(version="8", tainted=True))  # a heartbeat: nothing to plan
    assert take_nodes(cache.queue) == []
    cache.upsert_node({"metadata": {"name": "cpu", "resourceVersion": "9", "labels": {}}})
    assert "cpu" not in cache.node_watched  # a node we never keep is not remembered either
    cache.delete_node("n1")
    assert cache.node_watched == {} and not cache.watch_shows("n1")

"""podPolicy Evict in the write path: taint, evict the fewest pods, change once they are gone;
give up after the timeout (derived from the GPUNodeState, so a new leader agrees)."""

from __future__ import annotations

from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.rollout.rollouts import TAINT_KEY
from gpushare_operator.reconcile.outcomes import Done, NodeWritten
from gpushare_operator.reconcile.plans import NodePlan
from gpushare_operator.reconcile.reconciler import eviction_backoff
from gpushare_operator.reconcile.rollouts import Step
from gpushare_testing.builders import Clock, config_texts, node, on, policy
from gpushare_testing.leaders import EPOCH, confirm, labelled, leader, published, update
from gpushare_testing.writepath import PlanningLoop

GPU = "nvidia.com/gpu"


def evict_pool(
    clock: Clock, *, nodes: int, timeout: str = "1m", grace: int | None = None
) -> ClusterCache:
    """``nodes`` nodes Verified on p's replicas-4 config (16 slots each); p now wants 2 (8)."""
    cache = ClusterCache(clock=clock, wallclock=lambda: EPOCH + clock.now)
    cache.upsert_policy(policy("p", replicas=4))
    old = str(cache.policies["p"].config_key)
    before = config_texts(cache)
    for i in range(nodes):
        cache.upsert_node(node(f"n{i}", **on(old, "p", 4)))
    rollout = {
        "maxUnavailable": 1,
        "canary": 0,
        "podPolicy": "Evict",
        "eviction": {"timeout": timeout, "gracePeriodSeconds": grace},
    }
    cache.upsert_policy(policy("p", replicas=2, generation=2, rollout=rollout))
    cache.set_config_data(before | config_texts(cache), initial=True)
    cache.settle_initial_keys()
    clock.now += 100
    return cache


def gpu_pod(
    name: str, node_name: str, slots: int, *, priority: int = 0, day: int = 1, **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": f"uid-{name}",
            "namespace": "ns",
            "name": name,
            "creationTimestamp": f"2026-01-{day:02d}T00:00:00Z",
            **meta,
        },
        "spec": {
            "nodeName": node_name,
            "priority": priority,
            "containers": [{"resources": {"requests": {GPU: str(slots)}}}],
        },
        "status": {"phase": "Running"},
    }


def turn(loop: PlanningLoop, clock: Clock, name: str) -> NodePlan:
    """Rounds of the loop until ``name`` is admitted (its turn under the budget); its plan."""
    for _ in range(5):
        loop.plan_queued_nodes()
        clock.now += 1
        loop.due()
        if name in loop.book.admitted:
            break
    return loop.plan_node(name)


def written(loop: PlanningLoop, plan: NodePlan, **answer: Any) -> None:
    """Learn ``plan`` as sent: its taint on the node, and the API server's ``answer``."""
    if plan.taint is not None:
        body = node(plan.name, **loop.cache.nodes[plan.name].labels)
        body["spec"] = {"taints": [{"key": TAINT_KEY, "effect": "NoSchedule"}]}
        update(loop.cache, body)
    loop.reconciler.learn(plan, NodeWritten(Done(), status=plan.status, **answer))
    if plan.status is not None:
        loop.cache.upsert_node_state({"metadata": {"name": plan.name}, "status": plan.status})


def terminating(cache: ClusterCache, body: dict[str, Any]) -> None:
    body["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    cache.upsert_pod(body)


def test_an_admitted_change_drains_the_fewest_pods_then_changes_once_they_are_gone() -> None:
    clock = Clock()
    cache = evict_pool(clock, nodes=2)
    pods = [
        gpu_pod("old", "n0", 3, day=1),
        gpu_pod("young", "n0", 3, day=3),  # the youngest of the lowest priority: goes first
        gpu_pod("important", "n0", 8, priority=100, day=5),  # stays: it fits alone
    ]
    cache.upsert_pod(gpu_pod("busier", "n1", 15))  # n0 holds fewer slots: it goes first
    for body in pods:
        cache.upsert_pod(body)
    loop = leader(cache)
    plan = turn(loop, clock, "n0")
    assert plan.labels is None  # not before its pods are gone
    assert plan.taint is not None  # tainted first, though cordonDuringChange is false
    assert [e.name for e in plan.evictions] == ["young", "old"]  # 14 slots; 8 after
    assert all(e.uid.startswith("uid-") and e.grace_period is None for e in plan.evictions)
    assert plan.status is not None and plan.status["phase"] == NodePhase.EVICTING
    assert plan.status["eviction"]["pods"] == ["ns/young", "ns/old"]
    assert loop.book.down_nodes("p") == ["n0"]  # an evicting node counts against the budget
    assert "n1" not in loop.book.nodes_at("p", Step.ADMITTED)  # and holds it: n1 waits
    written(loop, plan, evicted=("uid-young", "uid-old"))
    again = loop.plan_node("n0")
    assert again.evictions == ()  # accepted: not asked again while the watch event comes
    terminating(cache, pods[1])
    terminating(cache, pods[0])
    assert loop.plan_node("n0").labels is None  # terminating is not gone
    cache.delete_pod("uid-young")
    cache.delete_pod("uid-old")
    plan = loop.plan_node("n0")
    assert plan.labels is not None  # gone: the change goes ahead
    assert set(plan.evictions_done) == {"uid-young", "uid-old"}  # counted done once


def test_a_grace_period_of_0_that_an_older_crd_let_in_is_asked_as_1() -> None:
    clock = Clock()
    cache = evict_pool(clock, nodes=1, grace=0)
    cache.upsert_pod(gpu_pod("a", "n0", 10))
    loop = leader(cache)
    plan = turn(loop, clock, "n0")
    assert [(e.name, e.grace_period) for e in plan.evictions] == [("a", 1)]  # never a deletion


def pdb(name: str, allowed: int, **match: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"selector": {"matchLabels": match}},
        "status": {"disruptionsAllowed": allowed},
    }


def test_a_pod_its_budget_protects_is_kept_and_an_older_unprotected_one_goes() -> None:
    """kube-scheduler's choice: the budget's pod is given back first, so the other goes."""
    for budgets, evicted in (((), "y"), ((pdb("guard", 0, app="y"),), "x")):
        clock = Clock()
        cache = evict_pool(clock, nodes=1)
        for body in budgets:
            cache.budgets.upsert(body)
        cache.upsert_pod(gpu_pod("x", "n0", 5, day=1, labels={"app": "x"}))  # older
        cache.upsert_pod(gpu_pod("y", "n0", 5, day=2, labels={"app": "y"}))  # 10 slots; 8 after
        plan = turn(leader(cache), clock, "n0")
        assert [e.name for e in plan.evictions] == [evicted]
        assert plan.status is not None and plan.status["eviction"]["pods"] == [f"ns/{evicted}"]


def test_after_a_429_the_victims_are_chosen_again_from_what_the_budgets_allow() -> None:
    """The cache showed the budget allowing one eviction; the API server's 429 says it allows
    none: the choice moves to the pod no budget protects, without waiting for the cache."""
    clock = Clock()
    cache = evict_pool(clock, nodes=1)
    cache.budgets.upsert(pdb("web", 1, app="y"))  # as the cache last saw it
    cache.upsert_pod(gpu_pod("x", "n0", 5, day=1, labels={"app": "x"}))
    cache.upsert_pod(gpu_pod("y", "n0", 5, day=2, labels={"app": "y"}))
    loop = leader(cache)
    plan = turn(loop, clock, "n0")
    assert [e.name for e in plan.evictions] == ["y"]  # its budget allows one: the younger goes
    written(loop, plan, refused={"uid-y": ("ns/web",)})
    again = loop.plan_node("n0")
    assert [e.name for e in again.evictions] == ["x"]  # chosen again: web allows nothing now
    assert again.status is not None and again.status["eviction"]["pods"] == ["ns/x"]
    written(loop, again, evicted=("uid-x",))
    cache.budgets.upsert(pdb("web", 0, app="y"))  # the cache catches up
    clock.now += eviction_backoff(1)
    assert loop.plan_node("n0").evictions == ()  # x on its way: y is not asked again
    cache.delete_pod("uid-x")
    assert loop.plan_node("n0").labels is not None  # x gone: the change goes ahead, y stays


def test_a_refused_eviction_is_asked_again_after_a_back_off_and_names_its_budget() -> None:
    clock = Clock()
    cache = evict_pool(clock, nodes=1)
    cache.upsert_pod(gpu_pod("a", "n0", 10))
    loop = leader(cache)
    plan = turn(loop, clock, "n0")
    assert [e.name for e in plan.evictions] == ["a"]
    written(loop, plan, refused={"uid-a": ("ns/web",)})
    retry = loop.plan_node("n0")
    assert retry.evictions == ()  # backing off
    assert retry.facts.recheck_at is not None and retry.facts.recheck_at <= clock.now + 1
    status = published(loop, "n0")
    assert status["eviction"]["blockedBy"] == ["ns/web"]
    clock.now += eviction_backoff(1)
    assert [e.name for e in loop.plan_node("n0").evictions] == ["a"]


def test_after_the_timeout_the_node_keeps_its_config_and_a_new_leader_agrees() -> None:
    clock = Clock()
    cache = evict_pool(clock, nodes=1, timeout="30s")
    old = str(cache.nodes["n0"].config_label)
    cache.upsert_pod(gpu_pod("a", "n0", 10))
    loop = leader(cache)
    plan = turn(loop, clock, "n0")
    written(loop, plan, refused={"uid-a": ("ns/web",)})
    assert plan.status is not None
    started = plan.status["eviction"]["startedAt"]
    clock.now += 20
    fresh = leader(cache)  # a failover: the start is read from the GPUNodeState
    fresh.plan_node("n0")
    assert fresh.book.down_nodes("p") == ["n0"]  # still evicting: counted as such
    plan = turn(fresh, clock, "n0")
    decision = plan.facts.decision
    assert decision is not None and decision.eviction is not None
    assert decision.eviction["startedAt"] == started  # not restarted by the new leader
    assert [e.name for e in plan.evictions] == ["a"]  # which asks again, as it knows no answer
    written(fresh, plan, refused={"uid-a": ("ns/web",)})
    clock.now += 10  # 31 s after the first eviction
    plan = fresh.plan_node("n0")
    status = plan.status
    assert status is not None and status["phase"] == NodePhase.PENDING
    blocked = next(c for c in status["conditions"] if c["type"] == "EvictionBlocked")
    assert blocked["reason"] == "EvictionTimedOut" and "ns/a" in blocked["message"]
    assert "ns/web" in blocked["message"]
    assert plan.labels is None and plan.evictions == ()
    assert plan.taint is not None  # our taint goes: the node runs its old config
    written(fresh, plan)
    assert fresh.book.down_nodes("p") == []  # available again
    assert "n0" in fresh.book.nodes_at("p", Step.BLOCKED)
    update(cache, node("n1", **on(old, "p", 4)))  # another node of the pool
    n1 = turn(fresh, clock, "n1")
    assert n1.labels is not None  # the rollout goes on without n0
    labelled(cache, "n1", n1.labels)
    confirm(cache, "n1", 2)
    clock.now += 600
    assert turn(fresh, clock, "n0").evictions == ()  # given up for this generation
    cache.delete_pod("uid-a")  # its pod ends by itself: the change goes ahead
    assert turn(fresh, clock, "n0").labels is not None


def test_daemonset_pods_in_the_way_give_the_node_up_at_once() -> None:
    clock = Clock()
    cache = evict_pool(clock, nodes=1)
    owner = [{"kind": "DaemonSet", "name": "dcgm", "controller": True, "uid": "x"}]
    cache.upsert_pod(gpu_pod("ds", "n0", 10, ownerReferences=owner))
    cache.upsert_pod(gpu_pod("job", "n0", 2))
    loop = leader(cache)
    plan = turn(loop, clock, "n0")
    assert plan.evictions == () and plan.labels is None
    status = plan.status
    assert status is not None
    blocked = next(c for c in status["conditions"] if c["type"] == "EvictionBlocked")
    assert blocked["reason"] == "NotEvictable" and "ns/ds" in blocked["message"]


def test_without_evict_nothing_is_evicted() -> None:
    clock = Clock()
    cache = evict_pool(clock, nodes=1)
    rollout = {"maxUnavailable": 1, "canary": 0, "podPolicy": "WaitForPods"}
    cache.upsert_policy(policy("p", replicas=2, generation=3, rollout=rollout))
    cache.set_config_data(dict(cache.config_data or {}) | config_texts(cache), initial=False)
    clock.now += 10
    cache.upsert_pod(gpu_pod("a", "n0", 10))
    loop = leader(cache)
    plan = turn(loop, clock, "n0")
    assert plan.evictions == () and plan.taint is None and plan.labels is None

"""Which pods podPolicy Evict takes off a node: kube-scheduler's preemption choice."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core.records.pods import PodRecord
from gpushare_operator.core.rollout.victims import choose, importance

SHARED = "nvidia.com/gpu.shared"
GPU = "nvidia.com/gpu"


def pod(
    name: str,
    slots: int = 1,
    *,
    priority: int = 0,
    created: str = "2026-01-01T00:00:00Z",
    resource: str = SHARED,
    evictable: bool = True,
    terminating: bool = False,
) -> PodRecord:
    return PodRecord(
        name,
        "ns",
        name,
        "n1",
        "Running",
        ((resource, slots),),
        priority,
        int("".join(c for c in created if c.isdigit())),  # as the record keeps it
        evictable,
        terminating,
    )


def names(pods: tuple[PodRecord, ...]) -> list[str]:
    return [p.name for p in pods]


def test_the_lowest_priority_then_youngest_pods_go_first_and_no_more_than_needed() -> None:
    pods = [
        pod("old-low", priority=0, created="2026-01-01T00:00:00Z"),
        pod("young-low", priority=0, created="2026-01-02T00:00:00Z"),
        pod("high", priority=100, created="2026-01-03T00:00:00Z"),
        pod("older-high", priority=100, created="2026-01-01T00:00:00Z"),
    ]
    chosen = choose(pods, resource=SHARED, capacity=2)
    assert names(chosen.evict) == ["young-low", "old-low"]  # least important first
    assert chosen.stuck is None
    assert names(choose(pods, resource=SHARED, capacity=3).evict) == ["young-low"]
    assert choose(pods, resource=SHARED, capacity=4).evict == ()


def test_a_pod_of_a_resource_the_new_config_lacks_goes_whatever_its_priority() -> None:
    pods = [pod("whole", resource=GPU, priority=1000), pod("shared")]
    assert names(choose(pods, resource=SHARED, capacity=8).evict) == ["whole"]


def test_daemonset_and_static_pods_stay_and_may_leave_the_node_stuck() -> None:
    pods = [pod("ds", 2, evictable=False), pod("job", 2)]
    chosen = choose(pods, resource=SHARED, capacity=2)
    assert names(chosen.evict) == ["job"] and chosen.stuck is None
    stuck = choose(pods, resource=SHARED, capacity=1)
    assert stuck.evict == () and stuck.stuck is not None and "ns/ds" in stuck.stuck


def test_a_pod_already_terminating_is_waited_for_not_evicted() -> None:
    chosen = choose([pod("going", 2, terminating=True), pod("job", 2)], resource=SHARED, capacity=2)
    assert names(chosen.leaving) == ["going"] and chosen.evict == ()


def test_a_change_that_needs_empty_gpus_takes_every_evictable_pod() -> None:
    chosen = choose([pod("a"), pod("b", resource=GPU)], resource=None, capacity=0)
    assert sorted(names(chosen.evict)) == ["a", "b"]
    assert choose([pod("ds", evictable=False)], resource=None, capacity=0).stuck is not None


records = st.builds(
    pod,
    st.uuids().map(str),
    st.integers(1, 4),
    priority=st.integers(-2, 2),
    created=st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]),
    evictable=st.booleans(),
)


@given(st.lists(records, max_size=8), st.integers(0, 12))
def test_the_rest_fit_and_no_victim_could_have_stayed(pods: list[PodRecord], capacity: int) -> None:
    chosen = choose(pods, resource=SHARED, capacity=capacity)
    staying = [p for p in pods if p not in chosen.evict]
    held = sum(p.amount(SHARED) for p in staying)
    if chosen.stuck is not None:
        fixed = sum(p.amount(SHARED) for p in pods if not p.evictable)
        assert fixed > capacity and chosen.evict == ()
        return
    assert held <= capacity  # the rest fit
    assert all(p.evictable for p in chosen.evict)  # never a DaemonSet's or a static pod
    for victim in chosen.evict:  # minimal: giving any victim back would overfill the node
        assert held + victim.amount(SHARED) > capacity
    kept = [p for p in staying if p.evictable]
    for victim in chosen.evict:  # and a kept pod is never less important than a victim
        # that would have fitted in its place
        for other in kept:
            if importance(other) > importance(victim):
                assert victim.amount(SHARED) + held - other.amount(SHARED) > capacity

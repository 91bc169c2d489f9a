"""Pod usage without any API: effective requests, slim records, and the incremental ledger.

The property test drives a ``ClusterCache`` through random pod, node and policy events, the way
the informers and kopf would deliver them, and holds the ledger's O(1) counters to a
from-scratch recomputation (``core.records.pods.total``) after every step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import PodSink
from gpushare_operator.cache.usage import UsageLedger
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.records.pods import (
    PodRecord,
    effective_request,
    effective_requests,
    project_pod,
    total,
)
from gpushare_testing import podbodies
from gpushare_testing.builders import drain

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
# A valid device-plugin resource name no policy starts with (not a MIG device resource: those
# are always kept, whatever the policies advertise).
MIG = "nvidia.com/slice-1g"
FPGA = "example.com/fpga"  # never tracked: no policy can advertise it

Spec = dict[str, Any]


# -- building pod specs ----------------------------------------------------------------------


def app(amount: object = None, *, limit: object = None, resource: str = SHARED) -> dict[str, Any]:
    """A container asking for ``amount`` (request) and/or ``limit`` of ``resource``."""
    resources: dict[str, Any] = {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}
    if amount is not None:
        resources["requests"][resource] = amount
    if limit is not None:
        resources["limits"][resource] = limit
    return {"name": "c", "image": "busybox", "resources": resources}


def init(amount: object = None, *, limit: object = None, resource: str = SHARED) -> dict[str, Any]:
    return app(amount, limit=limit, resource=resource)


def sidecar(amount: object, *, resource: str = SHARED) -> dict[str, Any]:
    return {**app(amount, resource=resource), "restartPolicy": "Always"}


def spec(*containers: dict[str, Any], inits: tuple[dict[str, Any], ...] = ()) -> Spec:
    body: Spec = {"containers": list(containers)}
    if inits:
        body["initContainers"] = list(inits)
    return body


# -- effective_request: the scheduler's rule, one row per case --------------------------------

EFFECTIVE_CASES: list[tuple[str, Spec, int]] = [
    ("no containers at all", {}, 0),
    ("empty container lists", {"containers": [], "initContainers": []}, 0),
    ("one app container", spec(app("2")), 2),
    ("app containers sum", spec(app("2"), app("3"), app("1")), 6),
    ("app container without the resource", spec(app("2"), app()), 2),
    ("init smaller than apps: apps win", spec(app("3"), inits=(init("1"),)), 3),
    ("init bigger than apps: init wins", spec(app("2"), inits=(init("6"),)), 6),
    ("init containers run one at a time: max", spec(app("1"), inits=(init("3"), init("4"))), 4),
    ("init with apps asking nothing", spec(app(), inits=(init("2"),)), 2),
    (
        "sidecar declared before an init adds to it",
        spec(app("1"), inits=(sidecar("2"), init("5"))),
        7,
    ),
    (
        "sidecar declared after an init does not",
        spec(app("1"), inits=(init("5"), sidecar("2"))),
        5,
    ),
    (
        "sidecar between two inits counts for the later one only",
        spec(app("1"), inits=(init("4"), sidecar("2"), init("3"))),
        5,
    ),
    ("sidecars add to the steady state", spec(app("3"), inits=(sidecar("2"), sidecar("1"))), 6),
    (
        "sidecar after every init still adds to the steady state",
        spec(app("3"), inits=(init("4"), sidecar("2"))),
        5,
    ),
    ("limit without a request counts", spec(app(limit="2")), 2),
    ("limits in init containers count too", spec(app(limit="1"), inits=(init(limit="3"),)), 3),
    ("request wins over a larger limit", spec(app("1", limit="3")), 1),
    ("request wins over a smaller limit", spec(app("3", limit="1")), 3),
    ("explicit zero request wins over the limit", spec(app("0", limit="2")), 0),
    ("integer quantity (not a string)", spec(app(3)), 3),
    ("fractional quantity ignored", spec(app("1.5"), app("2")), 2),
    ("milli quantity ignored", spec(app("500m")), 0),
    ("suffixed quantity ignored", spec(app("1k")), 0),
    ("garbage quantity ignored", spec(app("lots")), 0),
    ("null quantity ignored", spec(app(limit=None), app("1")), 1),
    ("list quantity ignored", spec(app([1])), 0),
    ("another resource does not count", spec(app("4", resource=GPU)), 0),
    (
        "null resources and null sections",
        {"containers": [{"name": "a", "resources": None}, {"name": "b"}], "initContainers": None},
        0,
    ),
    (
        "null requests fall back to limits",
        {"containers": [{"name": "a", "resources": {"requests": None, "limits": {SHARED: "2"}}}]},
        2,
    ),
]


@pytest.mark.parametrize(
    ("pod_spec", "expected"),
    [pytest.param(s, e, id=name) for name, s, e in EFFECTIVE_CASES],
)
def test_effective_request(pod_spec: Spec, expected: int) -> None:
    assert effective_request(pod_spec, SHARED) == expected


def test_effective_requests_keeps_tracked_positive_amounts_sorted() -> None:
    pod_spec = spec(
        app("2", resource=SHARED),
        app("1", resource=GPU),
        app("5", resource=FPGA),
        app("0", resource=MIG),
    )
    tracked = {GPU, SHARED, MIG}.__contains__
    assert effective_requests(pod_spec, tracked=tracked) == ((GPU, 1), (SHARED, 2))
    assert effective_requests(pod_spec, tracked={FPGA}.__contains__) == ((FPGA, 5),)
    assert effective_requests(pod_spec, tracked=lambda _: False) == ()


def test_effective_requests_considers_resources_named_only_in_init_containers() -> None:
    pod_spec = spec(app("1", resource=GPU), inits=(init(limit="3", resource=MIG),))
    assert effective_requests(pod_spec, tracked={GPU, MIG}.__contains__) == ((GPU, 1), (MIG, 3))


def test_equal_requests_share_one_tuple() -> None:
    # Built apart, from separately decoded strings: equal, but not the same objects.
    first = effective_requests(spec(app("2"), app(limit="1")), tracked={SHARED}.__contains__)
    second = effective_requests(spec(app("3")), tracked={SHARED}.__contains__)
    assert first == second == ((SHARED, 3),)
    assert first is second
    assert first[0] is second[0]


# -- project_pod: the one slim copy ----------------------------------------------------------


def tracked_default(name: str) -> bool:
    return name in (GPU, SHARED)


def fresh(text: str) -> str:
    """An equal string that is not the interned one (as a JSON decoder would produce)."""
    return "".join([text[:1], text[1:]])


def test_pod_without_a_tracked_resource_is_not_kept() -> None:
    assert project_pod(podbodies.plain_pod(name="web", node="n1"), tracked=tracked_default) is None
    fpga = podbodies.shared_gpu_pod(name="f", node="n1", resource=FPGA)
    assert project_pod(fpga, tracked=tracked_default) is None
    assert project_pod(fpga, tracked={FPGA}.__contains__) is not None
    assert project_pod({}, tracked=tracked_default) is None


def test_record_keeps_identity_node_phase_and_requests_only() -> None:
    body = podbodies.shared_gpu_pod(name="vllm-0", node="gpu-1", namespace="serving", count=2)
    assert body["metadata"]["managedFields"]  # the body is a realistic one
    record = project_pod(body, tracked=tracked_default)
    assert record == PodRecord(
        uid=body["metadata"]["uid"],
        namespace="serving",
        name="vllm-0",
        node="gpu-1",
        phase="Running",
        requests=((SHARED, 2),),
        priority=0,
        created=int("".join(c for c in body["metadata"]["creationTimestamp"] if c.isdigit())),
        evictable=True,
        terminating=False,
        memory_mib=None,
        labels=(),  # labelled, but no PodDisruptionBudget reads any of its keys
    )
    assert [f.name for f in dataclasses.fields(PodRecord)] == [
        "uid",
        "namespace",
        "name",
        "node",
        "phase",
        "requests",
        "priority",
        "created",
        "evictable",
        "terminating",
        "memory_mib",
        "labels",
    ]
    assert not hasattr(record, "__dict__")  # slots: nothing else can be attached
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.phase = "Failed"  # type: ignore[misc]


def _reachable(obj: object) -> Iterator[object]:
    for child in gc.get_referents(obj):
        if isinstance(child, type):
            continue
        yield child
        if isinstance(child, tuple):
            yield from _reachable(child)


def test_record_holds_no_part_of_the_body() -> None:
    body = podbodies.shared_gpu_pod(name="p", node="n1", init_count=3, sidecar_count=1)
    record = project_pod(body, tracked=tracked_default)
    assert record is not None
    held = list(_reachable(record))
    assert held, "gc sees the record's fields"
    assert all(isinstance(x, str | int | tuple | None) for x in held), held
    assert sys.getsizeof(record) <= 128  # 12 slots: one pointer each, and the object header


def test_a_memory_request_label_is_kept_in_mib_and_a_broken_one_as_none() -> None:
    body = podbodies.shared_gpu_pod(name="p", node="n1")
    body["metadata"]["labels"]["gpushare.dev/gpu-memory"] = "20Gi"
    record = project_pod(body, tracked=tracked_default)
    assert record is not None and record.memory_mib == 20480
    body["metadata"]["labels"]["gpushare.dev/gpu-memory"] = "plenty"
    record = project_pod(body, tracked=tracked_default)
    assert record is not None and record.memory_mib is None


def test_effective_request_of_a_realistic_pod() -> None:
    # fetch-model (init, 3) runs alongside nothing declared before it; proxy (sidecar, 1) is
    # declared after it, so: max(3, 1 app + 1 sidecar) = 3.
    body = podbodies.shared_gpu_pod(name="p", node="n1", count=1, init_count=3, sidecar_count=1)
    record = project_pod(body, tracked=tracked_default)
    assert record is not None and record.requests == ((SHARED, 3),)
    small = podbodies.shared_gpu_pod(name="q", node="n1", count=2, init_count=1, sidecar_count=1)
    record = project_pod(small, tracked=tracked_default)
    assert record is not None and record.requests == ((SHARED, 3),)


def test_unbound_pod_is_kept_with_no_node_and_holds_no_slots() -> None:
    body = podbodies.shared_gpu_pod(name="waiting", node=None)
    record = project_pod(body, tracked=tracked_default)
    assert record is not None
    assert record.node is None
    assert record.phase == "Pending"
    assert not record.holds_slots
    empty = {**body, "spec": {**body["spec"], "nodeName": ""}}
    assert (project_pod(empty, tracked=tracked_default) or record).node is None


@pytest.mark.parametrize(
    ("node", "phase", "holds"),
    [
        ("n1", "Pending", True),
        ("n1", "Running", True),
        ("n1", "Unknown", True),
        ("n1", "Succeeded", False),
        ("n1", "Failed", False),
        (None, "Pending", False),
    ],
)
def test_holds_slots(node: str | None, phase: str, holds: bool) -> None:
    body = podbodies.shared_gpu_pod(name="p", node=node, phase=phase)
    record = project_pod(body, tracked=tracked_default)
    assert record is not None and record.phase == phase
    assert record.holds_slots is holds


def test_missing_phase_is_pending() -> None:
    body = {"metadata": {"uid": "u"}, "spec": {"nodeName": "n1", "containers": [app("1")]}}
    record = project_pod(body, tracked=tracked_default)
    assert record is not None and record.phase == "Pending" and record.holds_slots


def test_records_share_interned_strings_and_request_tuples() -> None:
    records = []
    for index in range(2):
        body = podbodies.shared_gpu_pod(
            name=f"p{index}", node=fresh("gpu-node-7"), namespace=fresh("team-a")
        )
        body["status"]["phase"] = fresh("Running")
        record = project_pod(body, tracked=tracked_default)
        assert record is not None
        records.append(record)
    first, second = records
    assert first.node is second.node is sys.intern("gpu-node-7")
    assert first.namespace is second.namespace
    assert first.phase is second.phase
    assert first.requests is second.requests
    assert first.requests[0][0] is sys.intern(SHARED)


def test_amount_and_total() -> None:
    def rec(uid: str, node: str | None, phase: str, *requests: tuple[str, int]) -> PodRecord:
        return PodRecord(uid, "ns", uid, node, phase, tuple(requests))

    records = [
        rec("a", "n1", "Running", (GPU, 1), (SHARED, 2)),
        rec("b", "n1", "Pending", (SHARED, 3)),
        rec("c", "n1", "Succeeded", (SHARED, 5)),
        rec("d", "n1", "Failed", (SHARED, 5)),
        rec("e", "n2", "Running", (SHARED, 7)),
        rec("f", None, "Pending", (SHARED, 11)),
        rec("g", "n1", "Running", (GPU, 4)),
    ]
    assert records[0].amount(SHARED) == 2
    assert records[0].amount(MIG) == 0
    assert total(records, node="n1", resource=SHARED) == (5, 2)
    assert total(records, node="n1", resource=GPU) == (5, 2)
    assert total(records, node="n2", resource=SHARED) == (7, 1)
    assert total(records, node="n3", resource=SHARED) == (0, 0)


# -- the ledger and the state, deterministic cases --------------------------------------------


def node_body(name: str, *, pool: str | None, gpus: int = 4) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(gpus)}
    if pool is not None:
        labels["pool"] = pool
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "labels": labels},
        "status": {"capacity": {GPU: str(gpus)}},
    }


def policy_body(
    name: str,
    *,
    pool: str | None,
    uid: str | None = None,
    generation: int = 1,
    replicas: int = 4,
    priority: int = 0,
    resource: str = GPU,
    rename: bool = False,
) -> dict[str, Any]:
    selector: dict[str, Any] = {"matchLabels": {"pool": pool}} if pool is not None else {}
    return {
        "metadata": {"name": name, "uid": uid or f"uid-{name}", "generation": generation},
        "spec": {
            "nodeSelector": selector,
            "priority": priority,
            "strategy": "TimeSlicing",
            "replicas": replicas,
            "resourceName": resource,
            "renameByDefault": rename,
        },
    }


def pod_body(
    uid: str, *, node: str | None, phase: str = "Running", pod_spec: Spec | None = None
) -> dict[str, Any]:
    body_spec = dict(pod_spec or spec(app("1")))
    if node is not None:
        body_spec["nodeName"] = node
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": f"pod-{uid}"},
        "spec": body_spec,
        "status": {"phase": phase},
    }


def test_ledger_keeps_the_record_it_is_given() -> None:
    ledger = UsageLedger()
    record = PodRecord("u", "ns", "p", "n1", "Running", ((SHARED, 2),))
    assert ledger.replace("u", record) == (None, True)
    assert ledger.pods["u"] is record  # shared, not copied
    assert ledger.node_usage("n1", SHARED) == (2, 1)
    assert ledger.replace("u", record) == (record, False)  # no change: nothing moved
    finished = dataclasses.replace(record, phase="Succeeded")
    assert ledger.replace("u", finished) == (record, True)
    assert ledger.node_usage("n1", SHARED) == (0, 0)
    assert ledger.replace("u", None) == (finished, False)  # was not counted: nothing to undo
    assert ledger.pods == {}


def test_ledger_moves_a_nodes_slots_with_its_governor() -> None:
    ledger = UsageLedger()
    ledger.replace("a", PodRecord("a", "ns", "a", "n1", "Running", ((GPU, 1), (SHARED, 2))))
    ledger.replace("b", PodRecord("b", "ns", "b", "n1", "Pending", ((SHARED, 3),)))
    assert ledger.set_governor("n1", ("p", (SHARED,))) is None
    assert (ledger.policy_slots("p"), ledger.policy_slots("q")) == (5, 0)
    assert ledger.set_governor("n1", ("q", (GPU,))) == ("p", (SHARED,))
    assert (ledger.policy_slots("p"), ledger.policy_slots("q")) == (0, 1)
    ledger.replace("c", PodRecord("c", "ns", "c", "n1", "Running", ((GPU, 2),)))
    assert ledger.policy_slots("q") == 3
    ledger.set_governor("n1", None)
    assert ledger.policy_slots("q") == 0
    assert ledger.node_usage("n1", GPU) == (3, 2)  # the node's own counters stay
    assert ledger.node_slots("n1") == {GPU: 3, SHARED: 5}
    assert (ledger.node_total("n1"), ledger.node_total("n2")) == (8, 0)
    ledger.set_governor("n1", ("mixed", (GPU, SHARED)))  # a mixed MIG policy: every resource
    assert ledger.policy_resource_slots("mixed") == {GPU: 3, SHARED: 5}
    ledger.replace("b", None)
    assert ledger.policy_resource_slots("mixed") == {GPU: 3, SHARED: 2}
    assert ledger.policy_slots("mixed") == 5


class NoScan(dict[str, PodRecord]):
    """A pod map that fails the test if anything walks over all of it."""

    def __iter__(self) -> NoReturn:
        raise AssertionError("a per-event code path iterated over every pod")

    def __len__(self) -> NoReturn:
        raise AssertionError("a per-event code path counted every pod")

    def keys(self) -> NoReturn:
        raise AssertionError("a per-event code path listed every pod")

    def values(self) -> NoReturn:
        raise AssertionError("a per-event code path iterated over every pod")

    def items(self) -> NoReturn:
        raise AssertionError("a per-event code path iterated over every pod")


def test_no_event_scans_all_pods() -> None:
    cache = ClusterCache()
    cache.usage.pods = NoScan(cache.usage.pods)
    for index in range(3):
        cache.upsert_node(node_body(f"n{index}", pool="a"))
    cache.upsert_policy(policy_body("p", pool="a", rename=True))
    for index in range(200):
        cache.upsert_pod(pod_body(f"u{index}", node=f"n{index % 3}", pod_spec=spec(app("1"))))
    cache.upsert_pod(pod_body("u1", node="n2", phase="Running"))  # rebind
    cache.upsert_pod(pod_body("u2", node="n2", phase="Succeeded"))
    cache.delete_pod("u3")
    cache.upsert_node(node_body("n0", pool="b"))  # relabel out of the pool
    cache.upsert_policy(policy_body("p", pool="a", generation=2, replicas=2, rename=True))
    cache.upsert_policy(policy_body("q", pool="b", rename=True, priority=1))
    cache.delete_node("n1")
    cache.delete_policy("q")
    # n2 had 66 pods; u1 moved in, u2 finished; n0 left the pool, n1 is gone.
    assert cache.usage.policy_slots("p") == 66
    assert cache.usage.node_usage("n2", SHARED) == (66, 66)


def test_pod_events_mark_their_node_and_policy_dirty() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_body("n1", pool="a"))
    cache.upsert_node(node_body("n2", pool="b"))
    cache.upsert_policy(policy_body("p", pool="a", resource=GPU, rename=True))
    drain(cache)
    cache.upsert_pod(pod_body("u", node="n1", pod_spec=spec(app("2"))))
    assert (set(cache.queue.nodes), set(cache.queue.policies)) == ({"n1"}, {"p"})
    assert cache.usage.policy_slots("p") == 2
    drain(cache)
    cache.upsert_pod(pod_body("u", node="n2", pod_spec=spec(app("2"))))  # rebound
    assert (set(cache.queue.nodes), set(cache.queue.policies)) == ({"n1", "n2"}, {"p"})
    assert cache.usage.policy_slots("p") == 0
    drain(cache)
    cache.upsert_pod(pod_body("u", node=None, pod_spec=spec(app("2"))))
    cache.upsert_pod(pod_body("u", node=None, phase="Running", pod_spec=spec(app("2"))))
    assert set(cache.queue.nodes) == {"n2"}
    drain(cache)
    cache.upsert_pod(pod_body("v", node=None))  # unbound and new: no counter moved
    cache.upsert_pod(podbodies.plain_pod(name="web", node="n1"))
    assert not cache.queue.nodes and not cache.queue.policies


def test_new_resource_asks_for_a_relist_once_and_the_relist_recovers_its_pods() -> None:
    cache = ClusterCache()
    calls: list[str] = []
    cache.on_new_resource = lambda: calls.append("relist")
    sink = PodSink(cache)
    cache.upsert_node(node_body("n1", pool="mig"))
    mig_pod = pod_body("m", node="n1", pod_spec=spec(app("2", resource=MIG)))
    shared_pod = pod_body("s", node="n1", pod_spec=spec(app("1", resource=SHARED)))
    for body in (mig_pod, shared_pod):
        sink.apply("ADDED", body)
    assert set(cache.usage.pods) == {"s"}  # nobody advertises MIG yet: not kept

    cache.upsert_policy(policy_body("p", pool="gpu", resource=GPU, rename=True))
    assert calls == []  # nvidia.com/gpu.shared is always tracked
    cache.upsert_policy(policy_body("mig", pool="mig", resource=MIG))
    assert calls == ["relist"]
    assert MIG in cache.tracked_resources
    cache.upsert_policy(policy_body("mig", pool="mig", resource=MIG, generation=2, replicas=2))
    cache.upsert_policy(policy_body("mig-2", pool="other", resource=MIG))
    cache.upsert_policy({**policy_body("mig", pool="mig", resource=MIG, generation=2)})
    assert calls == ["relist"]  # MIG is known now
    assert cache.usage.policy_slots("mig") == 0  # …but its pod was skipped until the relist

    sink.begin_relist()
    for body in (mig_pod, shared_pod):
        sink.relist_item(body)
    sink.end_relist()
    assert set(cache.usage.pods) == {"m", "s"}
    assert cache.usage.policy_slots("mig") == 2
    assert cache.usage.node_usage("n1", MIG) == (2, 1)

    cache.upsert_policy(policy_body("mig", pool="mig", resource=MIG, generation=3, rename=True))
    assert calls == ["relist", "relist"]  # nvidia.com/mig-1g.10gb.shared is new again
    cache.delete_policy("mig")
    cache.upsert_policy(policy_body("mig", pool="mig", uid="uid-mig-2", resource=MIG))
    assert calls == ["relist", "relist"]


def test_invalid_policy_tracks_nothing() -> None:
    cache = ClusterCache()
    calls: list[str] = []
    cache.on_new_resource = lambda: calls.append("relist")
    cache.upsert_policy(policy_body("bad", pool="a", resource=MIG, replicas=1))
    assert calls == []
    assert MIG not in cache.tracked_resources


# -- the property: incremental counters equal a from-scratch recount --------------------------

NODES = ("n0", "n1", "n2", "n3")
UNKNOWN_NODE = "ghost"  # pods bound to a node the operator never saw (or no GPU node)
POOLS = ("a", "b")
POLICIES = ("p0", "p1", "p2")
POLICY_RESOURCES = (GPU, MIG)
POD_RESOURCES = (GPU, SHARED, MIG, MIG + ".shared", FPGA)
ALL_PHASES = ("Pending", "Running", "Unknown", "Succeeded", "Failed")
TERMINAL = frozenset({"Succeeded", "Failed"})

# Mostly small whole numbers, sometimes a zero or a quantity the rule ignores.
quantities = st.one_of(
    st.integers(1, 3).map(str),
    st.integers(1, 3).map(str),
    st.integers(0, 3),
    st.sampled_from(["0", "1.5", "500m", "x"]),
)


@st.composite
def containers(draw: st.DrawFn) -> dict[str, Any]:
    # Mostly the resources policies advertise by default, so that most pods count somewhere.
    resource = draw(st.sampled_from((GPU, SHARED, GPU, SHARED, *POD_RESOURCES)))
    how = draw(st.sampled_from(("request", "limit", "both")))
    resources: dict[str, Any] = {"requests": {}, "limits": {}}
    if how in ("request", "both"):
        resources["requests"][resource] = draw(quantities)
    if how in ("limit", "both"):
        resources["limits"][resource] = draw(quantities)
    container: dict[str, Any] = {"name": "c", "resources": resources}
    if draw(st.booleans()):
        container["restartPolicy"] = "Always"  # only meaningful among init containers
    return container


pod_specs = st.builds(
    lambda apps, inits: {"containers": apps, "initContainers": inits},
    st.lists(containers(), min_size=1, max_size=3),
    st.lists(containers(), max_size=3),
)
bindings = st.sampled_from((*NODES, *NODES, None, UNKNOWN_NODE))


class UsageMachine(RuleBasedStateMachine):
    """Pods, nodes and policies as the informers and kopf deliver them, in any order."""

    pods = Bundle("pods")

    def __init__(self) -> None:
        super().__init__()
        self.cache = ClusterCache()
        self.sink = PodSink(self.cache)
        self.relists_requested = 0
        self.cache.on_new_resource = self._relist_requested
        self.field_selector = True
        self.bodies: dict[str, dict[str, Any]] = {}  # uid → the pod as the API server has it
        self.next_uid = 0
        self.generations: dict[str, int] = {}
        self.policy_uids: dict[str, str] = {}
        self.deleted_policies = 0

    def _relist_requested(self) -> None:
        self.relists_requested += 1

    # The real informer leaves out finished pods on the server (a pod that finishes arrives as
    # DELETED); without the selector it would see them as MODIFIED.  Either way the counts hold.
    @initialize(selector=st.booleans())
    def choose_selector(self, selector: bool) -> None:
        self.field_selector = selector

    def _listed(self, body: Mapping[str, Any]) -> bool:
        return not (self.field_selector and body["status"]["phase"] in TERMINAL)

    def _deliver(self, uid: str, *, deleted: bool = False) -> None:
        body = self.bodies.get(uid)
        if body is None or deleted:
            self.sink.apply("DELETED", {"metadata": {"uid": uid}})
        elif self._listed(body):
            self.sink.apply("MODIFIED", body)
        else:
            self.sink.apply("DELETED", body)

    def _relist(self) -> None:
        self.sink.begin_relist()
        for body in self.bodies.values():
            if self._listed(body):
                self.sink.relist_item(body)
        self.sink.end_relist()

    def _published(self, node: str) -> tuple[object, ...]:
        """What the GPUNodeState shows of usage: who governs, and (slots, pods) of its resource."""
        governor = self.cache.usage.governor(node)
        return (governor, self.cache.usage.node_usage(node, governor[1]) if governor else None)

    @contextlib.contextmanager
    def _marks_dirty(self) -> Iterator[None]:
        """Whatever an event changes of published usage, it leaves dirty for the writer."""
        cache = self.cache
        drain(cache)
        nodes = {n: self._published(n) for n in cache.nodes}
        slots = {p: cache.usage.policy_slots(p) for p in POLICIES}
        yield
        for node in cache.nodes:
            if self._published(node) != nodes.get(node):
                assert node in cache.queue.nodes, node
        for policy in cache.policies:
            if cache.usage.policy_slots(policy) != slots[policy]:
                assert policy in cache.queue.policies, policy

    # -- pods ----------------------------------------------------------------------------

    @rule(target=pods, pod_spec=pod_specs, node=bindings, phase=st.sampled_from(ALL_PHASES))
    def add_pod(self, pod_spec: Spec, node: str | None, phase: str) -> str:
        uid = f"u{self.next_uid}"
        self.next_uid += 1
        self.bodies[uid] = pod_body(uid, node=node, phase=phase, pod_spec=pod_spec)
        with self._marks_dirty():
            self._deliver(uid)
        return uid

    @rule(uid=pods, phase=st.sampled_from(ALL_PHASES))
    def set_phase(self, uid: str, phase: str) -> None:
        if uid in self.bodies:
            self.bodies[uid]["status"] = {"phase": phase}
            with self._marks_dirty():
                self._deliver(uid)

    @rule(uid=pods, node=bindings)
    def rebind(self, uid: str, node: str | None) -> None:
        if uid in self.bodies:
            body_spec = {k: v for k, v in self.bodies[uid]["spec"].items() if k != "nodeName"}
            if node is not None:
                body_spec["nodeName"] = node
            self.bodies[uid]["spec"] = body_spec
            with self._marks_dirty():
                self._deliver(uid)

    @rule(uid=consumes(pods))
    def delete_pod(self, uid: str) -> None:
        self.bodies.pop(uid, None)
        with self._marks_dirty():
            self._deliver(uid, deleted=True)

    @rule()
    def relist_after_gone(self) -> None:
        with self._marks_dirty():
            self._relist()

    # -- nodes ---------------------------------------------------------------------------

    @rule(name=st.sampled_from(NODES), pool=st.sampled_from((*POOLS, None)), gpus=st.integers(0, 8))
    def upsert_node(self, name: str, pool: str | None, gpus: int) -> None:
        with self._marks_dirty():
            self.cache.upsert_node(node_body(name, pool=pool, gpus=gpus))

    @rule(name=st.sampled_from(NODES))
    def delete_node(self, name: str) -> None:
        with self._marks_dirty():
            self.cache.delete_node(name)

    # -- policies ------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(POLICIES),
        pool=st.sampled_from((*POOLS, None)),
        replicas=st.sampled_from((1, 2, 4)),  # 1 is invalid: the policy governs nothing
        priority=st.integers(0, 2),
        resource=st.sampled_from(POLICY_RESOURCES),
        rename=st.booleans(),
    )
    def upsert_policy(
        self, name: str, pool: str | None, replicas: int, priority: int, resource: str, rename: bool
    ) -> None:
        generation = self.generations.get(name, 0) + 1
        self.generations[name] = generation
        uid = self.policy_uids.setdefault(name, f"uid-{name}-{self.deleted_policies}")
        body = policy_body(
            name,
            pool=pool,
            uid=uid,
            generation=generation,
            replicas=replicas,
            priority=priority,
            resource=resource,
            rename=rename,
        )
        advertised = resource + devconfigs.SHARED_SUFFIX if rename else resource
        new = replicas >= devconfigs.MIN_REPLICAS and advertised not in self.cache.tracked_resources
        before = self.relists_requested
        with self._marks_dirty():
            self.cache.upsert_policy(body)
            assert self.relists_requested - before == int(new)
            if self.relists_requested != before:
                self._relist()  # what the pod informer does when asked
        # kopf delivers our own status write back: same generation, nothing may move.
        counters = self._counters()
        self.cache.upsert_policy({**body, "status": {"slots": {"allocated": 99}}})
        assert self._counters() == counters

    @rule(name=st.sampled_from(POLICIES))
    def delete_policy(self, name: str) -> None:
        with self._marks_dirty():
            self.cache.delete_policy(name)
        if self.policy_uids.pop(name, None) is not None:
            self.deleted_policies += 1
            self.generations.pop(name, None)

    # -- checks --------------------------------------------------------------------------

    def _counters(self) -> tuple[dict[tuple[str, str], tuple[int, int]], dict[str, int]]:
        usage = self.cache.usage
        by_node = {
            (n, r): usage.node_usage(n, r) for n in (*NODES, UNKNOWN_NODE) for r in POD_RESOURCES
        }
        return by_node, {p: usage.policy_slots(p) for p in POLICIES}

    @invariant()
    def ledger_keeps_what_the_informer_shows(self) -> None:
        tracked = self.cache.tracked_resources.__contains__
        wanted = {}
        for uid, body in self.bodies.items():
            if self._listed(body) and (record := project_pod(body, tracked=tracked)) is not None:
                wanted[uid] = record
        assert self.cache.usage.pods == wanted

    @invariant()
    def node_counters_equal_a_recount(self) -> None:
        usage = self.cache.usage
        records = list(usage.pods.values())
        for node in (*NODES, UNKNOWN_NODE):
            for resource in POD_RESOURCES:
                assert usage.node_usage(node, resource) == total(
                    records, node=node, resource=resource
                ), (node, resource)

    @invariant()
    def policy_counters_equal_a_recount(self) -> None:
        cache = self.cache
        records = list(cache.usage.pods.values())
        expected = dict.fromkeys(POLICIES, 0)
        for node in set(NODES) - set(cache.nodes):
            assert cache.usage.governor(node) is None
        for node in cache.nodes:
            policy = cache.governing(node)
            if policy is None or policy.sharing is None:
                assert cache.usage.governor(node) is None
                continue
            resource = devconfigs.advertised_resource(policy.sharing)
            assert cache.usage.governor(node) == (policy.name, (resource,))
            expected[policy.name] += total(records, node=node, resource=resource)[0]
        assert {p: cache.usage.policy_slots(p) for p in POLICIES} == expected

    @invariant()
    def every_advertised_resource_is_tracked(self) -> None:
        for policy in self.cache.policies.values():
            if policy.sharing is not None:
                assert devconfigs.advertised_resource(policy.sharing) in (
                    self.cache.tracked_resources
                )


UsageMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestUsageLedger = UsageMachine.TestCase

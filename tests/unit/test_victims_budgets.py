"""The victims podPolicy Evict chooses are the ones kube-scheduler's preemption would choose
with the same PodDisruptionBudgets: held against a plain reference of ``SelectVictimsOnNode``
and ``filterPodsWithPDBViolation`` (kubernetes pkg/scheduler/framework/plugins/
defaultpreemption/default_preemption.go), written here from the Go code's logic."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpushare_operator.core.records.pods import PodRecord, project_pod
from gpushare_operator.core.rollout import budgets as core_budgets
from gpushare_operator.core.rollout.budgets import BudgetRecord, project_budget
from gpushare_operator.core.rollout.victims import choose

GPU = "nvidia.com/gpu"
DAY1, DAY2 = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"

# -- the reference, as the Go code reads --------------------------------------------------------


@dataclass(frozen=True)
class RefPod:
    namespace: str
    name: str
    labels: Mapping[str, str]
    slots: int
    priority: int
    created: str


@dataclass(frozen=True)
class RefBudget:
    namespace: str
    selector: Mapping[str, Any] | None  # metav1.LabelSelector; None: nil
    allowed: int  # status.disruptionsAllowed
    disrupted: frozenset[str] = field(default_factory=frozenset)  # status.disruptedPods


def more_important(pod: RefPod) -> tuple[int, str, str, str]:
    """MoreImportantPod: the higher priority, then the earlier start (here the creation time,
    as gpushare reads it), then, where Go's sort leaves ties to chance, by name."""
    return (-pod.priority, pod.created, pod.namespace, pod.name)


def requirement_holds(labels: Mapping[str, str], expression: Mapping[str, Any]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values")
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    assert operator == "DoesNotExist"
    return key not in labels


def selector_empty(selector: Mapping[str, Any] | None) -> bool:
    """labels.Selector.Empty(): LabelSelectorAsSelector(nil) is Nothing (not empty: it matches
    nothing), and a selector with no requirement is Everything (empty)."""
    if selector is None:
        return False
    return not selector.get("matchLabels") and not selector.get("matchExpressions")


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(requirement_holds(labels, e) for e in selector.get("matchExpressions") or ())


def filter_pods_with_pdb_violation(
    pods: Sequence[RefPod], pdbs: Sequence[RefBudget]
) -> tuple[list[RefPod], list[RefPod]]:
    pdbs_allowed = [pdb.allowed for pdb in pdbs]
    violating, non_violating = [], []
    for pod in pods:
        pdb_for_pod_is_violated = False
        if len(pod.labels) != 0:  # a pod with no labels will not match any PDB
            for i, pdb in enumerate(pdbs):
                if pdb.namespace != pod.namespace:
                    continue
                if selector_empty(pdb.selector) or not selector_matches(pdb.selector, pod.labels):
                    continue
                if pod.name in pdb.disrupted:
                    continue  # processed by the API server already: not a violation
                pdbs_allowed[i] -= 1
                if pdbs_allowed[i] < 0:
                    pdb_for_pod_is_violated = True
        if pdb_for_pod_is_violated:
            violating.append(pod)
        else:
            non_violating.append(pod)
    return violating, non_violating


def select_victims_on_node(
    pods: Sequence[RefPod], pdbs: Sequence[RefBudget], *, capacity: int
) -> list[str]:
    """The victims' names, most important first; every pod is a potential victim, and "fits"
    is the node's one resource within ``capacity``."""
    potential = sorted(pods, key=more_important)
    violating, non_violating = filter_pods_with_pdb_violation(potential, pdbs)
    victims: list[RefPod] = []
    held = 0

    def reprieve(pod: RefPod) -> None:
        nonlocal held
        if held + pod.slots <= capacity:
            held += pod.slots
        else:
            victims.append(pod)

    for pod in violating:
        reprieve(pod)
    for pod in non_violating:
        reprieve(pod)
    if violating and non_violating:
        victims.sort(key=more_important)
    return [v.name for v in victims]


# -- gpushare's side: the same pods and budgets through the operator's own projection ------------


def pod_body(pod: RefPod) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "uid": f"uid-{pod.name}",
        "namespace": pod.namespace,
        "name": pod.name,
        "creationTimestamp": pod.created,
    }
    if pod.labels:
        metadata["labels"] = dict(pod.labels)
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": "n1",
            "priority": pod.priority,
            "containers": [{"resources": {"requests": {GPU: str(pod.slots)}}}],
        },
        "status": {"phase": "Running"},
    }


def budget_body(index: int, budget: RefBudget) -> dict[str, Any]:
    spec = {} if budget.selector is None else {"selector": dict(budget.selector)}
    status: dict[str, Any] = {"disruptionsAllowed": budget.allowed}
    if budget.disrupted:
        status["disruptedPods"] = dict.fromkeys(budget.disrupted, "2026-01-01T00:00:00Z")
    return {
        "metadata": {"namespace": budget.namespace, "name": f"pdb-{index}"},
        "spec": spec,
        "status": status,
    }


def ours(pods: Sequence[RefPod], pdbs: Sequence[RefBudget], *, capacity: int) -> list[str]:
    records = [project_budget(budget_body(i, b)) for i, b in enumerate(pdbs)]
    keys = core_budgets.label_keys(records)
    slim = [project_pod(pod_body(p), tracked=lambda r: r == GPU, label_keys=keys) for p in pods]
    chosen = choose([p for p in slim if p], resource=GPU, capacity=capacity, budgets=records)
    return [p.name for p in reversed(chosen.evict)]  # evicted least important first


# -- the property --------------------------------------------------------------------------------

NAMESPACES = ("a", "a", "a", "b")  # mostly one: budgets of another namespace cover nothing
KEYS = ("app", "tier")  # what selectors read
VALUES = ("x", "y")

label_sets = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)
# Pods also carry a label no budget reads: labelled, yet nothing of it kept but "labelled".
pod_labels = st.dictionaries(st.sampled_from((*KEYS, "zone")), st.sampled_from(VALUES), max_size=2)
expressions = st.one_of(
    st.builds(
        lambda k, op, vs: {"key": k, "operator": op, "values": sorted(vs)},
        st.sampled_from(KEYS),
        st.sampled_from(("In", "NotIn")),
        st.sets(st.sampled_from(VALUES), min_size=1),
    ),
    st.builds(
        lambda k, op: {"key": k, "operator": op},
        st.sampled_from(KEYS),
        st.sampled_from(("Exists", "DoesNotExist")),
    ),
)
requirements = st.builds(
    lambda labels, exprs: {
        **({"matchLabels": labels} if labels else {}),
        **({"matchExpressions": exprs} if exprs else {}),
    },
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=1),
    st.lists(expressions, min_size=1, max_size=2),
)
selectors = st.one_of(
    st.none(),
    st.just({}),
    requirements,
    st.builds(
        lambda labels, exprs: {
            **({"matchLabels": labels} if labels else {}),
            **({"matchExpressions": exprs} if exprs else {}),
        },
        label_sets,
        st.lists(expressions, max_size=2),
    ),
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[RefPod], list[RefBudget], int]:
    count = draw(st.integers(min_value=1, max_value=8))
    pods = [
        RefPod(
            namespace=draw(st.sampled_from(NAMESPACES)),
            name=f"p{i}",
            labels=draw(pod_labels),
            slots=draw(st.integers(min_value=1, max_value=4)),
            priority=draw(st.sampled_from((0, 10))),
            created=f"2026-01-0{draw(st.integers(min_value=1, max_value=4))}T00:00:00Z",
        )
        for i in range(count)
    ]
    names = [p.name for p in pods]
    pdbs = draw(
        st.lists(
            st.builds(
                RefBudget,
                namespace=st.sampled_from(NAMESPACES),
                selector=selectors,
                allowed=st.integers(min_value=0, max_value=2),
                disrupted=st.frozensets(st.sampled_from(names), max_size=2),
            ),
            max_size=4,
        )
    )
    capacity = draw(st.integers(min_value=0, max_value=sum(p.slots for p in pods)))
    return pods, pdbs, capacity


# A pod labelled with no key a budget reads is covered by a budget that wants a key absent;
# a pod with no labels at all is covered by none.
NO_APP = {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}
UNREAD = (
    [RefPod("a", "p0", {"app": "x"}, 1, 0, DAY1), RefPod("a", "p1", {"zone": "x"}, 1, 0, DAY2)],
    [RefBudget("a", NO_APP, 0)],
    1,
)
BARE = (
    [RefPod("a", "p0", {"app": "x"}, 1, 0, DAY1), RefPod("a", "p1", {}, 1, 0, DAY2)],
    [RefBudget("a", NO_APP, 0)],
    1,
)


@settings(max_examples=1000)
@example(UNREAD)
@example(BARE)
@given(scenarios())
def test_victims_are_kube_schedulers_with_the_same_budgets(
    scenario: tuple[list[RefPod], list[RefBudget], int],
) -> None:
    pods, pdbs, capacity = scenario
    assert ours(pods, pdbs, capacity=capacity) == select_victims_on_node(
        pods, pdbs, capacity=capacity
    )


# -- examples ------------------------------------------------------------------------------------


def record(name: str, *, day: int, labels: dict[str, str] | None = None) -> PodRecord:
    return PodRecord(
        uid=f"uid-{name}",
        namespace="ns",
        name=name,
        node="n1",
        phase="Running",
        requests=((GPU, 1),),
        created=f"2026-01-0{day}T00:00:00Z",
        labels=None if labels is None else tuple(sorted(labels.items())),
    )


def budget(name: str, allowed: int, **match: str) -> BudgetRecord:
    return project_budget(
        {
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"selector": {"matchLabels": match}},
            "status": {"disruptionsAllowed": allowed},
        }
    )


def test_an_older_unprotected_pod_goes_before_a_younger_one_its_budget_protects() -> None:
    older = record("x", day=1, labels={"app": "x"})
    younger = record("y", day=2, labels={"app": "y"})
    guard = budget("guard", 0, app="y")
    assert [p.name for p in choose([older, younger], resource=GPU, capacity=1).evict] == ["y"]
    chosen = choose([older, younger], resource=GPU, capacity=1, budgets=[guard])
    assert [p.name for p in chosen.evict] == ["x"]
    # One slot for two protected pods: the less important one goes all the same.
    both = budget("both", 0, tier="db")
    db = [record(n, day=d, labels={"tier": "db"}) for n, d in (("old", 1), ("new", 2))]
    assert [p.name for p in choose(db, resource=GPU, capacity=1, budgets=[both]).evict] == ["new"]


def test_a_budget_is_counted_down_per_choice_and_a_disrupted_pod_takes_nothing() -> None:
    pods = [record(n, day=d, labels={"app": "web"}) for n, d in (("a", 1), ("b", 2), ("c", 3))]
    web = budget("web", 1, app="web")
    # a takes the one disruption allowed; b and c would violate: kept first, so a goes.
    chosen = choose(pods, resource=GPU, capacity=2, budgets=[web])
    assert [p.name for p in chosen.evict] == ["a"]
    assert core_budgets.violating(pods, [web]) == {"uid-b", "uid-c"}
    let_go = BudgetRecord("ns", "web", web.selector, 0, frozenset({"a"}))
    assert core_budgets.violating(pods, [let_go]) == {"uid-b", "uid-c"}


def test_budgets_that_cover_nothing() -> None:
    labelled = record("x", day=1, labels={"app": "x"})
    bare = record("bare", day=2)  # no labels at all: no budget covers it
    everything = project_budget(
        {"metadata": {"namespace": "ns", "name": "all"}, "spec": {"selector": {}}}
    )
    missing = project_budget({"metadata": {"namespace": "ns", "name": "none"}, "spec": {}})
    absent = {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}
    not_app = project_budget(
        {"metadata": {"namespace": "ns", "name": "na"}, "spec": {"selector": absent}}
    )
    elsewhere = BudgetRecord("other", "x", budget("x", 0, app="x").selector, 0)
    assert everything.selector is None and missing.selector is None  # the scheduler's reading
    assert core_budgets.violating([labelled, bare], [everything, missing, elsewhere]) == set()
    assert core_budgets.violating([labelled, bare], [not_app]) == set()  # bare has no labels
    assert not_app.allowed == 0 and not_app.label_keys == {"app"}

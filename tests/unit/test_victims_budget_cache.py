"""The PodDisruptionBudget cache the victim choice reads: slim records by namespace, replace
semantics on a re-list, and the pod label keys that pod records keep."""

from __future__ import annotations

import gc
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import BudgetSink
from gpushare_operator.core.rollout.budgets import BudgetRecord

GPU = "nvidia.com/gpu"


def pdb(namespace: str, name: str, allowed: int = 0, **match: str) -> dict[str, Any]:
    """A PodDisruptionBudget as the API server sends it, managedFields and all."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "generation": 1,
            "annotations": {"note": "x" * 2000},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"minAvailable": 1, "selector": {"matchLabels": match}},
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": 1,
            "desiredHealthy": 1,
            "expectedPods": 1,
            "observedGeneration": 1,
            "conditions": [{"type": "DisruptionAllowed", "status": "False", "reason": "x"}],
        },
    }


def pod(name: str, namespace: str = "ns", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": f"uid-{name}", "namespace": namespace, "name": name, "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {GPU: "1"}}}]},
        "status": {"phase": "Running"},
    }


def test_a_budget_is_kept_as_its_slim_record_and_nothing_else() -> None:
    cache = ClusterCache()
    body = pdb("ns", "web", 2, app="web")
    cache.budgets.upsert(body)
    [record] = cache.budgets.around([_record(cache, pod("p", app="web"))])
    assert isinstance(record, BudgetRecord)
    assert (record.key, record.allowed, record.disrupted) == ("ns/web", 2, frozenset())
    assert record.selector is not None and record.selector.keys == {"app"}
    # Nothing of the body is held but the namespace, the name and the compiled selector.
    held = gc.get_referents(record)
    assert not any(isinstance(x, dict | list) for x in held), held
    assert body["metadata"]["annotations"]["note"] not in held


def _record(cache: ClusterCache, body: dict[str, Any]) -> Any:
    cache.upsert_pod(body)
    return cache.usage.pods[body["metadata"]["uid"]]


def test_pod_records_keep_only_the_labels_budgets_read_and_a_new_key_asks_for_a_relist() -> None:
    cache = ClusterCache()
    relists: list[int] = []
    cache.budgets.on_new_keys = lambda: relists.append(1)
    cache.upsert_pod(pod("before", app="web", team="ml"))
    assert cache.usage.pods["uid-before"].labels == ()  # labelled; no budget reads a key yet
    cache.budgets.upsert(pdb("ns", "web", app="web"))
    assert relists == [1] and cache.budgets.label_keys == {"app"}
    cache.upsert_pod(pod("before", app="web", team="ml"))  # the re-list, as the informer does
    assert cache.usage.pods["uid-before"].labels == (("app", "web"),)
    cache.budgets.upsert(pdb("other", "db", app="db"))  # a key read already: no re-list
    cache.budgets.upsert(pdb("ns", "web", 1, app="web"))  # a status change: no re-list
    assert relists == [1]
    cache.budgets.upsert(pdb("ns", "ml", team="ml"))
    assert relists == [1, 1] and cache.budgets.label_keys == {"app", "team"}
    cache.upsert_pod(pod("bare"))
    assert cache.usage.pods["uid-bare"].labels is None  # no labels at all: covered by none
    cache.budgets.delete("ns/ml")
    assert cache.budgets.label_keys == {"app"} and relists == [1, 1]
    cache.upsert_pod(pod("after", app="web", team="ml"))
    assert cache.usage.pods["uid-after"].labels == (("app", "web"),)


def test_the_sink_replaces_on_a_relist_and_reads_one_namespace_at_a_time() -> None:
    cache = ClusterCache()
    sink = BudgetSink(cache)
    sink.begin_relist()
    for body in (pdb("a", "one", app="x"), pdb("a", "two", app="y"), pdb("b", "three")):
        sink.relist_item(body)
    sink.end_relist()
    assert sorted(cache.budgets.keys()) == ["a/one", "a/two", "b/three"]
    x = _record(cache, pod("px", "a", app="x"))
    assert [r.name for r in cache.budgets.around([x])] == ["one", "two"]  # namespace a only
    sink.apply("MODIFIED", pdb("a", "one", 3, app="x"))
    one = cache.budgets.get("a/one")
    assert one is not None and one.allowed == 3
    sink.apply("DELETED", pdb("a", "two", app="y"))
    sink.begin_relist()
    sink.relist_item(pdb("b", "three"))  # a/one was deleted while unwatched
    sink.end_relist()
    assert cache.budgets.keys() == ["b/three"] and len(cache.budgets) == 1
    assert cache.budgets.around([x]) == []
    assert cache.budgets.label_keys == frozenset()  # b/three selects on nothing

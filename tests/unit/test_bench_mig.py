"""The MIG benchmarks' pure parts: the node bodies they feed, and how the re-layout row counts.

The figures come from runs on a real control plane (``make bench``, ``make bench-scale``); a
body missing half of GFD's MIG labels, or a counter that took a taint patch for a label apply,
would make those figures wrong without failing anything there.
"""

from __future__ import annotations

from typing import Any

from benchmarks import ingest, mignodes
from benchmarks.scale import migrelayout

from gpushare_operator.core.records.nodes import MIG_CONFIG_LABEL, project_node

USER = migrelayout.USER
# GFD's labels of one MIG resource under mixed: the base labeler's, and the device attributes.
SUFFIXES = {
    "product", "count", "replicas", "sharing-strategy", "memory", "multiprocessors",
    "slices.gi", "slices.ci", "engines.copy", "engines.decoder", "engines.encoder",
    "engines.jpeg", "engines.ofa",
}  # fmt: skip


def test_a_mig_node_carries_every_gfd_label_of_each_profile() -> None:
    labels = mignodes.mig_node(0)["metadata"]["labels"]
    for profile in mignodes.DEVICES:
        prefix = f"nvidia.com/mig-{profile}."
        assert {k.removeprefix(prefix) for k in labels if k.startswith(prefix)} == SUFFIXES
        assert labels[prefix + "count"] == str(mignodes.GPUS)
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert labels[MIG_CONFIG_LABEL] == mignodes.mig_config_name()


def test_a_mig_node_names_gpushare_as_the_owner_of_its_layout() -> None:
    body = mignodes.mig_node(1)
    owners = [
        entry["manager"]
        for entry in body["metadata"]["managedFields"]
        if f"f:{MIG_CONFIG_LABEL}" in entry["fieldsV1"].get("f:metadata", {}).get("f:labels", {})
    ]
    assert owners == ["gpushare-operator"]
    record = project_node(body)
    assert record.mig_config_owners == ()  # nobody else's layout: ours to change
    assert dict(record.allocatable)["nvidia.com/mig-1g.10gb"] == str(mignodes.GPUS)


def test_the_mig_policy_compiles_and_selects_the_mig_pool() -> None:
    cache, _ = ingest.ours([mignodes.mig_policy_body()])
    assert cache.policies[mignodes.MIG_POLICY].valid


def test_mig_budget_rows_appear_only_when_measured() -> None:
    assert ingest._mig_budgets(None) == []
    beat = {"ours_over_json_loads": 0.7, "naive_ns_per_event": 900, "json_loads_ns_per_event": 100,
            "dirty_objects_per_event": 0.0}  # fmt: skip
    mig = {"events": {"heartbeat": beat},
           "memory": {"ours_bytes_per_node": 2100.0, "naive_bytes_per_node": 80_000.0}}  # fmt: skip
    rows = {row["measure"]: row for row in ingest._mig_budgets(mig)}
    assert rows["MIG node: heartbeat ÷ json.loads"]["pass"] is True
    assert rows["MIG node: heartbeat ÷ json.loads"]["naive"] == 9.0
    assert rows["memory per cached MIG node"]["pass"] is False  # 2,100 B > 2 KiB
    assert rows["writes scheduled per MIG heartbeat"]["pass"] is True


def event(
    resource: str,
    *,
    sub: str = "",
    body: Any = None,
    verb: str = "patch",
    user: str = USER,
    at: str = "2026-01-01T00:00:10Z",
    code: int = 200,
) -> dict[str, Any]:
    ref = {"resource": resource, "name": "h100-0000"} | ({"subresource": sub} if sub else {})
    return {
        "user": {"username": user},
        "verb": verb,
        "objectRef": ref,
        "requestObject": body,
        "stageTimestamp": at,
        "responseStatus": {"code": code},
    }


def test_writes_are_told_apart_and_windowed() -> None:
    since = 1767225600.0 + 5  # 2026-01-01T00:00:05Z
    events = [
        event("nodes", body={"kind": "Node", "metadata": {"labels": {}}}),
        event("nodes", body=[{"op": "add", "path": "/spec/taints/-"}]),
        event("pods", sub="eviction", verb="create"),
        event("gpunodestates", sub="status"),
        event("gpunodestates", sub="status"),
        event("gpusharingpolicies", sub="status"),
        event("configmaps"),
        event("pods", sub="eviction", verb="create", code=429),  # a PDB said no
        event("nodes", body={"kind": "Node"}, user="someone-else"),
        event("nodes", body={"kind": "Node"}, at="2026-01-01T00:00:01Z"),  # before the edit
        event("nodes", body={"kind": "Node"}, at="2026-01-01T00:01:00Z"),  # after the end
        event("nodes", verb="get"),
    ]
    writes, refused = migrelayout.count_writes(events, user=USER, since=since, until=since + 30)
    assert writes == {
        "eviction": 1,
        "label apply": 1,
        "node status": 2,
        "patch configmaps": 1,
        "policy status": 1,
        "taint patch": 1,
    }
    assert refused == {"eviction": 1}


def test_the_minimum_and_the_verdicts() -> None:
    minimum = migrelayout.minimum_writes(nodes=500, pods=100)
    assert minimum == {"label apply": 500, "eviction": 100, "taint patch": 1000}
    writes = {"label apply": 501, "eviction": 100, "taint patch": 1000, "node status": 1750}
    rows = migrelayout.summary(writes, minimum, nodes=500)
    assert rows["label apply"]["at_minimum"] is False
    assert rows["eviction"]["at_minimum"] is True
    assert rows["node status"] == {"issued": 1750, "per_node": 3.5}
    table = migrelayout.render(
        {
            "nodes": 500,
            "layouts": [dict(migrelayout.BEFORE), dict(migrelayout.AFTER)],
            "rollout": dict(migrelayout.ROLLOUT),
            "pods": 100,
            "seconds": 12.5,
            "versus_minimum": rows,
            "writes_by_kind": writes,
            "refused_by_kind": {},
        }
    )
    assert "| label apply | 501 | 500 | MISS |" in table
    assert "| eviction | 100 | 100 | PASS |" in table


def test_the_relayout_is_a_new_layout_name_and_a_patch_that_drops_the_old_profile() -> None:
    before, after = migrelayout.BEFORE, migrelayout.AFTER
    assert migrelayout.layout_name(before) != migrelayout.layout_name(after)
    patch = migrelayout.devices_patch(before, after)
    assert patch == {"3g.40gb": None, "4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}


def test_most_changing_counts_from_label_apply_to_the_next_verified_status() -> None:
    def event(second: int, node: str, body: object, *, resource: str, sub: str = "") -> Any:
        return {
            "user": {"username": "u"},
            "verb": "patch",
            "stageTimestamp": f"2026-12-01T00:00:0{second}.000000Z",
            "objectRef": {"resource": resource, "name": node, "subresource": sub},
            "responseStatus": {"code": 200},
            "requestObject": body,
        }

    def status(phase: str) -> list[dict[str, Any]]:
        return [{"path": "/status", "value": {"phase": phase}}]

    events = [
        event(1, "a", {"kind": "Node"}, resource="nodes"),
        event(2, "b", {"kind": "Node"}, resource="nodes"),
        event(3, "a", status("Verified"), resource="gpunodestates", sub="status"),
        event(4, "c", {"kind": "Node"}, resource="nodes"),
        event(5, "b", status("Applied"), resource="gpunodestates", sub="status"),
    ]
    assert migrelayout.most_changing(events, user="u", since=0.0) == 2  # b and c, from 4 s

"""End to end: policies become device-plugin configs, node labels and published state.

Each test runs the operator as a child process against the real API server, with the GPU node
simulator playing the NVIDIA config manager and GPU Feature Discovery.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import webhooks as wh
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.quiet import quiet
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

phase_of = h.phase_of
wait_phase = h.wait_phase


async def wait_policy(sim: GpuClusterSimulator, name: str, **expected: Any) -> dict[str, Any]:
    def matches(body: dict[str, Any]) -> bool:
        status = body.get("status") or {}
        return all(status.get(k) == v for k, v in expected.items())

    return await eventually(
        lambda: h.get_policy(sim.client, name), until=matches, what=f"{name} status {expected}"
    )


async def test_policies_converge_to_verified_nodes(
    sim: GpuClusterSimulator, namespace: str, policies: list[str], start_operator: OperatorFactory
) -> None:
    pool_a, pool_b = h.unique("inference"), h.unique("batch")
    a_nodes = await sim.create_gpu_nodes(pool=pool_a, count=2, gpus=8)
    b_nodes = await sim.create_gpu_nodes(pool=pool_b, count=1, gpus=4)
    ts, mps = h.unique("ts"), h.unique("mps")
    await h.add_policy(sim, policies, h.policy(ts, pool=pool_a, replicas=4))
    await h.add_policy(
        sim, policies, h.policy(mps, pool=pool_b, strategy="MPS", replicas=8, renameByDefault=True)
    )
    await start_operator("--device-plugin-namespace", namespace, "--config-propagation-delay", "3")

    # A brand-new key is not put on nodes before the kubelet could have seen it.
    waiting = await wait_phase(sim, a_nodes[0], "Pending")
    assert h.condition(waiting["status"], "Ready")["reason"] in (
        "WaitingForConfigPropagation",
        "ConfigNotWritten",
    )
    for name in a_nodes + b_nodes:
        await wait_phase(sim, name, "Verified")

    body = await wait_policy(sim, ts, matchedNodes=2, appliedNodes=2, verifiedNodes=2)
    status = body["status"]
    assert status["gpus"] == 16
    slots = status["slots"]
    assert (slots["capacity"], slots["allocated"]) == (64, 0)
    assert status["observedGeneration"] == 1
    assert h.condition(status, "Ready")["status"] == "True"
    key = status["configKey"]
    assert key.startswith(f"{ts}-ts4-")
    data = await h.config_data(sim.client, namespace)
    assert data is not None
    assert "timeSlicing" in data[key]
    assert "default" in data

    node = await h.node(sim.client, a_nodes[0])
    assert node["metadata"]["labels"][h.CONFIG_LABEL] == key
    assert node["metadata"]["labels"][h.POLICY_LABEL] == ts
    state = await h.node_state(sim.client, a_nodes[0])
    assert state is not None
    assert state["status"]["slots"]["capacity"] == 32
    assert state["status"]["product"] == "NVIDIA-H100-80GB-HBM3"
    owner = state["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Node",
        a_nodes[0],
        node["metadata"]["uid"],
    )

    shared = await h.node(sim.client, b_nodes[0])
    assert shared["status"]["capacity"]["nvidia.com/gpu.shared"] == "32"  # renameByDefault
    assert shared["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "mps"


async def test_only_our_own_labels_ever_change(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    foreign = {"metadata": {"labels": {"team": "vision"}, "annotations": {"owner": "ops"}}}
    status, _ = await sim.client.patch(
        f"/api/v1/nodes/{name}", foreign, params={"fieldManager": "someone-else"}
    )
    assert status == 200
    before = await h.node(sim.client, name)
    theirs = dict(before["metadata"]["labels"])

    await start_operator("--device-plugin-namespace", namespace)
    policy = h.unique("p")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=2))
    await wait_phase(sim, name, "Verified")
    await h.patch_policy(sim.client, policy, {"replicas": 3})
    await eventually(
        lambda: h.node_state(sim.client, name),
        until=lambda s: phase_of(s) == "Verified" and s["status"]["replicas"] == 3,
        what="replicas 3 verified",
    )
    await h.delete_policy(sim.client, policy)
    await wait_phase(sim, name, "Unmanaged")

    after = await h.node(sim.client, name)
    labels = after["metadata"]["labels"]
    assert h.CONFIG_LABEL not in labels
    assert h.POLICY_LABEL not in labels
    assert not set(wh.SLOT_LABELS) & set(labels)  # they went with our config
    # Everything else is as it was, except what the simulated GFD itself rewrote.
    gfd = {
        "nvidia.com/gpu.replicas",
        "nvidia.com/gpu.sharing-strategy",
        "nvidia.com/gfd.timestamp",
        "nvidia.com/gpu.product",  # -SHARED while the config was in force
        "nvidia.com/mps.capable",
    }
    assert {k: v for k, v in labels.items() if k not in gfd} == {
        k: v for k, v in theirs.items() if k not in gfd
    }
    assert after["metadata"]["annotations"]["owner"] == "ops"
    managers = {m["manager"] for m in after["metadata"]["managedFields"]}
    assert "someone-else" in managers

    writes = h.writes_to(h.operator_writes(control_plane), resource="nodes", name=name)
    assert writes, "the operator never wrote the node"
    for event in writes:
        assert event["verb"] == "patch", event
        assert "subresource" not in event["objectRef"], event  # never node status
        assert "fieldManager=gpushare-operator" in event["requestURI"]
        labels_written = (event.get("requestObject") or {}).get("metadata", {}).get("labels", {})
        assert set(labels_written) <= {h.CONFIG_LABEL, h.POLICY_LABEL, *wh.SLOT_LABELS}
        assert set(event["requestObject"]["metadata"]) <= {"name", "uid", "labels"}


async def test_relabelled_node_is_released(
    sim: GpuClusterSimulator, namespace: str, policies: list[str], start_operator: OperatorFactory
) -> None:
    pool = h.unique("pool")
    names = await sim.create_gpu_nodes(pool=pool, count=2)
    policy = h.unique("p")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool))
    await start_operator("--device-plugin-namespace", namespace)
    for name in names:
        await wait_phase(sim, name, "Verified")
    await sim.relabel(names[0], {"pool": "elsewhere"})
    state = await wait_phase(sim, names[0], "Unmanaged")
    assert "policy" not in state["status"]
    labels = (await h.node(sim.client, names[0]))["metadata"]["labels"]
    assert h.CONFIG_LABEL not in labels
    assert h.POLICY_LABEL not in labels
    await wait_policy(sim, policy, matchedNodes=1, appliedNodes=1)


async def test_higher_priority_wins_and_the_loser_says_so(
    sim: GpuClusterSimulator, namespace: str, policies: list[str], start_operator: OperatorFactory
) -> None:
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    low, high = h.unique("low"), h.unique("high")
    await h.add_policy(sim, policies, h.policy(low, pool=pool, priority=1, replicas=2))
    await h.add_policy(sim, policies, h.policy(high, pool=pool, priority=5, replicas=4))
    await start_operator("--device-plugin-namespace", namespace)
    await wait_phase(sim, name, "Verified")
    assert (await h.node_state(sim.client, name) or {})["status"]["policy"] == high

    body = await wait_policy(sim, low, matchedNodes=1, conflictingNodes=1, appliedNodes=0)
    conflicting = h.condition(body["status"], "Conflicting")
    assert conflicting["status"] == "True"
    assert name in conflicting["message"]
    assert high in conflicting["message"]
    events = await eventually(
        lambda: h.events_about(sim.client, low),
        until=lambda es: any(e["reason"] == "Conflict" for e in es),
        what="a Conflict event",
    )
    conflict = next(e for e in events if e["reason"] == "Conflict")
    assert name in conflict["message"]
    assert conflict["involvedObject"]["kind"] == "GPUSharingPolicy"


async def test_missing_device_plugin_namespace_is_a_condition(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    missing = h.unique("no-such-ns")
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    policy = h.unique("p")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool))
    await start_operator("--device-plugin-namespace", missing)
    body = await eventually(
        lambda: h.get_policy(sim.client, policy),
        until=lambda b: (
            h.condition(b.get("status"), "Ready").get("reason") == "DevicePluginConfigUnavailable"
        ),
        what="the missing-namespace condition",
    )
    assert missing in h.condition(body["status"], "Ready")["message"]
    status, _ = await sim.client.get(f"/api/v1/namespaces/{missing}")
    assert status == 404  # never created by us
    labels = (await h.node(sim.client, name))["metadata"]["labels"]
    assert h.CONFIG_LABEL not in labels
    state = await h.node_state(sim.client, name)
    assert phase_of(state) == "Pending"


async def test_broken_gpu_count_label_is_reported_not_written(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    await sim.relabel(name, {"nvidia.com/gpu.count": "abc"})
    policy = h.unique("p")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool))
    running = await start_operator("--device-plugin-namespace", namespace)
    state = await wait_phase(sim, name, "Unsupported")
    assert "abc" in h.condition(state["status"], "Ready")["message"]
    events = await eventually(
        lambda: h.events_about(sim.client, name),
        until=lambda es: any(e["reason"] == "InvalidNodeLabel" for e in es),
        what="an InvalidNodeLabel event",
    )
    assert events[0]["type"] == "Warning"
    assert not h.writes_to(h.operator_writes(control_plane), resource="nodes", name=name)
    assert running.proc.poll() is None  # no crash


async def test_new_spec_means_new_key_and_the_old_one_is_collected(
    sim: GpuClusterSimulator, namespace: str, policies: list[str], start_operator: OperatorFactory
) -> None:
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    policy = h.unique("p")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=2))
    await start_operator("--device-plugin-namespace", namespace, "--config-key-grace-period", "2")
    await wait_phase(sim, name, "Verified")
    # The policy's status follows once its node has settled.
    old_key = (await wait_policy(sim, policy, verifiedNodes=1))["status"]["configKey"]
    await h.patch_policy(sim.client, policy, {"replicas": 6})
    body = await wait_policy(sim, policy, observedGeneration=2, verifiedNodes=1)
    new_key = body["status"]["configKey"]
    assert new_key != old_key
    labels = (await h.node(sim.client, name))["metadata"]["labels"]
    assert labels[h.CONFIG_LABEL] == new_key
    assert labels["nvidia.com/gpu.replicas"] == "6"
    data = await eventually(
        lambda: h.config_data(sim.client, namespace),
        until=lambda d: d is not None and old_key not in d,
        what="the old key to be deleted",
    )
    assert new_key in data


async def test_unconfirmed_config_becomes_mismatch(
    control_plane: ControlPlane,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=namespace, verify=False
    ) as sim:
        pool = h.unique("pool")
        [name] = await sim.create_gpu_nodes(pool=pool, count=1)
        policy = h.unique("p")
        await h.add_policy(sim, policies, h.policy(policy, pool=pool))
        await start_operator("--device-plugin-namespace", namespace, "--mismatch-timeout", "2")
        await wait_phase(sim, name, "Mismatch")
        body = await eventually(
            lambda: h.get_policy(sim.client, policy),
            until=lambda b: (
                h.condition(b.get("status"), "Ready").get("reason") == "NodesMismatched"
            ),
            what="NodesMismatched",
        )
        assert h.condition(body["status"], "Ready")["status"] == "False"
        for name in list(policies):
            await h.delete_policy(sim.client, name)
        policies.clear()


async def test_heartbeats_and_resync_write_nothing(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    names = await sim.create_gpu_nodes(pool=pool, count=3)
    policy = h.unique("p")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool))
    first = await start_operator("--device-plugin-namespace", namespace)
    for name in names:
        await wait_phase(sim, name, "Verified")
    await wait_policy(sim, policy, verifiedNodes=3)
    first.stop()

    # A restarted operator resyncs from its caches and finds nothing to do.
    user = "gpushare-operator-second"
    second = await start_operator("--device-plugin-namespace", namespace, user=user)
    seen = await second.events_ingested("Node")
    for round_ in range(5):
        for name in names:
            heartbeat = {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "lastHeartbeatTime": f"2026-11-29T00:00:0{round_}Z",
                            "lastTransitionTime": "2026-11-29T00:00:00Z",
                        },
                    ]
                }
            }
            status, _ = await sim.client.patch(
                f"/api/v1/nodes/{name}/status", heartbeat, params={"fieldManager": "kubelet"}
            )
            assert status == 200
    await sim.wait_idle()
    await eventually(
        lambda: second.events_ingested("Node"),
        until=lambda count: count >= seen + 5 * len(names),
        what="the operator to see every heartbeat",
    )
    # Once it is quiet, any write the heartbeats (or its resync) caused is in the audit log.
    await quiet(control_plane, [second], namespace=namespace)
    assert second.proc.poll() is None
    # Its own Lease and the leadership Event aside, the new leader wrote nothing.
    writes = [
        e
        for e in h.operator_writes(control_plane, user=user)
        if e["objectRef"]["resource"] not in ("leases", "events")
    ]
    assert writes == []


async def test_kopf_writes_nothing_on_policies(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    policy = h.unique("p")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool))
    await start_operator("--device-plugin-namespace", namespace)
    await wait_phase(sim, name, "Verified")
    body = await wait_policy(sim, policy, verifiedNodes=1)
    # Our one finalizer (a deleted policy releases its nodes first); none of kopf's.
    assert body["metadata"].get("finalizers") == ["gpushare.dev/release-nodes"]
    assert not any("kopf" in k for k in body["metadata"].get("annotations") or {})
    writes = h.writes_to(
        h.operator_writes(control_plane), resource="gpusharingpolicies", name=policy
    )
    assert writes
    spec_writes = [e for e in writes if e["objectRef"].get("subresource") != "status"]
    assert [op["path"] for e in spec_writes for op in e["requestObject"]] == [
        "/metadata/finalizers",  # the test of the (absent) list
        "/metadata/finalizers",  # and the add
    ], spec_writes


async def test_paused_policy_leaves_nodes_alone(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    policy = h.unique("p")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, paused=True))
    await start_operator("--device-plugin-namespace", namespace)
    body = await eventually(
        lambda: h.get_policy(sim.client, policy),
        until=lambda b: h.condition(b.get("status"), "Paused").get("status") == "True",
        what="Paused condition",
    )
    assert body["status"]["matchedNodes"] == 1
    state = await wait_phase(sim, name, "Pending")
    assert h.condition(state["status"], "Ready")["reason"] == "Paused"
    assert not h.writes_to(h.operator_writes(control_plane), resource="nodes", name=name)
    await h.patch_policy(sim.client, policy, {"paused": False})
    await wait_phase(sim, name, "Verified")

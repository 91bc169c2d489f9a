"""Policies that got past admission (an older, laxer CRD) are reported, never acted on.

The CRD schema is relaxed for a moment, the bad objects are stored, and the real CRDs are put
back, exactly as when a cluster upgrades its CRDs over objects written under an older schema.
"""

from __future__ import annotations

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import create_until_accepted
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.quiet import quiet
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")


async def test_policies_that_slipped_past_admission(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    relaxed_crd: None,
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    too_many = h.policy(h.unique("too-many"), pool=pool, replicas=100)
    bad_selector = h.policy(h.unique("bad-sel"), pool=pool)
    bad_selector["spec"]["nodeSelector"] = {
        "matchExpressions": [{"key": "pool", "operator": "Exists", "values": [pool]}]
    }
    # Matches the unconfigured node today (GFD says 1 replica), and would stop matching as soon
    # as its own config were in force: it must govern nothing.
    rewritten = h.policy(h.unique("rewritten"), pool=pool)
    rewritten["spec"]["nodeSelector"]["matchLabels"]["nvidia.com/gpu.replicas"] = "1"
    created = [too_many, bad_selector, rewritten]
    created = [body["metadata"]["name"] for body in created]
    try:
        await create_until_accepted(sim.client, too_many)
        await create_until_accepted(sim.client, bad_selector)
        await create_until_accepted(sim.client, rewritten)
        running = await start_operator("--device-plugin-namespace", namespace)

        spec_policy = await eventually(
            lambda: h.get_policy(sim.client, created[0]),
            until=lambda b: h.condition(b.get("status"), "Ready").get("reason") == "InvalidSpec",
            what="InvalidSpec",
        )
        ready = h.condition(spec_policy["status"], "Ready")
        assert ready["status"] == "False"
        assert "replicas" in ready["message"]
        assert "configKey" not in spec_policy["status"]

        selector_policy = await eventually(
            lambda: h.get_policy(sim.client, created[1]),
            until=lambda b: h.condition(b.get("status"), "SelectorValid").get("status") == "False",
            what="SelectorValid=False",
        )
        message = h.condition(selector_policy["status"], "SelectorValid")["message"]
        assert "Exists" in message
        assert "values" in message

        rewritten_policy = await eventually(
            lambda: h.get_policy(sim.client, created[2]),
            until=lambda b: h.condition(b.get("status"), "SelectorValid").get("status") == "False",
            what="SelectorValid=False for a rewritten label",
        )
        message = h.condition(rewritten_policy["status"], "SelectorValid")["message"]
        assert "a selector on label nvidia.com/gpu.replicas is refused" in message
        assert "GPU Feature Discovery sets it" in message
        assert rewritten_policy["status"]["matchedNodes"] == 0

        for policy in created:
            events = await eventually(
                lambda policy=policy: h.events_about(sim.client, policy),
                until=lambda es: any(e["reason"] == "InvalidPolicy" for e in es),
                what=f"InvalidPolicy event on {policy}",
            )
            assert all(e["type"] == "Warning" for e in events if e["reason"] == "InvalidPolicy")

        # Anything the operator would wrongly do to the node, it has done once it is quiet.
        await quiet(control_plane, [running], namespace=namespace)
        assert not h.writes_to(h.operator_writes(control_plane), resource="nodes", name=name)
        labels = (await h.node(sim.client, name))["metadata"]["labels"]
        assert h.CONFIG_LABEL not in labels
        assert running.proc.poll() is None
    finally:
        for policy in created:
            await h.delete_policy(sim.client, policy)


async def test_a_broken_update_leaves_the_nodes_as_they_were(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    relaxed_crd: None,
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("pool")
    [name] = await sim.create_gpu_nodes(pool=pool, count=1)
    body = h.policy(h.unique("edited"), pool=pool, replicas=4)
    policy = body["metadata"]["name"]
    try:
        await create_until_accepted(sim.client, body)
        operator = await start_operator("--device-plugin-namespace", namespace)
        working = await eventually(
            lambda: h.get_policy(sim.client, policy),
            until=lambda b: (b.get("status") or {}).get("verifiedNodes") == 1,
            what="the policy verified on its node",
        )
        key = working["status"]["configKey"]
        writes_before = len(h.operator_writes(control_plane))

        await h.patch_policy(sim.client, policy, {"replicas": 100})  # the relaxed CRD allows it
        broken = await eventually(
            lambda: h.get_policy(sim.client, policy),
            until=lambda b: h.condition(b.get("status"), "Ready").get("reason") == "InvalidSpec",
            what="InvalidSpec",
        )
        ready = h.condition(broken["status"], "Ready")
        assert "replicas" in ready["message"]
        assert "generation 1 stays in force" in ready["message"]
        assert broken["status"]["observedGeneration"] == 2
        assert broken["status"]["configKey"] == key

        await quiet(control_plane, [operator], namespace=namespace)  # a release would show
        labels = (await h.node(sim.client, name))["metadata"]["labels"]
        assert labels[h.CONFIG_LABEL] == key
        assert labels[h.POLICY_LABEL] == policy
        later = h.operator_writes(control_plane)[writes_before:]
        assert not h.writes_to(later, resource="nodes", name=name)
        state = await h.node_state(sim.client, name)
        assert state is not None and state["status"]["phase"] == "Verified"
    finally:
        await h.delete_policy(sim.client, policy)

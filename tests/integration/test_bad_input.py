"""Policies that got past admission (an older, laxer CRD) are reported, never acted on.

The CRD schema is relaxed for a moment, the bad objects are stored, and the real CRDs are put
back, exactly as when a cluster upgrades its CRDs over objects written under an older schema.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_operator.core import crds
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.simulator import GpuClusterSimulator
from tests.integration import helpers as h
from tests.integration.conftest import ROOT, OperatorFactory
from tests.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

POLICY_CRD = ROOT / "crds" / "gpushare.dev_gpusharingpolicies.yaml"


def _relaxed(crd: dict[str, Any]) -> dict[str, Any]:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema["properties"]["replicas"].pop("maximum")
    selector = schema["properties"]["nodeSelector"]["properties"]
    selector["matchExpressions"]["items"].pop("x-kubernetes-validations")
    # An older CRD without the rules that refuse labels our own configuration rewrites.
    stable = [dict(rule) for rule in crds.STABLE_MATCH_LABELS_RULES]
    rules = selector["matchLabels"]["x-kubernetes-validations"]
    selector["matchLabels"]["x-kubernetes-validations"] = [r for r in rules if r not in stable]
    return crd


def _kubectl(plane: ControlPlane, *args: str) -> None:
    command = [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.admin_kubeconfig), *args]
    subprocess.run(command, check=True, capture_output=True)


@pytest.fixture
def relaxed_crd(control_plane: ControlPlane, tmp_path: Path) -> Iterator[None]:
    path = tmp_path / "relaxed.yaml"
    path.write_text(yaml.safe_dump(_relaxed(yaml.safe_load(POLICY_CRD.read_text()))))
    _kubectl(control_plane, "apply", "-f", str(path))
    try:
        yield
    finally:
        _kubectl(control_plane, "apply", "-f", str(ROOT / "crds"))


async def _create_until_accepted(sim: GpuClusterSimulator, body: dict[str, Any]) -> None:
    """A changed CRD takes a moment to be served; until then the old schema still refuses."""

    async def attempt() -> int:
        status, _ = await sim.client.post(f"{h.API}/gpusharingpolicies", body)
        return int(status)

    await eventually(attempt, until=lambda s: s in (201, 409), timeout=30, what="relaxed CRD")


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
        await _create_until_accepted(sim, too_many)
        await _create_until_accepted(sim, bad_selector)
        await _create_until_accepted(sim, rewritten)
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

        await asyncio.sleep(2)  # anything the operator would wrongly do to the node, it does now
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
        await _create_until_accepted(sim, body)
        await start_operator("--device-plugin-namespace", namespace)
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

        await asyncio.sleep(2)  # a release of the node would happen by now
        labels = (await h.node(sim.client, name))["metadata"]["labels"]
        assert labels[h.CONFIG_LABEL] == key
        assert labels[h.POLICY_LABEL] == policy
        later = h.operator_writes(control_plane)[writes_before:]
        assert not h.writes_to(later, resource="nodes", name=name)
        state = await h.node_state(sim.client, name)
        assert state is not None and state["status"]["phase"] == "Verified"
    finally:
        await h.delete_policy(sim.client, policy)

"""The rollout promise on the real control plane, on nodes that drift, policies that are
deleted and taints that are not ours.

Drift (a GPU that fails its health check, a device plugin gone) is played by the simulator
(``lose_gpu``, ``stop_device_plugin``); what the operator did, and what it did not do, is read
from the API server's audit log.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import promise
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.quiet import quiet
from gpushare_testing.rolloutstate import (
    all_verified,
    gone,
    key_replicas,
    paced,
    rollout_metrics,
    rollout_of,
    rollout_state,
)
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

TAINT = "gpushare.dev/reconfiguring"
TIMEOUT = 3.0  # --mismatch-timeout of these tests


def ready(state: dict[str, Any] | None) -> dict[str, Any]:
    return dict(h.condition((state or {}).get("status"), "Ready"))


async def wall_clock() -> float:
    return time.time()


def wrote_halted(plane: ControlPlane, policy: str, *, since: float) -> bool:
    """Whether the operator wrote a status of ``policy`` that says Halted."""
    for event in plane.audit_events():
        ref = event["objectRef"]
        if ref.get("resource") != "gpusharingpolicies" or ref.get("name") != policy:
            continue
        if event["user"]["username"] != h.OPERATOR_USER or audit.moment(event) < since:
            continue
        if '"Halted"' in json.dumps(event.get("requestObject")):
            return True
    return False


# -- 4. drift on a Verified node is Degraded, not a failure -----------------------------------


@pytest.mark.parametrize("drift", ["lost-gpu", "plugin-outage"])
async def test_drift_on_a_verified_node_is_degraded_halts_nothing_and_new_nodes_still_join(
    drift: str,
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("drift")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=3, gpus=2))
    drifting = nodes[0]
    name = h.unique("drift")
    rollout = {"maxUnavailable": 1, "canary": 1, "failureThreshold": 1}
    await h.add_policy(sim, policies, paced(name, pool=pool, **rollout))
    operator = await start_operator(
        "--device-plugin-namespace", namespace, "--mismatch-timeout", f"{TIMEOUT:g}"
    )
    await all_verified(sim, nodes, name)

    since = time.time()
    if drift == "lost-gpu":
        sim.lose_gpu(drifting)  # allocatable 4 of the 8 its config advertises
    else:
        sim.stop_device_plugin(drifting)  # allocatable 0
    degraded = await h.wait_phase(sim, drifting, "Degraded")
    assert h.condition(degraded["status"], "Degraded")["status"] == "True"
    # Longer than --mismatch-timeout: what a drift would turn into by then, it has.
    await eventually(
        wall_clock,
        until=lambda now: now > since + 2 * TIMEOUT,
        what=f"the drift to outlast --mismatch-timeout {TIMEOUT:g} s",
    )
    [joined] = await sim.create_gpu_nodes(pool=pool, count=1, prefix=h.unique("joined"), gpus=2)
    await all_verified(sim, [joined], name, timeout=60)  # an autoscaled node is configured
    await quiet(control_plane, [operator], namespace=namespace)

    phases = [
        s.get("phase") for _, _, s in audit.status_writes(control_plane, [drifting], since=since)
    ]
    assert set(phases) == {"Degraded"}, phases
    assert not wrote_halted(control_plane, name, since=since), "the drift halted the rollout"
    state = await rollout_of(sim, name)
    assert state["state"] != "Halted" and state["degradedNodes"] == 1, state
    steps = await rollout_metrics(operator, name)
    assert (steps["degraded"], steps["failed"]) == (1, 0), steps
    assert ("Warning", "Degraded") in [
        (e["type"], e["reason"]) for e in await h.events_about(sim.client, drifting)
    ]

    if drift == "lost-gpu":
        sim.restore_gpus(drifting)
    else:
        sim.start_device_plugin(drifting)
    back = await h.wait_phase(sim, drifting, "Verified")
    assert h.condition(back["status"], "Degraded") == {}
    await rollout_state(sim, name, "Complete")


# -- 5. deleting a paused policy finishes ----------------------------------------------------


async def test_deleting_a_paused_policy_releases_its_nodes_and_finishes(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("paused")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=3, gpus=1))
    name = h.unique("paused")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=1, canary=0))
    await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, nodes, name)
    await h.patch_policy(sim.client, name, {"paused": True})
    await rollout_state(sim, name, "Paused")

    since = time.time()
    await h.delete_policy(sim.client, name)
    await gone(sim, name)  # what `kubectl delete gsp ... --wait` waits for
    for node in nodes:
        labels = (await h.node(sim.client, node))["metadata"]["labels"]
        assert h.CONFIG_LABEL not in labels and h.POLICY_LABEL not in labels
    assert audit.most_at_once(audit.release_windows(control_plane, nodes, since=since)) <= 1


# -- 6. nodes that cannot be released cleanly do not hold the deletion ------------------------


async def test_a_node_released_with_a_bad_gpu_stops_counting_and_the_finalizer_goes(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("badgpu")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=3, gpus=2))
    bad = nodes[0]
    name = h.unique("badgpu")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=1, canary=0))
    await start_operator(
        "--device-plugin-namespace", namespace, "--mismatch-timeout", f"{TIMEOUT:g}"
    )
    await all_verified(sim, nodes, name)
    sim.lose_gpu(bad)  # unshared again, it would still show 1 nvidia.com/gpu of 2
    await eventually(
        lambda: h.node_state(sim.client, bad),
        until=lambda s: h.phase_of(s) != "Verified",
        what=f"the lost GPU of {bad} seen",
    )

    since = time.time()
    await h.delete_policy(sim.client, name)
    await gone(sim, name)
    state = await eventually(
        lambda: h.node_state(sim.client, bad),
        until=lambda s: ready(s).get("reason") == "ReleaseNotConfirmed",
        what=f"{bad}'s release reported as never confirmed",
    )
    assert name in ready(state)["message"]
    events = promise.node_events(
        control_plane.audit_events(), nodes=nodes, operators=[h.OPERATOR_USER]
    )
    replicas_of = await key_replicas(sim, namespace)
    forever = promise.windows(events, replicas_of=replicas_of, gpus=sim.gpu_counts)
    [never] = [w for w in forever if w.node == bad and w.start >= since]
    assert never.end == promise.INF, "the bad node's release was never confirmed"
    capped = promise.windows(
        events, replicas_of=replicas_of, gpus=sim.gpu_counts, release_timeout=TIMEOUT
    )
    released = [w for w in capped if w.start >= since]
    assert sorted(w.node for w in released) == nodes
    assert promise.most_at_once(released) <= 1, "it counted until --mismatch-timeout, no longer"


async def test_a_co_owned_policy_label_is_release_blocked_and_the_deletion_completes(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("coowned")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=2, gpus=1))
    shared = nodes[0]
    name = h.unique("coowned")
    await h.add_policy(sim, policies, paced(name, pool=pool, maxUnavailable=1, canary=0))
    operator = await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, nodes, name)
    # Another tool applies the same label value: the API server records it as co-owned.
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": shared, "labels": {h.POLICY_LABEL: name}},
    }
    status, answer = await sim.client.patch(
        f"/api/v1/nodes/{shared}",
        body,
        content_type="application/apply-patch+yaml",
        params={"fieldManager": "fleet-labeller"},
    )
    assert status == 200, answer

    since = time.time()
    await h.delete_policy(sim.client, name)
    await gone(sim, name)
    state = await eventually(
        lambda: h.node_state(sim.client, shared),
        until=lambda s: ready(s).get("reason") == "ReleaseBlocked",
        what=f"{shared}'s release reported as blocked",
    )
    assert "fleet-labeller" in ready(state)["message"]
    labels = (await h.node(sim.client, shared))["metadata"]["labels"]
    assert labels[h.POLICY_LABEL] == name and h.CONFIG_LABEL not in labels
    await quiet(control_plane, [operator], namespace=namespace)
    writes = audit.label_writes(control_plane, [shared], since=since)
    assert len(writes) == 1, f"one release apply, not a loop: {writes}"


# -- 8. only our taint, by key and effect ------------------------------------------------------


def after_patch(patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The taints a JSON patch of ours leaves: its test op holds the list it applies to."""
    [test] = [op for op in patch if op["op"] == "test"]
    taints = list(test["value"] or [])
    for op in patch:
        whole = op["path"] == "/spec/taints"
        if op["op"] == "add":
            taints = list(op["value"]) if whole else [*taints, op["value"]]
        elif op["op"] == "remove" and whole:
            taints = []
        elif op["op"] == "remove":
            del taints[int(op["path"].rsplit("/", 1)[1])]
    return taints


async def test_a_humans_noexecute_taint_with_our_key_is_never_removed(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("human")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=2, gpus=1))
    marked = nodes[0]
    human = {"key": TAINT, "value": "hands-off", "effect": "NoExecute"}
    await h.ok(sim.client, "PATCH", f"/api/v1/nodes/{marked}", {"spec": {"taints": [human]}})
    name = h.unique("human")
    body = paced(name, pool=pool, maxUnavailable=1, canary=0, cordonDuringChange=True)
    await h.add_policy(sim, policies, body)
    since = time.time()
    operator = await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, nodes, name)
    await h.patch_policy(sim.client, name, {"replicas": 2})
    await all_verified(sim, nodes, name)
    await quiet(control_plane, [operator], namespace=namespace)

    assert human in (await h.node(sim.client, marked))["spec"]["taints"]
    patches = [p for _, n, p in audit.taint_writes(control_plane, [marked], since=since)]
    assert patches, "our own taint came and went around each change"
    for patch in patches:
        assert human in after_patch(patch), patch


async def test_a_mismatch_node_under_cordon_loses_our_taint(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("uncordon")
    nodes = sorted(await sim.create_gpu_nodes(pool=pool, count=3, gpus=1))
    bad = nodes[0]
    name = h.unique("uncordon")
    rollout = {"maxUnavailable": 2, "canary": 0, "failureThreshold": 3, "cordonDuringChange": True}
    await h.add_policy(sim, policies, paced(name, pool=pool, **rollout))
    await start_operator(
        "--device-plugin-namespace", namespace, "--mismatch-timeout", f"{TIMEOUT:g}"
    )
    await all_verified(sim, nodes, name)

    sim.set_healthy(bad, False)
    since = time.time()
    await h.patch_policy(sim.client, name, {"replicas": 2})
    await h.wait_phase(sim, bad, "Mismatch")
    await eventually(
        lambda: h.node(sim.client, bad),
        until=lambda n: not any(t.get("key") == TAINT for t in n["spec"].get("taints") or ()),
        timeout=30,
        what=f"our taint off the Mismatch node {bad}",
    )
    assert h.phase_of(await h.node_state(sim.client, bad)) == "Mismatch"
    [(on, _, add), (off, _, remove)] = audit.taint_writes(control_plane, [bad], since=since)
    assert add[-1]["op"] == "add" and remove[-1]["op"] == "remove" and on < off

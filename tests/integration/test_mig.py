"""Strategy MIG on the real control plane: the simulated MIG manager, GPU Feature Discovery and
device plugin (docs/simulator.md) confirm what gpushare asks for, and every claim about what
gpushare wrote, and in what order, is read from the API server's audit log.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import migparted
from gpushare_testing import rolloutaudit as audit
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create, delete_pod, small_pod
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.replicas import USERS, Replicas
from gpushare_testing.rolloutstate import all_verified, rollout_state
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed", "node_guard")

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
H200 = "NVIDIA-H200-141GB-HBM3e"
MIG_LABEL = "nvidia.com/mig.config"
TAINT = "gpushare.dev/reconfiguring"
MIG_CONFIGMAP = "gpushare-mig-parted-config"
REPLICAS = tuple(USERS.values())


def mig_policy(
    name: str, *, pool: str, mig: Mapping[str, Any], product: str | None = None, **rollout: Any
) -> dict[str, Any]:
    labels = {"pool": pool} | ({"nvidia.com/gpu.product": product} if product else {})
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": labels},
            "strategy": "MIG",
            "mig": dict(mig),
            "rollout": {"maxUnavailable": "100%", "canary": 0, **rollout},
        },
    }


def label_applies(
    plane: ControlPlane,
    nodes: Collection[str],
    *,
    since: float,
    users: Collection[str] = audit.USERS,
) -> list[tuple[float, str, dict[str, str]]]:
    """(when, node, labels applied) of each label apply gpushare made that changed a node's
    config, in order (a Verified node's slot labels come in applies of their own)."""
    ours = [
        e
        for e in plane.audit_events()
        if e["user"]["username"] in users
        and audit.moment(e) >= since
        and 200 <= int(e["responseStatus"]["code"]) < 300
    ]
    found = []
    for event in audit.config_applies(ours, nodes):
        labels = (event["requestObject"].get("metadata") or {}).get("labels") or {}
        found.append((audit.moment(event), str(event["objectRef"]["name"]), dict(labels)))
    return sorted(found, key=lambda item: item[0])


def taint_added_at(
    plane: ControlPlane, node: str, *, since: float, users: Collection[str] = audit.USERS
) -> list[float]:
    return [
        when
        for when, _, patch in audit.taint_writes(plane, [node], since=since, users=users)
        if any(op.get("op") == "add" and TAINT in str(op.get("value")) for op in patch)
    ]


async def status_of(sim: GpuClusterSimulator, node: str) -> dict[str, Any]:
    return dict(((await h.node_state(sim.client, node)) or {}).get("status") or {})


async def phase_reached(
    sim: GpuClusterSimulator, node: str, phase: str, *, reason: str | None = None
) -> dict[str, Any]:
    def reached(status: dict[str, Any]) -> bool:
        ready = h.condition(status, "Ready") if status else {}
        return status.get("phase") == phase and (reason is None or ready.get("reason") == reason)

    return await eventually(
        lambda: status_of(sim, node),
        until=reached,
        timeout=120,
        what=f"{node} {phase} {reason or ''}",
    )


async def mig_configs(sim: GpuClusterSimulator, namespace: str) -> dict[str, list[Any]]:
    """The mig-parted ConfigMap's configs, read back by the simulator's own mig-parted parser."""
    body = await h.ok(
        sim.client, "GET", f"/api/v1/namespaces/{namespace}/configmaps/{MIG_CONFIGMAP}"
    )
    spec = migparted.parse_mig_parted_config(body["data"]["config.yaml"])
    return {
        name: [
            {"devices": e.devices, "mig-enabled": e.mig_enabled, "mig-devices": dict(e.mig_devices)}
            for e in entries
        ]
        for name, entries in spec.configs.items()
    }


async def test_layouts_converge_on_each_model_with_one_label_write_each(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("mig")
    [h100] = await sim.create_gpu_nodes(
        pool=pool, count=1, prefix=f"{pool}-h", product=H100, gpus=2, mig_preset=False
    )
    [a100] = await sim.create_gpu_nodes(
        pool=f"{pool}-a", count=1, product=A100, gpus=2, mig_preset=False
    )
    [h200] = await sim.create_gpu_nodes(
        pool=f"{pool}-a", count=1, prefix=f"{pool}-x", product=H200, gpus=2, mig_preset=False
    )
    [hopper] = await sim.create_gpu_nodes(
        pool=f"{pool}-h200", count=1, product=H200, gpus=1, mig_preset=False
    )
    since = time.time()
    uniform, explicit = h.unique("uniform"), h.unique("explicit")
    # Selected by product: GFD's single-strategy rewrite of it must not move the node.
    await h.add_policy(
        sim, policies, mig_policy(uniform, pool=pool, product=H100, mig={"profile": "1g.10gb"})
    )
    layout = {"devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1}, "replicas": 2}
    await h.add_policy(sim, policies, mig_policy(explicit, pool=f"{pool}-a", mig=layout))
    h200_layout = {"devices": {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 1}}
    big = h.unique("h200")
    await h.add_policy(sim, policies, mig_policy(big, pool=f"{pool}-h200", mig=h200_layout))
    await start_operator("--device-plugin-namespace", namespace)

    await all_verified(sim, [h100], uniform)
    await all_verified(sim, [a100], explicit)
    await all_verified(sim, [hopper], big)
    assert (await status_of(sim, hopper))["mig"]["slotsPerGPU"] == {
        "nvidia.com/mig-3g.71gb": 1,
        "nvidia.com/mig-2g.35gb": 1,
        "nvidia.com/mig-1g.18gb": 1,
    }
    # A pod on one profile's resource counts there, and only there (slots per resource).
    pod = small_pod(h.unique("slice"), gpus=1, selector={"pool": f"{pool}-h200"})
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/mig-1g.18gb"] = limits.pop("nvidia.com/gpu")
    await create(sim, pods_ns, pod)
    per_resource = await eventually(
        lambda: h.get_policy(sim.client, big),
        until=lambda b: (b.get("status") or {}).get("slots", {}).get("allocated") == 1,
        what=f"{big} counting the pod",
    )
    assert per_resource["status"]["slots"]["byResource"] == {
        "nvidia.com/mig-1g.18gb": {"capacity": 1, "allocated": 1},
        "nvidia.com/mig-2g.35gb": {"capacity": 1, "allocated": 0},
        "nvidia.com/mig-3g.71gb": {"capacity": 1, "allocated": 0},
    }
    assert per_resource["status"]["resourcesSummary"] == (
        "mig-1g.18gb 1/1, mig-2g.35gb 0/1, mig-3g.71gb 0/1"
    )
    on_node = await eventually(
        lambda: status_of(sim, hopper),
        until=lambda st: st.get("slots", {}).get("allocated") == 1,
        what=f"{hopper} counting the pod",
    )
    assert on_node["slots"]["byResource"] == per_resource["status"]["slots"]["byResource"]
    refused = await phase_reached(sim, h200, "Unsupported", reason="MIGLayoutDoesNotFit")
    assert "has no MIG profile 3g.20gb" in h.condition(refused, "Ready")["message"]

    single = await status_of(sim, h100)
    assert single["gpus"] == 2 and single["product"] == H100  # not GFD's MIG device name
    assert single["mig"]["slotsPerGPU"] == {"nvidia.com/gpu": 7}
    assert single["mig"]["state"] == "success"
    assert single["slots"]["capacity"] == 14
    mixed = await status_of(sim, a100)
    assert mixed["mig"]["slotsPerGPU"] == {
        "nvidia.com/mig-3g.20gb": 2,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-1g.5gb": 2,
    }
    node = await h.node(sim.client, h100)
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == f"{H100}-MIG-1g.10gb"
    status = (await h.get_policy(sim.client, uniform))["status"]
    assert status["slots"]["capacity"] == 14  # 7 MIG devices on each of 2 GPUs

    # Each node: one apply of our three labels, naming a layout that mig-parted reads back.
    configs = await mig_configs(sim, namespace)
    writes = label_applies(control_plane, [h100, a100, h200, hopper], since=since)
    assert sorted(n for _, n, _ in writes) == sorted([h100, a100, hopper])
    for _, _, labels in writes:
        assert set(labels) == {h.CONFIG_LABEL, h.POLICY_LABEL, MIG_LABEL}
        assert labels[MIG_LABEL] in configs
    by_node = {name: labels for _, name, labels in writes}
    assert configs[by_node[h100][MIG_LABEL]] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}
    ]
    assert configs[by_node[a100][MIG_LABEL]] == [
        {
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1},
        }
    ]
    assert "all-disabled" in configs
    assert status_writes_to_node(control_plane, h200, since=since) == []


async def busy_h100(sim: GpuClusterSimulator, namespace: str, *, pool: str) -> tuple[str, str]:
    """(node, pod): a one-GPU H100 without a MIG layout, and a GPU pod running on it."""
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, product=H100, gpus=1, mig_preset=False)
    pod = h.unique("holder")
    await create(sim, namespace, small_pod(pod, gpus=1, node=node))
    await eventually(
        lambda: h.ok(sim.client, "GET", f"/api/v1/namespaces/{namespace}/pods/{pod}"),
        until=lambda p: p["status"].get("phase") == "Running",
        what=f"{pod} running",
    )
    return node, pod


async def taint_seen(sim: GpuClusterSimulator, node: str) -> None:
    await eventually(
        lambda: h.node(sim.client, node),
        until=lambda n: any(t["key"] == TAINT for t in n["spec"].get("taints") or ()),
        what=f"{node} tainted",
    )


def status_writes_to_node(plane: ControlPlane, node: str, *, since: float) -> list[Any]:
    """Every write gpushare made to the Node itself (labels, taints): none for a refused one."""
    return [
        e
        for e in plane.audit_events()
        if e["user"]["username"] == h.OPERATOR_USER
        and e["objectRef"].get("resource") == "nodes"
        and e["objectRef"].get("name") == node
        and e["verb"] in ("patch", "update")
        and audit.moment(e) >= since
    ]


async def test_a_gpu_pod_holds_the_change_and_the_taint_comes_first(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("migpod")
    node, pod = await busy_h100(sim, pods_ns, pool=pool)
    since = time.time()
    name = h.unique("migpod")
    await h.add_policy(sim, policies, mig_policy(name, pool=pool, mig={"profile": "3g.40gb"}))
    await start_operator("--device-plugin-namespace", namespace)
    held = await phase_reached(sim, node, "Pending", reason="WaitingForPods")
    assert "GPU pod" in h.condition(held, "Ready")["message"]
    await taint_seen(sim, node)
    assert label_applies(control_plane, [node], since=since) == []  # nothing while it runs

    await delete_pod(sim, pods_ns, pod)
    await all_verified(sim, [node], name)
    [(labelled, _, labels)] = label_applies(control_plane, [node], since=since)
    assert MIG_LABEL in labels
    [tainted, *_] = taint_added_at(control_plane, node, since=since)
    assert tainted < labelled  # the taint before the layout changed
    await eventually(
        lambda: h.node(sim.client, node),
        until=lambda n: not any(t["key"] == TAINT for t in n["spec"].get("taints") or ()),
        what=f"{node} untainted once Verified",
    )
    assert sim.mig.failures.get(node) is None  # the MIG manager never met a busy GPU


def taint_removed_at(plane: ControlPlane, node: str, *, since: float) -> list[float]:
    return [
        when
        for when, _, patch in audit.taint_writes(plane, [node], since=since, users=REPLICAS)
        if any(op.get("op") in ("remove", "replace") for op in patch)
    ]


async def test_a_new_leader_keeps_the_waiting_node_tainted_and_admitted(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    pods_ns: str,
    policies: list[str],
    start_replicas: Callable[..., Awaitable[Replicas]],
) -> None:
    """The wait's admission is in the GPUNodeState (idleWait): killed mid-wait, the leader's
    successor neither lifts the taint nor starts the wait afresh (audit log)."""
    pool = h.unique("migkill")
    node, pod = await busy_h100(sim, pods_ns, pool=pool)
    since = time.time()
    name = h.unique("migkill")
    await h.add_policy(sim, policies, mig_policy(name, pool=pool, mig={"profile": "3g.40gb"}))
    replicas = await start_replicas()
    leader, follower = await replicas.roles()
    held = await phase_reached(sim, node, "Pending", reason="WaitingForPods")
    wait = held["idleWait"]
    assert wait["policy"] == name and wait["target"]
    await taint_seen(sim, node)
    dying = replicas.running[leader]
    dying.proc.send_signal(signal.SIGKILL)
    assert await dying.exited() == -signal.SIGKILL
    killed = time.time()
    await replicas.wait_holder(follower, timeout=60)
    await replicas.quiet(follower)  # the successor has looked at every node, and is done
    still = await status_of(sim, node)
    assert still["phase"] == "Pending" and still["idleWait"] == wait  # the same wait, kept
    await delete_pod(sim, pods_ns, pod)
    await all_verified(sim, [node], name)
    [added] = taint_added_at(control_plane, node, since=since, users=REPLICAS)
    removed = taint_removed_at(control_plane, node, since=since)
    assert removed and all(when > killed for when in removed)
    labelled = [
        when for when, _, _ in label_applies(control_plane, [node], since=since, users=REPLICAS)
    ]
    # One taint from before the kill until after the layout changed: never lifted meanwhile.
    assert added < killed < min(labelled) < min(removed)


async def test_failed_is_a_mismatch_and_halts_the_rollout(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("migfail")
    broken, waiting = sorted(
        await sim.create_gpu_nodes(pool=pool, count=2, product=H100, gpus=1, mig_preset=False)
    )
    sim.mig.fail_next(broken, "injected NVML error")
    since = time.time()
    name = h.unique("migfail")
    rollout = {"maxUnavailable": 1, "failureThreshold": 1}
    await h.add_policy(
        sim, policies, mig_policy(name, pool=pool, mig={"profile": "7g.80gb"}, **rollout)
    )
    await start_operator("--device-plugin-namespace", namespace)
    failed = await phase_reached(sim, broken, "Mismatch", reason="MIGConfigFailed")
    assert "nvidia.com/mig.config.state=failed" in h.condition(failed, "Ready")["message"]
    await rollout_state(sim, name, "Halted")
    held = await phase_reached(sim, waiting, "Pending", reason="RolloutHalted")
    assert held["policy"] == name
    assert label_applies(control_plane, [waiting], since=since) == []  # the halt held it


async def test_a_new_layout_under_the_same_key_goes_under_the_budget(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    """A mixed layout edited keeps the device-plugin key; maxUnavailable 1 still holds: from
    the audit log, no node's layout label is written before the last node's new layout was
    shown by the cluster (its agents' last write before our Verified)."""
    pool = h.unique("relayout")
    nodes = await sim.create_gpu_nodes(pool=pool, count=3, product=H100, gpus=1, mig_preset=False)
    name = h.unique("relayout")
    old = {"devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, "migStrategy": "mixed"}
    body = mig_policy(name, pool=pool, mig=old, maxUnavailable=1)
    await h.add_policy(sim, policies, body)
    await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, nodes, name)
    key = (await h.node(sim.client, nodes[0]))["metadata"]["labels"][h.CONFIG_LABEL]

    since = time.time()
    # A merge patch: the 3g.40gb goes, a 4g.40gb takes its place.
    await h.patch_policy(sim.client, name, {"mig": {"devices": {"3g.40gb": None, "4g.40gb": 1}}})
    await eventually(
        lambda: h.get_policy(sim.client, name),
        until=lambda b: (b.get("status") or {}).get("observedGeneration") == 2,
        what=f"{name} generation 2 observed",
    )
    await all_verified(sim, nodes, name)
    labels = (await h.node(sim.client, nodes[0]))["metadata"]["labels"]
    assert labels[h.CONFIG_LABEL] == key  # the same key: only the layout changed
    writes = label_applies(control_plane, nodes, since=since)
    assert sorted(n for _, n, _ in writes) == sorted(nodes)  # one apply each
    verified = {
        node: min(
            t
            for t, n, st in audit.status_writes(control_plane, [node], since=when)
            if n == node and st.get("phase") == "Verified"
        )
        for when, node, _ in writes
    }
    windows = []
    for when, node, _ in writes:
        shown = [
            audit.moment(e)
            for e in control_plane.audit_events()
            if e["objectRef"].get("resource") == "nodes"
            and e["objectRef"].get("name") == node
            and e["user"]["username"] != h.OPERATOR_USER
            and e["verb"] in ("patch", "update")
            and when < audit.moment(e) < verified[node]
        ]
        windows.append(audit.Window(node, when, max(shown)))
    assert audit.most_at_once(windows) == 1, windows


async def test_a_failed_disable_is_a_mismatch_and_keeps_the_config(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    """Released, the node's all-disabled fails: Mismatch, and our labels stay (the config it
    runs matches its layout) until the MIG manager succeeds."""
    pool = h.unique("migoff")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, product=H100, gpus=1, mig_preset=False)
    name = h.unique("migoff")
    await start_operator("--device-plugin-namespace", namespace)
    # Created while the operator runs: the new policy's layout goes into the ConfigMap.
    await h.add_policy(sim, policies, mig_policy(name, pool=pool, mig={"profile": "7g.80gb"}))
    await all_verified(sim, [node], name)
    sim.mig.fail_next(node, "injected NVML error")
    since = time.time()
    await h.delete_policy(sim.client, name)
    failed = await phase_reached(sim, node, "Mismatch", reason="MIGDisableFailed")
    assert "could not disable MIG" in h.condition(failed, "Ready")["message"]
    [disabling] = label_applies(control_plane, [node], since=since)
    assert disabling[2][MIG_LABEL] == "all-disabled"
    labels = (await h.node(sim.client, node))["metadata"]["labels"]
    assert labels[h.POLICY_LABEL] == name and labels[MIG_LABEL] == "all-disabled"


@pytest.mark.parametrize("successor", ["none", "unfit-mig"])
async def test_leaving_mig_disables_it_first(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
    successor: str,
) -> None:
    """Deleted, the MIG policy's node has MIG disabled before anything else: released to no
    policy, or left to one that cannot work there (Unsupported: its layout does not fit)."""
    pool = h.unique("migleave")
    [leaving] = await sim.create_gpu_nodes(
        pool=pool, count=1, product=H100, gpus=1, mig_preset=False
    )
    name = h.unique("migleave")
    await h.add_policy(sim, policies, mig_policy(name, pool=pool, mig={"profile": "7g.80gb"}))
    next_name = h.unique("migsucc")
    if successor == "unfit-mig":  # 9 memory slices of 8: never fits an H100
        unfit = mig_policy(next_name, pool=pool, mig={"devices": {"1g.20gb": 4, "1g.10gb": 1}})
        await h.add_policy(sim, policies, unfit)
    await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, [leaving], name)

    since = time.time()
    await h.delete_policy(sim.client, name)
    await phase_reached(sim, leaving, "Unsupported" if successor == "unfit-mig" else "Unmanaged")
    writes = label_applies(control_plane, [leaving], since=since)
    disabling, released = writes[0], writes[-1]
    assert disabling[2][MIG_LABEL] == "all-disabled"
    assert disabling[2][h.POLICY_LABEL] == name  # the config it runs stays while MIG goes
    assert released[2] == {}  # then every label of ours goes, all-disabled too
    runs = [config for config, state in sim.mig.runs[leaving] if state == "success"]
    assert runs[-1] == "all-disabled"
    disabled_at = min(
        audit.moment(e)
        for e in control_plane.audit_events()
        if e["objectRef"].get("resource") == "nodes"
        and e["objectRef"].get("name") == leaving
        and e["user"]["username"] != h.OPERATOR_USER
        and '"nvidia.com/mig.config.state":"success"'
        in json.dumps(e.get("requestObject"), separators=(",", ":"))
        and audit.moment(e) > disabling[0]
    )
    assert disabling[0] < disabled_at < released[0]  # released only once MIG was off
    node = await h.node(sim.client, leaving)
    assert MIG_LABEL not in node["metadata"]["labels"]
    assert h.CONFIG_LABEL not in node["metadata"]["labels"]


async def test_a_mig_layout_someone_else_set_is_left_alone(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("migforeign")
    # The GPU Operator's preset all-disabled label (here written when the node registered).
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, product=H100, gpus=1)
    since = time.time()
    name = h.unique("migforeign")
    await h.add_policy(sim, policies, mig_policy(name, pool=pool, mig={"profile": "1g.10gb"}))
    await start_operator("--device-plugin-namespace", namespace)
    refused = await phase_reached(sim, node, "Unsupported", reason="MIGConfigOwnedByOther")
    assert "field manager kubelet" in h.condition(refused, "Ready")["message"]
    assert status_writes_to_node(control_plane, node, since=since) == []
    labels = (await h.node(sim.client, node))["metadata"]["labels"]
    assert labels[MIG_LABEL] == "all-disabled"


@pytest.mark.simulator(mig_reboot_seconds=3.0)
async def test_a_reboot_for_the_layout_is_no_mismatch(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("migboot")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, product=H100, gpus=1, mig_preset=False)
    since = time.time()
    name = h.unique("migboot")
    await h.add_policy(sim, policies, mig_policy(name, pool=pool, mig={"profile": "2g.20gb"}))
    await start_operator("--device-plugin-namespace", namespace, "--mismatch-timeout", "4")
    await all_verified(sim, [node], name)
    assert sim.mig.reboots.get(node, 0) >= 1
    phases = [s.get("phase") for _, _, s in audit.status_writes(control_plane, [node], since=since)]
    assert "Mismatch" not in phases and phases[-1] == "Verified", phases
    reasons = [
        e["reason"] for e in await h.events_about(sim.client, node) if e["type"] == "Warning"
    ]
    assert reasons == [], reasons

"""``kubectl gpushare`` on the real control plane, run as users run it (a child process).

The central claim: what ``plan`` predicts (which nodes change, to which policy, key and
capacity) is what the operator then does, read back from the GPUNodeStates once it has
converged, for random edits drawn by hypothesis.  Then the exit statuses a pipeline gates on,
and ``status`` and ``explain node`` against what the operator published.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from gpushare_testing import apiobjects as h
from gpushare_testing import bodies
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.gpupods import create as create_gpu_pod
from gpushare_testing.gpupods import create_pod, small_pod, wait_node_usage
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.pluginruns import PLUGIN_ROLE, Run, plugin
from gpushare_testing.rolloutstate import all_verified
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

SETTLED = frozenset({"Verified", "Unmanaged", "Unsupported"})
EDITS = 30  # hypothesis examples in the prediction test: one edit each
FAST_AGENTS = pytest.mark.simulator(config_sync_delay=0.5, restart_window=0.5)


def user_kubeconfig(plane: ControlPlane) -> Path:
    return plane.kubeconfig_for_user("kubectl-gpushare-user", groups=("system:masters",))


# -- what the operator published, in the plan's terms ----------------------------------------

Standing = tuple[str | None, str | None, int, str]  # policy, config key, capacity, standing


def published(state: Mapping[str, Any] | None) -> Standing:
    status = (state or {}).get("status") or {}
    policy = status.get("policy")
    standing = "Governed"
    if status.get("phase") == "Unsupported":
        standing = "Unsupported"
    elif policy is None:
        standing = "Unmanaged"
    capacity = int((status.get("slots") or {}).get("capacity") or 0)
    return (policy, status.get("configKey"), capacity, standing)


def predicted(target: Mapping[str, Any]) -> Standing:
    return (target.get("policy"), target.get("configKey"), target["capacity"], target["standing"])


async def standings(sim: GpuClusterSimulator, nodes: Sequence[str]) -> dict[str, Standing]:
    body = await h.ok(sim.client, "GET", f"{h.API}/gpunodestates")
    states = {item["metadata"]["name"]: item for item in body["items"]}
    return {node: published(states.get(node)) for node in nodes}


# -- a small fleet and a model of its policies ------------------------------------------------


@dataclass
class Shape:
    pools: tuple[str, ...]
    racks: tuple[str, ...] | None
    strategy: str
    replicas: int | None
    priority: int

    def spec(self, tag: str) -> dict[str, Any]:
        expressions = [
            {"key": "pool", "operator": "In", "values": [f"{tag}-{p}" for p in self.pools]}
        ]
        if self.racks:
            expressions.append({"key": "rack", "operator": "In", "values": list(self.racks)})
        spec: dict[str, Any] = {
            "nodeSelector": {"matchExpressions": expressions},
            "strategy": self.strategy,
            "priority": self.priority,
            "rollout": h.UNPACED,
        }
        if self.replicas is not None:
            spec["replicas"] = self.replicas
        return spec


# pool -> (nodes as (rack, mig strategy), GPUs per node)
FLEET = {
    "a": ((("r0", "single"), ("r1", "single"), ("r0", "single")), 2),
    "b": ((("r0", "single"), ("r1", "single"), ("r1", "single")), 4),
    "c": ((("r0", "mixed"), ("r1", "single")), 1),
}


@dataclass
class World:
    sim: GpuClusterSimulator
    namespace: str
    kubeconfig: Path
    tag: str
    nodes: list[str]
    created: list[str]
    scratch: Path
    shapes: dict[str, Shape] = field(default_factory=dict)
    serial: int = 0

    def body(self, name: str) -> dict[str, Any]:
        spec = self.shapes[name].spec(self.tag)
        return {**h.policy(name, pool="-"), "spec": spec}


async def create_fleet(sim: GpuClusterSimulator, tag: str) -> list[str]:
    names = []
    for pool, (nodes, gpus) in FLEET.items():
        for index, (rack, mig) in enumerate(nodes):
            name = f"{tag}-{pool}{index}"
            body = bodies.gpu_node(
                name=name,
                pool=f"{tag}-{pool}",
                gpus=gpus,
                mig_strategy=mig,
                extra_labels={"rack": rack},
            )
            await sim.create_node(body)
            names.append(name)
    return names


async def converged(world: World, *, gone: str | None = None, timeout: float = 120) -> None:
    """Every policy's status has seen its generation (a deleted one is gone), and every node
    is settled on what its policy's status names."""

    async def settled() -> str | None:
        keys = {}
        for name in world.shapes:
            body = await h.get_policy(world.sim.client, name)
            status = body.get("status") or {}
            if status.get("observedGeneration") != body["metadata"]["generation"]:
                return f"{name} at generation {status.get('observedGeneration')}"
            keys[name] = status.get("configKey")
        if gone is not None:
            status, _ = await world.sim.client.get(f"{h.API}/gpusharingpolicies/{gone}")
            if status != 404:
                return f"{gone} not deleted yet"
        body = await h.ok(world.sim.client, "GET", f"{h.API}/gpunodestates")
        published = {item["metadata"]["name"] for item in body["items"]}
        # A node a policy selects whole-pool has a status once judged: until then it is not
        # settled, whatever the statuses already published say.
        selected = {
            node
            for shape in world.shapes.values()
            if shape.racks is None
            for pool in shape.pools
            for node in world.nodes
            if node.startswith(f"{world.tag}-{pool}")
        }
        if missing := sorted(selected - published):
            return f"{missing} not published yet"
        for item in body["items"]:
            if item["metadata"]["name"] not in world.nodes:
                continue
            status = item.get("status") or {}
            policy = status.get("policy")
            if status.get("phase") not in SETTLED:
                return f"{item['metadata']['name']} {status.get('phase')}"
            if policy in keys and status.get("configKey") != keys[policy]:
                return f"{item['metadata']['name']} on {status.get('configKey')}"
        return None

    async def twice() -> str | None:
        first = await settled()
        if first is not None:
            return first
        await asyncio.sleep(1.0)  # settled for a second, not between two writes
        return await settled()

    try:
        await eventually(
            twice, until=lambda r: r is None, timeout=timeout, interval=0.5, what="settle"
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{await picture(world)}") from None


async def picture(world: World) -> str:
    """Each node's labels of ours and its GPUNodeState, for a failure message."""
    lines = []
    for node in world.nodes:
        labels = (await h.node(world.sim.client, node))["metadata"].get("labels") or {}
        status = (await h.node_state(world.sim.client, node) or {}).get("status") or {}
        ready = h.condition(status, "Ready")
        lines.append(
            f"{node}: labels {labels.get(h.POLICY_LABEL)}/{labels.get(h.CONFIG_LABEL)}"
            f" mig={labels.get('nvidia.com/mig.strategy')}; state {status.get('policy')}"
            f" {status.get('configKey')} {status.get('phase')} {ready.get('reason')}"
        )
    lines.append(f"policies: {world.shapes}")
    return "\n".join(lines)


@pytest.fixture
async def world(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
    tmp_path: Path,
) -> World:
    tag = h.unique("kp")
    world = World(
        sim=sim,
        namespace=namespace,
        kubeconfig=user_kubeconfig(control_plane),
        tag=tag,
        nodes=await create_fleet(sim, tag),
        created=policies,
        scratch=tmp_path,
    )
    world.shapes = {
        f"{tag}-p0": Shape(("a",), None, "TimeSlicing", 2, 10),
        f"{tag}-p1": Shape(("b",), None, "MPS", 4, 20),
    }
    for name in world.shapes:
        await h.add_policy(sim, policies, world.body(name))
    await start_operator("--device-plugin-namespace", namespace)
    await converged(world)
    return world


# -- random edits -------------------------------------------------------------------------------

STRATEGIES = (("TimeSlicing", 2), ("TimeSlicing", 3), ("MPS", 2), ("MPS", 4), ("Exclusive", None))
KINDS = ("replicas", "strategy", "priority", "narrow", "widen", "create", "delete")
REPLICAS = (2, 3, 4, 6)

# One edit, drawn the same way whatever the cluster holds (hypothesis requires it), then
# interpreted against the policies there are: which one, and what changes.
EDIT = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(KINDS),
        "which": st.integers(0, 3),
        "pools": st.lists(st.sampled_from("abc"), min_size=1, max_size=2, unique=True),
        "strategy": st.integers(0, len(STRATEGIES) - 1),
        "replicas": st.integers(0, len(REPLICAS) - 1),
        "priority": st.integers(0, 30),
        "rack": st.sampled_from(["r0", "r1"]),
    }
)


def interpret(edit: Mapping[str, Any], world: World) -> tuple[str, str, Shape | None]:
    """(kind, policy name, its new shape; None for a deletion)."""
    names = sorted(world.shapes)
    kind = edit["kind"]
    if not names or (kind == "delete" and len(names) < 2):
        kind = "create"
    if kind == "create" and len(names) >= 4:
        kind = "priority"
    strategy, replicas = STRATEGIES[edit["strategy"]]
    if kind == "create":
        world.serial += 1
        pools = tuple(sorted(edit["pools"]))
        shape = Shape(pools, None, strategy, replicas, edit["priority"])
        return kind, f"{world.tag}-n{world.serial}", shape
    name = names[edit["which"] % len(names)]
    old = world.shapes[name]
    if kind == "delete":
        return kind, name, None
    if kind == "replicas":
        index = edit["replicas"]
        if REPLICAS[index] == old.replicas:
            index = (index + 1) % len(REPLICAS)
        strategy = "TimeSlicing" if old.strategy == "Exclusive" else old.strategy
        return kind, name, Shape(old.pools, old.racks, strategy, REPLICAS[index], old.priority)
    if kind == "strategy":
        index = edit["strategy"]
        while STRATEGIES[index][0] == old.strategy:
            index = (index + 1) % len(STRATEGIES)
        strategy, replicas = STRATEGIES[index]
        return kind, name, Shape(old.pools, old.racks, strategy, replicas, old.priority)
    if kind == "priority":
        priority = edit["priority"] if edit["priority"] != old.priority else old.priority + 1
        return kind, name, Shape(old.pools, old.racks, old.strategy, old.replicas, priority)
    if kind == "narrow":
        racks = (edit["rack"],)
        return kind, name, Shape(old.pools, racks, old.strategy, old.replicas, old.priority)
    pools = tuple(sorted({*old.pools, *edit["pools"]}))
    return kind, name, Shape(pools, None, old.strategy, old.replicas, old.priority)


async def plan_edit(world: World, kind: str, name: str, shape: Shape | None) -> Run:
    common = ("-o", "json", "--device-plugin-namespace", world.namespace)
    if shape is None:
        return await plugin(world.kubeconfig, "plan", "--delete", name, *common)
    manifest = world.scratch / f"{name}.yaml"
    world.shapes[name], old = shape, world.shapes.get(name)
    manifest.write_text(yaml.safe_dump(world.body(name)))
    if old is None:
        del world.shapes[name]
    else:
        world.shapes[name] = old
    return await plugin(world.kubeconfig, "plan", "-f", str(manifest), *common)


async def apply_edit(world: World, name: str, shape: Shape | None) -> None:
    client = world.sim.client
    path = f"{h.API}/gpusharingpolicies/{name}"
    if shape is None:
        await h.delete_policy(client, name)
        del world.shapes[name]
        return
    fresh = name not in world.shapes
    world.shapes[name] = shape
    if fresh:
        await h.add_policy(world.sim, world.created, world.body(name))
        return
    current = await h.get_policy(client, name)
    current["spec"] = world.body(name)["spec"]  # replaced whole, as plan assumes
    status, body = await client.request("PUT", path, current)
    assert status == 200, body


@FAST_AGENTS
@settings(
    max_examples=EDITS,
    deadline=None,
    database=None,
    phases=[Phase.generate],  # each edit builds on the last: shrinking could not replay one
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(edit=EDIT)
async def test_plan_predicts_the_nodes_and_capacities_the_operator_then_publishes(
    world: World, edit: dict[str, Any]
) -> None:
    kind, name, shape = interpret(edit, world)
    note(f"{kind} {name}: {shape}")
    started = time.monotonic()
    before = await standings(world.sim, world.nodes)
    run = await plan_edit(world, kind, name, shape)
    assert run.code in (0, 2), run.stderr
    report = run.json()
    await apply_edit(world, name, shape)
    await converged(world, gone=name if shape is None else None)
    after = await standings(world.sim, world.nodes)

    changes = [n for n in report["nodes"] if n["name"] in world.nodes]
    assert {n["name"]: predicted(n["after"]) for n in changes} == {
        node: after[node] for node in world.nodes if after[node] != before[node]
    }, f"{kind} {name}"
    assert {n["name"]: predicted(n["before"]) for n in changes} == {
        n["name"]: before[n["name"]] for n in changes
    }
    unsupported = {u["node"] for u in report["unsupported"]}
    assert all(after[node][3] == "Unsupported" for node in unsupported)
    assert (run.code == 2) == bool(report["problems"]) == bool(unsupported)
    print(
        f"{kind} {name}: {len(changes)} node(s) changed, exit {run.code},"
        f" {time.monotonic() - started:.1f} s"
    )


# -- exit statuses --------------------------------------------------------------------------------


async def test_lowering_replicas_under_the_pods_of_a_node_exits_2_and_names_them(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    tmp_path: Path,
) -> None:
    pool = h.unique("busy")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    name = h.unique("busy")
    body = h.policy(name, pool=pool, replicas=4)  # 8 slots
    await h.add_policy(sim, policies, body)
    await start_operator("--device-plugin-namespace", namespace)
    await h.wait_phase(sim, node, "Verified")
    for index in range(3):
        await create_pod(sim, pods_ns, f"worker-{index}", node, count=2)
    await wait_node_usage(sim, node, 6, 3)

    body["spec"]["replicas"] = 2  # 4 slots: under the 6 the pods hold
    manifest = tmp_path / "lower.yaml"
    manifest.write_text(yaml.safe_dump(body))
    kubeconfig = user_kubeconfig(control_plane)
    args = ("plan", "-f", str(manifest), "--device-plugin-namespace", namespace)
    run = await plugin(kubeconfig, *args, "-o", "json")
    assert run.code == 2, run.stderr
    [item] = run.json()["overcommitted"]
    assert item["node"] == node and item["waitsForPods"]
    assert item["why"] == "pods hold 6 nvidia.com/gpu; the new config has 4"
    assert sorted(p["name"] for p in item["pods"]) == ["worker-0", "worker-1", "worker-2"]
    text = await plugin(kubeconfig, *args)
    assert text.code == 2
    assert "Result: blocked (exit 2)" in text.stdout
    assert f"{pods_ns}/worker-0" in text.stdout and "held (WaitingForPods)" in text.stdout
    # Nothing was changed: the policy is as it was.
    assert (await h.get_policy(sim.client, name))["spec"]["replicas"] == 4


async def test_an_object_the_api_server_refuses_exits_1_in_the_api_servers_words(
    control_plane: ControlPlane, sim: GpuClusterSimulator, tmp_path: Path
) -> None:
    name = h.unique("refused")
    body = h.policy(name, pool="x", replicas=100)
    manifest = tmp_path / "refused.yaml"
    manifest.write_text(yaml.safe_dump(body))
    run = await plugin(user_kubeconfig(control_plane), "plan", "-f", str(manifest))
    assert run.code == 1 and run.stdout == ""
    status, answer = await sim.client.post(
        f"{h.API}/gpusharingpolicies", body, params={"dryRun": "All"}
    )
    assert status == 422
    assert run.stderr.splitlines()[0] == f"Error from server (Invalid): {answer['message']}"
    assert "spec.replicas" in run.stderr
    status, _ = await sim.client.get(f"{h.API}/gpusharingpolicies/{name}")
    assert status == 404  # a dry run stores nothing
    missing = await plugin(user_kubeconfig(control_plane), "plan", "--delete", h.unique("none"))
    assert missing.code == 1 and "Error from server (NotFound)" in missing.stderr


# -- status and explain ---------------------------------------------------------------------------


async def test_status_and_explain_say_what_the_operator_published(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
) -> None:
    pool = h.unique("shown")
    nodes = await sim.create_gpu_nodes(pool=pool, count=2, gpus=2)
    wide, narrow = h.unique("wide"), h.unique("narrow")
    await h.add_policy(sim, policies, h.policy(wide, pool=pool, replicas=2, priority=1))
    await h.add_policy(sim, policies, h.policy(narrow, pool=pool, replicas=4, priority=9))
    await start_operator("--device-plugin-namespace", namespace)
    for node in nodes:
        await h.wait_phase(sim, node, "Verified")
    await create_pod(sim, pods_ns, "inference-0", nodes[0], count=3)
    await wait_node_usage(sim, nodes[0], 3, 1)
    published_status = await eventually(
        lambda: h.get_policy(sim.client, narrow),
        until=lambda b: (b.get("status") or {}).get("slots", {}).get("allocated") == 3,
        what="the policy to count the pod",
    )
    kubeconfig = user_kubeconfig(control_plane)
    common = ("--device-plugin-namespace", namespace)

    run = await plugin(kubeconfig, "status", "--policy", narrow, "-o", "json", *common)
    assert run.code == 0, run.stderr
    report = run.json()
    shown = {p["name"]: p for p in report["policies"]}
    status = published_status["status"]
    assert shown[narrow]["slots"] == {"allocated": 3, "capacity": 16}
    assert (status["slots"]["allocated"], status["slots"]["capacity"]) == (3, 16)
    assert (shown[narrow]["matched"], shown[narrow]["verified"]) == (2, 2)
    assert (shown[wide]["matched"], shown[wide]["conflicting"], shown[wide]["governed"]) == (
        2,
        2,
        0,
    )
    assert shown[narrow]["rollout"]["state"] == "Complete"
    assert [(n["name"], n["phase"], n["slots"]["allocated"]) for n in report["nodes"]] == [
        (nodes[0], "Verified", 3),
        (nodes[1], "Verified", 0),
    ]
    text = await plugin(kubeconfig, "status", *common)
    assert text.stdout.splitlines()[0].split() == [
        "POLICY", "STRATEGY", "REPLICAS", "PRIORITY", "MATCHED", "APPLIED", "VERIFIED",
        "ROLLOUT", "SLOTS",
    ]  # fmt: skip
    assert "█" not in text.stdout  # no bars: stdout is not a terminal

    run = await plugin(kubeconfig, "explain", "node", nodes[0], "-o", "yaml", *common)
    assert run.code == 0, run.stderr
    explained = yaml.safe_load(run.stdout)
    assert [(p["name"], p["outcome"]) for p in explained["policies"]] == [
        (narrow, "governs"),
        (wide, "outranked"),
    ]
    assert explained["policies"][0]["why"].startswith("highest priority (9")
    config = explained["config"]
    data = await h.config_data(sim.client, namespace)
    assert data is not None and config["carried"] == status["configKey"]
    assert config["content"] == data[config["carried"]]
    assert [p["name"] for p in explained["slots"]["pods"]] == ["inference-0"]
    assert explained["phase"]["published"] == "Verified"
    text = await plugin(kubeconfig, "explain", "node", nodes[0], *common)
    assert f"{narrow}" in text.stdout and "Slots (nvidia.com/gpu): 3/8" in text.stdout


H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200-141GB-HBM3e"


async def test_a_mig_plan_shows_layouts_slots_by_resource_and_the_pod_it_waits_for(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    tmp_path: Path,
) -> None:
    """A MIG policy over a busy and an idle H100 node and an H200 that has no 1g.10gb: the
    plan, made before it is applied, names the layout and its mig-parted config, the slots by
    resource, the pod the busy node waits for and the H200's refusal; applied, the operator
    does just that, and explain shows the layout once Verified.  (The plan reads the cluster
    alone: the operator starts once the policy is there.)"""
    pool = h.unique("migplan")
    busy, idle = await sim.create_gpu_nodes(
        pool=pool, count=2, product=H100, gpus=2, mig_preset=False
    )
    [h200] = await sim.create_gpu_nodes(
        pool=pool, count=1, prefix=f"{pool}-x", product=H200, gpus=1, mig_preset=False
    )
    await create_gpu_pod(sim, pods_ns, small_pod("holder", gpus=1, node=busy))
    await eventually(
        lambda: h.ok(sim.client, "GET", f"/api/v1/namespaces/{pods_ns}/pods/holder"),
        until=lambda p: p["status"].get("phase") == "Running",
        what="holder running",
    )
    name = h.unique("migplan")
    body = {
        **h.policy(name, pool=pool),
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": pool}},
            "strategy": "MIG",
            "mig": {"profile": "1g.10gb", "migStrategy": "mixed"},
            "rollout": {"maxUnavailable": "100%", "canary": 0},
        },
    }
    manifest = tmp_path / "mig.yaml"
    manifest.write_text(yaml.safe_dump(body))
    kubeconfig = user_kubeconfig(control_plane)
    common = ("--device-plugin-namespace", namespace)
    for path in (f"{h.API}/gpusharingpolicies", f"{h.API}/gpunodestates"):
        await eventually(  # served: the storage of a fresh CRD may still be initializing
            lambda path=path: sim.client.get(path),
            until=lambda answer: answer[0] == 200,
            what=f"{path} served",
        )

    run = await plugin(kubeconfig, "plan", "-f", str(manifest), "-o", "json", *common)
    assert run.code == 2, run.stderr  # the H200 cannot hold it; the busy node waits
    plan = run.json()
    [entry] = plan["policies"]
    [shown] = entry["pools"]
    [layout] = shown["layouts"]["after"]
    assert (layout["product"], layout["layout"], layout["nodes"]) == (H100, "7x 1g.10gb", 2)
    assert plan["migLayouts"]["written"][layout["config"]] == "7x 1g.10gb"
    assert shown["slotsByResource"] == {"nvidia.com/mig-1g.10gb": {"before": 0, "after": 28}}
    nodes = {n["name"]: n for n in plan["nodes"]}
    assert nodes[idle]["before"]["slots"] == {"nvidia.com/gpu": 2}
    assert nodes[idle]["after"]["slots"] == {"nvidia.com/mig-1g.10gb": 14}
    [waits] = plan["overcommitted"]
    assert (waits["node"], waits["migChange"], waits["waitsForPods"]) == (busy, True, True)
    assert [(p["namespace"], p["name"]) for p in waits["pods"]] == [(pods_ns, "holder")]
    assert [(x["node"], x["reason"]) for x in entry["rollout"]["held"]] == [
        (busy, "WaitingForPods")
    ]
    assert [b["nodes"] for b in entry["rollout"]["batches"]] == [[idle]]
    [refused] = plan["unsupported"]
    assert (refused["node"], refused["reason"]) == (h200, "MIGLayoutDoesNotFit")
    text = await plugin(kubeconfig, "plan", "-f", str(manifest), *common)
    assert f"layout on {H100}: 7x 1g.10gb per GPU (mig-parted config {layout['config']}" in (
        text.stdout
    )
    assert "slots by resource: nvidia.com/mig-1g.10gb: 0 -> 28" in text.stdout
    assert f"{pods_ns}/holder" in text.stdout and "Pods a MIG change waits for" in text.stdout

    # Applied: the operator does what the plan said.
    await h.add_policy(sim, policies, body)
    await start_operator("--device-plugin-namespace", namespace)
    await all_verified(sim, [idle], name)
    held = await eventually(
        lambda: h.node_state(sim.client, busy),
        until=lambda s: (
            h.condition((s or {}).get("status") or {}, "Ready").get("reason") == "WaitingForPods"
        ),
        what=f"{busy} waiting for its pod",
    )
    assert held is not None
    published = ((await h.node_state(sim.client, idle)) or {})["status"]
    assert published["mig"]["config"] == nodes[idle]["after"]["migConfig"] == layout["config"]
    assert published["slots"]["capacity"] == nodes[idle]["after"]["capacity"] == 14
    await eventually(
        lambda: h.node_state(sim.client, h200),
        until=lambda s: ((s or {}).get("status") or {}).get("phase") == "Unsupported",
        what=f"{h200} Unsupported",
    )

    run = await plugin(kubeconfig, "explain", "node", idle, "-o", "json", *common)
    assert run.code == 0, run.stderr
    mig = run.json()["mig"]
    assert mig["published"] == published["mig"]
    assert (mig["published"]["layout"], mig["published"]["state"]) == ("7x 1g.10gb", "success")
    assert mig["label"] == layout["config"] and mig["labelLayout"] == "7x 1g.10gb"
    assert mig["why"].startswith(f"policy {name} governs it: every {H100} GPU gets 7x 1g.10gb")
    text = await plugin(kubeconfig, "explain", "node", idle, *common)
    assert f"MIG layout: 7x 1g.10gb per GPU ({layout['config']})" in text.stdout
    run = await plugin(kubeconfig, "explain", "node", h200, "-o", "json", *common)
    [refusal] = run.json()["mig"]["unsupported"]
    assert (refusal["policy"], refusal["reason"]) == (name, "MIGLayoutDoesNotFit")


async def test_the_cluster_is_found_as_kubectl_finds_it(
    control_plane: ControlPlane, crds_installed: None, tmp_path: Path
) -> None:
    """$KUBECONFIG without a flag; --context picks another context; failures exit 1."""
    good = yaml.safe_load(user_kubeconfig(control_plane).read_text())
    broken = {"name": "broken", "context": {"cluster": "nowhere", "user": good["users"][0]["name"]}}
    good["clusters"].append({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}})
    good["contexts"].append(broken)
    real = good["current-context"]
    good["current-context"] = "broken"
    path = tmp_path / "two-contexts.yaml"
    path.write_text(yaml.safe_dump(good))
    env = {"KUBECONFIG": str(path)}

    failed = await plugin(None, "status", env=env)
    assert failed.code == 1 and failed.stderr.startswith("error: cannot reach the API server")
    ok = await plugin(None, "status", "--context", real, "-o", "json", env=env)
    assert ok.code == 0, ok.stderr
    assert "policies" in ok.json()
    flag = await plugin(path, "--context", real, "status", env={"KUBECONFIG": "/nonexistent"})
    assert flag.code == 0, flag.stderr
    unknown = await plugin(path, "status", "--context", "nope")
    assert unknown.code == 1 and unknown.stderr.startswith("error:")


async def test_a_user_who_may_list_but_not_watch_gets_the_same_plan(
    control_plane: ControlPlane, sim: GpuClusterSimulator, policies: list[str], tmp_path: Path
) -> None:
    pool = h.unique("rbac")
    await sim.create_gpu_nodes(pool=pool, count=2, gpus=2)
    name = h.unique("rbac")
    body = h.policy(name, pool=pool, replicas=2)
    await h.add_policy(sim, policies, body)
    role, user = h.unique("plugin-reader"), h.unique("reader")
    await h.ok(
        sim.client,
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {**PLUGIN_ROLE, "metadata": {"name": role}},
    )
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    await h.ok(
        sim.client, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding
    )
    try:
        body["spec"]["replicas"] = 4
        manifest = tmp_path / "edit.yaml"
        manifest.write_text(yaml.safe_dump(body))
        args = ("plan", "-f", str(manifest), "-o", "json", "-v")
        reader = await plugin(control_plane.kubeconfig_for_user(user), *args)
        admin = await plugin(user_kubeconfig(control_plane), *args)
        assert reader.code == admin.code == 0, reader.stderr
        assert reader.json() == admin.json()
        assert len([n for n in reader.json()["nodes"] if n["pool"] == pool]) == 2
        assert "GPU nodes" in reader.stderr  # -v: the steps on stderr
        denied = await plugin(control_plane.kubeconfig_for_user(h.unique("nobody")), *args)
        assert denied.code == 1 and "Error from server (Forbidden)" in denied.stderr
        # Its first request is the policy's GET before the dry run: named, with the check.
        assert denied.stderr.startswith(
            "error: missing permission: get gpusharingpolicies.gpushare.dev"
        ), denied.stderr
        assert "kubectl auth can-i get gpusharingpolicies.gpushare.dev/" in denied.stderr
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            await sim.client.delete(f"/apis/rbac.authorization.k8s.io/v1/{kind}/{role}")

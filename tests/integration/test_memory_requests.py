"""Ask for GPU memory, get a slot that enforces it: the webhook and kube-scheduler, for real.

Pools of simulated H100s (81559 MiB each, GFD's label): MPS at 4 replicas (20389 MiB a slot:
the MPS daemon's floor(memory / replicas)), MPS at 2 (40779 MiB), Exclusive (the whole GPU) and
time-slicing (nothing enforced).  The operator labels each Verified node with its promise; the
webhook (kopf's @kopf.on.mutate, served by the operator on 127.0.0.1, called by the real API
server through a configuration shaped as the chart's) turns a pod's gpushare.dev/gpu-memory
label into a request of the smallest class that holds it plus node affinity; the real
kube-scheduler places it, and the simulated kubelet admits it.  Every claim is read from the
objects or the API server's audit log.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import rolloutaudit
from gpushare_testing import webhooks as wh
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.gpupods import create, read
from gpushare_testing.operators import OperatorFactory, RunningOperator
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

GPU = "nvidia.com/gpu"
H100_MIB = 81559


@dataclass
class Pools:
    mps4: list[str]
    mps2: list[str]
    whole: list[str]
    sliced: list[str]
    policies: dict[str, str]  # pool kind -> policy name

    def kind_of(self, node: str) -> str:
        for kind in ("mps4", "mps2", "whole", "sliced"):
            if node in getattr(self, kind):
                return kind
        raise AssertionError(f"{node} is in no pool of this test")


@dataclass
class Setup:
    sim: GpuClusterSimulator
    namespace: str
    flags: wh.WebhookFlags
    port: int
    operator: RunningOperator
    pools: Pools


async def slot_labels(sim: GpuClusterSimulator, node: str) -> dict[str, str]:
    labels = (await h.node(sim.client, node))["metadata"].get("labels") or {}
    return {k: v for k, v in labels.items() if k.startswith(rolloutaudit.SLOT_PREFIX)}


async def wait_slot_memory(sim: GpuClusterSimulator, node: str, memory: str | None) -> None:
    async def shown() -> dict[str, str]:
        return await slot_labels(sim, node)

    await eventually(
        shown,
        until=lambda labels: labels.get(wh.SLOT_MEMORY) == memory and bool(labels),
        timeout=60,
        what=f"{node} to promise {memory} MiB a slot",
    )


async def start_webhook_operator(
    start_operator: OperatorFactory,
    sim: GpuClusterSimulator,
    namespace: str,
    flags: wh.WebhookFlags,
    *,
    port: int,
    extra: tuple[str, ...] = (),
) -> RunningOperator:
    operator = await start_operator(
        "--device-plugin-namespace", namespace, *flags.args(port=port), *extra
    )
    await wh.wait_published(sim, flags.configuration)
    return operator


async def make_pools(sim: GpuClusterSimulator, created: list[str]) -> Pools:
    tag = h.unique("mem")
    kinds = {"mps4": 2, "mps2": 1, "whole": 1, "sliced": 1}
    nodes = {
        kind: await sim.create_gpu_nodes(pool=f"{tag}-{kind}", count=count, gpus=1)
        for kind, count in kinds.items()
    }
    names = {kind: f"{tag}-{kind}" for kind in kinds}
    await h.add_policy(sim, created, h.policy(names["mps4"], pool=names["mps4"], strategy="MPS"))
    await h.add_policy(
        sim, created, h.policy(names["mps2"], pool=names["mps2"], strategy="MPS", replicas=2)
    )
    whole = h.policy(names["whole"], pool=names["whole"], strategy="Exclusive")
    del whole["spec"]["replicas"]
    await h.add_policy(sim, created, whole)
    await h.add_policy(sim, created, h.policy(names["sliced"], pool=names["sliced"]))
    return Pools(**nodes, policies=names)


@pytest.fixture
async def setup(
    crds_installed: None,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
) -> Setup:
    pools = await make_pools(sim, policies)
    port = free_port()
    await wh.install(sim, webhook_flags.configuration, port=port)
    operator = await start_webhook_operator(
        start_operator, sim, namespace, webhook_flags, port=port
    )
    for node in pools.mps4:
        await wait_slot_memory(sim, node, str(H100_MIB // 4))
    await wait_slot_memory(sim, pools.mps2[0], str(H100_MIB // 2))
    await wait_slot_memory(sim, pools.whole[0], str(H100_MIB))
    await wait_slot_memory(sim, pools.sliced[0], None)  # isolation none, no memory
    # What the API server shows, the operator's node informer takes in a moment later.
    names = pools.policies
    await wh.wait_offered(
        operator,
        {
            (names["mps4"], H100_MIB // 4): len(pools.mps4),
            (names["mps2"], H100_MIB // 2): 1,
            (names["whole"], H100_MIB): 1,
        },
    )
    return Setup(sim, namespace, webhook_flags, port, operator, pools)


async def wait_bound(sim: GpuClusterSimulator, namespace: str, name: str) -> dict[str, Any]:
    return await eventually(
        lambda: read(sim, namespace, name),
        until=lambda p: bool(p["spec"].get("nodeName")),
        timeout=60,
        what=f"kube-scheduler to place {name}",
    )


def scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c["type"] == "PodScheduled"), {})


async def test_pods_land_only_where_the_slot_enforces_their_request(
    setup: Setup, pods_ns: str, control_plane: ControlPlane
) -> None:
    sim, pools = setup.sim, setup.pools
    # The slot labels say what each pool's slots enforce.
    assert await slot_labels(sim, pools.mps4[0]) == {
        wh.SLOT_MEMORY: "20389",
        wh.SLOT_ISOLATION: "mps",
        wh.SLOT_RESOURCE: "nvidia.com_gpu",
    }
    assert (await slot_labels(sim, pools.whole[0]))[wh.SLOT_ISOLATION] == "exclusive"
    assert await slot_labels(sim, pools.sliced[0]) == {
        wh.SLOT_ISOLATION: "none",
        wh.SLOT_RESOURCE: "nvidia.com_gpu",
    }
    wanted = {"p10": ("10Gi", 10240, "mps4"), "p20": ("20Gi", 20480, "mps2")}
    wanted["p40"] = ("40Gi", 40960, "whole")
    for name, (memory, _, _) in wanted.items():
        await create(sim, pods_ns, wh.memory_pod(name, memory=memory))
    for name, (_, mib, kind) in wanted.items():
        pod = await wait_bound(sim, pods_ns, name)
        [container] = pod["spec"]["containers"]
        assert container["resources"]["requests"] == {GPU: "1"}
        assert container["resources"]["limits"] == {GPU: "1"}
        assert {"name": wh.MPS_LIMIT_ENV, "value": f"0={mib}M"} in container["env"]
        node = pod["spec"]["nodeName"]
        assert pools.kind_of(node) == kind, (name, node)
        promised = await slot_labels(sim, node)
        assert int(promised[wh.SLOT_MEMORY]) >= mib  # at least the request
    # The webhook, not a guess, made each of them: the audit log names it on every create.
    creates = [
        e
        for e in control_plane.audit_events()
        if e["verb"] == "create"
        and e["objectRef"].get("resource") == "pods"
        and e["objectRef"].get("namespace") == pods_ns
        and e["objectRef"].get("name") in wanted
        and not e["objectRef"].get("subresource")
    ]
    assert len(creates) == 3
    for event in creates:
        annotations = event.get("annotations") or {}
        mutated = [v for k, v in annotations.items() if k.startswith("mutation.webhook")]
        assert any(wh.WEBHOOK_NAME in v and '"mutated":true' in v for v in mutated), annotations


async def test_time_slicing_is_never_chosen_and_the_users_affinity_is_kept(
    setup: Setup, pods_ns: str
) -> None:
    sim, pools = setup.sim, setup.pools
    target = pools.mps4[1]
    hostname = {"key": "kubernetes.io/hostname", "operator": "In", "values": [target]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [hostname]}]
            }
        }
    }
    await create(sim, pods_ns, wh.memory_pod("mine", memory="1Gi", affinity=affinity))
    await create(sim, pods_ns, wh.memory_pod("small", memory="1Mi"))
    mine = await wait_bound(sim, pods_ns, "mine")
    assert mine["spec"]["nodeName"] == target
    [term] = mine["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"][0] == hostname  # the user's own, first
    assert {e["key"] for e in term["matchExpressions"][1:]} == {wh.SLOT_MEMORY, wh.SLOT_RESOURCE}
    small = await wait_bound(sim, pods_ns, "small")
    assert small["spec"]["nodeName"] not in pools.sliced  # even the smallest request
    assert pools.kind_of(small["spec"]["nodeName"]) == "mps4"


async def test_one_pod_more_than_the_free_slots_stays_pending_insufficient(
    setup: Setup, pods_ns: str
) -> None:
    sim, pools = setup.sim, setup.pools
    # 40Gi fits only the Exclusive GPU (MPS at 2 promises 40779 MiB < 40960): one slot.
    await create(sim, pods_ns, wh.memory_pod("first", memory="40Gi"))
    first = await wait_bound(sim, pods_ns, "first")
    assert first["spec"]["nodeName"] == pools.whole[0]
    await create(sim, pods_ns, wh.memory_pod("second", memory="40Gi"))
    pending = await eventually(
        lambda: read(sim, pods_ns, "second"),
        until=lambda p: scheduled(p).get("reason") == "Unschedulable",
        timeout=60,
        what="kube-scheduler to find no slot for the second 40Gi pod",
    )
    assert f"Insufficient {GPU}" in scheduled(pending)["message"]
    assert "nodeName" not in pending["spec"]


async def test_a_request_above_every_slot_is_refused_naming_the_largest(setup: Setup) -> None:
    sim = setup.sim
    status, body = await sim.client.post(
        f"/api/v1/namespaces/{setup.namespace}/pods", wh.memory_pod("huge", memory="100Gi")
    )
    assert status == 403, body
    message = body["message"]
    assert wh.WEBHOOK_NAME in message and "denied the request" in message
    assert "no GPU slot enforces 100Gi (102400 MiB)" in message
    assert f"{H100_MIB} MiB of nvidia.com/gpu (exclusive)" in message
    assert setup.pools.policies["whole"] in message
    status, body = await sim.client.post(
        f"/api/v1/namespaces/{setup.namespace}/pods", wh.memory_pod("typo", memory="20GB")
    )
    assert status == 400 and "is not a quantity" in body["message"], body
    both = wh.memory_pod("both", memory="1Gi")
    both["spec"]["containers"][0]["resources"] = {"limits": {GPU: "1"}}
    status, body = await sim.client.post(f"/api/v1/namespaces/{setup.namespace}/pods", both)
    # (the API server has made the limit a request too before any webhook sees the pod)
    assert status == 400 and "already requests nvidia.com/gpu" in body["message"], body
    missing = wh.memory_pod("missing", memory="1Gi", gpu_container="cuda")
    status, body = await sim.client.post(f"/api/v1/namespaces/{setup.namespace}/pods", missing)
    assert status == 400 and "'cuda', which the pod does not have" in body["message"], body
    # The operator counts what it answered: four refusals, nothing mutated.
    metrics = await setup.operator.metrics()
    assert metrics["gpushare_webhook_admissions_total{outcome=refused}"] == 4
    assert metrics["gpushare_webhook_admissions_total{outcome=mutated}"] == 0
    assert metrics["gpushare_webhook_admission_seconds_count"] >= 4


async def test_with_gpushare_stopped_labelled_pods_are_refused_and_others_admitted(
    setup: Setup,
) -> None:
    sim, namespace = setup.sim, setup.namespace
    assert setup.operator.stop() == 0
    status, body = await sim.client.post(
        f"/api/v1/namespaces/{namespace}/pods", wh.memory_pod("refused", memory="1Gi")
    )
    assert status == 500, body
    assert f'failed calling webhook "{wh.WEBHOOK_NAME}"' in body["message"], body
    plain = wh.memory_pod("plain", memory="1Gi")
    del plain["metadata"]["labels"][wh.REQUEST_LABEL]
    status, body = await sim.client.post(f"/api/v1/namespaces/{namespace}/pods", plain)
    assert status == 201, body
    assert not body["spec"]["containers"][0].get("resources")  # nobody touched it
    assert "affinity" not in body["spec"]


def slot_applies(
    plane: ControlPlane, node: str, *, since: float
) -> list[tuple[float, dict[str, str]]]:
    """(when, labels) of each of the operator's label applies to ``node`` (from the audit log)."""
    found = []
    for event in plane.audit_events():
        ref = event["objectRef"]
        if event["user"]["username"] != h.OPERATOR_USER or ref.get("resource") != "nodes":
            continue
        body = event.get("requestObject")
        if ref.get("name") != node or not isinstance(body, dict) or body.get("kind") != "Node":
            continue
        if rolloutaudit.moment(event) >= since and 200 <= event["responseStatus"]["code"] < 300:
            labels = (body.get("metadata") or {}).get("labels") or {}
            found.append((rolloutaudit.moment(event), dict(labels)))
    return sorted(found, key=lambda item: item[0])


async def test_an_mps_pool_from_4_to_8_replicas_is_relabelled_only_once_verified(
    crds_installed: None,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
    control_plane: ControlPlane,
) -> None:
    pool = h.unique("mps")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=1)
    await h.add_policy(sim, policies, h.policy(pool, pool=pool, strategy="MPS"))
    port = free_port()
    await wh.install(sim, webhook_flags.configuration, port=port)
    operator = await start_webhook_operator(
        start_operator, sim, namespace, webhook_flags, port=port
    )
    await wait_slot_memory(sim, node, "20389")
    since = time.time()
    await h.patch_policy(sim.client, pool, {"replicas": 8})
    await wait_slot_memory(sim, node, "10194")  # floor(81559 / 8)
    await wh.wait_offered(operator, {(pool, 10194): 1})

    applies = slot_applies(control_plane, node, since=since)
    changed, relabelled = applies[0], applies[-1]
    # The config change takes the old promise away in the same apply ...
    assert changed[1][h.CONFIG_LABEL] != "" and wh.SLOT_MEMORY not in changed[1], applies
    assert not any(k.startswith(rolloutaudit.SLOT_PREFIX) for k in changed[1]), applies
    # ... nothing in between promises anything, and the new one comes only after the node's
    # own agents showed 8 replicas (GFD's label write: allocatable was written before it).
    assert all(wh.SLOT_MEMORY not in labels for _, labels in applies[1:-1]), applies
    assert relabelled[1][wh.SLOT_MEMORY] == "10194"
    assert relabelled[1][h.CONFIG_LABEL] == changed[1][h.CONFIG_LABEL]
    confirmed = rolloutaudit.gfd_writes(control_plane, [node], replicas=8, since=since)[node]
    assert min(confirmed) < relabelled[0]

    # New pods follow the new size: 10000 MiB fits a 10194 MiB slot, 20Gi fits none now.
    await create(sim, pods_ns, wh.memory_pod("fits", memory="10000Mi"))
    fits = await wait_bound(sim, pods_ns, "fits")
    assert fits["spec"]["nodeName"] == node
    assert {"name": wh.MPS_LIMIT_ENV, "value": "0=10000M"} in fits["spec"]["containers"][0]["env"]
    status, body = await sim.client.post(
        f"/api/v1/namespaces/{pods_ns}/pods", wh.memory_pod("old-size", memory="20Gi")
    )
    assert status == 403 and "the largest is 10194 MiB of nvidia.com/gpu (mps)" in body["message"]


async def test_a_mig_slice_is_a_slot_class_of_its_own_resource(
    crds_installed: None,
    sim: GpuClusterSimulator,
    namespace: str,
    pods_ns: str,
    policies: list[str],
    start_operator: OperatorFactory,
    webhook_flags: wh.WebhookFlags,
) -> None:
    """A MIG pool (mixed, 2g.20gb: three per H100) promises the slice's memory from NVIDIA's
    tables, as its own resource; a time-sliced MIG pool promises nothing."""
    pool, shared = h.unique("mig"), h.unique("migts")
    [node] = await sim.create_gpu_nodes(
        pool=pool, count=1, product="NVIDIA-H100-80GB-HBM3", gpus=1, mig_preset=False
    )
    [sliced] = await sim.create_gpu_nodes(
        pool=shared, count=1, product="NVIDIA-H100-80GB-HBM3", gpus=1, mig_preset=False
    )
    for name, replicas in ((pool, None), (shared, 2)):
        mig: dict[str, Any] = {"profile": "2g.20gb", "migStrategy": "mixed"}
        if replicas:
            mig["replicas"] = replicas
        body = h.policy(name, pool=name, strategy="MIG", mig=mig)
        del body["spec"]["replicas"]
        await h.add_policy(sim, policies, body)
    port = free_port()
    await wh.install(sim, webhook_flags.configuration, port=port)
    operator = await start_webhook_operator(
        start_operator, sim, namespace, webhook_flags, port=port
    )
    await wait_slot_memory(sim, node, "20480")  # go-nvml's 2g.20gb on the H100
    await wh.wait_offered(operator, {(pool, 20480): 1})
    assert await slot_labels(sim, node) == {
        wh.SLOT_MEMORY: "20480",
        wh.SLOT_ISOLATION: "mig",
        wh.SLOT_RESOURCE: "nvidia.com_mig-2g.20gb",
    }
    await wait_slot_memory(sim, sliced, None)
    assert (await slot_labels(sim, sliced))[wh.SLOT_ISOLATION] == "none"

    await create(sim, pods_ns, wh.memory_pod("slice", memory="20Gi"))
    pod = await wait_bound(sim, pods_ns, "slice")
    assert pod["spec"]["nodeName"] == node
    resource = "nvidia.com/mig-2g.20gb"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {resource: "1"}
    status, body = await sim.client.post(
        f"/api/v1/namespaces/{pods_ns}/pods", wh.memory_pod("too-big", memory="21Gi")
    )
    assert status == 403 and "20480 MiB of nvidia.com/mig-2g.20gb (mig)" in body["message"]


ZONE = "topology.kubernetes.io/zone"


async def test_an_empty_node_selector_term_does_not_widen_where_the_pod_may_run(
    setup: Setup, pods_ns: str
) -> None:
    """``[{zone In [a]}, {}]``: the empty term matches no node, so only zone a may hold the
    pod.  ANDed with our expressions it would match every node of a big enough slot, and
    kube-scheduler would prefer the smaller MPS slots outside zone a."""
    sim, pools = setup.sim, setup.pools
    zone_a = pools.whole[0]  # a bigger slot than the request needs: never preferred
    for node in [*pools.mps4, *pools.mps2, *pools.whole]:
        zone = "a" if node == zone_a else "b"
        status, body = await sim.client.patch(
            f"/api/v1/nodes/{node}", {"metadata": {"labels": {ZONE: zone}}}
        )
        assert status == 200, body
    in_a = {"key": ZONE, "operator": "In", "values": ["a"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [in_a]}, {}]
            }
        }
    }
    await create(sim, pods_ns, wh.memory_pod("zoned", memory="10Gi", affinity=affinity))
    zoned = await wait_bound(sim, pods_ns, "zoned")
    assert zoned["spec"]["nodeName"] == zone_a
    terms = zoned["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0] == in_a and len(terms[0]["matchExpressions"]) == 3
    assert terms[1] == {}  # still empty: still matches no node
    # Empty terms alone match no node: the pod stays Pending, as without gpushare (made into
    # ours alone, it would run on any MPS node).
    nowhere = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}
        }
    }
    await create(sim, pods_ns, wh.memory_pod("nowhere", memory="1Gi", affinity=nowhere))
    pending = await eventually(
        lambda: read(sim, pods_ns, "nowhere"),
        until=lambda p: scheduled(p).get("reason") == "Unschedulable",
        timeout=60,
        what="kube-scheduler to find no node for empty terms alone",
    )
    assert "affinity" in scheduled(pending)["message"], scheduled(pending)
    assert "nodeName" not in pending["spec"]


async def test_a_pods_own_mps_limit_above_its_slot_is_refused_and_one_within_kept(
    setup: Setup, pods_ns: str
) -> None:
    """NVIDIA's MPS obeys a client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT only below its daemon's
    default (the slot); above it the value would mean more than the label asks for on a bigger
    slot and nothing on the chosen one: refused, saying what would fit.  Within it, kept."""
    sim = setup.sim
    above = wh.memory_pod("above", memory="10Gi")
    above["spec"]["containers"][0]["env"] = [{"name": wh.MPS_LIMIT_ENV, "value": "0=30G"}]
    status, body = await sim.client.post(f"/api/v1/namespaces/{pods_ns}/pods", above)
    assert status == 400, body
    message = body["message"]
    assert wh.WEBHOOK_NAME in message and "denied the request" in message
    assert "30720 MiB on device 0 is more than the 20389 MiB of nvidia.com/gpu (mps)" in message
    assert f"raise the {wh.REQUEST_LABEL} label" in message

    within = wh.memory_pod("within", memory="10Gi")
    within["spec"]["containers"][0]["env"] = [{"name": wh.MPS_LIMIT_ENV, "value": "0=8G"}]
    client = sim.client
    async with client.session.post(
        f"{client.server}/api/v1/namespaces/{pods_ns}/pods", json=within
    ) as response:
        assert response.status == 201, await response.text()
        created = await response.json()
        warnings = response.headers.getall("Warning", [])
    [container] = created["spec"]["containers"]
    assert container["env"] == [{"name": wh.MPS_LIMIT_ENV, "value": "0=8G"}]  # theirs, alone
    assert container["resources"]["limits"] == {GPU: "1"}
    assert any(wh.MPS_LIMIT_ENV in w and "kept as it is" in w for w in warnings), warnings
    metrics = await setup.operator.metrics()
    assert metrics["gpushare_webhook_admissions_total{outcome=refused}"] == 1
    assert metrics["gpushare_webhook_admissions_total{outcome=mutated}"] == 1


async def test_a_labelled_pod_whose_review_is_over_1_mib_is_admitted(
    setup: Setup, pods_ns: str
) -> None:
    """aiohttp refuses a body over 1 MiB by default; the API server accepts a pod of up to
    3 MiB (and etcd stores 1.5 MiB), and the review it sends carries the whole pod.  Big
    annotations (at most 256 KiB, the API server's limit) and big env values make one of about
    1.3 MiB: admitted and mutated like any other."""
    big = wh.memory_pod("big", memory="10Gi")
    big["metadata"]["annotations"]["example.com/notes"] = "n" * (250 * 1024)
    big["spec"]["containers"][0]["env"] = [
        {"name": f"BLOB_{i}", "value": str(i) * (256 * 1024)} for i in range(4)
    ]
    sent = orjson.dumps(big)
    assert len(sent) > 1024 * 1024 + 200 * 1024, len(sent)  # the review holds all of it
    client = setup.sim.client
    async with client.session.post(
        f"{client.server}/api/v1/namespaces/{pods_ns}/pods",
        data=io.BytesIO(sent),  # aiohttp warns of a large body given as bytes
        headers={"Content-Type": "application/json"},
    ) as response:
        assert response.status == 201, (await response.text())[:2000]
        body = await response.json()
    [container] = body["spec"]["containers"]
    assert container["resources"]["limits"] == {GPU: "1"}
    assert {"name": wh.MPS_LIMIT_ENV, "value": "0=10240M"} in container["env"]
    placed = await wait_bound(setup.sim, pods_ns, "big")
    assert setup.pools.kind_of(placed["spec"]["nodeName"]) == "mps4"
    metrics = await setup.operator.metrics()
    assert metrics["gpushare_webhook_admissions_total{outcome=mutated}"] == 1

"""MIG under backend DRA in the pure core and the planner: a DeviceClass per profile, a node
confirmed by its slice's MIG devices, claims counted per profile (no API)."""

from __future__ import annotations

from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.dra import draclasses
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    MIG_CONFIG_LABEL,
    POLICY_LABEL,
    project_node,
)
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy
from gpushare_operator.reconcile import classplan
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing import draplugin
from gpushare_testing.builders import Clock, node, policy
from gpushare_testing.migtables import load_tables
from gpushare_testing.writepath import PlanningLoop

H100 = "NVIDIA-H100-80GB-HBM3"
ON = {dra.DEPLOY_DEVICE_PLUGIN: "false", dra.DRA_DRIVER_LABEL: "true"}
MIXED = {"devices": {"3g.40gb": 1, "1g.10gb": 4}}


def compiled(name: str = "m", **mig: Any) -> CompiledPolicy:
    spec = {
        "nodeSelector": {"matchLabels": {"pool": "a"}},
        "strategy": "MIG",
        "mig": mig or MIXED,
        "backend": "DRA",
    }
    found = compile_policy(name=name, uid=f"uid-{name}", generation=1, spec=spec)
    assert found.error is None, found.error
    return found


def on_dra_mig(policy: CompiledPolicy, **labels: str) -> dict[str, Any]:
    assert policy.mig is not None
    return node(
        "n1",
        count="2",
        allocatable="0",
        **{
            "nvidia.com/gpu.product": H100,
            CONFIG_LABEL: str(policy.config_key),
            POLICY_LABEL: policy.name,
            MIG_CONFIG_LABEL: policy.mig.names[H100],
            "nvidia.com/mig.config.state": "success",
            **ON,
            **labels,
        },
    )


def slice_of(layout: list[list[str] | None], name: str = "n1") -> dict[str, Any]:
    """The slice the simulated plugin publishes for ``layout`` (profiles per GPU)."""
    model = load_tables()[H100]
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.memory": "81559"}
    body = draplugin.slice_body(
        node=name, node_uid="u", gpus=len(layout), labels=labels, mig=layout, model=model
    )
    body["metadata"]["name"] = f"{name}-slice"
    return body


def devices_of(body: dict[str, Any]) -> tuple[dra.Device, ...]:
    record = dra.slice_record(body)
    assert record is not None
    return dra.node_devices([record])


MIG_LAYOUT = [["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]] * 2


def test_nvidias_mig_device_names_and_attributes_are_read_back() -> None:
    devices = devices_of(slice_of(MIG_LAYOUT))
    # gpu-<minor>-mig-<profile without dots>-<giProfileId>-<placement start>: the 3g.40gb
    # (profile id 2) at slice 4, as the 1g.10gb (id 0) cannot take slice 7 on an H100.
    assert [d.name for d in devices[:5]] == [
        "gpu-0-mig-3g40gb-2-4",
        "gpu-0-mig-1g10gb-0-0",
        "gpu-0-mig-1g10gb-0-1",
        "gpu-0-mig-1g10gb-0-2",
        "gpu-0-mig-1g10gb-0-3",
    ]
    assert {(d.type, d.profile) for d in devices} == {("mig", "3g.40gb"), ("mig", "1g.10gb")}
    assert not any(d.name == "gpu-0" for d in devices), "a GPU in MIG mode is not listed whole"
    one = next(d for d in devices if d.profile == "1g.10gb")
    assert one.memory_mib == load_tables()[H100].profiles["1g.10gb"].memory_mib


def test_one_class_per_profile_selects_that_profiles_mig_devices() -> None:
    cache = ClusterCache()
    cache.upsert_policy(policy("m", replicas=None, strategy="MIG", mig=MIXED, backend="DRA"))
    wanted = classplan.wanted(cache)
    assert sorted(wanted) == ["mig-1g-10gb.gpushare.dev", "mig-3g-40gb.gpushare.dev"]
    small = wanted["mig-1g-10gb.gpushare.dev"]["spec"]
    assert small["extendedResourceName"] == "nvidia.com/mig-1g.10gb"
    expression = small["selectors"][0]["cel"]["expression"]
    assert "type == 'mig'" in expression and "profile == '1g.10gb'" in expression
    # Until both are there, the policy's nodes wait, and the condition names what is missing.
    cache.dra.upsert_class(wanted["mig-1g-10gb.gpushare.dev"])
    ready = cache.dra.readiness(*cache.policies["m"].resources)
    assert not ready.class_ready
    cond = draclasses.class_condition(cache.policies["m"].resources, ready)
    assert cond.reason == "DeviceClassNotWritten" and "mig-3g-40gb.gpushare.dev" in cond.message
    cache.dra.upsert_class(wanted["mig-3g-40gb.gpushare.dev"])
    assert cache.dra.readiness(*cache.policies["m"].resources).class_ready


def decide(policy: CompiledPolicy, body: dict[str, Any], devices: tuple[dra.Device, ...]) -> Any:
    return nodephases.decide(
        record=project_node(body),
        policy=policy,
        key=nodephases.KeyReadiness(present=True),
        mig_key=nodephases.KeyReadiness(present=True),
        applied_since=0.0,
        now=1.0,
        mismatch_timeout=60,
        backend=dra.Readiness(class_ready=True, devices=devices),
    )


def test_a_dra_mig_node_is_verified_only_by_a_slice_of_the_layouts_devices() -> None:
    policy = compiled()
    done = decide(policy, on_dra_mig(policy), devices_of(slice_of(MIG_LAYOUT)))
    assert done.phase is NodePhase.VERIFIED, done.message
    assert "4 x nvidia.com/mig-1g.10gb" in done.message
    # The plugin started before the layout changed: its slice still lists whole GPUs.
    stale = decide(policy, on_dra_mig(policy), devices_of(slice_of([None, None])))
    assert stale.phase is NodePhase.APPLIED
    problems = dra.mig_disagreements(
        project_node(on_dra_mig(policy)),
        devices_of(slice_of([None, None])),
        per_gpu=policy.mig.slots_per_gpu(H100) if policy.mig else {},
    )
    assert "lists 0 1g.10gb MIG devices, expected 8" in "; ".join(problems)
    assert "lists 2 full GPUs, expected none (MIG)" in "; ".join(problems)
    # Another layout's devices are not this one's.
    other = devices_of(slice_of([["1g.10gb"] * 7] * 2))
    assert decide(policy, on_dra_mig(policy), other).phase is NodePhase.APPLIED
    # While the MIG manager works, the node waits without a deadline.
    busy = decide(
        policy,
        on_dra_mig(policy, **{"nvidia.com/mig.config.state": "pending"}),
        devices_of(slice_of(MIG_LAYOUT)),
    )
    assert busy.phase is NodePhase.APPLIED
    # The device plugin still serving a profile is not confirmed, whatever the slice says.
    body = on_dra_mig(policy)
    body["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "8"
    assert decide(policy, body, devices_of(slice_of(MIG_LAYOUT))).phase is NodePhase.APPLIED


def claim(uid: str, *devices: str) -> dict[str, Any]:
    results = [{"request": "r", "driver": dra.DRIVER, "pool": "n1", "device": d} for d in devices]
    return {
        "metadata": {"uid": uid},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": uid, "uid": f"pod-{uid}"}],
        },
    }


def test_a_dra_mig_nodes_claims_are_counted_per_profile() -> None:
    cache = ClusterCache(clock=Clock())
    cache.upsert_policy(policy("m", replicas=None, strategy="MIG", mig=MIXED, backend="DRA"))
    loop = PlanningLoop(
        Reconciler(
            cache,
            timings=Timings(propagation_delay=0, key_grace_period=300, mismatch_timeout=60),
            max_unavailable="10%",
        )
    )
    compiled_m = cache.policies["m"]
    cache.upsert_node(on_dra_mig(compiled_m))
    body = slice_of(MIG_LAYOUT)
    cache.dra.upsert_slice(body)
    names = [d.name for d in devices_of(body)]
    big = next(n for n in names if "3g40gb" in n)
    small = [n for n in names if "1g10gb" in n]
    cache.dra.upsert_claim(claim("a", big))
    cache.dra.upsert_claim(claim("b", small[0]))
    cache.dra.upsert_claim(claim("c", small[1]))
    tally = loop.reconciler.planner.tally(compiled_m)
    assert tally.allocated == 3
    plan = loop.plan_node("n1")
    assert plan.status is not None
    by_resource = plan.status["slots"]["byResource"]
    assert by_resource["nvidia.com/mig-3g.40gb"] == {"capacity": 2, "allocated": 1}
    assert by_resource["nvidia.com/mig-1g.10gb"] == {"capacity": 8, "allocated": 2}
    assert plan.status["pods"] == 3

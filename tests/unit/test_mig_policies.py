"""Strategy MIG in the pure core and the planner: layouts per GPU model, what a node must show,
what is written, and when a change waits (no API: the cache is fed as the informers feed it)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import ConfigMapSink
from gpushare_operator.core import migphases, policystatus
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.labelling import selectors
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    MIG_CONFIG_LABEL,
    POLICY_LABEL,
    project_node,
)
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy
from gpushare_operator.core.rollout import rollouts
from gpushare_operator.core.workqueue import CONFIG, DEVICE_CLASSES, MIG_CONFIG, MIG_CONFIG_KEY
from gpushare_operator.reconcile.planner import Timings
from gpushare_operator.reconcile.reconciler import Reconciler
from gpushare_testing.builders import Clock, config_texts, node, pod, policy, sync_config
from gpushare_testing.writepath import PlanningLoop, drain

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200-141GB-HBM3e"
A100 = "NVIDIA-A100-SXM4-40GB"
UNIFORM = {"strategy": "MIG", "mig": {"profile": "1g.10gb"}}


def compiled(name: str = "m", **spec: Any) -> CompiledPolicy:
    body = {"nodeSelector": {"matchLabels": {"pool": "a"}}, **UNIFORM, **spec}
    compiled = compile_policy(name=name, uid=f"uid-{name}", generation=1, spec=body)
    assert compiled.error is None, compiled.error
    return compiled


def h100(name: str = "n1", **labels: str) -> dict[str, Any]:
    return node(name, count="2", **{"nvidia.com/gpu.product": H100, **labels})


def test_a_uniform_profile_is_as_many_as_fit_on_each_model_that_has_it() -> None:
    mig = compiled().mig
    assert mig is not None
    assert mig.layouts[H100].as_dict() == {"1g.10gb": 7}
    assert mig.layouts[A100].as_dict() == {"1g.10gb": 4}  # two memory slices each, of 8
    assert mig.slots_per_gpu(H100) == {"nvidia.com/gpu": 7}
    assert "has no MIG profile 1g.10gb" in mig.refusals[H200]
    # One name per distinct layout, content-hashed; the ConfigMap holds each once.
    assert set(mig.entries) == set(mig.names.values())


def test_an_explicit_layout_is_refused_where_it_does_not_fit() -> None:
    mig = compiled(mig={"devices": {"1g.20gb": 4, "1g.10gb": 1}}).mig
    assert mig is not None
    assert H100 not in mig.layouts  # NVIDIA's guide: 9 memory slices of 8
    assert "memory slices" in mig.refusals[H100]


def test_single_strategy_labels_read_back_the_physical_gpus() -> None:
    """GFD under single counts MIG devices and names the device; the record does not."""
    record = project_node(
        h100(
            **{
                "nvidia.com/gpu.count": "14",
                "nvidia.com/gpu.product": f"{H100}-MIG-1g.10gb",
                "nvidia.com/gpu.memory": "9856",
                "nvidia.com/mig.strategy": "single",
            }
        )
    )
    assert record.gpus == 2
    assert record.product == H100
    assert record.memory_mib == 81920  # the whole GPU's, from NVIDIA's tables
    rewritten = {"nvidia.com/gpu.count": "13", "nvidia.com/gpu.product": f"{H100}-MIG-1g.10gb"}
    broken = project_node(h100(**rewritten))
    assert broken.gpus is None  # not a whole number of GPUs: unknown, never guessed


def test_a_product_selector_keeps_matching_the_rewritten_product() -> None:
    selector = selectors.compile_selector({"matchLabels": {"nvidia.com/gpu.product": H100}})
    for shown in (H100, f"{H100}-SHARED", f"{H100}-MIG-1g.10gb", f"{H100}-MIG-3g.40gb-SHARED"):
        assert selector.matches({"nvidia.com/gpu.product": shown}), shown
    assert not selector.matches({"nvidia.com/gpu.product": f"{H200}-MIG-1g.18gb"})


def test_a_node_gets_its_models_layout_name_with_our_labels() -> None:
    policy = compiled()
    record = project_node(h100())
    decision = nodephases.decide(
        record=record,
        policy=policy,
        key=nodephases.KeyReadiness(present=True),
        mig_key=nodephases.KeyReadiness(present=True),
        applied_since=None,
        now=0.0,
        mismatch_timeout=60,
    )
    assert decision.labels == {
        CONFIG_LABEL: policy.config_key,
        POLICY_LABEL: "m",
        MIG_CONFIG_LABEL: policy.mig.names[H100] if policy.mig else None,
    }
    missing = nodephases.decide(
        record=record,
        policy=policy,
        key=nodephases.KeyReadiness(present=True),
        mig_key=nodephases.KeyReadiness(present=False),
        applied_since=None,
        now=0.0,
        mismatch_timeout=60,
    )
    assert missing.labels is None and missing.reason == "ConfigNotWritten"


def unsupported_reason(labels: dict[str, str], owners: tuple[str, ...] = ()) -> str | None:
    record = project_node(node("n1", **labels))
    if owners:
        record = dataclasses.replace(record, mig_config_owners=owners)
    problem = migphases.unsupported(record, compiled())
    return None if problem is None else problem[0]


def test_what_makes_a_node_unsupported_for_a_mig_policy() -> None:
    assert unsupported_reason({"nvidia.com/gpu.product": H100}) is None
    assert unsupported_reason({"nvidia.com/gpu.product": H200}) == "MIGLayoutDoesNotFit"
    assert unsupported_reason({"nvidia.com/gpu.product": "Tesla-T4"}) == "MIGModelUnknown"
    assert unsupported_reason({}) == "MIGModelUnknown"
    capable = {"nvidia.com/gpu.product": H100, "nvidia.com/mig.capable": "false"}
    assert unsupported_reason(capable) == "MIGNotCapable"
    preset = {"nvidia.com/gpu.product": H100, MIG_CONFIG_LABEL: "all-disabled"}
    assert unsupported_reason(preset, owners=("gpu-operator",)) == "MIGConfigOwnedByOther"


def on_mig(policy: CompiledPolicy, **labels: str) -> dict[str, Any]:
    assert policy.mig is not None
    return h100(
        **{
            CONFIG_LABEL: str(policy.config_key),
            POLICY_LABEL: policy.name,
            MIG_CONFIG_LABEL: policy.mig.names[H100],
            **labels,
        }
    )


def applied(policy: CompiledPolicy, body: dict[str, Any], *, now: float = 0.0) -> Any:
    return nodephases.decide(
        record=project_node(body),
        policy=policy,
        key=nodephases.KeyReadiness(present=True),
        mig_key=nodephases.KeyReadiness(present=True),
        applied_since=0.0,
        now=now,
        mismatch_timeout=60,
    )


def test_the_mig_managers_states_decide_the_phase() -> None:
    policy = compiled()
    broken = on_mig(policy, **{"nvidia.com/mig.config.state": "failed"})
    # Right after our label, failed may still be the last layout's: not yet a failure.
    assert applied(policy, broken, now=1.0).phase is NodePhase.APPLIED
    failed = applied(policy, broken, now=migphases.STALE_STATE)
    assert (failed.phase, failed.reason) == (NodePhase.MISMATCH, "MIGConfigFailed")
    working = on_mig(policy, **{"nvidia.com/mig.config.state": "pending"})
    pending = applied(policy, working, now=1e6)
    assert pending.phase is NodePhase.APPLIED  # long past the timeout: still no Mismatch
    paused = on_mig(
        policy,
        **{
            "nvidia.com/mig.config.state": "success",
            "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change",
        },
    )
    assert applied(policy, paused, now=1e6).phase is NodePhase.APPLIED
    done = on_mig(
        policy,
        allocatable="14",
        **{
            "nvidia.com/mig.config.state": "success",
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/gpu.count": "14",
            "nvidia.com/gpu.product": f"{H100}-MIG-1g.10gb",
        },
    )
    assert applied(policy, done).phase is NodePhase.VERIFIED
    short = dict(done, status={"allocatable": {"nvidia.com/gpu": "7"}})
    assert applied(policy, short).phase is NodePhase.APPLIED  # the plugin not back yet


def test_a_node_leaving_mig_is_disabled_first_then_released() -> None:
    policy = compiled()
    body = on_mig(policy, **{"nvidia.com/mig.config.state": "success"})
    first = nodephases.decide(
        record=project_node(body),
        policy=None,
        key=nodephases.KeyReadiness(present=False),
        applied_since=None,
        now=0.0,
        mismatch_timeout=60,
    )
    assert first.labels == {
        CONFIG_LABEL: policy.config_key,
        POLICY_LABEL: "m",
        MIG_CONFIG_LABEL: migconfigs.ALL_DISABLED,
    }
    assert first.released_from == "m"
    body["metadata"]["labels"][MIG_CONFIG_LABEL] = migconfigs.ALL_DISABLED
    body["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"
    waiting = nodephases.decide(
        record=project_node(body),
        policy=None,
        key=nodephases.KeyReadiness(present=False),
        applied_since=None,
        now=0.0,
        mismatch_timeout=60,
    )
    assert (waiting.labels, waiting.reason) == (None, "DisablingMIG")
    body["metadata"]["labels"]["nvidia.com/mig.config.state"] = "success"
    last = nodephases.decide(
        record=project_node(body),
        policy=None,
        key=nodephases.KeyReadiness(present=False),
        applied_since=None,
        now=0.0,
        mismatch_timeout=60,
    )
    assert last.labels == {CONFIG_LABEL: None, POLICY_LABEL: None}  # all-disabled goes with them


def loop(clock: Clock) -> PlanningLoop:
    cache = ClusterCache(clock=clock)
    timings = Timings(propagation_delay=0.0, key_grace_period=60.0, mismatch_timeout=60.0)
    return PlanningLoop(Reconciler(cache, timings=timings, max_unavailable="100%"))


def mig_policy(name: str, **spec: Any) -> dict[str, Any]:
    body = policy(name, **{**UNIFORM, **spec})
    del body["spec"]["replicas"]
    return body


def sync_mig(cache: ClusterCache, data: dict[str, str] | None) -> None:
    sink = ConfigMapSink(cache, mig=True)
    sink.begin_relist()
    if data is not None:
        sink.relist_item({"data": data})
    sink.end_relist()


def test_the_mig_configmap_is_written_only_for_mig_policies_and_keeps_names_in_use() -> None:
    clock = Clock()
    planner = loop(clock)
    cache = planner.cache
    sync_mig(cache, None)
    cache.upsert_policy(policy("ts"))
    assert planner.reconciler.plan(("config", "mig")).data is None  # no MIG: no ConfigMap
    cache.upsert_policy(mig_policy("m"))
    plan = planner.reconciler.plan(("config", "mig"))
    assert plan.data is not None
    written = migconfigs.parse_text(plan.data[migconfigs.CONFIGMAP_KEY])
    mig = cache.policies["m"].mig
    assert written is not None and mig is not None
    assert set(written) == {migconfigs.ALL_DISABLED, *mig.entries}


def test_a_foreign_mig_file_is_never_overwritten() -> None:
    planner = loop(Clock())
    cache = planner.cache
    sync_mig(cache, {migconfigs.CONFIGMAP_KEY: "version: v1\nmig-configs:\n  custom: []\n"})
    cache.upsert_policy(mig_policy("m"))
    plan = planner.reconciler.plan(("config", "mig"))
    assert plan.data is None
    assert "not a mig-parted config gpushare renders" in plan.foreign_keys["config.yaml"]


def test_a_gpu_pod_holds_a_mig_change_under_our_taint() -> None:
    clock = Clock()
    planner = loop(clock)
    cache = planner.cache
    cache.upsert_policy(mig_policy("m", rollout={"canary": 0}))
    sync_config(cache, config_texts(cache), initial=True)
    mig = cache.policies["m"].mig
    assert mig is not None
    sync_mig(cache, {migconfigs.CONFIGMAP_KEY: migconfigs.render_text(mig.entries)})
    cache.upsert_node(h100())
    cache.upsert_pod(pod("p1", "n1", 1))
    held = planner.plan_admitted("n1")
    assert held.labels is None
    assert held.taint is not None  # tainted first, while it waits
    assert held.facts.decision is not None and held.facts.decision.reason == "WaitingForPods"
    cache.delete_pod("p1")
    tainted = h100()
    tainted["spec"] = {"taints": [dict(rollouts.TAINT)]}
    cache.upsert_node(tainted)  # our taint, as the informer delivers it
    go = planner.plan_admitted("n1")
    assert go.labels is not None and go.labels[MIG_CONFIG_LABEL] == mig.names[H100]
    assert go.idle_check  # only if the node's pods, listed now, are none


def test_a_new_leader_keeps_a_waiting_mig_change_admitted_from_its_node_state() -> None:
    """The wait's admission is in the GPUNodeState: a new leader (empty memory) keeps the node
    tainted and charged, and admits no idle node in its place under maxUnavailable 1."""
    body = mig_policy("m", rollout={"canary": 0, "maxUnavailable": 1})
    first = loop(Clock())
    first.cache.upsert_policy(body)
    sync_config(first.cache, config_texts(first.cache), initial=True)
    mig = first.cache.policies["m"].mig
    assert mig is not None
    text = {migconfigs.CONFIGMAP_KEY: migconfigs.render_text(mig.entries)}
    sync_mig(first.cache, text)
    first.cache.upsert_node(h100("n1"))
    first.cache.upsert_pod(pod("p1", "n1", 1))
    held = first.plan_admitted("n1")
    assert held.taint is not None and held.status is not None
    assert held.status["idleWait"]["policy"] == "m"
    assert held.status["idleWait"]["target"] == first.cache.policies["m"].config_key

    new = loop(Clock())  # the next leader: the cluster as the first one left it
    cache = new.cache
    cache.upsert_policy(body)
    sync_config(cache, config_texts(cache), initial=True)
    sync_mig(cache, text)
    tainted = h100("n1")
    tainted["spec"] = {"taints": [dict(rollouts.TAINT)]}
    cache.upsert_node(tainted)
    cache.upsert_node(h100("n2"))  # idle: it would go first, fewest slots in use
    cache.upsert_pod(pod("p1", "n1", 1))
    cache.upsert_node_state({"metadata": {"name": "n1"}, "status": held.status})
    kept = new.plan_admitted("n1")
    assert kept.taint is None  # neither lifted nor added again
    assert kept.facts.decision is not None and kept.facts.decision.reason == "WaitingForPods"
    other = new.plan_node("n2")
    assert other.labels is None and other.taint is None
    assert other.facts.decision is not None
    assert other.facts.decision.reason == "RolloutWaiting"


def test_evict_takes_every_gpu_pod_before_a_mig_change() -> None:
    planner = loop(Clock())
    cache = planner.cache
    cache.upsert_policy(mig_policy("m", rollout={"canary": 0, "podPolicy": "Evict"}))
    sync_config(cache, config_texts(cache), initial=True)
    mig = cache.policies["m"].mig
    assert mig is not None
    sync_mig(cache, {migconfigs.CONFIGMAP_KEY: migconfigs.render_text(mig.entries)})
    cache.upsert_node(h100())
    cache.upsert_pod(pod("p1", "n1", 1))  # one slot of fourteen: it would fit, but MIG needs idle
    cache.upsert_pod(pod("p2", "n1", 1))
    plan = planner.plan_admitted("n1")
    assert plan.labels is None and plan.taint is not None
    assert sorted(e.uid for e in plan.evictions) == ["p1", "p2"]


def test_the_last_layouts_success_is_not_taken_for_mig_disabled() -> None:
    """Our all-disabled label read back with the state the MIG manager left for the layout
    before: GFD still shows the MIG devices, so the release waits."""
    stale = project_node(
        h100(
            **{
                MIG_CONFIG_LABEL: migconfigs.ALL_DISABLED,
                "nvidia.com/mig.config.state": "success",
                "nvidia.com/gpu.product": f"{H100}-MIG-1g.10gb",
            }
        )
    )
    assert not migphases.disabled(stale)
    mixed = project_node(
        h100(
            **{
                MIG_CONFIG_LABEL: migconfigs.ALL_DISABLED,
                "nvidia.com/mig.config.state": "success",
                "nvidia.com/mig-1g.10gb.count": "14",
            }
        )
    )
    assert not migphases.disabled(mixed)
    done = project_node(
        h100(
            **{MIG_CONFIG_LABEL: migconfigs.ALL_DISABLED, "nvidia.com/mig.config.state": "success"}
        )
    )
    assert migphases.disabled(done)


def test_a_replicas_edit_of_a_mixed_layout_judges_each_resource_without_crashing() -> None:
    planner = loop(Clock())
    cache = planner.cache
    mixed = {"devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, "replicas": 2}
    cache.upsert_policy(mig_policy("m", mig=mixed, rollout={"canary": 0}))
    sync_config(cache, config_texts(cache), initial=True)
    mig = cache.policies["m"].mig
    assert mig is not None
    sync_mig(cache, {migconfigs.CONFIGMAP_KEY: migconfigs.render_text(mig.entries)})
    old = cache.policies["m"]
    cache.upsert_node(on_mig(old, **{"nvidia.com/mig.config.state": "success"}))
    for uid in ("p1", "p2", "p3"):  # 3 of the 4 slots of 2g.20gb (2 GPUs x 1 x 2 replicas)
        cache.upsert_pod(pod(uid, "n1", 1, resource="nvidia.com/mig-2g.20gb"))
    fewer = mig_policy("m", mig={"devices": mixed["devices"]}, rollout={"canary": 0}, generation=2)
    cache.upsert_policy(fewer)
    sync_config(cache, config_texts(cache), initial=False)
    plan = planner.plan_admitted("n1")  # the same layout: no MIG change, per-resource check
    assert plan.labels is None
    decision = plan.facts.decision
    assert decision is not None and "3 nvidia.com/mig-2g.20gb" in decision.message


def test_pods_on_a_mig_resource_are_kept_whatever_the_policies_advertise() -> None:
    cache = ClusterCache()
    cache.upsert_policy(policy("ts"))
    cache.upsert_pod(pod("p1", "n1", 1, resource="nvidia.com/mig-2g.20gb"))
    cache.delete_policy("ts")  # what is tracked is rebuilt from the policies left
    assert cache.usage.node_slots("n1") == {"nvidia.com/mig-2g.20gb": 1}


def test_disabling_mig_for_another_policy_is_under_that_policys_budget() -> None:
    """Four nodes on MIG policy m; a time-slicing policy t with maxUnavailable 1 wins them:
    one node at a time goes through all-disabled, charged to t (read from the labels)."""
    planner = loop(Clock())
    cache = planner.cache
    cache.upsert_policy(mig_policy("m"))
    old = cache.policies["m"]
    names = [f"n{i}" for i in range(4)]
    verified = {
        **on_mig(old)["metadata"]["labels"],
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.count": "14",
        "nvidia.com/gpu.product": f"{H100}-MIG-1g.10gb",
    }
    for name in names:
        cache.upsert_node(h100(name, allocatable="14", **verified))
    cache.upsert_policy(policy("t", priority=10, rollout={"maxUnavailable": 1, "canary": 0}))
    sync_config(cache, config_texts(cache), initial=True)
    plans = planner.plan_queued_nodes()
    planner.due()
    plans = [planner.plan_node(name) for name in names]
    # Admitted, n0 is tainted first; the other nodes are left as they are.
    assert [p.name for p in plans if p.taint is not None] == ["n0"]
    assert not any(p.labels for p in plans)
    taints = {"taints": [dict(rollouts.TAINT)]}
    cache.upsert_node(h100("n0", allocatable="14", **verified) | {"spec": taints})
    plans = [planner.plan_node(name) for name in names]
    disabling = [p.name for p in plans if p.labels and p.labels.get(MIG_CONFIG_LABEL)]
    assert disabling == ["n0"], [
        (p.name, p.facts.decision and p.facts.decision.reason) for p in plans
    ]
    # Written: n0 waits for the MIG manager, still down for t; the others still wait their turn.
    labels = {
        **verified,
        MIG_CONFIG_LABEL: "all-disabled",
        "nvidia.com/mig.config.state": "pending",
    }
    cache.upsert_node(h100("n0", allocatable="14", **labels) | {"spec": taints})
    planner.due()
    again = [planner.plan_node(name) for name in names]
    assert [p.name for p in again if p.labels] == []
    assert planner.book.unavailable_for(cache.nodes["n0"], planner.decide(cache.nodes["n0"])) == "t"


def mixed_mig_node(gone: CompiledPolicy) -> dict[str, Any]:
    """A node on the mixed layout of ``gone``, a MIG policy that is no more."""
    return on_mig(
        gone,
        **{
            "nvidia.com/mig.config.state": "success",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig-1g.10gb.count": "14",
        },
    )


def test_an_orphaned_node_no_usable_policy_takes_has_its_mig_layout_disabled_first() -> None:
    """Its policy deleted, the node is selected only by a MIG policy whose layout it cannot
    hold (Unsupported): our labels go, but MIG is disabled before they do."""
    gone = compiled("gone", mig={"profile": "1g.10gb", "migStrategy": "mixed"})
    planner = loop(Clock())
    cache = planner.cache
    refused = {"devices": {"1g.20gb": 4, "1g.10gb": 1}}  # 9 memory slices of 8 on an H100
    cache.upsert_policy(mig_policy("x", mig=refused))
    cache.upsert_node(mixed_mig_node(gone))
    first = planner.decide(cache.nodes["n1"])
    assert first.labels == {
        CONFIG_LABEL: gone.config_key,
        POLICY_LABEL: "gone",
        MIG_CONFIG_LABEL: migconfigs.ALL_DISABLED,
    }
    assert first.reason == migphases.DISABLING
    off = {
        **mixed_mig_node(gone)["metadata"]["labels"],
        MIG_CONFIG_LABEL: migconfigs.ALL_DISABLED,
        "nvidia.com/mig-1g.10gb.count": "0",
    }
    cache.upsert_node(h100(**off))
    last = planner.decide(cache.nodes["n1"])
    assert last.phase is NodePhase.UNSUPPORTED
    assert last.labels == {CONFIG_LABEL: None, POLICY_LABEL: None}


def test_mps_takes_a_node_whose_mixed_strategy_is_our_own_mig_layout() -> None:
    """GFD's mig.strategy=mixed comes from our MIG policy's config: MPS disables MIG first
    instead of being Unsupported there for good."""
    gone = compiled("gone", mig={"profile": "1g.10gb", "migStrategy": "mixed"})
    planner = loop(Clock())
    cache = planner.cache
    cache.upsert_policy(policy("p", strategy="MPS"))
    sync_config(cache, config_texts(cache), initial=True)
    cache.upsert_node(mixed_mig_node(gone))
    decision = planner.decide(cache.nodes["n1"])
    assert decision.phase is not NodePhase.UNSUPPORTED
    assert decision.labels is not None
    assert decision.labels[MIG_CONFIG_LABEL] == migconfigs.ALL_DISABLED
    theirs = {**mixed_mig_node(gone)["metadata"]["labels"]}
    del theirs[MIG_CONFIG_LABEL], theirs[CONFIG_LABEL], theirs[POLICY_LABEL]
    cache.upsert_node(h100(**theirs))  # mixed, and no layout of ours: someone else's MIG
    assert planner.decide(cache.nodes["n1"]).reason == "MPSWithMixedMIG"


def test_a_mixed_policy_counts_slots_and_overcommitment_per_resource() -> None:
    """Three pods on one profile's two devices: overcommitted there, though the policy's six
    slots in all would hold them."""
    layout = {"devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, "migStrategy": "mixed"}
    planner = loop(Clock())
    cache = planner.cache
    cache.upsert_policy(mig_policy("m", mig=layout))
    cache.upsert_node(h100())
    for uid in ("p1", "p2", "p3"):
        cache.upsert_pod(pod(uid, "n1", 1, resource="nvidia.com/mig-1g.10gb"))
    cache.upsert_pod(pod("p4", "n1", 1, resource="nvidia.com/mig-3g.40gb"))
    compiled_m = cache.policies["m"]
    tally = planner.tally(compiled_m)
    assert (tally.capacity, tally.allocated) == (6, 4)
    status = policystatus.render_policy_status(
        policy=compiled_m, tally=tally, previous=None, now="2026-12-01T00:00:00Z"
    )
    assert status["slots"]["byResource"] == {
        "nvidia.com/mig-1g.10gb": {"capacity": 2, "allocated": 3},
        "nvidia.com/mig-2g.20gb": {"capacity": 2, "allocated": 0},
        "nvidia.com/mig-3g.40gb": {"capacity": 2, "allocated": 1},
    }
    assert status["resourcesSummary"] == "mig-1g.10gb 3/2, mig-2g.20gb 0/2, mig-3g.40gb 1/2"
    [over] = [c for c in status["conditions"] if c["type"] == "Overcommitted"]
    assert over["status"] == "True"
    assert over["message"].startswith("nvidia.com/mig-1g.10gb: pods hold 3 slots but only 2")


def test_a_failed_disable_is_a_mismatch_once_it_can_be_about_all_disabled() -> None:
    """Going to a time-slicing policy, the MIG manager says failed for all-disabled: a moment
    after we began to wait it is the disable's, a Mismatch (and stays one, as published)."""
    mig = compiled()
    target = compile_policy(
        name="t", uid="uid-t", generation=1, spec={"nodeSelector": {}, "replicas": 2}
    )
    body = on_mig(mig, **{"nvidia.com/mig.config.state": "failed"})
    body["metadata"]["labels"][MIG_CONFIG_LABEL] = migconfigs.ALL_DISABLED
    record = project_node(body)

    def decide(published: nodephases.Published, now: float) -> nodephases.NodeDecision:
        return nodephases.decide(
            record=record,
            policy=target,
            key=nodephases.KeyReadiness(present=True),
            applied_since=None,
            now=now,
            mismatch_timeout=60,
            published=published,
        )

    waiting = nodephases.Published(phase="Pending", reason=migphases.DISABLING, since=10.0)
    early = decide(waiting, 12.0)  # may still be the last layout's failed
    assert (early.phase, early.reason, early.recheck_at) == (
        NodePhase.PENDING,
        migphases.DISABLING,
        10.0 + migphases.STALE_STATE,
    )
    late = decide(waiting, 16.0)
    assert (late.phase, late.reason) == (NodePhase.MISMATCH, migphases.DISABLE_FAILED)
    assert late.labels is None  # nothing more is written: the new config waits
    said = nodephases.Published(phase="Mismatch", reason=migphases.DISABLE_FAILED, since=16.0)
    assert decide(said, 17.0).reason == migphases.DISABLE_FAILED


def test_a_policy_event_queues_the_mig_configmap_too() -> None:
    """A MIG policy created, edited or deleted while the operator runs changes the layouts the
    mig-parted ConfigMap must hold."""
    planner = loop(Clock())
    cache = planner.cache
    sync_mig(cache, None)
    drain(cache.queue)
    cache.upsert_policy(mig_policy("m"))
    assert drain(cache.queue).get(CONFIG) == ["", MIG_CONFIG, DEVICE_CLASSES]
    plan = planner.reconciler.plan(MIG_CONFIG_KEY)
    assert plan.data is not None and migconfigs.CONFIGMAP_KEY in plan.data


def test_a_relayout_under_the_same_key_goes_one_node_at_a_time() -> None:
    """A new mixed layout keeps the device-plugin key: the nodes still on the old layout,
    confirmed, are available, so maxUnavailable 1 admits one node at a time."""
    old_layout = {"devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, "migStrategy": "mixed"}
    new_layout = {"devices": {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, "migStrategy": "mixed"}
    rollout = {"maxUnavailable": 1, "canary": 0}
    planner = loop(Clock())
    cache = planner.cache
    cache.upsert_policy(mig_policy("m", mig=old_layout, rollout=rollout))
    before = cache.policies["m"]
    assert before.mig is not None
    names = [f"n{i}" for i in range(4)]
    labels = {
        CONFIG_LABEL: str(before.config_key),
        POLICY_LABEL: "m",
        MIG_CONFIG_LABEL: before.mig.names[H100],
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/mig.strategy": "mixed",
        **{f"nvidia.com/mig-{p}.count": "2" for p in ("3g.40gb", "2g.20gb", "1g.10gb")},
    }
    for name in names:
        body = h100(name, **labels)
        for profile in ("3g.40gb", "2g.20gb", "1g.10gb"):
            body["status"]["allocatable"][f"nvidia.com/mig-{profile}"] = "2"
        cache.upsert_node(body)
    cache.upsert_policy(mig_policy("m", mig=new_layout, rollout=rollout, generation=2))
    after = cache.policies["m"]
    assert after.mig is not None and after.config_key == before.config_key
    sync_config(cache, config_texts(cache), initial=True)
    entries = {**before.mig.entries, **after.mig.entries}
    sync_mig(cache, {migconfigs.CONFIGMAP_KEY: migconfigs.render_text(entries)})
    planner.plan_queued_nodes()
    planner.due()
    plans = [planner.plan_node(name) for name in names]
    # The one admitted is tainted first (its layout label waits for the taint in the cache).
    changing = [p for p in plans if p.taint is not None]
    assert len(changing) == 1, [
        (p.name, p.facts.decision and p.facts.decision.reason) for p in plans
    ]
    assert changing[0].facts.decision is not None
    assert changing[0].facts.decision.reason == "ConfirmingIdle"
    held = [p for p in plans if p.taint is None]
    assert not any(p.labels for p in plans)
    assert all(p.facts.decision and p.facts.decision.reason == "RolloutWaiting" for p in held)


def test_a_mig_key_shown_in_the_configmap_is_not_written_again() -> None:
    """The device-plugin ConfigMap holding a MIG policy's key as rendered: nothing to write
    (a key shape left out of ours was rewritten on every plan)."""
    planner = loop(Clock())
    cache = planner.cache
    cache.upsert_policy(mig_policy("m", mig={"profile": "1g.10gb", "migStrategy": "mixed"}))
    cache.upsert_policy(mig_policy("r", mig={"profile": "1g.10gb", "replicas": 2}))
    sync_config(cache, config_texts(cache), initial=True)
    assert {"m", "r"} <= {k.split("-")[0] for k in cache.config_data or {}}
    assert planner.plan_config().data is None

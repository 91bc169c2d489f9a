"""GFD's labels and the device plugin's resources on MIG GPUs (k8s-device-plugin's rules)."""

from __future__ import annotations

from dataclasses import replace

from gpushare_testing.agents import Sharing, parse_device_plugin_config
from gpushare_testing.bodies import gpu_node
from gpushare_testing.miglabels import (
    MigNode,
    mig_gfd_labels,
    mig_plugin_resources,
    plugin_refusal,
    stale_gfd_labels,
)
from gpushare_testing.migmanager import GpuMig, disabled
from gpushare_testing.migtables import load_tables
from gpushare_testing.nodeagents import NodeAgents, Timing

H100 = "NVIDIA-H100-80GB-HBM3"
ALL_1G = GpuMig(True, ("1g.10gb",) * 7)
MIXED = GpuMig(True, ("1g.10gb", "2g.20gb", "3g.40gb"))
REGISTERED = {"nvidia.com/gpu"}


def _sharing(strategy: str, resource: str | None = None, replicas: int = 4) -> Sharing:
    text = f"version: v1\nflags:\n  migStrategy: {strategy}\n"
    if resource:
        text += (
            "sharing:\n  timeSlicing:\n    resources:\n"
            f"    - name: {resource}\n      replicas: {replicas}\n"
        )
    sharing = parse_device_plugin_config(text)
    assert sharing is not None
    return sharing


def _node(*gpus: GpuMig) -> MigNode:
    return MigNode(product=H100, memory_mib=81559, layout=tuple(gpus), model=load_tables()[H100])


def _labels() -> dict[str, str]:
    return dict(gpu_node(name="n", pool="p", gpus=2)["metadata"]["labels"])


def test_single_serves_each_mig_device_as_a_gpu_times_replicas() -> None:
    node = _node(ALL_1G, ALL_1G)
    plain = mig_plugin_resources(sharing=_sharing("single"), node=node, registered=REGISTERED)
    assert plain == {"nvidia.com/gpu": "14"}
    shared = _sharing("single", "nvidia.com/gpu")
    assert mig_plugin_resources(sharing=shared, node=node, registered=REGISTERED) == {
        "nvidia.com/gpu": "56"
    }


def test_single_labels_are_rewritten_to_the_mig_device() -> None:
    labels = mig_gfd_labels(
        _labels(), sharing=_sharing("single", "nvidia.com/gpu"), node=_node(ALL_1G, ALL_1G)
    )
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == f"{H100}-MIG-1g.10gb-SHARED"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "10240"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.slices.gi"] == labels["nvidia.com/gpu.slices.ci"] == "1"
    assert labels["nvidia.com/mps.capable"] == "false"
    unshared = mig_gfd_labels(_labels(), sharing=_sharing("single"), node=_node(ALL_1G, ALL_1G))
    assert unshared["nvidia.com/gpu.product"] == f"{H100}-MIG-1g.10gb"
    assert unshared["nvidia.com/gpu.replicas"] == "1"


def test_single_refuses_mixed_profiles_and_gfd_says_invalid() -> None:
    for gpus in ((MIXED, MIXED), (ALL_1G, GpuMig()), (GpuMig(True), GpuMig(True))):
        node = _node(*gpus)
        assert plugin_refusal(_sharing("single"), node)
        assert mig_plugin_resources(sharing=_sharing("single"), node=node, registered=()) is None
        labels = mig_gfd_labels(_labels(), sharing=_sharing("single"), node=node)
        assert labels["nvidia.com/gpu.product"] == f"{H100}-MIG-INVALID"
        assert labels["nvidia.com/gpu.count"] == labels["nvidia.com/gpu.memory"] == "0"


def test_mixed_serves_one_resource_per_profile() -> None:
    node = _node(MIXED, MIXED)
    sharing = _sharing("mixed", "nvidia.com/mig-1g.10gb", replicas=3)
    assert mig_plugin_resources(sharing=sharing, node=node, registered=REGISTERED) == {
        "nvidia.com/gpu": "0",  # registered before, served no more: kubelet keeps it at 0
        "nvidia.com/mig-1g.10gb": "6",
        "nvidia.com/mig-2g.20gb": "2",
        "nvidia.com/mig-3g.40gb": "2",
    }
    labels = mig_gfd_labels(_labels(), sharing=sharing, node=node)
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.10gb.replicas"] == "3"
    assert labels["nvidia.com/mig-1g.10gb.product"] == f"{H100}-MIG-1g.10gb-SHARED"
    assert labels["nvidia.com/mig-3g.40gb.product"] == f"{H100}-MIG-3g.40gb"
    assert labels["nvidia.com/mig-3g.40gb.memory"] == "40960"
    assert labels["nvidia.com/mig-2g.20gb.sharing-strategy"] == "none"
    # The full-GPU labels of MIG-enabled GPUs carry no sharing: replicas 0 (a nil config).
    assert labels["nvidia.com/gpu.product"] == H100
    assert labels["nvidia.com/gpu.count"] == "2" and labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.memory"] == "81559"


def test_mixed_keeps_mig_disabled_gpus_as_gpus_and_refuses_empty_ones() -> None:
    sharing = _sharing("mixed")
    half = _node(MIXED, GpuMig())
    served = mig_plugin_resources(sharing=sharing, node=half, registered=REGISTERED)
    assert served is not None and served["nvidia.com/gpu"] == "1"
    assert mig_plugin_resources(sharing=sharing, node=_node(GpuMig(True)), registered=()) is None


def test_mps_on_mig_devices_is_refused() -> None:
    mps = (
        "version: v1\nsharing:\n  mps:\n    resources:\n"
        "    - name: nvidia.com/mig-1g.10gb\n      replicas: 2\n"
    )
    assert parse_device_plugin_config(mps) is None
    gpu_mps = replace(_sharing("single"), strategy="mps", replicas=2)
    assert plugin_refusal(gpu_mps, _node(ALL_1G))


def test_stale_mig_labels_go_when_the_layout_or_strategy_changes() -> None:
    mixed = mig_gfd_labels(_labels(), sharing=_sharing("mixed"), node=_node(MIXED, MIXED))
    single = mig_gfd_labels(mixed, sharing=_sharing("single"), node=_node(ALL_1G, ALL_1G))
    assert not [k for k in single if k.startswith("nvidia.com/mig-")]
    stale = stale_gfd_labels(mixed, single)
    assert "nvidia.com/mig-3g.40gb.count" in stale
    back = mig_gfd_labels(single, sharing=_sharing("none"), node=_node(GpuMig(), GpuMig()))
    assert back["nvidia.com/mig.strategy"] == "single"  # left as it was (docs/simulator.md)
    assert back["nvidia.com/gpu.product"] == H100 and back["nvidia.com/gpu.count"] == "2"
    assert "nvidia.com/gpu.slices.gi" not in back
    assert set(stale_gfd_labels(single, back)) == {
        "nvidia.com/gpu.slices.gi",
        "nvidia.com/gpu.slices.ci",
    }


def test_gpus_without_mig_keep_the_rules_of_full_gpus() -> None:
    node = _node(GpuMig(), GpuMig())
    sharing = _sharing("single", "nvidia.com/gpu")
    assert mig_plugin_resources(sharing=sharing, node=node, registered=REGISTERED) == {
        "nvidia.com/gpu": "8",
        "nvidia.com/gpu.shared": None,
    }
    labels = mig_gfd_labels(_labels(), sharing=sharing, node=node)
    assert labels["nvidia.com/gpu.product"] == f"{H100}-SHARED"
    assert labels["nvidia.com/mig.strategy"] == "single"


def test_node_agents_serve_the_layout_after_a_plugin_restart() -> None:
    view = {"mig": "version: v1\nflags:\n  migStrategy: mixed\n"}
    agents = NodeAgents.start(
        gpus=2,
        capacity={"nvidia.com/gpu": "2"},
        label=None,
        view=view,
        timing=Timing(restart_window=1.0),
        now=0.0,
        mig=_node(GpuMig(), GpuMig()),
    )
    agents.stop_plugin()
    agents.set_mig_layout((MIXED, MIXED))
    agents.see_label("mig", now=1.0, view=view)
    agents.start_plugin(now=1.0, view=view)
    agents.advance(now=2.5, view=view)
    assert agents.status()["allocatable"]["nvidia.com/mig-3g.40gb"] == "2"
    assert agents.status()["allocatable"]["nvidia.com/gpu"] == "0"
    agents.lose_gpus(1)
    assert agents.status()["allocatable"]["nvidia.com/mig-3g.40gb"] == "1"
    patch = agents.gfd_labels(_labels())
    assert patch["nvidia.com/mig-2g.20gb.count"] == "2"
    assert disabled(1) == (GpuMig(),)

"""Drift on a node that was fine, as the simulated agents play it: a GPU that fails its health
check, a device-plugin pod that goes away and comes back."""

from __future__ import annotations

import yaml

from gpushare_testing.agents import Sharing
from gpushare_testing.nodeagents import NodeAgents, Timing

GPU = "nvidia.com/gpu"
TS4 = yaml.safe_dump(
    {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}},
    }
)
TS2 = TS4.replace("replicas: 4", "replicas: 2")
VIEW = {"default": "", "ts4": TS4, "ts2": TS2}
TIMING = Timing(restart_window=2.0, backoff_initial=1.0, backoff_cap=4.0)


def shared(label: str = "ts4") -> NodeAgents:
    """Two GPUs, running ``label``'s config since t=2."""
    agents = NodeAgents.start(
        gpus=2, capacity={GPU: "2"}, label=None, view=VIEW, timing=TIMING, now=0.0
    )
    agents.see_label(label, now=0.0, view=VIEW)
    agents.advance(now=2.0, view=VIEW)
    return agents


def test_a_failed_gpu_leaves_allocatable_with_every_device_made_of_it() -> None:
    agents = shared()
    passes = agents.gfd_passes
    agents.lose_gpus(1)
    assert agents.status() == {
        "capacity": {GPU: "8", "nvidia.com/gpu.shared": None},
        "allocatable": {GPU: "4", "nvidia.com/gpu.shared": None},
    }
    assert agents.gfd_passes == passes, "GFD still counts and labels it"
    agents.lose_gpus(5)
    assert agents.status()["allocatable"][GPU] == "0"


def test_a_failed_gpu_stays_failed_through_a_plugin_restart() -> None:
    agents = shared()
    agents.lose_gpus(1)
    agents.see_label("ts2", now=10.0, view=VIEW)
    agents.advance(now=12.0, view=VIEW)
    assert agents.gfd_sharing == Sharing("time-slicing", 2)
    assert agents.status()["allocatable"][GPU] == "2"  # 4 devices, 2 of them on the bad GPU
    agents.see_label(None, now=20.0, view=VIEW)
    agents.advance(now=22.0, view=VIEW)
    assert agents.status()["allocatable"][GPU] == "1"  # released: still short of 2
    agents.restore_gpus()
    assert agents.status()["allocatable"][GPU] == "2"


def test_a_plugin_outage_zeroes_allocatable_and_runs_no_timer() -> None:
    agents = shared()
    agents.stop_plugin()
    assert agents.status()["allocatable"][GPU] == "0"
    assert agents.status()["capacity"][GPU] == "8"
    agents.see_label("ts2", now=10.0, view=VIEW)  # nobody reads it while the pod is gone
    assert agents.next_deadline() is None and agents.settled(VIEW)
    assert agents.gfd_sharing == Sharing("time-slicing", 4)


def test_the_plugin_back_runs_what_the_label_names_now() -> None:
    agents = shared()
    agents.stop_plugin()
    agents.see_label("ts2", now=10.0, view=VIEW)
    agents.start_plugin(now=20.0, view=VIEW)
    assert agents.status()["allocatable"][GPU] == "0"  # its restart window
    assert agents.next_deadline() == 22.0
    agents.advance(now=22.0, view=VIEW)
    assert agents.status()["allocatable"][GPU] == "4"
    assert agents.gfd_sharing == Sharing("time-slicing", 2)


def test_the_plugin_back_on_the_same_config_still_restarts() -> None:
    agents = shared()
    restarts = agents.restarts
    agents.stop_plugin()
    agents.start_plugin(now=20.0, view=VIEW)
    agents.advance(now=22.0, view=VIEW)
    assert agents.restarts == restarts + 1
    assert agents.status()["allocatable"][GPU] == "8"
    agents.start_plugin(now=30.0, view=VIEW)  # not stopped: nothing happens
    assert agents.next_deadline() is None

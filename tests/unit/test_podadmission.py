"""The simulated kubelet's pure rules: pod admission, its statuses, and the NoSchedule pass."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_testing import bodies
from gpushare_testing.nodeagents import NodeAgents, Timing
from gpushare_testing.nodelifecycle import no_schedule_taints
from gpushare_testing.podadmission import (
    Admitted,
    NodeResources,
    Rejection,
    admit,
    is_extended,
    parse_quantity,
    pod_requests,
    rejected_status,
    running_status,
)
from gpushare_testing.podagent import kubelet_view

GPU, SHARED, FPGA = "nvidia.com/gpu", "nvidia.com/gpu.shared", "example.com/fpga"


def container(name: str = "app", **requests: Any) -> dict[str, Any]:
    """A container whose ``requests`` keys use ``_`` for ``/`` and ``.``-free names."""
    resources = {k.replace("__", "/").replace("_", "."): str(v) for k, v in requests.items()}
    return {"name": name, "image": "r/i:1", "resources": {"requests": resources}}


def node(
    *, devices: dict[str, int] | None = None, pods: int = 110, **allocatable: int
) -> NodeResources:
    """A node with 96 cores and 1 TiB unless told otherwise, and the given plugin devices."""
    base = {"pods": pods, "cpu": 96_000, "memory": 2**40}
    return NodeResources(allocatable=base | allocatable, devices=devices or {})


def held(**requests: int) -> Admitted:
    return Admitted(requests={"pods": 1, **requests}, devices={})


# -- quantities and requests -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "milli", "expected"),
    [
        ("4", False, 4),
        (4, False, 4),
        ("500m", True, 500),
        ("500m", False, 1),  # Value() rounds up
        ("1.5", True, 1500),
        ("32Gi", False, 32 * 2**30),
        ("7768000Ki", False, 7_768_000 * 1024),
        ("1k", False, 1000),
        ("2M", False, 2_000_000),
        ("1e3", False, 1000),
        ("1E", False, 10**18),  # E alone is exa, not an exponent
        ("lots", False, 0),
        ("", False, 0),
        (None, False, 0),
        (True, False, 0),
        ("NaN", False, 0),
        ("Infinity", False, 0),
    ],
)
def test_parse_quantity(raw: object, milli: bool, expected: int) -> None:
    assert parse_quantity(raw, milli=milli) == expected


def test_extended_resources_are_qualified_and_outside_kubernetes_io() -> None:
    assert is_extended(GPU) and is_extended(FPGA)
    assert not is_extended("cpu") and not is_extended("memory") and not is_extended("pods")
    assert not is_extended("kubernetes.io/something") and not is_extended("requests.nvidia.com/x")


def test_pod_requests_use_the_schedulers_effective_request_in_kubelets_units() -> None:
    spec = {
        "initContainers": [container("init", cpu="2", nvidia_com__gpu=3)],
        "containers": [
            container("a", cpu="250m", memory="1Gi", nvidia_com__gpu=1),
            container("b", cpu="250m", memory="512Mi", nvidia_com__gpu=1),
        ],
    }
    # cpu: max(init 2000m, 250m + 250m); memory: 1.5 GiB; GPUs: max(init 3, 1 + 1).
    assert pod_requests(spec) == {"pods": 1, "cpu": 2000, "memory": 3 * 2**29, GPU: 3}


def test_a_limit_alone_stands_in_for_the_request_of_an_extended_resource() -> None:
    spec = {"containers": [{"name": "a", "resources": {"limits": {GPU: "2"}}}]}
    assert pod_requests(spec) == {"pods": 1, GPU: 2}


# -- admission: the device manager first ---------------------------------------------------------


def test_a_registered_plugin_without_healthy_devices_rejects_the_pod() -> None:
    outcome = admit(requests={"pods": 1, GPU: 1}, node=node(devices={GPU: 0}), others=[])
    assert outcome == Rejection(
        "UnexpectedAdmissionError",
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices"
        " nvidia.com/gpu, which is unexpected",
    )


def test_too_few_free_devices_rejects_the_pod_with_what_was_available() -> None:
    others = [Admitted(requests={"pods": 1, GPU: 3}, devices={GPU: 3})]
    outcome = admit(requests={"pods": 1, GPU: 2}, node=node(devices={GPU: 4}), others=others)
    assert isinstance(outcome, Rejection)
    assert outcome.reason == "UnexpectedAdmissionError"
    assert outcome.message == (
        "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu."
        " Requested: 2, Available: 1, which is unexpected"
    )


def test_devices_that_fit_are_allocated_and_held() -> None:
    others = [Admitted(requests={"pods": 1, GPU: 3}, devices={GPU: 3})]
    outcome = admit(requests={"pods": 1, GPU: 1}, node=node(devices={GPU: 4}), others=others)
    assert outcome == Admitted(requests={"pods": 1, GPU: 1}, devices={GPU: 1})


def test_a_stale_node_allocatable_does_not_reject_what_the_device_manager_allocated() -> None:
    """sanitizeNodeAllocatable: the Node still says 0 while the plugin already serves 8."""
    resources = node(devices={GPU: 8}, **{GPU: 0})
    outcome = admit(requests={"pods": 1, GPU: 2}, node=resources, others=[])
    assert isinstance(outcome, Admitted)


# -- admission: then the predicates --------------------------------------------------------------


def test_an_extended_resource_the_node_does_not_list_is_dropped_from_the_requests() -> None:
    """removeMissingExtendedResources: kubelet admits a pod asking for an unknown resource."""
    outcome = admit(requests={"pods": 1, SHARED: 4}, node=node(devices={GPU: 8}), others=[])
    assert outcome == Admitted(requests={"pods": 1, SHARED: 4}, devices={})


def test_a_listed_extended_resource_that_is_not_a_plugins_must_fit_the_allocatable() -> None:
    others = [held(**{FPGA: 1})]
    outcome = admit(requests={"pods": 1, FPGA: 2}, node=node(**{FPGA: 2}), others=others)
    assert outcome == Rejection(
        "OutOfexample.com/fpga",
        "Node didn't have enough resource: example.com/fpga, requested: 2, used: 1, capacity: 2",
    )


@pytest.mark.parametrize(
    ("requests", "others", "resources", "reason", "message"),
    [
        (
            {"pods": 1},
            [held(), held()],
            node(pods=2),
            "OutOfpods",
            "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2",
        ),
        (
            {"pods": 1, "cpu": 4000},
            [held(cpu=93_000)],
            node(),
            "OutOfcpu",
            "Node didn't have enough resource: cpu, requested: 4000, used: 93000, capacity: 96000",
        ),
        (
            {"pods": 1, "memory": 2**39 + 1},
            [held(memory=2**39)],
            node(),
            "OutOfmemory",
            f"Node didn't have enough resource: memory, requested: {2**39 + 1},"
            f" used: {2**39}, capacity: {2**40}",
        ),
    ],
)
def test_the_fit_predicate_checks_pods_cpu_and_memory_in_that_order(
    requests: dict[str, int],
    others: list[Admitted],
    resources: NodeResources,
    reason: str,
    message: str,
) -> None:
    assert admit(requests=requests, node=resources, others=others) == Rejection(reason, message)


def test_the_device_manager_speaks_before_the_predicates() -> None:
    resources = node(pods=0, devices={GPU: 0})
    outcome = admit(requests={"pods": 1, GPU: 1}, node=resources, others=[])
    assert isinstance(outcome, Rejection) and outcome.reason == "UnexpectedAdmissionError"


# -- what the simulator feeds it -----------------------------------------------------------------


def test_the_kubelet_view_of_a_restarting_plugin_has_no_healthy_device() -> None:
    body = bodies.gpu_node(name="n", pool="p", gpus=2, managed_fields=False)
    timing = Timing(restart_window=5.0)
    agents = NodeAgents.start(
        gpus=2, capacity=body["status"]["capacity"], label=None, view={}, timing=timing, now=0.0
    )
    view = kubelet_view(agents, body)
    assert view is not None and view[0].devices == {GPU: 2}
    assert view[0].allocatable["cpu"] == 192_000 - 920
    agents.see_label("ts4", now=1.0, view={"ts4": "version: v1\n"})  # a change: SIGHUP
    view = kubelet_view(agents, body)
    assert view is not None and view[0].devices == {GPU: 0}
    assert kubelet_view(None, body) is None and kubelet_view(agents, None) is None


# -- statuses ------------------------------------------------------------------------------------


def test_a_rejected_pod_fails_for_good_with_kubelets_wording() -> None:
    status = rejected_status(Rejection("OutOfcpu", "Node didn't have enough resource: cpu"))
    assert status == {
        "phase": "Failed",
        "reason": "OutOfcpu",
        "message": "Pod was rejected: Node didn't have enough resource: cpu",
    }


def test_a_running_status_has_every_condition_true_and_every_container_started() -> None:
    pod = {
        "metadata": {"uid": "u-1"},
        "spec": {
            "initContainers": [
                {"name": "fetch", "image": "r/fetch:1"},
                {"name": "proxy", "image": "r/proxy:1", "restartPolicy": "Always"},
            ],
            "containers": [{"name": "app", "image": "r/app:2"}],
        },
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "T0"},
            ]
        },
    }
    body = bodies.gpu_node(name="n", pool="p", managed_fields=False)
    status = running_status(pod=pod, node=body, now="T1")
    assert status["phase"] == "Running" and status["startTime"] == "T1"
    conditions = {c["type"]: (c["status"], c["lastTransitionTime"]) for c in status["conditions"]}
    assert conditions["PodScheduled"] == ("True", "T0")  # the scheduler's, kept
    assert {v for k, v in conditions.items() if k != "PodScheduled"} == {("True", "T1")}
    fetch, proxy = status["initContainerStatuses"]
    assert fetch["state"]["terminated"]["reason"] == "Completed" and not fetch["started"]
    assert "running" in proxy["state"]
    [app] = status["containerStatuses"]
    assert app["ready"] and app["started"] and "running" in app["state"]
    assert status["hostIP"] == next(
        a["address"] for a in body["status"]["addresses"] if a["type"] == "InternalIP"
    )
    assert status["podIP"].startswith(body["spec"]["podCIDR"].rsplit(".", 2)[0])
    assert running_status(pod=pod, node=body, now="T1") == status  # deterministic


# -- the node lifecycle controller's NoSchedule pass ---------------------------------------------


def test_a_ready_node_loses_the_not_ready_taint_and_keeps_the_others() -> None:
    body = bodies.gpu_node(name="n", pool="p", managed_fields=False)
    own = {"key": "example.com/dedicated", "value": "ml", "effect": "NoSchedule"}
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    body["spec"]["taints"] = [not_ready, own]
    assert no_schedule_taints(body) == [own]
    body["spec"]["taints"] = [own]
    assert no_schedule_taints(body) is None


def test_conditions_and_cordoning_add_their_taints() -> None:
    body = bodies.gpu_node(name="n", pool="p", managed_fields=False)
    for condition in body["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "Unknown"
    body["spec"]["unschedulable"] = True
    assert no_schedule_taints(body) == [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
    ]

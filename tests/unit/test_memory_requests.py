"""The memory-request webhook's decision (core.slots.memoryrequests, core.quantities): no API."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core import quantities
from gpushare_operator.core.slots import memoryrequests, slotclasses
from gpushare_operator.core.slots.memoryrequests import Placement, Refusal
from gpushare_operator.core.slots.slotclasses import Isolation, Offer

MPS8 = Offer(10194, "nvidia.com/gpu", Isolation.MPS, "batch8")
MPS4 = Offer(20389, "nvidia.com/gpu", Isolation.MPS, "batch")
MIG = Offer(20480, "nvidia.com/mig-2g.20gb", Isolation.MIG, "h100-mig")
WHOLE = Offer(81559, "nvidia.com/gpu", Isolation.EXCLUSIVE, "training")
OFFERS = tuple(sorted([MPS8, MPS4, MIG, WHOLE]))


def known(name: str) -> bool:
    return memoryrequests.is_gpu_resource(name, known={"example.com/vgpu"})


def pod(memory: str = "10Gi", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "p", "labels": {memoryrequests.REQUEST_LABEL: memory}},
        "spec": {"containers": [{"name": "main", "image": "x"}, {"name": "side", "image": "y"}]},
    }
    body["spec"].update(spec)
    return body


def placed(body: dict[str, Any]) -> tuple[Placement, dict[str, Any]]:
    placement = memoryrequests.place(body, offers=OFFERS, is_gpu_resource=known)
    mutated = copy.deepcopy(body)
    memoryrequests.apply(mutated, placement)
    return placement, mutated


# -- quantities ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("20Gi", 20480),
        ("20480Mi", 20480),
        ("20G", 19074),  # 20e9 bytes, rounded up to whole MiB
        ("1.5Gi", 1536),
        ("21474836480", 20480),
        ("21474836481", 20481),  # a byte more needs a MiB more
        ("2e10", 19074),
        ("0.5Ti", 524288),
        ("+1Mi", 1),
    ],
)
def test_quantities_parse_as_the_api_server_writes_them(text: str, mib: int) -> None:
    assert quantities.parse_mib(text) == mib


@pytest.mark.parametrize("text", ["", "lots", "20 Gi", "20GB", "-1Gi", "0", "0Gi", "1e99", "Gi"])
def test_what_is_not_a_positive_quantity_is_refused(text: str) -> None:
    with pytest.raises(quantities.QuantityError):
        quantities.parse_mib(text)


@given(st.integers(min_value=1, max_value=2**40))
def test_binary_suffixes_are_exact(mib: int) -> None:
    assert quantities.parse_mib(f"{mib}Mi") == mib
    if mib % 1024 == 0:
        assert quantities.parse_mib(f"{mib // 1024}Gi") == mib


# -- the choice ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "chosen"),
    [("1Gi", MPS8), ("10194Mi", MPS8), ("10Gi", MPS4), ("20Gi", MIG), ("20481Mi", WHOLE)],
)
def test_the_smallest_enforced_class_that_holds_the_request_is_chosen(
    memory: str, chosen: Offer
) -> None:
    placement, _ = placed(pod(memory))
    assert placement.offer == chosen


@given(st.integers(min_value=1, max_value=WHOLE.memory_mib))
def test_the_choice_holds_the_request_and_nothing_smaller_would(request_mib: int) -> None:
    chosen = memoryrequests.choose(request_mib, OFFERS)
    assert chosen.memory_mib >= request_mib
    assert all(o.memory_mib < request_mib for o in OFFERS if o < chosen)


def test_more_than_every_slot_is_refused_naming_the_largest_and_its_policy() -> None:
    with pytest.raises(Refusal) as refused:
        placed(pod("100Gi"))
    message = refused.value.message
    assert "100Gi (102400 MiB)" in message
    assert "81559 MiB of nvidia.com/gpu (exclusive)" in message and "policy training" in message
    assert refused.value.reason == memoryrequests.TOO_LARGE


def test_no_enforced_slot_anywhere_is_refused_saying_time_slicing_enforces_none() -> None:
    with pytest.raises(Refusal, match="time-slicing") as refused:
        memoryrequests.place(pod(), offers=(), is_gpu_resource=known)
    assert refused.value.reason == memoryrequests.NO_OFFER


@pytest.mark.parametrize("memory", ["lots", "10GB", "-5Gi", "0"])
def test_a_request_that_does_not_parse_is_refused_saying_so(memory: str) -> None:
    with pytest.raises(Refusal, match=memoryrequests.REQUEST_LABEL) as refused:
        placed(pod(memory))
    assert refused.value.reason == memoryrequests.BAD_LABEL


@pytest.mark.parametrize(
    "resource",
    ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared", "example.com/vgpu"],
)
@pytest.mark.parametrize("section", ["requests", "limits"])
def test_a_pod_that_already_asks_for_a_gpu_resource_is_refused(resource: str, section: str) -> None:
    body = pod()
    body["spec"]["initContainers"] = [{"name": "init", "resources": {section: {resource: "1"}}}]
    with pytest.raises(Refusal, match="init container 'init' already") as refused:
        placed(body)
    assert refused.value.reason == memoryrequests.ALREADY_GPU


def test_a_container_named_by_the_annotation_that_does_not_exist_is_refused() -> None:
    body = pod()
    body["metadata"]["annotations"] = {memoryrequests.CONTAINER_ANNOTATION: "gpu"}
    with pytest.raises(Refusal, match=r"'gpu', which the pod does not have .*main, side") as no:
        placed(body)
    assert no.value.reason == memoryrequests.BAD_CONTAINER


# -- the mutation --------------------------------------------------------------------------------


def test_the_first_container_gets_one_slot_and_the_mps_limit() -> None:
    _, mutated = placed(pod("10Gi"))
    main, side = mutated["spec"]["containers"]
    assert main["resources"] == {
        "requests": {"nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert main["env"] == [{"name": memoryrequests.MPS_LIMIT_ENV, "value": "0=10240M"}]
    assert "resources" not in side and "env" not in side


def test_the_annotation_chooses_the_container_and_its_own_resources_are_kept() -> None:
    body = pod("20Gi")
    body["metadata"]["annotations"] = {memoryrequests.CONTAINER_ANNOTATION: "side"}
    body["spec"]["containers"][1]["resources"] = {
        "requests": {"cpu": "1"},
        "limits": {"memory": "1Gi"},
    }
    _, mutated = placed(body)
    side = mutated["spec"]["containers"][1]
    assert side["resources"] == {
        "requests": {"cpu": "1", "nvidia.com/mig-2g.20gb": "1"},
        "limits": {"memory": "1Gi", "nvidia.com/mig-2g.20gb": "1"},
    }
    assert "resources" not in mutated["spec"]["containers"][0]


def with_limit(*values: str | None, memory: str = "10Gi") -> dict[str, Any]:
    """A pod whose first container sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT itself (None: from a
    ConfigMap)."""
    body = pod(memory)
    body["spec"]["containers"][0]["env"] = [
        {"name": "OTHER", "value": "x"},
        *(
            {"name": memoryrequests.MPS_LIMIT_ENV, "value": v}
            if v is not None
            else {
                "name": memoryrequests.MPS_LIMIT_ENV,
                "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
            }
            for v in values
        ),
    ]
    return body


# 10Gi gets the MPS x4 slot, 20389 MiB: NVIDIA's MPS obeys a client's own value only below the
# control daemon's, which the device plugin sets to the slot.
@pytest.mark.parametrize(
    "value", ["0=1G", "0=20389M", "0=19G", "0=19GB", "0=512MB,1=1G", "GPU-1a2b=20000m", ""]
)
def test_a_limit_the_user_set_within_the_slot_is_kept_with_a_warning(value: str) -> None:
    body = with_limit(value)
    before = copy.deepcopy(body["spec"]["containers"][0]["env"])
    placement = memoryrequests.place(body, offers=OFFERS, is_gpu_resource=known)
    assert placement.offer == MPS4
    warnings = memoryrequests.apply(body, placement)
    assert body["spec"]["containers"][0]["env"] == before  # nothing of ours added
    assert len(warnings) == 1 and "kept" in warnings[0] and "20389 MiB slot" in warnings[0]


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (("0=20390M",), "20390 MiB on device 0 is more than the 20389 MiB"),
        (("0=20G",), "20480 MiB on device 0"),  # 20 GiB: G is read as GiB, the larger
        (("0=1G,1=30G",), "30720 MiB on device 1"),
        (("GPU-1a2b=21G",), "on device GPU-1a2b"),
        (("0=1G", "0=80G"), "81920 MiB on device 0"),  # the kubelet gives the process the last
    ],
)
def test_a_limit_the_user_set_above_the_slot_is_refused_saying_what_would_fit(
    values: tuple[str, ...], said: str
) -> None:
    with pytest.raises(Refusal) as refused:
        memoryrequests.place(with_limit(*values), offers=OFFERS, is_gpu_resource=known)
    message = refused.value.message
    assert said in message and "nvidia.com/gpu (mps) slot" in message
    assert "at most 20389 MiB" in message and f"raise the {memoryrequests.REQUEST_LABEL}" in message


@pytest.mark.parametrize("value", ["lots", "20G", "0=1T", "0=1.5G", "0=", "0=1G,", "0=-1G"])
def test_a_limit_the_user_set_that_does_not_read_as_nvidias_form_is_refused(value: str) -> None:
    with pytest.raises(Refusal, match="does not read as NVIDIA's"):
        memoryrequests.place(with_limit(value), offers=OFFERS, is_gpu_resource=known)


def test_a_limit_taken_from_elsewhere_is_refused_as_unknowable() -> None:
    with pytest.raises(Refusal, match=r"from elsewhere \(valueFrom\)"):
        memoryrequests.place(with_limit(None), offers=OFFERS, is_gpu_resource=known)


def test_a_limit_is_read_as_nvidia_writes_it() -> None:
    assert memoryrequests.limit_mib("0=1G,1=512MB") == {"0": 1024, "1": 512}
    assert memoryrequests.limit_mib(memoryrequests.limit_value(10240)) == {"0": 10240}


def test_the_bigger_slot_chosen_for_a_bigger_request_takes_a_bigger_limit() -> None:
    body = with_limit("0=20G", memory="20Gi")  # the MIG 2g.20gb slice: 20480 MiB
    placement = memoryrequests.place(body, offers=OFFERS, is_gpu_resource=known)
    assert placement.offer == MIG


OURS = [
    {"key": slotclasses.MEMORY_LABEL, "operator": "Gt", "values": ["10239"]},
    {"key": slotclasses.RESOURCE_LABEL, "operator": "In", "values": ["nvidia.com_gpu"]},
]


def required(mutated: dict[str, Any]) -> list[dict[str, Any]]:
    node = mutated["spec"]["affinity"]["nodeAffinity"]
    terms: list[dict[str, Any]] = node["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


def test_without_affinity_one_term_of_ours_is_made_and_the_chosen_size_preferred() -> None:
    _, mutated = placed(pod("10Gi"))
    assert required(mutated) == [{"matchExpressions": OURS}]
    preferred = mutated["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred == [
        {
            "weight": memoryrequests.PREFERENCE_WEIGHT,
            "preference": {
                "matchExpressions": [
                    {"key": slotclasses.MEMORY_LABEL, "operator": "Lt", "values": ["20390"]}
                ]
            },
        }
    ]


def test_every_term_of_the_users_affinity_is_kept_and_anded_with_ours() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    host = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    theirs = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchFields": [host]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [zone]}}
            ],
        },
        "podAntiAffinity": {"x": 1},
    }
    _, mutated = placed(pod("10Gi", affinity=theirs, nodeSelector={"pool": "a"}))
    assert required(mutated) == [
        {"matchExpressions": [zone, *OURS]},
        {"matchFields": [host], "matchExpressions": OURS},
    ]
    node = mutated["spec"]["affinity"]["nodeAffinity"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"][0] == {
        "weight": 5,
        "preference": {"matchExpressions": [zone]},
    }
    assert mutated["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    assert mutated["spec"]["nodeSelector"] == {"pool": "a"}


@given(
    terms=st.lists(
        st.fixed_dictionaries(
            {
                "matchExpressions": st.lists(
                    st.fixed_dictionaries(
                        {
                            "key": st.sampled_from(["zone", "rack", "pool"]),
                            "operator": st.sampled_from(["In", "NotIn"]),
                            "values": st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2),
                        }
                    ),
                    max_size=3,
                )
            }
        ),
        min_size=1,
        max_size=4,
    )
)
def test_merging_keeps_each_term_and_adds_ours_to_each_that_can_match(
    terms: list[dict[str, Any]],
) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    _, mutated = placed(pod("10Gi", affinity=copy.deepcopy(affinity)))
    merged = required(mutated)
    assert len(merged) == len(terms)
    for before, after in zip(terms, merged, strict=True):
        if before["matchExpressions"]:
            assert after["matchExpressions"] == [*before["matchExpressions"], *OURS]
        else:  # an empty term matches nothing, and still does
            assert after == before


def test_an_empty_term_stays_empty_so_the_pod_stays_where_the_user_put_it() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    theirs = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {}, {"matchFields": []}]
            }
        }
    }
    _, mutated = placed(pod("10Gi", affinity=theirs))
    assert required(mutated) == [{"matchExpressions": [zone, *OURS]}, {}, {"matchFields": []}]


@pytest.mark.parametrize(
    "requirement",
    [
        {"nodeSelectorTerms": [{}]},  # matches no node: still none
        {"nodeSelectorTerms": [{"matchExpressions": []}, {"matchFields": []}]},
        {"nodeSelectorTerms": []},  # the API server refuses it after us, as without us
        {},
    ],
)
def test_a_requirement_no_node_meets_is_not_made_one_that_ours_meet(
    requirement: dict[str, Any],
) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": requirement}}
    _, mutated = placed(pod("10Gi", affinity=copy.deepcopy(affinity)))
    node = mutated["spec"]["affinity"]["nodeAffinity"]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"] == requirement


# -- node affinity as kube-scheduler reads it ----------------------------------------------------
# A reference of Kubernetes' semantics (k8s.io/component-helpers/scheduling/corev1/nodeaffinity):
# no required affinity admits every node; otherwise a node is admitted by any term that is not
# empty and whose requirements all hold.  Gt and Lt compare integers; a label that is not one
# fails them.


def _holds(requirement: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = requirement["key"], requirement["operator"], requirement.get("values", [])
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if key not in labels or not labels[key].lstrip("-").isdigit():
        return False
    return int(labels[key]) > int(values[0]) if op == "Gt" else int(labels[key]) < int(values[0])


def _admits(spec: dict[str, Any], node: dict[str, Any]) -> bool:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    requirement = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if requirement is None:
        return True
    fields = {"metadata.name": node["name"]}
    for term in requirement.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        by_field = term.get("matchFields") or []
        if not expressions and not by_field:
            continue  # "A null or empty node selector term matches no objects"
        if all(_holds(r, node["labels"]) for r in expressions) and all(
            _holds(r, fields) for r in by_field
        ):
            return True
    return False


KEYS = st.sampled_from(["zone", slotclasses.MEMORY_LABEL, slotclasses.RESOURCE_LABEL])
REQUIREMENT = st.one_of(
    st.fixed_dictionaries(
        {
            "key": KEYS,
            "operator": st.sampled_from(["In", "NotIn"]),
            "values": st.lists(
                st.sampled_from(["a", "b", "20389", "nvidia.com_gpu"]), min_size=1, max_size=2
            ),
        }
    ),
    st.fixed_dictionaries({"key": KEYS, "operator": st.sampled_from(["Exists", "DoesNotExist"])}),
    st.fixed_dictionaries(
        {
            "key": st.just(slotclasses.MEMORY_LABEL),
            "operator": st.sampled_from(["Gt", "Lt"]),
            "values": st.sampled_from(["0", "10239", "20389", "40000"]).map(lambda v: [v]),
        }
    ),
)
TERM = st.fixed_dictionaries(
    {},
    optional={
        "matchExpressions": st.lists(REQUIREMENT, max_size=3),
        "matchFields": st.lists(
            st.fixed_dictionaries(
                {
                    "key": st.just("metadata.name"),
                    "operator": st.sampled_from(["In", "NotIn"]),
                    "values": st.lists(st.sampled_from(["n1", "n2"]), min_size=1, max_size=2),
                }
            ),
            max_size=1,
        ),
    },
)
NODE = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["n1", "n2", "n3"]),
        "labels": st.fixed_dictionaries(
            {},
            optional={
                "zone": st.sampled_from(["a", "b"]),
                slotclasses.MEMORY_LABEL: st.sampled_from(["10194", "20389", "81559", "x"]),
                slotclasses.RESOURCE_LABEL: st.sampled_from(["nvidia.com_gpu", "nvidia.com_x"]),
            },
        ),
    }
)


@given(
    requirement=st.one_of(
        st.none(), st.fixed_dictionaries({"nodeSelectorTerms": st.lists(TERM, max_size=4)})
    ),
    nodes=st.lists(NODE, min_size=1, max_size=6),
    memory=st.sampled_from(["1Gi", "10Gi", "20Gi"]),
)
def test_the_mutated_affinity_admits_exactly_the_nodes_both_admit(
    requirement: dict[str, Any] | None, nodes: list[dict[str, Any]], memory: str
) -> None:
    """Never a node the user's affinity did not admit (an empty term widened, a term lost),
    never one our slot class does not admit, and every node both admit."""
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": requirement}}
    body = pod(memory, affinity=copy.deepcopy(affinity)) if requirement is not None else pod(memory)
    placement, mutated = placed(body)
    ours = placed(pod(memory))[1]["spec"]  # what our affinity alone admits
    for node in nodes:
        both = _admits(body["spec"], node) and _admits(ours, node)
        assert _admits(mutated["spec"], node) == both, (node, mutated["spec"]["affinity"])
        if _admits(mutated["spec"], node):
            assert int(node["labels"][slotclasses.MEMORY_LABEL]) >= placement.request_mib


# -- the JSON patch, against kopf's -----------------------------------------------------------

ENV = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["A", "B", memoryrequests.MPS_LIMIT_ENV, "PATH"])},
        optional={
            "value": st.one_of(st.text(max_size=5), st.sampled_from(["0=1G", "0=900M", "0=80G"])),
            "valueFrom": st.just({"fieldRef": {"x": 1}}),
        },
    ),
    max_size=4,
)
CONTAINER = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "c"]), "image": st.just("img")},
    optional={
        "env": ENV,
        "resources": st.sampled_from(
            [{}, {"requests": {"cpu": "1"}}, {"limits": {"memory": "1Gi"}, "requests": {}}]
        ),
        "ports": st.just([{"containerPort": 80}]),
        "volumeMounts": st.just([{"name": "v", "mountPath": "/v"}]),
    },
)
AFFINITY = st.sampled_from(
    [
        None,
        {"podAntiAffinity": {"x": 1}},
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "z", "operator": "Exists"}]}
                    ]
                }
            }
        },
    ]
)


def _decide(body: dict[str, Any]) -> Placement | str:
    """The placement, or the refusal's message."""
    try:
        return memoryrequests.place(body, offers=OFFERS, is_gpu_resource=known)
    except Refusal as refusal:
        return refusal.message


@given(
    containers=st.lists(CONTAINER, min_size=1, max_size=3),
    affinity=AFFINITY,
    memory=st.sampled_from(["1Gi", "10Gi", "20Gi", "40Gi"]),
    extra=st.booleans(),
)
def test_the_patch_built_from_the_placement_does_what_kopfs_diff_did(
    containers: list[dict[str, Any]], affinity: dict[str, Any] | None, memory: str, extra: bool
) -> None:
    """The old path: kopf deep-copied the pod, let ``apply`` change the copy and answered with
    its diff of the two.  The new one names the changes from the placement alone; applied to
    the pod, both give the same pod, and the one ``apply`` makes."""
    import jsonpatch  # kopf's own dependency: what it answered the API server with
    from kopf._cogs.structs import bodies, patches

    body = pod(memory, containers=containers)
    if affinity is not None:
        body["spec"]["affinity"] = copy.deepcopy(affinity)
    if extra:
        body["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
        body["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
        body["status"] = {"phase": "Pending"}
    body = orjson.loads(orjson.dumps(body))  # as decoded from a review: no object shared
    placement = _decide(body)
    if isinstance(placement, str):
        return
    before = copy.deepcopy(body)
    kopfs = patches.Patch(body=bodies.Body(body))
    kopfs.fns.append(lambda raw: memoryrequests.apply(raw, placement))
    by_kopf = jsonpatch.apply_patch(body, kopfs.as_json_patch())
    ops, warnings = memoryrequests.patch(body, placement)
    assert body == before  # built without changing the pod
    by_placement = jsonpatch.apply_patch(body, ops)
    expected = copy.deepcopy(body)
    assert warnings == memoryrequests.apply(expected, placement)
    assert by_placement == by_kopf == expected


@pytest.mark.parametrize(
    ("container", "paths"),
    [
        ({"name": "a"}, ["/spec/containers/0/resources", "/spec/containers/0/env"]),
        (
            {"name": "a", "resources": {"requests": {"cpu": "1"}}, "env": [{"name": "A"}]},
            [
                "/spec/containers/0/resources/requests/nvidia.com~1gpu",
                "/spec/containers/0/resources/limits",
                "/spec/containers/0/env/-",
            ],
        ),
        (
            {"name": "a", "resources": None, "env": []},
            ["/spec/containers/0/resources", "/spec/containers/0/env"],
        ),
    ],
)
def test_the_patch_names_only_what_changes(container: dict[str, Any], paths: list[str]) -> None:
    body = pod("10Gi", containers=[container])
    ops, _ = memoryrequests.patch(
        body, memoryrequests.place(body, offers=OFFERS, is_gpu_resource=known)
    )
    assert [op["path"] for op in ops] == [*paths, "/spec/affinity"]
    assert {op["op"] for op in ops} == {"add"}

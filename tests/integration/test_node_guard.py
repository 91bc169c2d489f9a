"""The chart's node guards on the real API server: the operator's ServiceAccount may change on a
Node its own labels and its own taint, and every other change is refused with the guard's message;
and nobody else, kubelets included, may set, change or remove a gpushare.dev/ label.

The chart is installed with the real ``helm``; the requests are sent with a token the
TokenRequest API minted for the chart's ServiceAccount, so the API server authenticates,
authorizes and admits them as it would the operator's in a cluster.  (Impersonation would send
the same username, but with the groups and extra the admin's headers name and after the admin's
own authorization: a real token is the faithful test.)  The guard's request bodies are the
operator's own: ``core.rollout.rollouts`` builds the taint patches, the label apply is the one
``kube.patching`` sends.  Every refusal is also sent as admin as a dry run, which succeeds: the
request is valid, RBAC allows it to the ServiceAccount, and only the guard stops it.  That
nothing changed is read from the audit log.  Kubelets are ``system:node:<name>`` in
``system:nodes`` with a client certificate, authorized by the Node authorizer and held to their
own Node by NodeRestriction, as the control plane runs them.  (How the chart renders the guards:
test_chart.py.)
"""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpushare_operator.core.api import models
from gpushare_operator.core.rollout import rollouts
from gpushare_testing import apiobjects as h
from gpushare_testing import bodies, nodeguard
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.helm import Helm
from gpushare_testing.nodeguard import REFUSED
from gpushare_testing.paths import CHART
from gpushare_testing.rawclient import RawClient
from gpushare_testing.rolloutaudit import moment
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

APPLY = "application/apply-patch+yaml"
JSON = "application/json-patch+json"
MERGE = "application/merge-patch+json"
FOREIGN_TAINT = {"key": "example.com/dedicated", "value": "training", "effect": "NoSchedule"}
DEDICATED = "example.com/dedicated=training:NoSchedule"  # as the guard's message names it

LABELS = "may change only its own node labels"
TAINTS = "may add and remove only its own taint gpushare.dev/reconfiguring:NoSchedule"
OTHER = "may change on a Node only its own labels and its own taint"


@pytest.fixture
def operator_account(control_plane: ControlPlane, namespace: str, release: str) -> Path:
    """A kubeconfig with a token of the chart's ServiceAccount, once the guard is in effect."""
    account = f"{release}-gpushare-operator"
    token = control_plane.service_account_token(namespace=namespace, name=account)
    kubeconfig = control_plane.kubeconfig_for_token(token, name=f"{namespace}-{account}")
    nodeguard.wait_enforced(control_plane, [kubeconfig])
    return kubeconfig


@pytest.fixture
async def clients(
    control_plane: ControlPlane, operator_account: Path
) -> AsyncIterator[tuple[RawClient, RawClient]]:
    """(admin, the operator's ServiceAccount)."""
    async with (
        RawClient(kubeconfig=control_plane.admin_kubeconfig) as admin,
        RawClient(kubeconfig=operator_account) as account,
    ):
        yield admin, account


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[list[str]]:
    """Nodes a test created; deleted afterwards."""
    created: list[str] = []
    yield created
    for name in created:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")


async def create_node(
    admin: RawClient, created: list[str], *, taints: list[dict[str, str]]
) -> dict[str, Any]:
    """A GPU node as kubelet, GFD and an admin made it, without podCIDR and providerID (so
    that setting them is a valid request) and with exactly ``taints``."""
    body = bodies.gpu_node(name=h.unique("guarded"), pool=h.unique("pool"), managed_fields=False)
    metadata = {k: v for k, v in body["metadata"].items() if k not in ("uid", "creationTimestamp")}
    status, node = await admin.post(
        "/api/v1/nodes",
        {**body, "metadata": metadata, "spec": {}},
        params={"fieldManager": "kubelet"},
    )
    assert status == 201, node
    created.append(metadata["name"])
    # Whatever admission added on create (the not-ready taint) goes: the node has exactly these.
    path = f"/api/v1/nodes/{metadata['name']}"
    patch = {"spec": {"taints": taints or None}}
    return dict(await h.ok(admin, "PATCH", path, patch, content_type=MERGE))


def label_apply(node: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """The operator's label write (``kube.patching``): an apply with the uid as precondition."""
    metadata: dict[str, Any] = {"name": node["metadata"]["name"], "uid": node["metadata"]["uid"]}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata}


def params_for(content_type: str) -> dict[str, str]:
    query = {"fieldManager": models.FIELD_MANAGER}
    if content_type == APPLY:
        query["force"] = "true"
    return query


async def allowed(
    client: RawClient, node: dict[str, Any], body: Any, content_type: str
) -> dict[str, Any]:
    path = f"/api/v1/nodes/{node['metadata']['name']}"
    status, answer = await client.patch(
        path, body, content_type=content_type, params=params_for(content_type)
    )
    assert status == 200, answer
    return dict(answer)


async def test_the_operator_account_may_write_its_labels_and_its_taint(
    clients: tuple[RawClient, RawClient], nodes: list[str]
) -> None:
    admin, account = clients
    for taints in ([FOREIGN_TAINT], []):  # another's taint first, or none (the list comes, goes)
        node = await create_node(admin, nodes, taints=taints)
        ours = {
            h.CONFIG_LABEL: "ts-4-0123456789ab",
            h.POLICY_LABEL: "inference",
            "gpushare.dev/slot-0": "12Gi",  # any gpushare.dev/ key is ours
        }
        node = await allowed(account, node, label_apply(node, ours), APPLY)
        assert ours.items() <= node["metadata"]["labels"].items()

        node = await allowed(account, node, rollouts.taint_added(taints), JSON)
        assert node["spec"]["taints"] == [*taints, rollouts.TAINT]
        removal = rollouts.taint_removed(node["spec"]["taints"])
        node = await allowed(account, node, removal, JSON)
        assert node["spec"].get("taints", []) == taints

        # Ours again, then another's after it: ours goes from between them, the others stay.
        node = await allowed(account, node, rollouts.taint_added(taints), JSON)
        later = {"key": "example.com/maintenance", "effect": "PreferNoSchedule"}
        path = f"/api/v1/nodes/{node['metadata']['name']}"
        node = await h.ok(admin, "PATCH", path, add_taint(**later), content_type=JSON)
        assert node["spec"]["taints"] == [*taints, rollouts.TAINT, later]
        node = await allowed(account, node, rollouts.taint_removed(node["spec"]["taints"]), JSON)
        assert node["spec"]["taints"] == [*taints, later]

        # The release: an apply without labels takes ours away.
        node = await allowed(account, node, label_apply(node, {}), APPLY)
        assert not set(ours) & set(node["metadata"]["labels"])


@dataclass(frozen=True)
class Refusal:
    """A change the operator must not make, and what the guard's message must say of it;
    each is a valid request that an admin could make."""

    what: str
    body: Any
    says: str
    content_type: str = MERGE
    subresource: str = ""


def add_taint(key: str, effect: str) -> list[dict[str, Any]]:
    return [{"op": "add", "path": "/spec/taints/-", "value": {"key": key, "effect": effect}}]


def label(key: str, value: str | None) -> dict[str, Any]:
    return {"metadata": {"labels": {key: value}}}


def refusals(node: dict[str, Any]) -> list[Refusal]:
    ours = rollouts.TAINT_KEY
    labels = (
        f"{LABELS} (nvidia.com/device-plugin.config, nvidia.com/mig.config,"
        " nvidia.com/gpu.deploy.device-plugin, gpushare.dev/*);"
        " refused: label"
    )
    taints = f"{TAINTS}; refused: other taints [{DEDICATED}] changed to"
    effect = [{"op": "replace", "path": "/spec/taints/0/effect", "value": "PreferNoSchedule"}]
    swap = [{"op": "replace", "path": "/spec/taints", "value": [rollouts.TAINT]}]
    return [
        Refusal("another's label", label("pool", "b"), f"{labels} pool"),
        Refusal("a new label", label("example.com/team", "a"), "label example.com/team"),
        Refusal("GFD's label", label("nvidia.com/gpu.product", "B200"), "nvidia.com/gpu.product"),
        Refusal("a look-alike key", label("gpushare.dev.evil/x", "1"), "gpushare.dev.evil/x"),
        Refusal("a label removed", label("pool", None), f"{labels} pool"),
        Refusal(
            "ours and another",
            label_apply(node, {h.CONFIG_LABEL: "k", "pool": "b"}),
            f"{labels} pool",
            APPLY,
        ),
        Refusal(
            "an annotation",
            {"metadata": {"annotations": {"example.com/a": "x"}}},
            f"{OTHER}; refused: metadata.annotations",
        ),
        Refusal(
            "a finalizer",
            {"metadata": {"finalizers": ["example.com/hold"]}},
            "refused: metadata.finalizers",
        ),
        Refusal("a cordon", {"spec": {"unschedulable": True}}, "refused: spec.unschedulable"),
        Refusal("the pod CIDR", {"spec": {"podCIDR": "10.250.0.0/24"}}, "refused: spec.podCIDR"),
        Refusal(
            "the provider ID",
            {"spec": {"providerID": "aws:///us-east-1a/i-0f"}},
            "refused: spec.providerID",
        ),
        Refusal(
            "another taint",
            add_taint("example.com/evil", "NoSchedule"),
            f"{taints} [{DEDICATED}, example.com/evil:NoSchedule]",
            JSON,
        ),
        Refusal(
            "another's taint's effect",
            effect,
            f"{taints} [example.com/dedicated=training:PreferNoSchedule]",
            JSON,
        ),
        Refusal(
            "another's taint's value",
            [{"op": "replace", "path": "/spec/taints/0/value", "value": "inference"}],
            f"{taints} [example.com/dedicated=inference:NoSchedule]",
            JSON,
        ),
        Refusal(
            "another's taint removed",
            [{"op": "remove", "path": "/spec/taints/0"}],
            f"{taints} []",
            JSON,
        ),
        Refusal(
            "our key, effect NoExecute",
            add_taint(ours, "NoExecute"),
            f"{taints} [{DEDICATED}, {ours}:NoExecute]",
            JSON,
        ),
        Refusal("ours for another's", swap, f"{taints} []", JSON),
        Refusal(
            "its status",
            {"status": {"capacity": {"example.com/fake": "1"}}},
            f"{OTHER}; refused: status",
            subresource="status",
        ),
    ]


async def test_every_other_node_change_is_refused_with_the_guards_message(
    control_plane: ControlPlane,
    clients: tuple[RawClient, RawClient],
    nodes: list[str],
    namespace: str,
    release: str,
) -> None:
    admin, account = clients
    node = await create_node(admin, nodes, taints=[FOREIGN_TAINT])
    name = node["metadata"]["name"]
    username = f"system:serviceaccount:{namespace}:{release}-gpushare-operator"
    with nodeguard.node_status_granted(control_plane, username):
        await eventually(
            lambda: may(account, "patch", "nodes", "status"),
            what="RBAC to let the account patch nodes/status",
        )
        since = time.time()
        cases = refusals(node)
        for case in cases:
            path = f"/api/v1/nodes/{name}" + (f"/{case.subresource}" if case.subresource else "")
            query = params_for(case.content_type)
            status, answer = await account.patch(
                path, case.body, content_type=case.content_type, params=query
            )
            assert status == 403, (case.what, status, answer)
            assert answer["reason"] == "Forbidden", (case.what, answer)
            message = str(answer["message"])
            assert REFUSED in message and case.says in message, (case.what, message)
            # The same request is valid: as admin (a dry run) it goes through.
            status, dry = await admin.patch(
                path, case.body, content_type=case.content_type, params={**query, "dryRun": "All"}
            )
            assert status == 200, (case.what, dry)

    # Nothing changed: each of those requests was authorized, then refused at admission.
    events = await eventually(
        lambda: account_writes(control_plane, username, name, since),
        until=lambda found: len(found) == len(cases),
        what="every refused request in the audit log",
    )
    assert [e["responseStatus"]["code"] for e in events] == [403] * len(cases)
    assert {e["annotations"]["authorization.k8s.io/decision"] for e in events} == {"allow"}
    current = await h.ok(admin, "GET", f"/api/v1/nodes/{name}")
    assert current["metadata"]["resourceVersion"] == node["metadata"]["resourceVersion"]


async def test_the_policy_type_checks_against_the_node_schema(
    control_plane: ControlPlane, release: str
) -> None:
    """The API server type-checks the guard's validations against the Node schema
    (``status.typeChecking``) and finds nothing.  It skips rules it cannot resolve to one kind
    (a wildcard version) and then reports nothing whatever the typos, so an unbound copy of the
    guard (it admits and refuses nothing) with one typo'd field shows that the check ran."""
    name = f"{release}-gpushare-operator-node-guard"
    for checked in (f"{name}-labels", name):  # the operator's guard last: copied below
        guard = await nodeguard.type_checked(control_plane, checked)
        typing = guard["status"].get("typeChecking", {})
        assert "expressionWarnings" not in typing, (checked, guard["status"])
        assert not guard["status"].get("conditions") or all(
            c["status"] == "True" for c in guard["status"]["conditions"]
        ), guard["status"]

    typo = f"{name}-typo"
    spec = copy.deepcopy(guard["spec"])
    spec["validations"][0]["expression"] = "object.spec.unschedulabel != true"
    copied = {"apiVersion": guard["apiVersion"], "kind": guard["kind"], "metadata": {"name": typo}}
    status, raw = control_plane.request("POST", nodeguard.POLICIES, body={**copied, "spec": spec})
    assert status == 201, raw
    try:
        broken = await nodeguard.type_checked(control_plane, typo)
    finally:
        status, raw = control_plane.request("DELETE", f"{nodeguard.POLICIES}/{typo}")
        assert status == 200, raw
    [warning] = broken["status"]["typeChecking"]["expressionWarnings"]
    assert warning["fieldRef"] == "spec.validations[0].expression", warning
    assert "undefined field 'unschedulabel'" in warning["warning"], warning


async def test_more_label_keys_are_one_value(
    control_plane: ControlPlane,
    helm: Helm,
    clients: tuple[RawClient, RawClient],
    nodes: list[str],
    namespace: str,
    release: str,
) -> None:
    admin, account = clients
    node = await create_node(admin, nodes, taints=[])
    path = f"/api/v1/nodes/{node['metadata']['name']}"
    query = {**params_for(APPLY), "dryRun": "All"}
    # The MIG layout label is the operator's own: allowed without any value.
    mig = label_apply(node, {"nvidia.com/mig.config": "all-disabled"})
    status, answer = await account.patch(path, mig, content_type=APPLY, params=query)
    assert status == 200, answer
    extra = label_apply(node, {"nvidia.com/gpu.workload.config": "container"})
    status, answer = await account.patch(path, extra, content_type=APPLY, params=query)
    assert status == 403 and "refused: label nvidia.com/gpu.workload.config" in answer["message"]

    helm.run(
        "upgrade",
        release,
        str(CHART),
        "-n",
        namespace,
        "--reuse-values",
        "--set",
        "nodeGuard.extraLabelKeys={nvidia.com/gpu.workload.config}",
    )
    notes = helm.run("get", "notes", release, "-n", namespace).stdout
    assert "gpushare.dev/*, nvidia.com/gpu.workload.config) and its" in notes, notes
    await eventually(
        lambda: account.patch(path, extra, content_type=APPLY, params=query),
        until=lambda answer: answer[0] == 200,
        what="the upgraded guard to allow the extra label",
    )
    status, answer = await account.patch(
        path,
        label_apply(node, {"nvidia.com/mig.strategy": "mixed"}),
        content_type=APPLY,
        params=query,
    )
    assert status == 403 and "refused: label nvidia.com/mig.strategy" in answer["message"]


async def account_writes(
    plane: ControlPlane, username: str, node: str, since: float
) -> list[dict[str, Any]]:
    """The account's requests on ``node`` since ``since``, as the audit log has them (async:
    ``eventually`` awaits its probe)."""
    return [
        e
        for e in h.writes_to(h.operator_writes(plane, user=username), resource="nodes", name=node)
        if moment(e) >= since and e["stage"] == "ResponseComplete"
    ]


async def may(client: RawClient, verb: str, resource: str, subresource: str = "") -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {"verb": verb, "resource": resource, "subresource": subresource}
        },
    }
    answer = await h.ok(
        client, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review
    )
    return bool(answer["status"].get("allowed"))


# -- the label guard: nobody else writes gpushare.dev/ labels ------------------------------------

LABEL_GUARD = "gpushare node guard: only gpushare writes gpushare.dev/ labels on a Node"
SLOT_MEMORY = "gpushare.dev/slot-memory-mib"
SLOT_ISOLATION = "gpushare.dev/slot-isolation"


@dataclass(frozen=True)
class LabelRefusal:
    """A kubelet's write that sets, changes or removes a gpushare.dev/ label on its own Node,
    and the label the guard's message must name."""

    what: str
    body: Any
    label: str
    content_type: str = MERGE
    subresource: str = ""


def kubelet_refusals(node: str) -> list[LabelRefusal]:
    own = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    return [
        LabelRefusal("a bigger slot advertised", label(SLOT_MEMORY, "819200"), SLOT_MEMORY),
        LabelRefusal("a new slot label", label(SLOT_ISOLATION, "mps"), SLOT_ISOLATION),
        LabelRefusal("the policy label changed", label(h.POLICY_LABEL, "other"), h.POLICY_LABEL),
        LabelRefusal("the policy label removed", label(h.POLICY_LABEL, None), h.POLICY_LABEL),
        LabelRefusal("any other gpushare.dev/ key", label("gpushare.dev/x", "1"), "gpushare.dev/x"),
        LabelRefusal(
            "through nodes/status",
            label(SLOT_MEMORY, "819200"),
            SLOT_MEMORY,
            subresource="status",
        ),
        LabelRefusal(
            "by server-side apply",
            {**own, "metadata": {**own["metadata"], "labels": {SLOT_MEMORY: "819200"}}},
            SLOT_MEMORY,
            APPLY,
        ),
    ]


async def test_no_one_but_gpushare_writes_gpushare_labels_kubelets_included(
    control_plane: ControlPlane, clients: tuple[RawClient, RawClient], nodes: list[str]
) -> None:
    """A kubelet may label its own Node (NodeRestriction allows any key outside kubernetes.io
    and k8s.io), but not with gpushare.dev/ keys: not when it registers, not afterwards, not
    through nodes/status; the operator's own labels stay as it wrote them."""
    admin, account = clients
    node = await create_node(admin, nodes, taints=[])
    name = node["metadata"]["name"]
    ours = {h.POLICY_LABEL: "inference", SLOT_MEMORY: "20389"}
    node = await allowed(account, node, label_apply(node, ours), APPLY)
    user = f"system:node:{name}"
    async with RawClient(kubeconfig=nodeguard.kubelet(control_plane, name)) as kubelet:
        path = f"/api/v1/nodes/{name}"
        dry = {"fieldManager": "kubelet", "dryRun": "All"}
        # The kubelet's own labels, and its status, are its business.
        status, answer = await kubelet.patch(path, label("example.com/rack", "r7"), params=dry)
        assert status == 200, answer
        heartbeat = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        status, answer = await kubelet.patch(f"{path}/status", heartbeat, params=dry)
        assert status == 200, answer
        # The control plane holds kubelets as a cluster does: NodeRestriction keeps it to its
        # own Node (and away from node-restriction.kubernetes.io/ keys).
        status, answer = await kubelet.patch(
            "/api/v1/nodes/" + h.unique("elsewhere"), label("example.com/rack", "r7"), params=dry
        )
        assert status in (403, 404) and "guard" not in str(answer), answer
        restricted = label("node-restriction.kubernetes.io/pool", "a")
        status, answer = await kubelet.patch(path, restricted, params=dry)
        assert status == 403 and "is not allowed to modify labels" in answer["message"], answer

        since = time.time()
        cases = kubelet_refusals(name)
        for case in cases:
            target = path + (f"/{case.subresource}" if case.subresource else "")
            params = {
                "fieldManager": "kubelet",
                **({"force": "true"} if case.content_type == APPLY else {}),
            }
            status, answer = await kubelet.patch(
                target, case.body, content_type=case.content_type, params=params
            )
            assert status == 403, (case.what, status, answer)
            message = str(answer["message"])
            assert f"{LABEL_GUARD}; refused: label {case.label} by {user}" in message, (
                case.what,
                message,
            )
            # The same request is valid: as admin (a dry run) it goes through.
            status, dry_answer = await admin.patch(
                target, case.body, content_type=case.content_type, params={**params, **dry}
            )
            assert status == 200, (case.what, dry_answer)

        # Registering: a Node created with a gpushare.dev/ label is refused; without, admitted.
        joining = h.unique("joining")
        async with RawClient(kubeconfig=nodeguard.kubelet(control_plane, joining)) as newcomer:
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": joining}}
            labelled = {**body, "metadata": {**body["metadata"], "labels": {SLOT_MEMORY: "81920"}}}
            status, answer = await newcomer.post("/api/v1/nodes", labelled, params=dry)
            assert status == 403, answer
            assert f"refused: label {SLOT_MEMORY} by system:node:{joining}" in answer["message"]
            status, answer = await newcomer.post("/api/v1/nodes", body, params=dry)
            assert status == 201, answer

    # Each refusal was authorized (by the Node authorizer) and admitted by NodeRestriction,
    # which runs before the policies: the guard alone refused it, and nothing changed.
    events = await eventually(
        lambda: account_writes(control_plane, user, name, since),
        until=lambda found: len(found) == len(cases),
        what="every refused request in the audit log",
    )
    assert [e["responseStatus"]["code"] for e in events] == [403] * len(cases)
    assert {e["annotations"]["authorization.k8s.io/decision"] for e in events} == {"allow"}
    current = await h.ok(admin, "GET", f"/api/v1/nodes/{name}")
    assert current["metadata"]["resourceVersion"] == node["metadata"]["resourceVersion"]
    assert ours.items() <= current["metadata"]["labels"].items()


async def test_exempt_groups_are_a_value(
    control_plane: ControlPlane,
    helm: Helm,
    clients: tuple[RawClient, RawClient],
    nodes: list[str],
    namespace: str,
    release: str,
) -> None:
    """By default members of system:masters (the test admin) may still write gpushare.dev/
    labels; with nodeGuard.exemptGroups=[] nobody but the operator may."""
    admin, _ = clients
    node = await create_node(admin, nodes, taints=[])
    path = f"/api/v1/nodes/{node['metadata']['name']}"
    change = label(h.POLICY_LABEL, "by-hand")
    dry = {"dryRun": "All"}
    status, answer = await admin.patch(path, change, params=dry)
    assert status == 200, answer

    def upgrade(groups: str) -> None:
        helm.run(
            "upgrade",
            release,
            str(CHART),
            "-n",
            namespace,
            "--reuse-values",
            "--set-json",
            f"nodeGuard.exemptGroups={groups}",
        )

    upgrade("[]")
    try:
        status, answer = await eventually(
            lambda: admin.patch(path, change, params=dry),
            until=lambda answer: answer[0] == 403,
            what="the upgraded guard to refuse the admin",
        )
        by = "by gpushare-admin"
        assert f"{LABEL_GUARD}; refused: label {h.POLICY_LABEL} {by}" in answer["message"], answer
    finally:
        # Back to the default, so that the next test's admin is exempt again from the start.
        upgrade('["system:masters"]')
        await eventually(
            lambda: admin.patch(path, change, params=dry),
            until=lambda answer: answer[0] == 200,
            what="the admin exempt again",
        )

"""``kubectl gpushare`` cannot be turned against the cluster: hostile names, and RBAC that says no.

Judged from the API server's audit log, where the plugin's users are in the READS_AUDITED group
so that their reads are logged as well as their writes: a run refused before any request leaves
no event at all, and every event a run leaves is a read or carries ``dryRun=All``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from gpushare_testing import apiobjects as h
from gpushare_testing.components import READS_AUDITED
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.pluginruns import PLUGIN_ROLE, Run, plugin
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

FINALIZER = "gpushare.dev/release-nodes"
PLUGINS_AT_ONCE = 3  # plugin processes run side by side by hostile_runs
READS = frozenset({"get", "list", "watch"})
RBAC = "/apis/rbac.authorization.k8s.io/v1"
CONFIGMAP = "gpushare-device-plugin-configs"

# Each a name that, put raw into a path, changes the request; built on a real object's name so
# that what it reaches instead is that object.
HOSTILE: tuple[Callable[[str], str], ...] = (
    lambda real: f"{real}#",  # ?dryRun=All becomes a fragment, never sent
    lambda real: f"{real}?b",  # a query of its own, with dryRun=All lost inside it
    lambda real: f"{real}/b",  # a subresource
    lambda real: f"{real}%2Fb",  # the same, once the API server has decoded the path
    lambda real: "..",  # resolved away by the client: the API group's discovery document
    lambda real: "ünïcode",
    lambda real: f"{real}-{'x' * 300}"[:300],
)


@dataclass
class Hostile:
    args: tuple[str, ...]
    name: str
    run: Run


def audited_kubeconfig(plane: ControlPlane, user: str) -> Path:
    """A user whose every request is logged, and who may do anything while ``audited`` holds
    (a client certificate carries one group: READS_AUDITED, bound to cluster-admin)."""
    return plane.kubeconfig_for_user(user, groups=(READS_AUDITED,))


@pytest.fixture
async def audited(sim: GpuClusterSimulator) -> AsyncIterator[None]:
    """The READS_AUDITED group may do anything (as system:masters may) for the test's span."""
    name = h.unique("reads-audited-admin")
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": READS_AUDITED}
        ],
    }
    await h.ok(sim.client, "POST", f"{RBAC}/clusterrolebindings", binding)
    try:
        probe = h.unique("probe")
        await eventually(
            lambda: allowed(sim, probe, verb="delete", resource="nodes", groups=[READS_AUDITED]),
            what="cluster-admin for the READS_AUDITED group",
        )
        yield
    finally:
        await sim.client.delete(f"{RBAC}/clusterrolebindings/{name}")


def requests_of(plane: ControlPlane, user: str) -> list[dict[str, Any]]:
    """One audit event per request ``user`` sent (a watch is logged as it starts and ends)."""
    seen: dict[str, dict[str, Any]] = {}
    for event in plane.audit_events():
        if event["user"]["username"] == user:
            seen.setdefault(event["auditID"], event)
    return list(seen.values())


def dry_run(event: dict[str, Any]) -> bool:
    return parse_qs(urlsplit(event["requestURI"]).query).get("dryRun") == ["All"]


def neither_read_nor_dry_run(events: Iterable[dict[str, Any]]) -> list[str]:
    return [
        f"{e['verb']} {e['requestURI']} -> {(e.get('responseStatus') or {}).get('code')}"
        for e in events
        if e["verb"] not in READS and not dry_run(e)
    ]


async def all_logged(plane: ControlPlane) -> None:
    """Until everything sent so far is in the audit log: a request sent after it, by another
    audited user, is there (an event is written once its request is done)."""
    marker = h.unique("marker")
    run = await plugin(audited_kubeconfig(plane, marker), "status")
    assert run.code == 0, run.stderr

    async def logged() -> list[dict[str, Any]]:
        return requests_of(plane, marker)

    await eventually(logged, until=lambda events: len(events) > 0, what="the marker's requests")


async def ours(sim: GpuClusterSimulator, node: str) -> dict[str, str | None]:
    """The node's labels of ours: the policy that governs it and the config it carries."""
    labels = (await h.node(sim.client, node))["metadata"].get("labels") or {}
    return {key: labels.get(key) for key in (h.POLICY_LABEL, h.CONFIG_LABEL)}


async def hostile_runs(
    kubeconfig: Path, *, policy: str, node: str, pool: str, tmp_path: Path, common: Sequence[str]
) -> list[Hostile]:
    """``plan --delete``, ``plan -f`` and ``explain node`` with every hostile name.

    A few runs at a time: each is a process of its own, and one costs seconds of start-up;
    what any of them sends is judged from the audit log once they have all ended."""
    commands = []
    for index, hostile in enumerate(HOSTILE):
        bad_policy, bad_node = hostile(policy), hostile(node)
        manifest = tmp_path / f"hostile-{index}.yaml"
        manifest.write_text(yaml.safe_dump(h.policy(bad_policy, pool=pool, replicas=2)))
        commands += [
            (("plan", "--delete", bad_policy), bad_policy),
            (("plan", "-f", str(manifest)), bad_policy),
            (("explain", "node", bad_node), bad_node),
        ]
    at_once = asyncio.Semaphore(PLUGINS_AT_ONCE)

    async def run(args: tuple[str, ...], name: str) -> Hostile:
        async with at_once:
            return Hostile(args, name, await plugin(kubeconfig, *args, *common))

    return list(await asyncio.gather(*(run(args, name) for args, name in commands)))


async def test_hostile_names_are_refused_before_any_request_and_the_policy_keeps_its_nodes(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    start_operator: OperatorFactory,
    tmp_path: Path,
    audited: None,
) -> None:
    pool = h.unique("hostile")
    nodes = await sim.create_gpu_nodes(pool=pool, count=2, gpus=2)
    policy = h.unique("inference")
    await h.add_policy(sim, policies, h.policy(policy, pool=pool, replicas=2))
    await start_operator("--device-plugin-namespace", namespace)
    for node in nodes:
        await h.wait_phase(sim, node, "Verified")
    before = await eventually(
        lambda: h.get_policy(sim.client, policy),
        until=lambda b: FINALIZER in (b["metadata"].get("finalizers") or ()),
        what="the operator's finalizer on the policy",
    )
    labels = {n: await ours(sim, n) for n in nodes}
    user = h.unique("hostile-user")
    common = ("--device-plugin-namespace", namespace)

    runs = await hostile_runs(
        audited_kubeconfig(control_plane, user),
        policy=policy,
        node=nodes[0],
        pool=pool,
        tmp_path=tmp_path,
        common=common,
    )
    await all_logged(control_plane)

    # The policy first: on a plugin that sends a hostile name, it is being deleted by now.
    status, after = await sim.client.get(f"{h.API}/gpusharingpolicies/{policy}")
    assert status == 200, after
    assert "deletionTimestamp" not in after["metadata"], after["metadata"]
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert FINALIZER in after["metadata"]["finalizers"]
    for node in nodes:
        assert await ours(sim, node) == labels[node]
        assert h.phase_of(await h.node_state(sim.client, node)) == "Verified"
    deletions = [
        e
        for e in h.writes_to(
            control_plane.audit_events(), resource="gpusharingpolicies", name=policy
        )
        if e["verb"] == "delete"
    ]
    assert deletions == []
    # Not one request, not even a read: each name was refused before the cluster was reached.
    assert [f"{e['verb']} {e['requestURI']}" for e in requests_of(control_plane, user)] == []
    for hostile in runs:
        assert hostile.run.code == 1 and hostile.run.stdout == "", hostile
        [line] = hostile.run.stderr.splitlines()
        assert f"name {hostile.name[:60]!r}" in line and " is not valid (" in line, line
        assert "must be a DNS-1123 subdomain" in line, line


async def test_every_request_the_plugin_sends_is_a_read_or_a_dry_run(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    tmp_path: Path,
    audited: None,
) -> None:
    """Every command, with good names and hostile ones: nothing but reads and dry runs reaches
    the API server.  The good runs come first, and show that the log holds this user's reads
    and dry runs (of a create, an update and a delete)."""
    pool = h.unique("reads")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    policy = h.unique("inference")
    body = h.policy(policy, pool=pool, replicas=2)
    await h.add_policy(sim, policies, body)
    user = h.unique("audited")
    kubeconfig = audited_kubeconfig(control_plane, user)
    common = ("--device-plugin-namespace", namespace)
    edit = tmp_path / "edit.yaml"
    edit.write_text(yaml.safe_dump({**body, "spec": {**body["spec"], "replicas": 4}}))
    fresh = tmp_path / "fresh.yaml"
    fresh.write_text(yaml.safe_dump(h.policy(h.unique("fresh"), pool=pool)))
    for args in (
        ("plan", "--delete", policy),
        ("plan", "-f", str(edit), "-f", str(fresh)),
        ("status", "--policy", policy),
        ("explain", "node", node),
    ):
        run = await plugin(kubeconfig, *args, *common)
        assert run.code == 0, (args, run.stderr)
    await hostile_runs(
        kubeconfig, policy=policy, node=node, pool=pool, tmp_path=tmp_path, common=common
    )
    await all_logged(control_plane)

    sent = requests_of(control_plane, user)
    assert neither_read_nor_dry_run(sent) == []
    verbs = {e["verb"] for e in sent}
    assert verbs >= {"get", "create", "update", "delete"} and verbs & {"list", "watch"}, verbs
    status, _ = await sim.client.get(f"{h.API}/gpusharingpolicies/{policy}")
    assert status == 200


# -- permissions ----------------------------------------------------------------------------------


def without_configmaps(role: dict[str, Any]) -> dict[str, Any]:
    """The plugin's list-only role (test_kubectl_plugin) without a word about ConfigMaps."""
    rules = [
        {**rule, "resources": [r for r in rule["resources"] if r != "configmaps"]}
        for rule in role["rules"]
    ]
    return {**role, "rules": rules}


async def bind(
    sim: GpuClusterSimulator, rules: list[dict[str, Any]], user: str, *, namespace: str | None
) -> list[str]:
    """``rules`` for ``user`` (a ClusterRole, or a Role in ``namespace``); what to delete after."""
    where = f"{RBAC}/namespaces/{namespace}" if namespace else RBAC
    kind = "Role" if namespace else "ClusterRole"
    name = h.unique("plugin-role")
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "rules": rules}
    await h.ok(sim.client, "POST", f"{where}/{kind.lower()}s", {**role, "metadata": {"name": name}})
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": f"{kind}Binding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    await h.ok(sim.client, "POST", f"{where}/{kind.lower()}bindings", binding)
    return [f"{where}/{kind.lower()}bindings/{name}", f"{where}/{kind.lower()}s/{name}"]


async def allowed(
    sim: GpuClusterSimulator,
    user: str,
    *,
    verb: str,
    resource: str,
    group: str = "",
    groups: Sequence[str] = (),
    **where: str,
) -> bool:
    """Whether the API server's authorizer lets ``user`` (in ``groups``) do it now (a
    SubjectAccessReview)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": list(groups),
            "resourceAttributes": {"verb": verb, "resource": resource, "group": group, **where},
        },
    }
    path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    answer = await h.ok(sim.client, "POST", path, review)
    return bool(answer["status"].get("allowed"))


async def test_a_user_who_may_not_read_the_configmap_is_told_which_permission_not_given_a_plan(
    control_plane: ControlPlane,
    sim: GpuClusterSimulator,
    namespace: str,
    policies: list[str],
    tmp_path: Path,
) -> None:
    pool = h.unique("noconfig")
    [node] = await sim.create_gpu_nodes(pool=pool, count=1, gpus=2)
    name = h.unique("noconfig")
    body = h.policy(name, pool=pool, replicas=2)
    await h.add_policy(sim, policies, body)
    manifest = tmp_path / "edit.yaml"
    manifest.write_text(yaml.safe_dump({**body, "spec": {**body["spec"], "replicas": 4}}))
    user = h.unique("noconfig-user")
    kubeconfig = control_plane.kubeconfig_for_user(user)
    common = ("--device-plugin-namespace", namespace)
    created = await bind(sim, without_configmaps(PLUGIN_ROLE)["rules"], user, namespace=None)
    try:
        await eventually(
            lambda: allowed(sim, user, verb="list", resource="pods"), what="the ClusterRole"
        )
        for args in (("plan", "-f", str(manifest)), ("status",), ("explain", "node", node)):
            run = await plugin(kubeconfig, *args, *common)
            assert run.code == 1 and run.stdout == "", (args, run)
            lines = run.stderr.splitlines()
            assert lines[0] == (
                f'error: missing permission: get configmaps "{CONFIGMAP}" in namespace'
                f' "{namespace}" (needed for the device-plugin ConfigMap: which config keys'
                " exist and have propagated)"
            ), run.stderr
            assert lines[1] == (
                f"  check with: kubectl auth can-i get configmaps/{CONFIGMAP} -n {namespace}"
            )
            assert lines[2].startswith(f'Error from server (Forbidden): configmaps "{CONFIGMAP}"')

        # That permission, and only it, was missing: granted in the namespace, the plan is made.
        reader = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]
        created += await bind(sim, reader, user, namespace=namespace)
        await eventually(
            lambda: allowed(sim, user, verb="get", resource="configmaps", namespace=namespace),
            what="the Role",
        )
        granted = await plugin(kubeconfig, "plan", "-f", str(manifest), "-o", "json", *common)
        assert granted.code == 0, granted.stderr
        assert node in {n["name"] for n in granted.json()["nodes"]}
    finally:
        for path in reversed(created):
            await sim.client.delete(path)

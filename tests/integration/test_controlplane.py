"""The local control plane is a real one: watches, RBAC, tokens, audit, clean teardown."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from gpushare_operator.kube import connection
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.waiting import eventually


async def _collect_configmap_events(
    api: client.ApiClient, namespace: str, seen: list[tuple[str, str]], ready: asyncio.Event
) -> None:
    core = client.CoreV1Api(api)
    listed = await core.list_namespaced_config_map(namespace)
    ready.set()
    async with watch.Watch().stream(
        core.list_namespaced_config_map,
        namespace,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=30,
    ) as stream:
        async for event in stream:
            name = event["object"].metadata.name
            if name.startswith("smoke"):
                seen.append((event["type"], name))
            if event["type"] == "DELETED":
                return


async def test_namespace_and_configmap_lifecycle_is_watched(kube_api: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_api)
    ns = "smoke-lifecycle"
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    seen: list[tuple[str, str]] = []
    ready = asyncio.Event()
    watcher = asyncio.create_task(_collect_configmap_events(kube_api, ns, seen, ready))
    await ready.wait()
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="smoke"), data={"a": "1"})
    await core.create_namespaced_config_map(ns, body)
    await core.patch_namespaced_config_map("smoke", ns, {"data": {"a": "2"}})
    await core.delete_namespaced_config_map("smoke", ns)
    await asyncio.wait_for(watcher, timeout=30)
    assert seen == [("ADDED", "smoke"), ("MODIFIED", "smoke"), ("DELETED", "smoke")]

    # Namespace deletion only completes if the controller manager's namespace loop runs.
    await core.delete_namespace(ns)

    async def namespace_status() -> int:
        try:
            await core.read_namespace(ns)
        except ApiException as exc:
            return int(exc.status)
        return 200

    await eventually(namespace_status, until=lambda s: s == 404, timeout=60, what="ns gone")


async def _client_for(kubeconfig: str) -> client.ApiClient:
    return connection.api_client(await connection.load_configuration(kubeconfig=kubeconfig))


async def test_rbac_is_enforced_for_an_unbound_user(control_plane: ControlPlane) -> None:
    kubeconfig = control_plane.kubeconfig_for_user("nobody", groups=("some-team",))
    async with await _client_for(str(kubeconfig)) as api:
        with pytest.raises(ApiException) as refused:
            await client.CoreV1Api(api).list_node()
    assert refused.value.status == 403
    assert "nobody" in refused.value.body


async def test_service_account_token_authenticates(
    control_plane: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    sa = client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="robot"))
    await core.create_namespaced_service_account(namespace, sa)
    token = control_plane.service_account_token(namespace=namespace, name="robot")
    kubeconfig = control_plane.kubeconfig_for_token(token, name="robot")
    async with await _client_for(str(kubeconfig)) as api:
        review = await client.AuthenticationV1Api(api).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        with pytest.raises(ApiException) as refused:
            await client.CoreV1Api(api).list_node()
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:robot"
    assert refused.value.status == 403


async def test_audit_log_records_who_wrote_what(
    control_plane: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube_api)
    role = client.V1Role(
        metadata=client.V1ObjectMeta(name="cm-writer"),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["create"])],
    )
    await rbac.create_namespaced_role(namespace, role)
    binding: dict[str, Any] = {
        "metadata": {"name": "cm-writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-writer"},
        "subjects": [{"kind": "User", "name": "writer", "apiGroup": "rbac.authorization.k8s.io"}],
    }
    await rbac.create_namespaced_role_binding(namespace, binding)
    kubeconfig = control_plane.kubeconfig_for_user("writer")
    async with await _client_for(str(kubeconfig)) as api:
        cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="audited"), data={"k": "v"})
        await client.CoreV1Api(api).create_namespaced_config_map(namespace, cm)

    async def matching() -> list[dict[str, Any]]:
        return [
            e
            for e in control_plane.audit_events()
            if e["user"]["username"] == "writer"
            and e["verb"] == "create"
            and e["objectRef"].get("name") == "audited"
            and e["objectRef"].get("namespace") == namespace
        ]

    events = await eventually(matching, timeout=10, what="audit event")
    assert len(events) == 1
    assert events[0]["objectRef"]["resource"] == "configmaps"
    assert events[0]["responseStatus"]["code"] == 201


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def test_no_orphans_when_the_owner_is_killed(control_plane: ControlPlane) -> None:
    """SIGKILL of the process that started a control plane takes its children with it."""
    script = (
        "import pathlib, time\n"
        "from gpushare_testing.controlplane import ControlPlane\n"
        f"plane = ControlPlane(bin_dir=pathlib.Path({str(control_plane.bin_dir)!r}))\n"
        "plane.start()\n"
        "print(' '.join(str(p) for p in plane.pids().values()), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    pids = [int(p) for p in owner.stdout.readline().split()]
    assert len(pids) == 4  # etcd, kube-apiserver, kube-controller-manager, kube-scheduler
    assert all(_alive(pid) for pid in pids)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    owner.stdout.close()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)]

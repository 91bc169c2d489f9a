"""Least privilege, proven: the operator runs as the chart's ServiceAccount, and that is enough.

The chart is installed with the real ``helm``; a token for its ServiceAccount is minted with
the TokenRequest API; the operator process runs with that token through the whole reconcile and
usage scenario, with the memory-request webhook on (its Secret made, the configuration's
caBundle published).  Then the same identity is shown to be refused what it must never do.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import podbodies, webhooks
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.helm import Helm
from gpushare_testing.operators import OperatorFactory, RunningOperator
from gpushare_testing.simulator import GpuClusterSimulator, RawClient
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"

# Writes the operator may make, as (resource, subresource, verb) in the audit log.
ALLOWED_WRITES = {
    ("nodes", "", "patch"),
    ("gpunodestates", "", "create"),
    ("gpunodestates", "status", "patch"),
    ("gpusharingpolicies", "status", "patch"),
    ("gpusharingpolicies", "", "patch"),  # our finalizer only (see the audit check below)
    ("configmaps", "", "patch"),
    ("events", "", "create"),
    ("pods", "eviction", "create"),  # podPolicy Evict: never a delete
    ("leases", "", "create"),
    ("leases", "", "update"),
    ("secrets", "", "create"),  # the webhook's serving certificate, then patched by name
    ("secrets", "", "patch"),
    ("mutatingwebhookconfigurations", "", "patch"),  # its caBundle
}


SIX_OF_32 = {"capacity": 32, "allocated": 6}


def _totals(slots: Any) -> dict[str, Any]:
    """A status's slot totals (its per-class breakdown, slots.classes, aside)."""
    return {k: v for k, v in (slots or {}).items() if k in ("capacity", "allocated")}


def pod_body(name: str, *, node: str, namespace: str, count: int) -> dict[str, Any]:
    """A shared-GPU pod as a controller would create it (the ReplicaSet itself is not here)."""
    body = podbodies.shared_gpu_pod(
        name=name, node=node, namespace=namespace, count=count, managed_fields=False
    )
    metadata = body["metadata"]
    for key in ("uid", "creationTimestamp", "ownerReferences", "generateName"):
        metadata.pop(key, None)
    body.pop("status")
    return body


async def run_pod(client: RawClient, name: str, *, node: str, namespace: str, count: int) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    await h.ok(client, "POST", path, pod_body(name, node=node, namespace=namespace, count=count))
    await h.ok(client, "PATCH", f"{path}/{name}/status", {"status": {"phase": "Running"}})


async def test_operator_runs_as_the_chart_service_account_and_can_do_nothing_else(
    control_plane: ControlPlane,
    helm: Helm,
    namespace: str,
    plugin_namespace: str,
    release: str,
    start_operator: OperatorFactory,
) -> None:
    account = f"{release}-gpushare-operator"
    username = f"system:serviceaccount:{namespace}:{account}"
    token = control_plane.service_account_token(namespace=namespace, name=account)
    kubeconfig = control_plane.kubeconfig_for_token(token, name=f"{namespace}-{account}")

    async with (
        GpuClusterSimulator(
            kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_namespace
        ) as sim,
        RawClient(kubeconfig=kubeconfig) as as_operator,
    ):
        admin = sim.client
        pool = h.unique("rbac")
        nodes = await sim.create_gpu_nodes(pool=pool, count=2, gpus=4)
        policy = h.unique("p")
        await h.create_policy(admin, h.policy(policy, pool=pool, replicas=4, renameByDefault=True))
        pods = [(h.unique("vllm"), nodes[0], 1), (h.unique("vllm"), nodes[0], 2)]
        pods.append((h.unique("vllm"), nodes[1], 3))
        operator: RunningOperator | None = None
        try:
            operator = await start_operator(
                "--namespace",
                namespace,
                "--device-plugin-namespace",
                plugin_namespace,
                "--config-propagation-delay",
                "1",
                # The webhook, named as the chart names it (127.0.0.1: no Service here).
                "--webhook-port",
                str(free_port()),
                "--webhook-hosts",
                "127.0.0.1",
                "--webhook-secret",
                f"{account}-webhook-tls",
                "--webhook-configuration",
                account,
                "--webhook-service",
                f"{account}-webhook",
                kubeconfig=kubeconfig,
                user=username,
            )
            for node in nodes:
                await eventually(
                    functools.partial(h.node_state, admin, node),
                    until=lambda s: (s or {}).get("status", {}).get("phase") == "Verified",
                    timeout=60,
                    what=f"{node} Verified",
                )
            for name, node, count in pods:
                await run_pod(admin, name, node=node, namespace=namespace, count=count)
            body = await eventually(
                lambda: h.get_policy(admin, policy),
                until=lambda b: (
                    _totals((b.get("status") or {}).get("slots"))
                    == {"capacity": 32, "allocated": 6}
                ),
                timeout=60,
                what="6 of 32 slots allocated",
            )
            assert body["status"]["verifiedNodes"] == 2
            for node, allocated in ((nodes[0], 3), (nodes[1], 3)):
                state = await h.node_state(admin, node)
                assert state is not None
                assert _totals(state["status"]["slots"]) == {"capacity": 16, "allocated": allocated}
            data = await h.config_data(admin, plugin_namespace)
            assert data is not None
            assert body["status"]["configKey"] in data

            # The webhook's certificate: its Secret made, and the chart's configuration given
            # the CA bundle, with the chart's permissions alone.
            assert await webhooks.wait_published(sim, account)
            secret = await h.ok(
                admin, "GET", f"/api/v1/namespaces/{namespace}/secrets/{account}-webhook-tls"
            )
            assert secret["type"] == "kubernetes.io/tls"

            # Leadership and Events, in the namespaces the chart's Roles cover.
            lease = await h.ok(
                admin,
                "GET",
                f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/gpushare-operator",
            )
            assert lease["spec"]["holderIdentity"]
            announced = await eventually(
                lambda: h.events_about(admin, policy),
                until=lambda es: any(e["reason"] == "ConfigKeyWritten" for e in es),
                what="a ConfigKeyWritten event",
            )
            assert {e["metadata"]["namespace"] for e in announced} == {"default"}
            leadership = await h.events_about(admin, "gpushare-operator")
            assert any(
                e["reason"] == "LeaderElected" and e["metadata"]["namespace"] == namespace
                for e in leadership
            ), leadership

            # podPolicy Evict: the pods hold nvidia.com/gpu.shared, which the config stops
            # advertising; the chart's identity evicts them (and leaves an Event on each).
            rollout = {"podPolicy": "Evict", "maxUnavailable": 2, "canary": 0}
            await h.patch_policy(admin, policy, {"renameByDefault": False, "rollout": rollout})
            for name, _, _ in pods:
                await eventually(
                    lambda name=name: admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}"),
                    until=lambda answer: answer[0] == 404,
                    timeout=90,
                    what=f"{name} evicted and gone",
                )
            evicted = await eventually(
                lambda: h.ok(admin, "GET", f"/api/v1/namespaces/{namespace}/events"),
                until=lambda body: sum(e["reason"] == "Evicted" for e in body["items"]) == 3,
                what="an Evicted Event on each pod, in its namespace",
            )
            assert {
                e["involvedObject"]["name"] for e in evicted["items"] if e["reason"] == "Evicted"
            } == {name for name, _, _ in pods}

            await assert_refused(
                as_operator,
                admin,
                namespace,
                plugin_namespace,
                nodes[0],
                secret=f"{account}-webhook-tls",
                configuration=account,
            )

            logs = operator.logs()
            # A refusal would log its status code; a timestamp's microseconds may hold "403".
            assert re.search(r"\b403\b", logs) is None, logs
            assert "forbidden" not in logs.lower()
            assert operator.stop() == 0
        finally:
            if operator is not None:
                operator.stop()  # before the simulator deletes its nodes
            for name, _, _ in pods:
                await admin.delete(
                    f"/api/v1/namespaces/{namespace}/pods/{name}",
                    params={"gracePeriodSeconds": "0"},
                )
            await h.delete_policy(admin, policy)

    # What the identity wrote is all in the chart's list, and it was refused only the probes.
    writes = h.operator_writes(control_plane, user=username)
    done = {
        (w["objectRef"]["resource"], w["objectRef"].get("subresource", ""), w["verb"])
        for w in writes
        if w["responseStatus"]["code"] < 400
    }
    assert done <= ALLOWED_WRITES, done - ALLOWED_WRITES
    assert {("nodes", "", "patch"), ("configmaps", "", "patch"), ("leases", "", "create")} <= done
    assert {("secrets", "", "create"), ("mutatingwebhookconfigurations", "", "patch")} <= done
    # Patching a policy itself is allowed only for our finalizer: every such patch is a JSON
    # patch of /metadata/finalizers and nothing else.
    policy_patches = [
        w["requestObject"]
        for w in writes
        if w["objectRef"]["resource"] == "gpusharingpolicies"
        and not w["objectRef"].get("subresource")
    ]
    assert policy_patches, "the finalizer was set"
    assert {op["path"].split("/")[2] for patch in policy_patches for op in patch} == {"finalizers"}
    refused = [w["requestURI"] for w in writes if w["responseStatus"]["code"] == 403]
    assert refused, "the probes' refusals are audited"
    assert all("dryRun=All" in uri for uri in refused), refused


async def assert_refused(
    client: RawClient,
    admin: RawClient,
    namespace: str,
    plugin_namespace: str,
    node: str,
    *,
    secret: str,
    configuration: str,
) -> None:
    """The operator's identity is refused (403) everything it has no business doing."""
    # Sanity: the token works, and it does get what it needs.
    status, current = await client.get(f"/api/v1/nodes/{node}")
    assert status == 200, current
    status, _ = await client.get(
        f"/api/v1/namespaces/{plugin_namespace}/configmaps/gpushare-device-plugin-configs"
    )
    assert status == 200
    status, _ = await client.get(f"/api/v1/namespaces/{namespace}/secrets/{secret}")
    assert status == 200
    status, _ = await client.get(f"{webhooks.CONFIGURATIONS}/{configuration}")
    assert status == 200

    other = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}}
    await h.ok(
        admin,
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        {**other, "metadata": {"name": "rbac-probe-existing"}},
    )
    dry = {"dryRun": "All"}
    apply = {"fieldManager": "gpushare-operator", "force": "true", "dryRun": "All"}

    def configmap(name: str, ns: str) -> dict[str, Any]:
        return {**other, "metadata": {"name": name, "namespace": ns}}

    probes: list[tuple[str, str, Any, dict[str, str], str]] = [
        # Nodes: labels by patch only; never delete, update or status.
        ("DELETE", f"/api/v1/nodes/{node}", None, dry, MERGE),
        ("PUT", f"/api/v1/nodes/{node}", current, dry, "application/json"),
        ("PATCH", f"/api/v1/nodes/{node}/status", {"status": {"phase": "x"}}, dry, MERGE),
        # Secrets: the webhook's own alone, by name, never deleted; no other, anywhere.
        ("GET", "/api/v1/secrets", None, {}, MERGE),
        ("GET", f"/api/v1/namespaces/{namespace}/secrets", None, {}, MERGE),
        ("GET", f"/api/v1/namespaces/{namespace}/secrets/other-tls", None, {}, MERGE),
        ("DELETE", f"/api/v1/namespaces/{namespace}/secrets/{secret}", None, dry, MERGE),
        ("GET", f"/api/v1/namespaces/{plugin_namespace}/secrets", None, {}, MERGE),
        ("GET", "/api/v1/namespaces/kube-system/secrets", None, {}, MERGE),
        # Webhook configurations: its caBundle alone (RBAC narrows the patch to the one
        # configuration, the chart's webhook guard to its caBundle); never another one, never
        # created.
        (
            "PATCH",
            f"{webhooks.CONFIGURATIONS}/{configuration}",
            [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}],
            dry,
            "application/json-patch+json",
        ),
        ("GET", webhooks.CONFIGURATIONS, None, {}, MERGE),
        ("GET", f"{webhooks.CONFIGURATIONS}/other", None, {}, MERGE),
        ("DELETE", f"{webhooks.CONFIGURATIONS}/{configuration}", None, dry, MERGE),
        (
            "POST",
            webhooks.CONFIGURATIONS,
            webhooks.configuration("rbac-probe", port=1),
            dry,
            "application/json",
        ),
        # ConfigMaps outside the device plugin's namespace, or another name inside it.
        (
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            configmap("rbac-probe", namespace),
            dry,
            "application/json",
        ),
        (
            "PATCH",
            f"/api/v1/namespaces/{namespace}/configmaps/rbac-probe-existing",
            {"data": {"k": "changed"}},
            dry,
            MERGE,
        ),
        (
            "PATCH",
            f"/api/v1/namespaces/{namespace}/configmaps/rbac-probe",
            configmap("rbac-probe", namespace),
            apply,
            APPLY,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/configmaps/rbac-probe",
            configmap("rbac-probe", "default"),
            apply,
            APPLY,
        ),
        (
            "POST",
            f"/api/v1/namespaces/{plugin_namespace}/configmaps",
            configmap("rbac-probe", plugin_namespace),
            dry,
            "application/json",
        ),
        (
            "PATCH",
            f"/api/v1/namespaces/{plugin_namespace}/configmaps/rbac-probe",
            configmap("rbac-probe", plugin_namespace),
            apply,
            APPLY,
        ),
        (
            "DELETE",
            f"/api/v1/namespaces/{plugin_namespace}/configmaps/gpushare-device-plugin-configs",
            None,
            dry,
            MERGE,
        ),
        ("GET", "/api/v1/configmaps", None, {}, MERGE),
        # Policies are the users': the operator may patch them (RBAC cannot narrow a patch to
        # metadata.finalizers), and the audit check shows it only ever touches its finalizer.
        ("DELETE", f"{h.API}/gpunodestates/{node}", None, dry, MERGE),
        # Pods are only read; the Lease only in its own namespace.
        ("DELETE", f"/api/v1/namespaces/{namespace}/pods/rbac-probe", None, dry, MERGE),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases/gpushare-operator",
            None,
            {},
            MERGE,
        ),
        (
            "DELETE",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/gpushare-operator",
            None,
            dry,
            MERGE,
        ),
    ]
    answers = []
    for method, path, body, params, content_type in probes:
        status, _ = await client.request(
            method, path, body, params=params, content_type=content_type
        )
        answers.append((status, method, path))
    assert [a for a in answers if a[0] != 403] == []

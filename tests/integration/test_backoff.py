"""Refused writes back off instead of looping: RBAC for node patches revoked mid-rollout.

The operator runs as the chart's ServiceAccount.  Early in a rollout over 250 nodes the chart's
ClusterRole loses ``patch`` on nodes; every label write is then answered 403.  Counted in the
API server's audit log: the refused writes thin out window by window (the per-object
back-off), the ConfigMap and the policies' statuses keep being written, the Lease keeps its
holder, and once the permission is back every node converges within one back-off cap.

The sizes keep the shape of the case (first the refusals fill the write budget, --write-qps,
100/s; then each node's back-off thins them out towards one refusal per half cap) in 60 s of
counted windows rather than 100: half the nodes and half the cap of the first version (500,
60 s) keep what the refusals take at first over what they take at the end,
``QPS * CAP / (2 * NODES)``, at 6.  The budget stays full for about 30 s (each node is refused
once per ``NODES / QPS`` seconds until its back-off outgrows that), so the last window, 48 s
after the revocation, is well into the thinning (the first version's began at 80 s, its budget
full for about 65 s).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.simulator import GpuClusterSimulator
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

NODES = 250
CAP = 30.0  # --write-backoff-cap for this test (300 s by default)
WINDOW = CAP / 2.5  # seconds per window of counted writes
WINDOWS = 5  # the last window starts a full cap after the revocation
RBAC = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{}/leases/gpushare-operator"


def _when(event: dict[str, Any]) -> float:
    stamp = event["requestReceivedTimestamp"].replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def _writes(plane: ControlPlane, user: str, resource: str) -> list[dict[str, Any]]:
    return [
        e
        for e in plane.audit_events()
        if e["user"]["username"] == user and e["objectRef"].get("resource") == resource
    ]


def _node_patch_verbs(plane: ControlPlane, role: str, *, allow: bool) -> None:
    status, raw = plane.request("GET", f"{RBAC}/{role}")
    assert status == 200, raw
    body = json.loads(raw)
    for rule in body["rules"]:
        if rule.get("resources") == ["nodes"]:
            verbs = [v for v in rule["verbs"] if v != "patch"]
            rule["verbs"] = [*verbs, "patch"] if allow else verbs
    status, raw = plane.request("PUT", f"{RBAC}/{role}", body=body)
    assert status == 200, raw


async def test_refused_node_writes_back_off_and_recover(
    control_plane: ControlPlane,
    namespace: str,
    plugin_namespace: str,
    release: str,
    start_operator: OperatorFactory,
) -> None:
    account = f"{release}-gpushare-operator"
    user = f"system:serviceaccount:{namespace}:{account}"
    token = control_plane.service_account_token(namespace=namespace, name=account)
    kubeconfig = control_plane.kubeconfig_for_token(token, name=f"{namespace}-{account}")
    async with GpuClusterSimulator(
        kubeconfig=control_plane.admin_kubeconfig, namespace=plugin_namespace
    ) as sim:
        pool, other = h.unique("many"), h.unique("other")
        nodes = await sim.create_gpu_nodes(pool=pool, count=NODES, gpus=1)
        await sim.create_gpu_nodes(pool=other, count=1, gpus=1)
        rolled, edited = h.unique("rolled"), h.unique("edited")
        created = [rolled, edited]
        await h.create_policy(sim.client, h.policy(rolled, pool=pool, replicas=2))
        await h.create_policy(sim.client, h.policy(edited, pool=other, replicas=2))
        try:
            await start_operator(
                "--namespace",
                namespace,
                "--device-plugin-namespace",
                plugin_namespace,
                "--write-backoff-cap",
                str(CAP),
                kubeconfig=kubeconfig,
                user=user,
            )
            for node in nodes:  # a first rollout, all the way
                await eventually(
                    lambda node=node: h.node_state(sim.client, node),
                    until=lambda s: (s or {}).get("status", {}).get("phase") == "Verified",
                    timeout=120,
                    interval=0.5,
                    what=f"{node} Verified",
                )
            first = len(_writes(control_plane, user, "nodes"))
            await h.patch_policy(sim.client, rolled, {"replicas": 4})  # the second one
            await eventually(
                lambda: asyncio.sleep(0, len(_writes(control_plane, user, "nodes")) - first),
                until=lambda count: count >= NODES // 10,
                timeout=60,
                what="the second rollout under way",
            )
            _node_patch_verbs(control_plane, account, allow=False)
            revoked = time.time()
            lease_path = LEASES.format(namespace)  # the operator's --namespace
            holder = (await h.ok(sim.client, "GET", lease_path))["spec"]
            # Another policy edited meanwhile: its new key must still reach the ConfigMap.
            await asyncio.sleep(WINDOW / 2)
            await h.patch_policy(sim.client, edited, {"replicas": 3})
            await asyncio.sleep(WINDOWS * WINDOW - WINDOW / 2)
            refused = [
                e
                for e in _writes(control_plane, user, "nodes")
                if e["responseStatus"]["code"] == 403 and _when(e) >= revoked
            ]
            windows = [
                sum(
                    1
                    for e in refused
                    if revoked + i * WINDOW <= _when(e) < revoked + (i + 1) * WINDOW
                )
                for i in range(WINDOWS)
            ]
            print(f"refused node writes per {WINDOW:.0f} s window: {windows}")
            # First the refusals take the whole write budget (the token bucket holds them to
            # --write-qps), then each node's back-off thins them out, to about one per node
            # and half a cap at the end.
            assert windows[-1] < max(windows) / 3, windows
            assert windows[-1] <= windows[-2], windows
            assert windows[-1] <= 2 * NODES * WINDOW / (CAP / 2), windows
            after = [e for e in control_plane.audit_events() if _when(e) >= revoked]
            ours = [e for e in after if e["user"]["username"] == user]
            assert any(
                e["objectRef"].get("resource") == "configmaps"
                and e["responseStatus"]["code"] == 200
                for e in ours
            ), "the edited policy's key was never written"
            assert any(
                e["objectRef"].get("resource") == "gpusharingpolicies"
                and e["responseStatus"]["code"] == 200
                for e in ours
            ), "no policy status was written while node writes were refused"
            lease = (await h.ok(sim.client, "GET", lease_path))["spec"]
            assert lease["holderIdentity"] == holder["holderIdentity"]
            assert lease.get("leaseTransitions") == holder.get("leaseTransitions")
            state = await h.node_state(sim.client, nodes[-1])
            assert state is not None
            refusal = h.condition(state["status"], "WriteFailed")
            if state["status"].get("phase") != "Verified":  # not labelled before the revoke
                assert "403" in refusal.get("message", ""), state["status"]

            _node_patch_verbs(control_plane, account, allow=True)
            restored = time.monotonic()
            for node in nodes:
                await eventually(
                    lambda node=node: h.node_state(sim.client, node),
                    until=lambda s: (s or {}).get("status", {}).get("phase") == "Verified",
                    timeout=CAP + 60,
                    interval=0.5,
                    what=f"{node} Verified once RBAC is back",
                )
            print(f"converged {time.monotonic() - restored:.1f} s after RBAC came back")
            assert time.monotonic() - restored <= CAP + 60
        finally:
            _node_patch_verbs(control_plane, account, allow=True)
            for name in created:
                await h.delete_policy(sim.client, name)

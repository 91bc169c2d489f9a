"""How ``ControlPlane`` runs each binary: the flags, as pure functions of paths and ports.

Split from ``controlplane`` (which owns the processes, their lifecycle and the client side) so
that each module stays small; nothing here starts anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

__all__ = [
    "AUDIT_POLICY",
    "READS_AUDITED",
    "apiserver_args",
    "controller_manager_args",
    "etcd_args",
    "scheduler_args",
]

# A group whose every request is logged, reads included: for a test that must show from the log
# that a client sent nothing at all, or nothing but reads (kubectl gpushare's safety tests).
READS_AUDITED: Final = "gpushare-testing:reads-audited"

# Writes are logged with who made them; reads are not (a watch-heavy test would drown the log),
# but those of the READS_AUDITED group and lists of pods.
AUDIT_POLICY: Final[dict[str, Any]] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": [READS_AUDITED]},
        # Lists of pods, with their query but no body: which node's pods a client looked at
        # (before a MIG layout the operator lists the pods bound to the node, test_mig_idle).
        {
            "level": "Metadata",
            "verbs": ["list"],
            "resources": [{"group": "", "resources": ["pods"]}],
        },
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {
            "level": "None",
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
            "users": ["system:kube-controller-manager", "system:apiserver"],
        },
        # With their bodies: what a label, taint, phase, binding or disruption budget was at
        # each moment (the rollout and eviction tests read them back).
        {
            "level": "Request",
            "resources": [
                # nodes/status too: the device plugin's allocatable, which the rollout
                # promise's checker reads (a resource rule does not cover its subresources).
                {"group": "", "resources": ["nodes", "nodes/status", "pods/binding"]},
                # What each eviction asked for (its deleteOptions: grace period, preconditions).
                {"group": "", "resources": ["pods/eviction"]},
                {"group": "gpushare.dev", "resources": ["gpunodestates/status"]},
                {"group": "gpushare.dev", "resources": ["gpusharingpolicies"]},
                # What the disruption controller said a PDB allowed at each moment.
                {"group": "policy", "resources": ["poddisruptionbudgets/status"]},
                # Which node a DRA kubelet plugin's ResourceSlice was for, and our DeviceClasses.
                {"group": "resource.k8s.io", "resources": ["resourceslices", "deviceclasses"]},
                # The webhook's certificate and CA bundle as the leader wrote them (test keys
                # only: a cluster's audit policy would log Secrets at Metadata at most).
                {"group": "", "resources": ["secrets"]},
                {
                    "group": "admissionregistration.k8s.io",
                    "resources": ["mutatingwebhookconfigurations"],
                },
            ],
        },
        {"level": "Metadata"},
    ],
}


def etcd_args(*, data_dir: Path, port: int, peer_port: int) -> list[str]:
    """A single-member etcd on loopback; no fsync (a test cluster is thrown away anyway)."""
    client = f"http://127.0.0.1:{port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
        "--quota-backend-bytes=8589934592",
    ]


def apiserver_args(
    *, workdir: Path, etcd_port: int, port: int, audit_log: Path, extra: tuple[str, ...]
) -> list[str]:
    """kube-apiserver with client-cert auth, Node and RBAC authorization, bound ServiceAccount
    tokens and an audit log."""
    pki = workdir / "pki"
    return [
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        "--endpoint-reconciler-type=none",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        # As every cluster runs it: kubelets (system:node:<name>) are authorized by the Node
        # authorizer and held to their own Node by NodeRestriction, so that what a kubelet may
        # still do to its Node (set labels outside kubernetes.io) is what the tests meet.
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/16",
        # The controller manager here runs no ServiceAccount controller, so no namespace gets
        # its `default` ServiceAccount; this plugin would refuse every pod of a new namespace.
        "--disable-admission-plugins=ServiceAccount",
        f"--audit-policy-file={workdir / 'audit-policy.json'}",
        f"--audit-log-path={audit_log}",
        "--audit-log-mode=blocking",
        "--profiling=false",
        f"--cert-dir={pki}",
        *extra,
    ]


def controller_manager_args(*, kubeconfig: Path, port: int) -> list[str]:
    """The controllers the tests live with, without election.

    Garbage collection (ownerReferences), namespace deletion, ClusterRole aggregation (the
    chart's viewer role gathered into the built-in ``view``) and the type check of
    ValidatingAdmissionPolicies (their ``status.typeChecking``, which the chart's node guard is
    tested by); and the workload controllers an eviction is judged by: Deployments and their
    ReplicaSets (an evicted pod is made again, for kube-scheduler to place), PodDisruptionBudgets'
    ``status.disruptionsAllowed`` (the disruption controller, which the Eviction API reads) and
    DaemonSets (a pod on each node they select); and the ResourceClaim controller (the
    claims of pods using DRA: those from templates made, and the scheduler's extended-resource
    claims cleaned up once their pod is gone).  They all run with the kubeconfig's identity
    (no ``--use-service-account-credentials``): the audit log tells them apart by user agent,
    ``kube-controller-manager/...`` ending in the controller's name.  Node lifecycle stays off
    (its heartbeat checks would mark every simulated node unreachable), and so do the
    ServiceAccount controllers (see ``apiserver_args``).
    """
    controllers = (
        "clusterrole-aggregation-controller",
        "daemonset-controller",
        "deployment-controller",
        "disruption-controller",
        "garbage-collector-controller",
        "namespace-controller",
        "replicaset-controller",
        "resourceclaim-controller",
        "validatingadmissionpolicy-status-controller",
    )
    return [
        f"--kubeconfig={kubeconfig}",
        f"--controllers={','.join(controllers)}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--concurrent-gc-syncs=5",
    ]


def scheduler_args(*, kubeconfig: Path, port: int, pki: Path) -> list[str]:
    """kube-scheduler as kubeadm runs it (its own identity and bootstrap RBAC), no election.

    It serves on loopback with a cert from the test CA only so that its ``/readyz`` (which
    includes its informers' sync) can be polled and verified.
    """
    return [
        f"--kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki / 'scheduler.crt'}",
        f"--tls-private-key-file={pki / 'scheduler.key'}",
    ]

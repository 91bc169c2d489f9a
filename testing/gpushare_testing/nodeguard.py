"""The chart's node guards (``templates/nodeguard.yaml``) on a local control plane.

The guards are rendered from the chart with the real ``helm`` (never a copy), for the
identities a test runs operators as, with the test admin's group (``system:masters``, which the
simulator and every test's set-up write as) exempt from the label guard, and applied as admin.
A ValidatingAdmissionPolicy takes effect once the API server's informers have seen both it and
its binding, a moment after they are created, so ``installed`` waits until each guard really
refuses (dry runs on a probe node of its own, as a guarded operator and as the probe node's
kubelet: nothing changes, no test's node is touched) and, on the way out, until neither does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpushare_testing.apiobjects import OPERATOR_USER
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.crdinstall import kubectl
from gpushare_testing.helm import Helm
from gpushare_testing.replicas import USERS
from gpushare_testing.rolloutaudit import moment
from gpushare_testing.waiting import eventually

TEMPLATE = "templates/nodeguard.yaml"
REFUSED = "gpushare node guard: "  # how every refusal's message starts
MERGE_PATCH = "application/merge-patch+json"
PROBE_ANNOTATION = "gpushare.dev/node-guard-probe"
PROBE_LABEL = "gpushare.dev/node-guard-probe"  # what the label guard's probe sets
# The group of the test admin (``ControlPlane.admin_kubeconfig``), which the simulator and every
# test's set-up write nodes as.
ADMIN_GROUP = "system:masters"
PROBE_PREFIX = "guard-probe-"  # the probe nodes' names
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"

T = TypeVar("T")


def render(
    helm: Helm,
    *,
    users: Sequence[str],
    exempt_groups: Sequence[str] = (ADMIN_GROUP,),
    release: str = "guard",
) -> str:
    """The guards' manifests as the chart renders them, bound to ``users`` instead of the
    chart's ServiceAccount (``nodeGuard.users``), the label guard exempting ``exempt_groups``
    (``nodeGuard.exemptGroups``: the test admin's, whatever the chart's default)."""
    args = (
        "--show-only",
        TEMPLATE,
        "--set-json",
        f"nodeGuard.users={json.dumps(list(users))}",
        "--set-json",
        f"nodeGuard.exemptGroups={json.dumps(list(exempt_groups))}",
    )
    return helm.render(*args, release=release).stdout


def kubelet(plane: ControlPlane, node: str) -> Path:
    """A kubeconfig of ``node``'s kubelet: ``system:node:<node>`` in ``system:nodes``, which the
    Node authorizer and NodeRestriction hold to that one Node, as in a cluster."""
    return plane.kubeconfig_for_user(f"system:node:{node}", groups=("system:nodes",))


def operator_identities(plane: ControlPlane) -> dict[str, Path]:
    """Username -> kubeconfig of every identity ``start_operator`` and ``start_replicas`` run
    operators as (client certificates in ``system:masters``, as ``operators.spawn`` makes)."""
    return {
        user: plane.kubeconfig_for_user(user, groups=("system:masters",))
        for user in (OPERATOR_USER, *USERS.values())
    }


@contextlib.contextmanager
def installed(plane: ControlPlane, helm: Helm, identities: Mapping[str, Path]) -> Iterator[str]:
    """The guard, bound to ``identities`` (username -> kubeconfig), in effect for the block;
    yields the rendered manifests.  On the way out, fails if it refused any of their node
    writes: the operator retries a refused write, so a suite could pass with the guard in its
    way, and only the audit log tells."""
    rendered = render(helm, users=sorted(identities))
    kubectl(plane, "apply", "-f", "-", stdin=rendered)
    try:
        wait_enforced(plane, identities.values())
        since = time.time()
        yield rendered
        refusals = refused_writes(plane, since=since)
        assert not refusals, f"the node guard refused {len(refusals)} writes: {refusals[:5]}"
    finally:
        kubectl(plane, "delete", "--wait", "-f", "-", stdin=rendered)
        wait_enforced(plane, identities.values(), enforced=False)


def wait_enforced(
    plane: ControlPlane,
    kubeconfigs: Iterable[Path],
    *,
    enforced: bool = True,
    timeout: float = 30.0,
) -> None:
    """Wait until each identity is refused (or, ``enforced=False``, allowed) a change to a
    foreign annotation, and the probe node's kubelet a gpushare.dev/ label: dry runs on a
    probe node."""
    state = "on" if enforced else "off"
    with probe_node(plane) as node:
        for kubeconfig in kubeconfigs:
            poll(
                functools.partial(refused, kubeconfig, node),
                until=lambda answer: answer == enforced,
                timeout=timeout,
                what=f"the node guard {state} for {kubeconfig.name}",
            )
        label = {"metadata": {"labels": {PROBE_LABEL: "x"}}}
        poll(
            functools.partial(refused, kubelet(plane, node), node, label),
            until=lambda answer: answer == enforced,
            timeout=timeout,
            what=f"the node label guard {state} for the kubelet of {node}",
        )


def refused_writes(plane: ControlPlane, *, since: float) -> list[tuple[str, str, str]]:
    """(user, node, message) of each node write since ``since`` that a guard refused, whoever
    sent it (an operator, or a test's own set-up that the label guard would not exempt), from
    the audit log; the probes' refusals are not counted."""
    found = []
    for event in plane.audit_events():
        answer = event.get("responseStatus") or {}
        node = str(event["objectRef"].get("name", ""))
        if (
            event["objectRef"].get("resource") == "nodes"
            and event["stage"] == "ResponseComplete"
            and answer.get("code") == 403
            and REFUSED in str(answer.get("message"))
            and not node.startswith(PROBE_PREFIX)
            and moment(event) >= since
        ):
            found.append((event["user"]["username"], node, str(answer["message"])))
    return found


def refused(kubeconfig: Path, node: str, patch: Mapping[str, Any] | None = None) -> bool:
    """Whether a guard refuses this identity a dry-run ``patch`` (by default, an annotation)
    on ``node``."""
    patch = patch or {"metadata": {"annotations": {PROBE_ANNOTATION: "x"}}}
    status, body = request_as(
        kubeconfig,
        "PATCH",
        f"/api/v1/nodes/{node}",
        patch,
        params={"dryRun": "All"},
        content_type=MERGE_PATCH,
    )
    if status == 200:
        return False
    if status == 403 and REFUSED in str((body or {}).get("message")):
        return True
    raise AssertionError(f"the guard probe got {status}: {body!r:.500}")


@contextlib.contextmanager
def probe_node(plane: ControlPlane) -> Iterator[str]:
    """A bare Node for the probes, deleted afterwards."""
    name = f"{PROBE_PREFIX}{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    status, raw = plane.request("POST", "/api/v1/nodes", body=body)
    assert status == 201, raw
    try:
        yield name
    finally:
        status, raw = plane.request("DELETE", f"/api/v1/nodes/{name}")
        assert status in (200, 404), raw


async def type_checked(plane: ControlPlane, name: str) -> dict[str, Any]:
    """The policy ``name`` once its status says the API server type-checked its current
    generation (``status.typeChecking``; kube-controller-manager does it)."""

    async def policy() -> dict[str, Any]:
        status, raw = plane.request("GET", f"{POLICIES}/{name}")
        assert status == 200, raw
        return dict(yaml.safe_load(raw))

    return await eventually(
        policy,
        until=lambda body: (
            (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]
        ),
        what=f"the type check of {name}",
    )


@contextlib.contextmanager
def node_status_granted(plane: ControlPlane, username: str) -> Iterator[None]:
    """More than the chart grants, for the block: patch on nodes/status, so that a refusal
    there is the guard's, not RBAC's."""
    rules = [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    with granted(plane, username, rules, name="node-guard-test-node-status"):
        yield


@contextlib.contextmanager
def granted(
    plane: ControlPlane, username: str, rules: list[dict[str, list[str]]], *, name: str
) -> Iterator[None]:
    """More than the chart grants, for the block: ``rules`` in a ClusterRole ``name`` bound to
    ``username``, so that a refusal of what they allow is a guard's, not RBAC's."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "name": username, "apiGroup": "rbac.authorization.k8s.io"}],
    }
    try:
        for plural, body in (("clusterroles", role), ("clusterrolebindings", binding)):
            status, raw = plane.request("POST", f"{rbac}/{plural}", body=body)
            assert status == 201, raw
        yield
    finally:
        for plural in ("clusterrolebindings", "clusterroles"):
            status, raw = plane.request("DELETE", f"{rbac}/{plural}/{name}")
            assert status in (200, 404), raw


def request_as(
    kubeconfig: Path,
    method: str,
    path: str,
    body: Any = None,
    *,
    params: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """One synchronous request with a kubeconfig's credentials (client certificate or token):
    for fixtures, which have no event loop.  Returns the status and the decoded JSON body."""
    config = yaml.safe_load(kubeconfig.read_text())
    [cluster] = config["clusters"]
    [user] = config["users"]
    context = ssl.create_default_context(cafile=cluster["cluster"]["certificate-authority"])
    credentials = user["user"]
    if "client-certificate" in credentials:
        context.load_cert_chain(credentials["client-certificate"], credentials["client-key"])
    url = cluster["cluster"]["server"] + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", content_type)
    if "token" in credentials:
        request.add_header("Authorization", f"Bearer {credentials['token']}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            status, raw = int(response.status), bytes(response.read())
    except urllib.error.HTTPError as err:
        status, raw = int(err.code), bytes(err.read())
    return status, json.loads(raw) if raw else None


def poll(
    probe: Callable[[], T],
    *,
    until: Callable[[T], bool],
    timeout: float,
    what: str,
    interval: float = 0.1,
) -> T:
    """``waiting.eventually`` for code without an event loop (fixtures)."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if until(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {result!r}")
        time.sleep(interval)

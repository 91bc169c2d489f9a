"""The chart's webhook guard on the real API server: on its MutatingWebhookConfiguration the
operator's ServiceAccount may change the caBundle, and every other change is refused with the
guard's message; the operator still rotates its certificate with the guard in place.

The chart is installed with the real ``helm``; requests are sent with a token the TokenRequest
API minted for the chart's ServiceAccount, so the API server authenticates, authorizes and
admits them as it would the operator's.  Every refused patch is valid: as admin, a dry run of it
succeeds.  Where RBAC refuses first (create, update, delete: the ClusterRole grants only patch)
the answer is RBAC's; with those verbs granted for the test, the guard refuses them too, so the
guard holds should RBAC ever be widened.  That nothing changed is read from the audit log.
(How the chart renders the guard: test_chart.py.)
"""

from __future__ import annotations

import base64
import copy
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpushare_testing import apiobjects as h
from gpushare_testing import nodeguard, webhooks
from gpushare_testing.controlplane import ControlPlane, free_port
from gpushare_testing.operators import OperatorFactory
from gpushare_testing.rawclient import RawClient
from gpushare_testing.rolloutaudit import moment
from gpushare_testing.waiting import eventually

pytestmark = pytest.mark.usefixtures("crds_installed")

JSON = "application/json-patch+json"
MERGE = "application/merge-patch+json"
GUARD = "gpushare webhook guard: the operator may change only the caBundle of a"
WEBHOOK = webhooks.WEBHOOK_NAME
VERBS = "mutatingwebhookconfigurations"  # RBAC's name of the resource


@dataclass(frozen=True)
class Account:
    """The chart's ServiceAccount: its username and a kubeconfig with a real token."""

    username: str
    kubeconfig: Path


@pytest.fixture
def account(control_plane: ControlPlane, namespace: str, release: str) -> Account:
    name = f"{release}-gpushare-operator"
    token = control_plane.service_account_token(namespace=namespace, name=name)
    kubeconfig = control_plane.kubeconfig_for_token(token, name=f"{namespace}-{name}")
    return Account(f"system:serviceaccount:{namespace}:{name}", kubeconfig)


@pytest.fixture
def configuration(release: str) -> str:
    """The path of the chart's MutatingWebhookConfiguration."""
    return f"{webhooks.CONFIGURATIONS}/{release}-gpushare-operator"


@pytest.fixture
async def clients(
    control_plane: ControlPlane, account: Account, configuration: str
) -> AsyncIterator[tuple[RawClient, RawClient]]:
    """(admin, the operator's ServiceAccount), once the guard refuses the account."""
    async with (
        RawClient(kubeconfig=control_plane.admin_kubeconfig) as admin,
        RawClient(kubeconfig=account.kubeconfig) as operator,
    ):
        await eventually(
            functools.partial(guarded, operator, configuration),
            what="the webhook guard in effect",
        )
        yield admin, operator


async def guarded(client: RawClient, path: str) -> bool:
    """Whether the guard refuses ``client`` a dry-run change of the failurePolicy."""
    body = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]
    status, answer = await client.patch(path, body, content_type=JSON, params={"dryRun": "All"})
    if status == 200:
        return False
    assert status == 403 and GUARD in str(answer.get("message")), answer
    return True


def publish(configuration: dict[str, Any], bundle: bytes) -> list[dict[str, Any]]:
    """The leader's caBundle write, as ``kube.rotating`` sends it: a JSON patch that tests each
    webhook's name and sets its caBundle."""
    encoded = base64.b64encode(bundle).decode()
    patch: list[dict[str, Any]] = []
    for index, webhook in enumerate(configuration["webhooks"]):
        patch.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]})
        patch.append(
            {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded}
        )
    return patch


@dataclass(frozen=True)
class Refusal:
    """A change the operator must not make, and what the guard's message must say of it; each
    is a valid request an admin could make."""

    what: str
    body: Any
    says: str
    content_type: str = JSON


def replace(path: str, value: Any) -> list[dict[str, Any]]:
    return [{"op": "replace", "path": path, "value": value}]


def refusals(current: dict[str, Any], *, other_bundle: bytes) -> list[Refusal]:
    entry = current["webhooks"][0]
    bundle = entry["clientConfig"]["caBundle"]
    everything = [
        {
            "apiGroups": ["*"],
            "apiVersions": ["*"],
            "operations": ["*"],
            "resources": ["*/*"],
            "scope": "*",
        }
    ]
    attacker = {"url": "https://webhook.attacker.example/mutate", "caBundle": bundle}
    second = {**copy.deepcopy(entry), "name": "everything.attacker.example", "rules": everything}
    rules = f"{WEBHOOK}: rules"
    return [
        Refusal("rules widened to everything", replace("/webhooks/0/rules", everything), rules),
        Refusal(
            "the objectSelector dropped",
            [{"op": "remove", "path": "/webhooks/0/objectSelector"}],
            f"{WEBHOOK}: objectSelector",
        ),
        Refusal(
            "a URL instead of the Service",
            replace("/webhooks/0/clientConfig", attacker),
            f"{WEBHOOK}: clientConfig.url, clientConfig.service",
        ),
        Refusal(
            "another Service",
            replace("/webhooks/0/clientConfig/service/name", "attacker"),
            f"{WEBHOOK}: clientConfig.service",
        ),
        Refusal(
            "another path",
            replace("/webhooks/0/clientConfig/service/path", "/other"),
            f"{WEBHOOK}: clientConfig.service",
        ),
        Refusal(
            "failurePolicy Ignore",
            replace("/webhooks/0/failurePolicy", "Ignore"),
            f"{WEBHOOK}: failurePolicy",
        ),
        Refusal(
            "a namespaceSelector",
            replace("/webhooks/0/namespaceSelector", {"matchLabels": {"team": "a"}}),
            f"{WEBHOOK}: namespaceSelector",
        ),
        Refusal(
            "matchConditions",
            [
                {
                    "op": "add",
                    "path": "/webhooks/0/matchConditions",
                    "value": [{"name": "all", "expression": "true"}],
                }
            ],
            f"{WEBHOOK}: matchConditions",
        ),
        Refusal(
            "the timeout",
            replace("/webhooks/0/timeoutSeconds", 30),
            f"{WEBHOOK}: timeoutSeconds",
        ),
        Refusal(
            "reinvocation",
            replace("/webhooks/0/reinvocationPolicy", "IfNeeded"),
            f"{WEBHOOK}: reinvocationPolicy",
        ),
        Refusal(
            "a new webhook entry",
            [{"op": "add", "path": "/webhooks/-", "value": second}],
            f"refused: webhooks [{WEBHOOK}] changed to [{WEBHOOK}, everything.attacker.example]",
        ),
        Refusal(
            "the webhook removed",
            [{"op": "remove", "path": "/webhooks/0"}],
            f"refused: webhooks [{WEBHOOK}] changed to []",
        ),
        Refusal(
            "the caBundle and the rules at once",
            [*publish(current, other_bundle), *replace("/webhooks/0/rules", everything)],
            rules,
        ),
        Refusal(
            "cert-manager's CA injection",
            {"metadata": {"annotations": {"cert-manager.io/inject-ca-from": "ns/attacker"}}},
            "refused: metadata.annotations",
            MERGE,
        ),
        Refusal(
            "a label",
            {"metadata": {"labels": {"example.com/owner": "attacker"}}},
            "refused: metadata.labels",
            MERGE,
        ),
        Refusal(
            "a finalizer",
            {"metadata": {"finalizers": ["example.com/keep"]}},
            "refused: metadata.finalizers",
            MERGE,
        ),
    ]


async def test_the_operator_account_may_change_the_ca_bundle_and_nothing_else(
    control_plane: ControlPlane,
    clients: tuple[RawClient, RawClient],
    account: Account,
    configuration: str,
    release: str,
) -> None:
    admin, operator = clients
    # The API server type-checked the guard's expressions against the schema: no warning.
    guard = await nodeguard.type_checked(
        control_plane, f"{release}-gpushare-operator-webhook-guard"
    )
    assert "expressionWarnings" not in guard["status"].get("typeChecking", {}), guard["status"]

    # What the leader does: set the caBundle (to the control plane's CA, a real one).
    before = await h.ok(admin, "GET", configuration)
    bundle = control_plane.ca_path.read_bytes()
    status, current = await operator.patch(
        configuration, publish(before, bundle), content_type=JSON
    )
    assert status == 200, current
    assert base64.b64decode(current["webhooks"][0]["clientConfig"]["caBundle"]) == bundle
    assert current["webhooks"][0]["rules"] == before["webhooks"][0]["rules"]

    since = time.time()
    cases = refusals(current, other_bundle=bundle * 2)
    for case in cases:
        status, answer = await operator.patch(
            configuration, case.body, content_type=case.content_type
        )
        assert status == 403, (case.what, status, answer)
        assert answer["reason"] == "Forbidden", (case.what, answer)
        message = str(answer["message"])
        assert GUARD in message and case.says in message, (case.what, message)
        # The same request is valid: as admin (a dry run) it goes through.
        status, dry = await admin.patch(
            configuration, case.body, content_type=case.content_type, params={"dryRun": "All"}
        )
        assert status == 200, (case.what, dry)

    # Nothing changed: each of those requests was authorized, then refused at admission.
    name = configuration.rsplit("/", 1)[1]
    events = await eventually(
        lambda: account_writes(control_plane, account.username, name, since),
        until=lambda found: len(found) == len(cases),
        what="every refused request in the audit log",
    )
    assert [e["responseStatus"]["code"] for e in events] == [403] * len(cases)
    assert {e["annotations"]["authorization.k8s.io/decision"] for e in events} == {"allow"}
    after = await h.ok(admin, "GET", configuration)
    assert after["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]


async def test_create_update_and_delete_are_refused_by_rbac_and_by_the_guard(
    control_plane: ControlPlane,
    clients: tuple[RawClient, RawClient],
    account: Account,
    configuration: str,
) -> None:
    """The ClusterRole grants patch alone, so RBAC refuses the rest before admission; granted
    them, the account is still refused by the guard, an update that changes only the caBundle
    aside."""
    admin, operator = clients
    current = await h.ok(admin, "GET", configuration)
    new = webhooks.configuration("attacker-everything", port=1)
    changed = copy.deepcopy(current)
    changed["webhooks"][0]["failurePolicy"] = "Ignore"
    rotated = copy.deepcopy(current)
    rotated["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(
        control_plane.ca_path.read_bytes()
    ).decode()
    dry = {"dryRun": "All"}
    requests: list[tuple[str, str, str, Any]] = [
        ("delete", "DELETE", configuration, None),
        ("create", "POST", webhooks.CONFIGURATIONS, new),
        ("update", "PUT", configuration, changed),
    ]
    for verb, method, path, body in requests:
        status, answer = await operator.request(method, path, body, params=dry)
        assert status == 403, (verb, answer)
        message = str(answer["message"])
        assert f'cannot {verb} resource "{VERBS}"' in message and GUARD not in message, message

    rules = [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": [VERBS],
            "verbs": ["create", "update", "delete"],
        }
    ]
    with nodeguard.granted(
        control_plane, account.username, rules, name="webhook-guard-test-more-verbs"
    ):
        await eventually(
            lambda: operator.request("DELETE", configuration, params=dry),
            until=lambda answer: GUARD in str((answer[1] or {}).get("message")),
            what="RBAC to let the account delete, and the guard to refuse it",
        )
        says = {
            "delete": "refused: DELETE",
            "create": "refused: CREATE",
            "update": f"refused: webhook {WEBHOOK}: failurePolicy",
        }
        for verb, method, path, body in requests:
            status, answer = await operator.request(method, path, body, params=dry)
            assert status == 403, (verb, answer)
            assert GUARD in answer["message"] and says[verb] in answer["message"], answer
        # A whole-object update that changes the caBundle alone is what the guard lets through.
        status, answer = await operator.request("PUT", configuration, rotated, params=dry)
        assert status == 200, answer
    status, _ = await admin.get(f"{webhooks.CONFIGURATIONS}/attacker-everything")
    assert status == 404
    after = await h.ok(admin, "GET", configuration)
    assert after["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]


async def test_the_operator_rotates_its_certificate_under_the_guard(
    control_plane: ControlPlane,
    clients: tuple[RawClient, RawClient],
    account: Account,
    configuration: str,
    namespace: str,
    plugin_namespace: str,
    release: str,
    start_operator: OperatorFactory,
) -> None:
    """The operator, as the chart's ServiceAccount, with a 30 s certificate (replaced every
    20 s): it publishes the first bundle and then each rotation's, and the guard refuses none."""
    admin, operator = clients
    name = f"{release}-gpushare-operator"
    since = time.time()
    running = await start_operator(
        "--namespace",
        namespace,
        "--device-plugin-namespace",
        plugin_namespace,
        "--webhook-port",
        str(free_port()),
        "--webhook-hosts",
        "127.0.0.1",
        "--webhook-secret",
        f"{name}-webhook-tls",
        "--webhook-configuration",
        name,
        "--webhook-service",
        f"{name}-webhook",
        "--webhook-cert-validity",
        "30",
        kubeconfig=account.kubeconfig,
        user=account.username,
    )
    # Two rotations: the Secret got a third serving certificate, and the configuration the
    # bundle that trusts its issuer after it.
    await eventually(
        lambda: serving_certificates(control_plane, account.username, f"{name}-webhook-tls"),
        until=lambda served: len(set(served)) >= 3,
        timeout=120,
        what="the first certificate and two rotations in the Secret",
    )
    published = await eventually(
        lambda: published_bundles(control_plane, account.username, name, since),
        until=lambda bundles: len(set(bundles)) >= 3,
        timeout=60,
        what="the first bundle and two rotations' published",
    )
    # Each was a write of the caBundle alone, and the guard refused none of the account's.
    writes = await account_writes(control_plane, account.username, name, since)
    assert {e["responseStatus"]["code"] for e in writes} == {200}, writes
    current = await h.ok(admin, "GET", configuration)
    assert current["webhooks"][0]["clientConfig"]["caBundle"] in published
    assert await guarded(operator, configuration)
    logs = running.logs()
    assert "webhook guard" not in logs and "forbidden" not in logs.lower(), logs[-3000:]


async def account_writes(
    plane: ControlPlane, username: str, name: str, since: float
) -> list[dict[str, Any]]:
    """The account's requests to the configuration ``name`` since ``since``, as the audit log
    has them (async: ``eventually`` awaits its probe)."""
    return [
        e
        for e in h.writes_to(h.operator_writes(plane, user=username), resource=VERBS, name=name)
        if moment(e) >= since and e["stage"] == "ResponseComplete"
    ]


async def published_bundles(
    plane: ControlPlane, username: str, name: str, since: float
) -> list[str]:
    """The caBundles the account wrote, in order, from the audit log."""
    bundles = []
    for event in await account_writes(plane, username, name, since):
        if event["responseStatus"]["code"] != 200:
            continue
        for op in event.get("requestObject") or ():
            if str(op.get("path", "")).endswith("/caBundle"):
                bundles.append(str(op["value"]))
    return bundles


async def serving_certificates(plane: ControlPlane, username: str, secret: str) -> list[str]:
    """The serving certificates (tls.crt) the account wrote to the webhook's Secret, in order,
    from the audit log."""
    return [
        str(e["requestObject"]["data"]["tls.crt"])
        for e in h.operator_writes(plane, user=username)
        if e["objectRef"].get("resource") == "secrets"
        and e["objectRef"].get("name") in (secret, None)
        and e["stage"] == "ResponseComplete"
        and 200 <= e["responseStatus"]["code"] < 300
        and "tls.crt" in ((e.get("requestObject") or {}).get("data") or {})
    ]

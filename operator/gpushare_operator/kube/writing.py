"""Writing one object: the requests, their tokens, and what an answer tells the caches.

``writer`` decides what to write next and how many writes are in flight; this module makes one
write happen: it plans again once it holds a token (folding whatever arrived meanwhile into the
same write), sends it under the leader gate, and records the answer (the ConfigMap as written,
the Node as applied) so the next plan starts from it.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import structlog
from kubernetes_asyncio import client

from gpushare_operator.cache.sinks import data_owners
from gpushare_operator.cache.state import ClusterState
from gpushare_operator.core import announcements, models
from gpushare_operator.kube import http
from gpushare_operator.kube.events import EventRecorder, ObjectRef
from gpushare_operator.kube.informer import drop_managed_fields
from gpushare_operator.kube.leadership import LeaderGate
from gpushare_operator.kube.ratelimit import TokenBucket
from gpushare_operator.kube.telemetry import NoTelemetry, Telemetry
from gpushare_operator.reconcile.planner import NodePlan, Planner

T = TypeVar("T")

log = structlog.get_logger(__name__)

FIELD_MANAGER = models.FIELD_MANAGER
JSON_PATCH = "application/json-patch+json"
_API = f"/apis/{models.GROUP}/{models.VERSION}"
RETRY_AFTER = 5.0
# Answers that the same request will get again until someone changes something (RBAC, the CRD,
# the object): reported, and retried only on the object's back-off.
PERMANENT = frozenset({401, 403, 422})

# Whether the running job's first write already holds its token (see plan_with_token); a
# context variable, so each job in flight has its own.
_PREPAID: contextvars.ContextVar[bool] = contextvars.ContextVar("prepaid", default=False)
# Whether the running job's write failed (and was put on its back-off); per job, as above.
_FAILED: contextvars.ContextVar[bool] = contextvars.ContextVar("failed", default=False)


class LostLeadership(Exception):
    """The gate closed between planning and writing: drop the write, resync when leading."""


@dataclass(frozen=True, slots=True)
class ConfigTarget:
    namespace: str
    name: str


@dataclass
class WriteCounters:
    ok: dict[str, int]
    failed: dict[str, int]

    def count(self, kind: str, *, ok: bool) -> None:
        bucket = self.ok if ok else self.failed
        bucket[kind] = bucket.get(kind, 0) + 1


class ObjectWriter:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        state: ClusterState,
        planner: Planner,
        gate: LeaderGate,
        bucket: TokenBucket,
        recorder: EventRecorder,
        config: ConfigTarget,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._api = api
        self._state = state
        self._planner = planner
        self._gate = gate
        self._bucket = bucket
        self._recorder = recorder
        self._config = config
        self._telemetry: Telemetry = telemetry or NoTelemetry()
        self.counters = WriteCounters(ok={}, failed={})
        self._announced_foreign: set[str] = set()

    def new_job(self) -> None:
        """A job starts: its first write has no token yet, and nothing has failed."""
        _PREPAID.set(False)
        _FAILED.set(False)

    def job_failed(self) -> bool:
        return _FAILED.get()

    async def node_job(self, node: str) -> None:
        plan = await self.plan_with_token("node", lambda: self._planner.plan_node(node))
        if plan is not None:
            await self._write_node(plan)

    async def plan_with_token(self, kind: str, plan: Callable[[], T | None]) -> T | None:
        """Plan; if there is something to write, wait for a token and plan again.

        A no-op plan costs no token.  Planning again after the wait folds whatever arrived
        meanwhile (say, the rest of a burst of pod events) into this one write.
        """
        if self._timed_plan(kind, plan) is None:
            return None
        await self._bucket.take()
        _PREPAID.set(True)  # the job's first write has its token
        return self._timed_plan(kind, plan)

    async def _write(self, kind: str, **request: Any) -> Any:
        if _PREPAID.get():
            _PREPAID.set(False)
        else:
            await self._bucket.take()
        if not self._gate.is_leader():
            raise LostLeadership()
        started = time.perf_counter()
        # A write must not land after our lease could have passed to another replica.
        request.setdefault("timeout", max(0.1, min(30.0, self._gate.time_left())))
        try:
            result = await http.request(self._api, **request)
        except (http.ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.counters.count(kind, ok=False)
            outcome = f"http_{exc.status}" if isinstance(exc, http.ApiError) else "error"
            self._telemetry.wrote(kind, outcome, time.perf_counter() - started)
            raise
        self.counters.count(kind, ok=True)
        self._telemetry.wrote(kind, "ok", time.perf_counter() - started)
        return result

    def _timed_plan(self, kind: str, plan: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return plan()
        finally:
            self._telemetry.reconciled(kind, time.perf_counter() - started)

    # -- ConfigMap -----------------------------------------------------------------------------

    async def write_config(self) -> None:
        data = await self.plan_with_token("configmap", self._planner.plan_config)
        await self._announce_foreign_keys()
        if data is None:
            return
        target = self._config
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": target.name,
                "namespace": target.namespace,
                "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
            },
            "data": data,
        }
        new_keys = set(data) - set(self._state.config_data or {})
        try:
            written = await self._write(
                "configmap",
                method="PATCH",
                path=f"/api/v1/namespaces/{target.namespace}/configmaps/{target.name}",
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                body=body,
                content_type=http.APPLY_PATCH,
            )
        except http.ApiError as exc:
            self._config_failed(exc)
            return
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning(
                "ConfigMap write failed; retrying",
                kind="ConfigMap",
                name=target.name,
                error=str(exc),
            )
            self.retry_later("config", "")
            return
        if isinstance(written, dict) and isinstance(written.get("data"), dict):
            # Take the answer as the new state at once: the nodes waiting on a new key start
            # their propagation wait now, not when the watch event arrives.
            version = (written.get("metadata") or {}).get("resourceVersion")
            self._state.set_config_data(
                written["data"], initial=False, version=version, owners=data_owners(written)
            )
        else:
            self._state.in_flight[("configmap", "")] = data
        if self._planner.config_error is not None:
            self._planner.config_error = None
            self._state.dirty.many_policies(self._state.policies)
        await self._announce_keys(new_keys)

    async def _announce_foreign_keys(self) -> None:
        """Say once per key that a key shaped like ours belongs to someone else: it is never
        planned, compared or deleted (our apply could not remove it, and must not take it)."""
        target = self._config
        for key, manager in self._planner.foreign_keys.items():
            if key in self._announced_foreign:
                continue
            self._announced_foreign.add(key)
            message = (
                f"ConfigMap {target.namespace}/{target.name} key {key} is owned by field manager"
                f" {manager}, not {FIELD_MANAGER}: it is left alone (delete it by hand if unused)"
            )
            log.warning("foreign config key", kind="ConfigMap", key=key, manager=manager)
            for policy in list(self._state.policies.values()):
                await self._recorder.post(
                    ref=_policy_ref(policy.name, policy.uid),
                    type_="Warning",
                    reason="ForeignConfigKey",
                    message=message,
                )
        self._announced_foreign &= set(self._planner.foreign_keys)

    def _config_failed(self, exc: http.ApiError) -> None:
        target = self._config
        if exc.status == 404:
            problem = (
                f"namespace {target.namespace} does not exist: install the GPU Operator (or create"
                f" the namespace) so that ConfigMap {target.name} can be written; retrying"
            )
        elif exc.status == 403:
            # Refused before the namespace is even looked up: it may be missing, or present
            # without the Role the chart creates there (at an install or upgrade that finds it).
            problem = (
                f"forbidden to write ConfigMap {target.namespace}/{target.name}: namespace"
                f" {target.namespace} may not exist yet, or the operator's Role there is missing"
                f" (`helm upgrade --reuse-values` creates it once the namespace exists); retrying"
            )
        else:
            problem = f"cannot write ConfigMap {target.namespace}/{target.name}: {exc}"
        if self._planner.config_error != problem:
            log.warning(
                "device-plugin ConfigMap not written",
                kind="ConfigMap",
                name=target.name,
                namespace=target.namespace,
                problem=problem,
            )
            self._planner.config_error = problem
            self._state.dirty.many_policies(self._state.policies)
        self.retry_later("config", "")

    def retry_later(self, kind: str, name: str) -> None:
        """The write of (kind, name) failed: try again on its back-off, which grows with each
        failure in a row, so an object that keeps failing asks for ever fewer writes."""
        _FAILED.set(True)
        delay = self._state.dirty.failed((kind, name))
        log.debug("write retry scheduled", kind=kind, name=name, retry_in=round(delay, 3))

    async def _announce_keys(self, keys: set[str]) -> None:
        for policy in self._state.policies.values():
            if policy.config_key in keys:
                await self._recorder.post(
                    ref=_policy_ref(policy.name, policy.uid),
                    type_="Normal",
                    reason="ConfigKeyWritten",
                    message=f"device-plugin config key {policy.config_key} written",
                )

    # -- nodes -----------------------------------------------------------------------------------

    async def _write_node(self, plan: NodePlan) -> None:
        try:
            if plan.taint is not None and not await self._taint(plan):
                return
            if plan.labels is not None:
                if not await self._label_or_report(plan):
                    return
                # The status planned before the label write would say "labelling": plan it
                # again from the node the apply returned, so it says what is now true.
                plan = self._planner.plan_node(plan.name) or plan
                if plan.labels is not None:
                    return  # not what we expected back; the node's watch event re-plans
            if plan.status is not None:
                await self._write_node_state(plan)
        except (http.ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("node write failed; retrying", kind="Node", name=plan.name, error=str(exc))
            if isinstance(exc, http.ApiError) and exc.status in PERMANENT:
                await self._report(
                    ObjectRef("v1", "Node", plan.name, plan.uid),
                    f"cannot write GPUNodeState {plan.name} status: {_problem(exc)}",
                )
            self.retry_later("node", plan.name)

    async def _label_or_report(self, plan: NodePlan) -> bool:
        """Apply the labels; on a refusal that retrying cannot cure by itself (403, 422), say so
        in the node's status and an Event, and leave the label to its back-off.  True when the
        labels were applied."""
        try:
            await self._apply_labels(plan)
        except http.ApiError as exc:
            if exc.status not in PERMANENT:
                raise
            problem = f"cannot label the node: {_problem(exc)}"
            log.warning("node label write refused", kind="Node", name=plan.name, problem=problem)
            self._planner.node_problems[plan.name] = problem
            await self._report(ObjectRef("v1", "Node", plan.name, plan.uid), problem)
            again = self._planner.plan_node(plan.name)
            if again is not None and again.status is not None:
                await self._write_node_state(again)
            self.retry_later("node", plan.name)
            return False
        if self._planner.node_problems.pop(plan.name, None) is not None:
            self._state.dirty.node(plan.name)  # its status drops the condition
        return True

    async def _taint(self, plan: NodePlan) -> bool:
        """Add or remove our taint; False when the node's taints changed since we read them
        (the patch's test failed): the node's watch event plans it again."""
        try:
            node = await self._write(
                "node-taint",
                method="PATCH",
                path=f"/api/v1/nodes/{plan.name}",
                query=[("fieldManager", FIELD_MANAGER)],
                body=plan.taint,
                content_type=JSON_PATCH,
            )
        except http.ApiError as exc:
            if exc.status not in (409, 422):
                raise
            log.info("node taints changed meanwhile; planning again", kind="Node", name=plan.name)
            self.retry_later("node", plan.name)
            return False
        current = self._state.nodes.get(plan.name)
        if isinstance(node, dict) and current is not None and current.uid == plan.uid:
            self._state.upsert_node(drop_managed_fields(node))
        return True

    async def _report(self, ref: ObjectRef, problem: str) -> None:
        """A Warning Event for a refused write (the recorder rate-limits and de-duplicates)."""
        await self._recorder.post(ref=ref, type_="Warning", reason="WriteFailed", message=problem)

    async def _apply_labels(self, plan: NodePlan) -> None:
        assert plan.labels is not None
        wanted = {k: v for k, v in plan.labels.items() if v is not None}
        # The uid makes the apply a precondition: without it, applying to a node deleted a moment
        # ago would create a bare Node; with it the API server answers 409 instead.
        metadata: dict[str, Any] = {"name": plan.name, "uid": plan.uid}
        if wanted:
            metadata["labels"] = wanted
        node = await self._write(
            "node-labels",
            method="PATCH",
            path=f"/api/v1/nodes/{plan.name}",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body={"apiVersion": "v1", "kind": "Node", "metadata": metadata},
            content_type=http.APPLY_PATCH,
        )
        self._state.in_flight[("node", plan.name)] = plan.labels
        current = self._state.nodes.get(plan.name)
        if isinstance(node, dict) and current is not None and current.uid == plan.uid:
            # Not if a DELETED event came while we waited: a response must not revive a node.
            self._state.upsert_node(drop_managed_fields(node))

    async def _write_node_state(self, plan: NodePlan) -> None:
        assert plan.status is not None
        # Read before writing: our own write's watch event may land before the PATCH returns.
        previous = self._state.node_states.get(plan.name) or {}
        if plan.create_state:
            await self._create_node_state(plan)
        answer = await self._write(
            "nodestate-status",
            method="PATCH",
            path=f"{_API}/{models.NODE_STATE_PLURAL}/{plan.name}/status",
            body=[{"op": "add", "path": "/status", "value": plan.status}],
            query=[("fieldManager", FIELD_MANAGER)],
            content_type=JSON_PATCH,
        )
        self._state.in_flight[("nodestate", plan.name)] = plan.status
        if isinstance(answer, dict):
            self._planner.echoed("nodestate", written=plan.status, echoed=answer.get("status"))
        # The node's phase feeds its policies' counts and conditions.
        self._state.dirty.many_policies(self._state.index.policies_of(plan.name))
        await self._node_events(plan, previous)

    async def _create_node_state(self, plan: NodePlan) -> None:
        body = {
            "apiVersion": f"{models.GROUP}/{models.VERSION}",
            "kind": models.NODE_STATE_KIND,
            "metadata": {
                "name": plan.name,
                "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": plan.name, "uid": plan.uid}
                ],
            },
        }
        try:
            await self._write(
                "nodestate-create",
                method="POST",
                path=f"{_API}/{models.NODE_STATE_PLURAL}",
                body=body,
                query=[("fieldManager", FIELD_MANAGER)],
            )
        except http.ApiError as exc:
            if exc.status != 409:
                raise

    async def _node_events(self, plan: NodePlan, previous: Mapping[str, Any]) -> None:
        assert plan.status is not None
        ref = ObjectRef("v1", "Node", plan.name, plan.uid)
        for event in announcements.node_announcements(previous, plan.status):
            await self._recorder.post(
                ref=ref, type_=event.type, reason=event.reason, message=event.message
            )

    # -- policies --------------------------------------------------------------------------------

    async def write_policy(self, name: str) -> None:
        if not await self._finalize(name):
            return
        status = await self.plan_with_token("policy", lambda: self._planner.plan_policy(name))
        if status is None or name not in self._state.policies:
            return
        policy = self._state.policies[name]
        previous = self._state.policy_status.get(name) or {}
        try:
            answer = await self._write(
                "policy-status",
                method="PATCH",
                path=f"{_API}/{models.POLICY_PLURAL}/{name}/status",
                body=[{"op": "add", "path": "/status", "value": status}],
                query=[("fieldManager", FIELD_MANAGER)],
                content_type=JSON_PATCH,
            )
        except (http.ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            if isinstance(exc, http.ApiError) and exc.status == 404:
                return  # deleted meanwhile; its DELETED event removes it from the cache
            log.warning(
                "policy status write failed; retrying",
                kind=models.POLICY_KIND,
                name=name,
                error=str(exc),
            )
            if isinstance(exc, http.ApiError) and exc.status in PERMANENT:
                problem = f"cannot write the policy's status: {_problem(exc)}"
                await self._report(_policy_ref(policy.name, policy.uid), problem)
            self.retry_later("policy", name)
            return
        self._state.in_flight[("policy", name)] = status
        if isinstance(answer, dict):
            self._planner.echoed("policy", written=status, echoed=answer.get("status"))
        await self._policy_events(policy.name, policy.uid, previous, status)

    async def _finalize(self, name: str) -> bool:
        """Add or remove our finalizer; False when the policy is gone, or its finalizers
        changed since we read them (its watch event brings it back)."""
        patch = await self.plan_with_token("policy", lambda: self._planner.plan_finalizer(name))
        if patch is None:
            return True
        try:
            answer = await self._write(
                "policy-finalizer",
                method="PATCH",
                path=f"{_API}/{models.POLICY_PLURAL}/{name}",
                body=patch,
                query=[("fieldManager", FIELD_MANAGER)],
                content_type=JSON_PATCH,
            )
        except http.ApiError as exc:
            if exc.status == 404:
                return False
            if exc.status in PERMANENT - {422}:
                # An older ClusterRole without patch on policies: the status still gets written;
                # a deleted policy then goes at once and its nodes are released under the
                # cluster-wide budget only.
                policy = self._state.policies.get(name)
                if policy is not None:
                    problem = f"cannot set the policy's finalizer: {_problem(exc)}"
                    await self._report(_policy_ref(policy.name, policy.uid), problem)
                return True
            if exc.status not in (409, 422):
                raise
            self.retry_later("policy", name)
            return False
        if isinstance(answer, dict) and (answer.get("metadata") or {}).get("name") == name:
            self._state.upsert_policy(drop_managed_fields(answer))
        else:  # no object in the answer: the patch's own result, until the watch shows it
            self._state.policy_finalizers[name] = self._planner.finalizers_after(name)
        return name in self._state.policies

    async def _policy_events(
        self, name: str, uid: str, previous: Mapping[str, Any], status: Mapping[str, Any]
    ) -> None:
        for event in announcements.policy_announcements(previous, status):
            await self._recorder.post(
                ref=_policy_ref(name, uid),
                type_=event.type,
                reason=event.reason,
                message=event.message,
            )


def _problem(exc: http.ApiError) -> str:
    body = exc.body if isinstance(exc.body, Mapping) else {}
    message = body.get("message") or exc.reason or ""
    return f"HTTP {exc.status} {body.get('reason') or exc.reason}: {message}".rstrip(": ")


def _policy_ref(name: str, uid: str) -> ObjectRef:
    return ObjectRef(f"{models.GROUP}/{models.VERSION}", models.POLICY_KIND, name, uid)

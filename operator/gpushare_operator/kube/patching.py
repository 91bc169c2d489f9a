"""Sending a node's or a policy's plan, and saying what came back as a value.

``kube.writeloop`` decides what to write and when; this module makes the requests of one plan
(server-side apply of a node's labels, JSON patches of its taint and of a policy's finalizer,
status patches, and the pod list a MIG layout label waits on) under the loop's permit, posts
the Events they call for, and returns a ``reconcile.outcomes`` value: what was written, what
the API server answered, and an ``Outcome``.  It changes no cache and no queue:
``Reconciler.learn`` takes the answer in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import aiohttp
import structlog

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import announcements
from gpushare_operator.core.api import models
from gpushare_operator.core.records.nodes import CONFIG_LABEL, POLICY_LABEL
from gpushare_operator.core.rollout.rollouts import TAINT_KEY
from gpushare_operator.kube import checking, evicting, http
from gpushare_operator.kube.events import ObjectRef
from gpushare_operator.kube.sending import (
    API,
    FAILURES,
    FIELD_MANAGER,
    JSON_PATCH,
    PERMANENT,
    NotSent,
    Sender,
    Tokens,
    policy_ref,
    problem_of,
    slim,
)
from gpushare_operator.reconcile.outcomes import (
    Done,
    Gone,
    LeadershipLost,
    NodeWritten,
    PolicyWritten,
    Refused,
    Retry,
)
from gpushare_operator.reconcile.plans import NodePlan, PolicyPlan

log = structlog.get_logger(__name__)


class Patches:
    def __init__(self, *, sender: Sender, cache: ClusterCache) -> None:
        self._sender = sender
        self._cache = cache  # read only: what was there before a write, for its Events

    async def write(
        self, plan: NodePlan | PolicyPlan, *, tokens: Tokens
    ) -> NodeWritten | PolicyWritten | None:
        """Send ``plan``'s requests; None when it has none."""
        if isinstance(plan, NodePlan) and plan.evictions_done:
            self._sender.telemetry.evicted("done", len(plan.evictions_done))
        if not plan.writes:
            return None
        if isinstance(plan, NodePlan):
            return await self._write_node(plan, tokens)
        return await self._write_policy(plan, tokens)

    # -- nodes -----------------------------------------------------------------------------------

    async def _write_node(self, plan: NodePlan, tokens: Tokens) -> NodeWritten:
        node: dict[str, Any] | None = None
        what = f"GPUNodeState {plan.name} status"  # what a refusal below was for
        try:
            if plan.taint is not None:
                what = f"the taint {TAINT_KEY} on Node {plan.name}"
                try:
                    node = slim(await self._patch_node(plan, tokens, plan.taint))
                except http.ApiError as exc:
                    if exc.status not in (409, 422):
                        raise
                    # The node's taints changed since we read them (the patch's test failed).
                    log.info("node taints changed meanwhile", kind="Node", name=plan.name)
                    return NodeWritten(Retry("taints changed"))
            what = f"GPUNodeState {plan.name} status"
            if plan.labels is not None and plan.idle_check:
                busy = await checking.gpu_pods(
                    self._sender, node=plan.name, tracked=self._cache.tracks
                )
                if busy:  # bound after our taint, not yet in our cache: its event follows
                    log.info(
                        "GPU pods on the node; its MIG layout waits", name=plan.name, pods=busy
                    )
                    return NodeWritten(
                        Retry(f"GPU pods on the node: {', '.join(busy)}"), node, busy=busy
                    )
            if plan.labels is not None:
                return await self._write_labels(plan, tokens, node)
            evicted = evicting.Evicted()
            if plan.evictions:  # after our taint: replacements must not land here
                evicted = await evicting.evict(self._sender, tokens, plan.evictions, node=plan.name)
            written = NodeWritten(Done(), node)
            if plan.status is not None:
                written = await self._write_node_state(plan, tokens, node)
            outcome = written.outcome if evicted.failed is None else Retry(evicted.failed)
            return replace(
                written, outcome=outcome, evicted=evicted.accepted, refused=evicted.refused
            )
        except NotSent:
            return NodeWritten(LeadershipLost(), node)
        except FAILURES as exc:
            log.warning("node write failed; retrying", kind="Node", name=plan.name, error=str(exc))
            if isinstance(exc, http.ApiError) and exc.status in PERMANENT:
                await self._sender.report(
                    _node_ref(plan),
                    f"cannot write {what}: {problem_of(exc)}",
                )
            return NodeWritten(Retry(str(exc)), node)

    async def _patch_node(self, plan: NodePlan, tokens: Tokens, patch: Any) -> Any:
        return await self._sender.send(
            tokens,
            "node-taint",
            method="PATCH",
            path=f"/api/v1/nodes/{plan.name}",
            query=[("fieldManager", FIELD_MANAGER)],
            body=patch,
            content_type=JSON_PATCH,
        )

    async def _write_labels(
        self, plan: NodePlan, tokens: Tokens, node: dict[str, Any] | None
    ) -> NodeWritten:
        """Apply our two labels; a refusal that retrying cannot cure by itself (403, 422) is
        reported, and the node's status will say so (``Reconciler.learn``)."""
        assert plan.labels is not None
        wanted = {k: v for k, v in plan.labels.items() if v is not None}
        # The uid makes the apply a precondition: without it, applying to a node deleted a moment
        # ago would create a bare Node; with it the API server answers 409 instead.
        metadata: dict[str, Any] = {"name": plan.name, "uid": plan.uid}
        if wanted:
            metadata["labels"] = wanted
        try:
            answer = await self._sender.send(
                tokens,
                "node-labels",
                method="PATCH",
                path=f"/api/v1/nodes/{plan.name}",
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                body={"apiVersion": "v1", "kind": "Node", "metadata": metadata},
                content_type=http.APPLY_PATCH,
            )
        except http.ApiError as exc:
            if exc.status not in PERMANENT:
                raise
            problem = f"cannot label the node: {problem_of(exc)}"
            log.warning("node label write refused", kind="Node", name=plan.name, problem=problem)
            await self._sender.report(_node_ref(plan), problem)
            return NodeWritten(Refused(problem), node)
        co_owners = other_label_owners(answer) if isinstance(answer, dict) else ()
        return NodeWritten(Done(), slim(answer) or node, labels=plan.labels, co_owners=co_owners)

    async def _write_node_state(
        self, plan: NodePlan, tokens: Tokens, node: dict[str, Any] | None
    ) -> NodeWritten:
        assert plan.status is not None
        # Read before writing: our own write's watch event may land before the PATCH returns.
        previous = self._cache.node_states.get(plan.name) or {}
        if plan.create_state:
            await self._create_node_state(plan, tokens)
        answer = await self._sender.send(
            tokens,
            "nodestate-status",
            method="PATCH",
            path=f"{API}/{models.NODE_STATE_PLURAL}/{plan.name}/status",
            body=[{"op": "add", "path": "/status", "value": plan.status}],
            query=[("fieldManager", FIELD_MANAGER)],
            content_type=JSON_PATCH,
        )
        for event in announcements.node_announcements(previous, plan.status):
            ref = _node_ref(plan)
            if event.reason in announcements.NODE_STATE_REASONS:  # about the drain itself
                ref = self._node_state_ref(plan.name) or ref
            if event.reason == "EvictionBlocked":
                left = (plan.status.get("eviction") or {}).get("pods") or ()
                self._sender.telemetry.evicted("blocked", len(left))
            await self._sender.recorder.post(
                ref=ref, type_=event.type, reason=event.reason, message=event.message
            )
        echo = answer if isinstance(answer, dict) else None
        return NodeWritten(Done(), node, status=plan.status, echo=echo)

    def _node_state_ref(self, name: str) -> ObjectRef | None:
        uid = self._cache.node_state_uids.get(name)
        if uid is None:
            return None
        return ObjectRef(models.API_VERSION, models.NODE_STATE_KIND, name, uid)

    async def _create_node_state(self, plan: NodePlan, tokens: Tokens) -> None:
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
            await self._sender.send(
                tokens,
                "nodestate-create",
                method="POST",
                path=f"{API}/{models.NODE_STATE_PLURAL}",
                body=body,
                query=[("fieldManager", FIELD_MANAGER)],
            )
        except http.ApiError as exc:
            if exc.status != 409:
                raise

    # -- policies --------------------------------------------------------------------------------

    async def _write_policy(self, plan: PolicyPlan, tokens: Tokens) -> PolicyWritten:
        try:
            if plan.finalizer is not None:
                return await self._write_finalizer(plan, tokens)
            return await self._write_policy_status(plan, tokens)
        except NotSent:
            return PolicyWritten(LeadershipLost())

    async def _write_finalizer(self, plan: PolicyPlan, tokens: Tokens) -> PolicyWritten:
        """Add or remove our finalizer; the status follows once it went through."""
        try:
            answer = await self._sender.send(
                tokens,
                "policy-finalizer",
                method="PATCH",
                path=f"{API}/{models.POLICY_PLURAL}/{plan.name}",
                body=plan.finalizer,
                query=[("fieldManager", FIELD_MANAGER)],
                content_type=JSON_PATCH,
            )
        except http.ApiError as exc:
            if exc.status == 404:
                return PolicyWritten(Gone())
            if exc.status in PERMANENT - {422}:
                # An older ClusterRole without patch on policies: the status still gets written;
                # a deleted policy then goes at once and its nodes are released under the
                # cluster-wide budget only.
                problem = f"cannot set the policy's finalizer: {problem_of(exc)}"
                await self._sender.report(policy_ref(plan.name, plan.uid), problem)
                return PolicyWritten(Done(), proceed=True)
            log.warning("policy finalizer not patched", kind=models.POLICY_KIND, name=plan.name)
            return PolicyWritten(Retry(str(exc)))  # 409/422: its finalizers changed meanwhile
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("policy finalizer not patched", kind=models.POLICY_KIND, error=str(exc))
            return PolicyWritten(Retry(str(exc)))
        body = answer if isinstance(answer, dict) else {}
        policy = slim(body) if (body.get("metadata") or {}).get("name") == plan.name else None
        return PolicyWritten(Done(), policy=policy, finalized=True, proceed=True)

    async def _write_policy_status(self, plan: PolicyPlan, tokens: Tokens) -> PolicyWritten:
        assert plan.status is not None
        previous = self._cache.policy_status.get(plan.name) or {}
        try:
            answer = await self._sender.send(
                tokens,
                "policy-status",
                method="PATCH",
                path=f"{API}/{models.POLICY_PLURAL}/{plan.name}/status",
                body=[{"op": "add", "path": "/status", "value": plan.status}],
                query=[("fieldManager", FIELD_MANAGER)],
                content_type=JSON_PATCH,
            )
        except FAILURES as exc:
            if isinstance(exc, http.ApiError) and exc.status == 404:
                return PolicyWritten(Gone())  # deleted meanwhile; its DELETED event follows
            log.warning(
                "policy status write failed; retrying",
                kind=models.POLICY_KIND,
                name=plan.name,
                error=str(exc),
            )
            if isinstance(exc, http.ApiError) and exc.status in PERMANENT:
                problem = f"cannot write the policy's status: {problem_of(exc)}"
                await self._sender.report(policy_ref(plan.name, plan.uid), problem)
            return PolicyWritten(Retry(str(exc)))
        ref = policy_ref(plan.name, plan.uid)
        for event in announcements.policy_announcements(previous, plan.status):
            await self._sender.recorder.post(
                ref=ref, type_=event.type, reason=event.reason, message=event.message
            )
        echo = answer if isinstance(answer, dict) else None
        return PolicyWritten(Done(), status=plan.status, echo=echo)


def other_label_owners(node: dict[str, Any]) -> tuple[str, ...]:
    """The field managers other than ours that own one of our labels on ``node`` (read from
    the apply's answer, before its managedFields are dropped)."""
    ours = {f"f:{CONFIG_LABEL}", f"f:{POLICY_LABEL}"}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if CONFIG_LABEL not in labels and POLICY_LABEL not in labels:
        return ()
    owners = set()
    for entry in (node.get("metadata") or {}).get("managedFields") or ():
        fields = (((entry or {}).get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels")
        manager = (entry or {}).get("manager")
        if isinstance(fields, dict) and manager != FIELD_MANAGER and ours & set(fields):
            owners.add(str(manager))
    return tuple(sorted(owners))


def _node_ref(plan: NodePlan) -> ObjectRef:
    return ObjectRef("v1", "Node", plan.name, plan.uid)

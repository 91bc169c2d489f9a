"""Writing the device-plugin ConfigMap: one server-side apply of every key we own.

Keys are content-hashed and never edited in place (``reconcile.configplan`` plans them);
here they are applied, the policies whose key is new are told so by an Event, and keys shaped
like ours that another field manager owns are announced once and left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
import structlog

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core.api import defaults
from gpushare_operator.kube import http
from gpushare_operator.kube.sending import FIELD_MANAGER, NotSent, Sender, Tokens, policy_ref
from gpushare_operator.reconcile.memory import WriteMemory
from gpushare_operator.reconcile.outcomes import ConfigWritten, Done, LeadershipLost, Retry
from gpushare_operator.reconcile.plans import ConfigPlan

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ConfigMapRef:
    """Where the device-plugin ConfigMap is (and the mig-parted one, beside it)."""

    namespace: str
    name: str
    mig_name: str = defaults.MIG_PARTED_CONFIGMAP


class ConfigMapWrites:
    def __init__(
        self,
        *,
        sender: Sender,
        cache: ClusterCache,
        memory: WriteMemory,
        config: ConfigMapRef,
        what: str = "device-plugin",
    ) -> None:
        self._sender = sender
        self._cache = cache  # read only: which keys are new, which policies name them
        self._memory = memory  # read only: a problem is logged when it is new
        self._config = config
        self._announced_foreign: set[str] = set()
        self._what = what  # which ConfigMap, in what is logged and said

    async def write(self, plan: ConfigPlan, *, tokens: Tokens) -> ConfigWritten | None:
        if self._what == "device-plugin":  # a foreign mig-parted file: its policies say so
            await self._announce_foreign_keys(plan.foreign_keys)
        if plan.data is None:
            return None
        target = self._config
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": target.name,
                "namespace": target.namespace,
                "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
            },
            "data": plan.data,
        }
        new_keys = set(plan.data) - set(self._cache.config_data or {})
        try:
            answer = await self._sender.send(
                tokens,
                "configmap",
                method="PATCH",
                path=f"/api/v1/namespaces/{target.namespace}/configmaps/{target.name}",
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                body=body,
                content_type=http.APPLY_PATCH,
            )
        except NotSent:
            return ConfigWritten(LeadershipLost())
        except http.ApiError as exc:
            return ConfigWritten(Retry(str(exc)), problem=self._config_problem(exc))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning(
                "ConfigMap write failed; retrying",
                kind="ConfigMap",
                name=target.name,
                error=str(exc),
            )
            return ConfigWritten(Retry(str(exc)))
        if self._what == "device-plugin":
            await self._announce_keys(new_keys)
        answered = answer if isinstance(answer, dict) else None
        return ConfigWritten(Done(), data=plan.data, answer=answered)

    def _config_problem(self, exc: http.ApiError) -> str:
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
        if problem != self._memory.config_error:
            log.warning(
                f"{self._what} ConfigMap not written",
                kind="ConfigMap",
                name=target.name,
                namespace=target.namespace,
                problem=problem,
            )
        return problem

    async def _announce_foreign_keys(self, foreign: Mapping[str, str]) -> None:
        """Say once per key that a key shaped like ours belongs to someone else: it is never
        planned, compared or deleted (our apply could not remove it, and must not take it)."""
        target = self._config
        for key, manager in foreign.items():
            if key in self._announced_foreign:
                continue
            self._announced_foreign.add(key)
            message = (
                f"ConfigMap {target.namespace}/{target.name} key {key} is owned by field manager"
                f" {manager}, not {FIELD_MANAGER}: it is left alone (delete it by hand if unused)"
            )
            log.warning("foreign config key", kind="ConfigMap", key=key, manager=manager)
            for policy in list(self._cache.policies.values()):
                await self._sender.recorder.post(
                    ref=policy_ref(policy.name, policy.uid),
                    type_="Warning",
                    reason="ForeignConfigKey",
                    message=message,
                )
        self._announced_foreign &= set(foreign)

    async def _announce_keys(self, keys: set[str]) -> None:
        for policy in list(self._cache.policies.values()):
            if policy.config_key in keys:
                await self._sender.recorder.post(
                    ref=policy_ref(policy.name, policy.uid),
                    type_="Normal",
                    reason="ConfigKeyWritten",
                    message=f"device-plugin config key {policy.config_key} written",
                )

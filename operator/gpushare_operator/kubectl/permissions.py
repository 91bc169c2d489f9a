"""What the plugin needs of the user's RBAC, and the error that says which part is missing.

A read the API server refuses (403) is never taken for an empty answer: a ConfigMap the user
may not read would look like no ConfigMap at all, and the plan would promise keys to write and
a propagation wait that are not real.  It ends the command with ``MissingPermission``, which
names the verb, the resource (as RBAC names it), the object and the namespace, what the plugin
wanted it for, and the ``kubectl auth can-i`` that checks it; then the API server's own words.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gpushare_operator.kube import http, objectpaths


@dataclass(frozen=True, slots=True, kw_only=True)
class Permission:
    """One RBAC permission a request needs, and why the plugin makes that request."""

    verb: str  # get, list, create, update, delete
    resource: objectpaths.Resource
    purpose: str
    name: str | None = None
    namespace: str | None = None  # None: cluster-scoped, or every namespace

    def __str__(self) -> str:
        what = f"{self.verb} {self.resource.rbac_name}"
        if self.name is not None:
            what += f' "{self.name}"'
        if self.namespace is not None:
            return f'{what} in namespace "{self.namespace}"'
        return f"{what} in every namespace" if self.resource.namespaced else what

    def can_i(self) -> str:
        """The kubectl command that asks whether the current user has it."""
        target = self.resource.rbac_name + (f"/{self.name}" if self.name is not None else "")
        if self.namespace is not None:
            scope = f" -n {self.namespace}"
        else:
            scope = " --all-namespaces" if self.resource.namespaced else ""
        return f"kubectl auth can-i {self.verb} {target}{scope}"


class MissingPermission(Exception):
    """The API server refused a request the command cannot do without (exit 1)."""

    def __init__(self, permission: Permission, refusal: http.ApiError) -> None:
        self.permission = permission
        body = refusal.body if isinstance(refusal.body, Mapping) else {}
        said = body.get("message") or refusal.body or refusal.reason
        super().__init__(
            f"missing permission: {permission} (needed for {permission.purpose})\n"
            f"  check with: {permission.can_i()}\n"
            f"Error from server (Forbidden): {said}"
        )


@contextlib.contextmanager
def needing(permission: Permission) -> Iterator[None]:
    """Around a request that needs ``permission``: its 403 becomes MissingPermission."""
    try:
        yield
    except http.ApiError as exc:
        if exc.status == 403:
            raise MissingPermission(permission, exc) from exc
        raise

"""Dry runs for the kubectl plugin: what the API server would store, with nothing stored.

Not reads (kube/reading.py): each is a write (``dryRun=All``) that goes through defaulting,
validation and admission like a real one, and needs the write's verb in the user's RBAC.  The
path of each is built by kube/objectpaths.py from a checked name, so that no name can cut the query
(and ``dryRun=All`` with it) off the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from gpushare_operator.kube import http, objectpaths
from gpushare_operator.kube.streams import drop_managed_fields

DRY_RUN = ("dryRun", "All")


async def create(
    api: client.ApiClient, resource: objectpaths.Resource, body: Mapping[str, Any]
) -> dict[str, Any]:
    """The object as the API server would store it (defaults, admission)."""
    path = objectpaths.path(resource)
    created = await http.request(api, method="POST", path=path, query=[DRY_RUN], body=dict(body))
    return drop_managed_fields(dict(created))


async def replace(
    api: client.ApiClient, resource: objectpaths.Resource, name: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    """A whole-object update; ``body`` carries the current resourceVersion."""
    path = objectpaths.path(resource, name)
    replaced = await http.request(api, method="PUT", path=path, query=[DRY_RUN], body=dict(body))
    return drop_managed_fields(dict(replaced))


async def delete(
    api: client.ApiClient, resource: objectpaths.Resource, name: str
) -> dict[str, Any]:
    """What a delete would leave: the object with its deletionTimestamp while finalizers
    hold it (the operator's keeps a policy until its nodes are released)."""
    path = objectpaths.path(resource, name)
    answer = await http.request(api, method="DELETE", path=path, query=[DRY_RUN])
    return drop_managed_fields(dict(answer)) if isinstance(answer, Mapping) else {}

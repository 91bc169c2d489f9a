"""The operator's informers in tests: the test's own Nodes (created through the operator's HTTP
client, tagged so that a test lists only its own), a sink that records what an informer
delivered, and an informer run until its first sync."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpushare_operator.kube import http
from gpushare_operator.kube.informer import Informer
from gpushare_operator.kube.reading import Collection, Sink
from gpushare_testing import bodies
from gpushare_testing.waiting import eventually

NODES = "/api/v1/nodes"
TAG = "gpushare.dev/informer-test"  # every node of a test carries TAG=<that test's id>
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class Nodes:
    """Creates this test's Nodes (all labelled ``TAG=<tag>``) and deletes them afterwards."""

    # The operator's kubernetes_asyncio ApiClient: typed loosely, since the test support may
    # not import kubernetes_asyncio itself (the import-linter contracts).
    def __init__(self, api: Any) -> None:
        self.api = api
        self.tag = uuid.uuid4().hex[:10]
        self.created: list[str] = []

    def name(self, role: str) -> str:
        return f"inf-{self.tag}-{role}"

    def collection(self, *, page_size: int = 500) -> Collection:
        return Collection(
            path=NODES, kind="Node", label_selector=f"{TAG}={self.tag}", page_size=page_size
        )

    async def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await http.request(self.api, method="POST", path=NODES, body=body)
        self.created.append(body["metadata"]["name"])
        return created

    async def gpu(self, role: str, **extra_labels: str) -> dict[str, Any]:
        body = bodies.gpu_node(
            name=self.name(role), pool="informer", extra_labels={TAG: self.tag, **extra_labels}
        )
        body["metadata"].pop("managedFields", None)
        body["metadata"].pop("resourceVersion", None)
        return await self._create(body)

    async def plain(self, role: str) -> dict[str, Any]:
        """A node without any NVIDIA label or capacity: a CPU node."""
        name = self.name(role)
        labels = {TAG: self.tag, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
        status = {"capacity": {"cpu": "16", "memory": "65536Mi", "pods": "110"}}
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        return await self._create(body | {"status": status})

    async def label(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        patched: dict[str, Any] = await http.request(
            self.api,
            method="PATCH",
            path=f"{NODES}/{name}",
            body={"metadata": {"labels": dict(labels)}},
            content_type=http.MERGE_PATCH,
        )
        return patched

    async def heartbeat(self, name: str) -> dict[str, Any]:
        """What kubelet does every few seconds: new heartbeat times on the status subresource."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [
            {"type": kind, "lastHeartbeatTime": now} for kind in bodies.KUBELET_CONDITIONS
        ]
        patched: dict[str, Any] = await http.request(
            self.api,
            method="PATCH",
            path=f"{NODES}/{name}/status",
            body={"status": {"conditions": conditions}},
            content_type=STRATEGIC_MERGE_PATCH,
        )
        return patched

    async def delete(self, name: str) -> None:
        try:
            await http.request(self.api, method="DELETE", path=f"{NODES}/{name}")
        except http.ApiError as exc:
            if exc.status != 404:
                raise

    async def exists(self, name: str) -> bool:
        try:
            await http.request(self.api, method="GET", path=f"{NODES}/{name}")
        except http.ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def delete_all(self) -> None:
        for name in self.created:
            await self.delete(name)


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def version_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion"))


class RecordingSink:
    """Delegates to a real sink and records what the informer delivered, to wait on it."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.relists: list[list[str]] = []  # names per re-list, in delivery order
        self.events: list[tuple[str, str, str]] = []  # (type, name, resourceVersion)

    def begin_relist(self) -> None:
        self.relists.append([])
        self.inner.begin_relist()

    def relist_item(self, obj: dict[str, Any]) -> None:
        self.relists[-1].append(name_of(obj))
        self.inner.relist_item(obj)

    def end_relist(self) -> None:
        self.inner.end_relist()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self.events.append((event_type, name_of(obj), version_of(obj)))
        self.inner.apply(event_type, obj)

    async def wait_event(self, event_type: str, obj: Mapping[str, Any]) -> None:
        """Wait until the informer has delivered the event that made ``obj`` (by version)."""
        wanted = (event_type, name_of(obj), version_of(obj))

        async def delivered() -> bool:
            return wanted in self.events

        await eventually(delivered, timeout=30, what=f"watch event {wanted}")


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[asyncio.Task[None]]:
    """Run the informer as the operator does and wait for its first sync; always cancel it."""
    task = asyncio.create_task(informer.run(), name=f"informer-{informer.kind}")
    try:

        async def synced_or_dead() -> bool:
            return informer.synced.is_set() or task.done()

        await eventually(synced_or_dead, timeout=30, what="the informer's first sync")
        if task.done():
            task.result()  # raises what killed it
            raise AssertionError("informer.run() returned")
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


Request = Callable[..., Awaitable[Any]]


def expiring_after_first_page(
    real: Request,
    nodes: Nodes,
    *,
    victim: str,
    bumped: str,
    compact: Callable[[], Awaitable[object]],
    calls: list[tuple[dict[str, str], int]],
) -> Request:
    """A stand-in for ``http.request`` that, once the first page of nodes has been answered,
    deletes ``victim``, relabels ``bumped`` and compacts etcd: the continue token of that
    page has then expired (410).  Every node list asked is recorded in ``calls`` as (query,
    HTTP status); every other request goes through unchanged."""

    async def request(
        api: Any, *, method: str, path: str, query: Sequence[tuple[str, str]] = (), **kw: Any
    ) -> Any:
        if method != "GET" or path != NODES:
            return await real(api, method=method, path=path, query=query, **kw)
        try:
            answer = await real(api, method=method, path=path, query=query, **kw)
        except Exception as exc:
            calls.append((dict(query), int(getattr(exc, "status", 0))))
            raise
        calls.append((dict(query), 200))
        if len(calls) == 1:
            await nodes.delete(victim)
            await nodes.label(bumped, {"gpushare.dev/team": "bump"})
            await compact()
        return answer

    return request

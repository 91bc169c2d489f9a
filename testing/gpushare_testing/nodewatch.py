"""Following the API server's Nodes with a list + watch, for the GPU simulator.

Split from ``simulator`` to keep each module small; the simulator decides what to do with what
this sees (``_observe``, ``_forget``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp

from gpushare_testing.rawclient import ApiError, JsonObject, RawClient

__all__ = ["NodeWatcher", "rv"]

logger = logging.getLogger(__name__)


def rv(obj: JsonObject | None) -> int:
    """A resourceVersion as a number: opaque by contract, an etcd revision in every real server."""
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


class NodeWatcher(abc.ABC):
    """Keeps ``_nodes`` (the bodies a subclass cares about) current from a Node watch."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self._nodes: dict[str, JsonObject] = {}  # latest bodies, by resourceVersion
        self._background: list[asyncio.Task[None]] = []
        self._listed = asyncio.Event()

    @abc.abstractmethod
    def _observe(self, node: JsonObject) -> None:
        """A node as listed or watched: keep it if it is one of ours and newer."""

    @abc.abstractmethod
    def _forget(self, node: JsonObject) -> None:
        """A node deleted (or gone while unwatched): drop what is kept for it."""

    async def _watch_nodes(self) -> None:
        version = await self._list_nodes()
        while True:
            try:
                version = await self._follow(version)
            except (aiohttp.ClientError, TimeoutError, ValueError, ApiError) as exc:
                logger.warning("node watch failed: %s; retrying", exc)
                await asyncio.sleep(0.5)

    async def _follow(self, version: str) -> str:
        """One watch request from ``version``; returns where the next one should start."""
        params = {"resourceVersion": version, "allowWatchBookmarks": "true"}
        # aclosing: leaving early must close the response now, not when the generator is GC'd.
        async with contextlib.aclosing(self.client.watch("/api/v1/nodes", params=params)) as events:
            async for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":  # 410 Gone: our resourceVersion was compacted away
                    logger.info("node watch expired (%s); listing again", obj.get("message"))
                    return await self._list_nodes()
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind == "DELETED":
                    self._forget(obj)
                elif kind in ("ADDED", "MODIFIED"):
                    self._observe(obj)
        return version

    async def _list_nodes(self) -> str:
        """List every node (in pages) to start or restart the watch; refresh ours on the way."""
        params, seen = {"limit": "500"}, set()
        while True:
            status, page = await self.client.get("/api/v1/nodes", params=params)
            if status != 200:
                raise ApiError(method="LIST", path="/api/v1/nodes", status=status, body=page)
            for node in page["items"]:
                seen.add(node["metadata"]["name"])
                self._observe(node)
            if not page["metadata"].get("continue"):
                break
            params = {"limit": "500", "continue": page["metadata"]["continue"]}
        for name in set(self._nodes) - seen:  # deleted while we were not watching
            self._forget(self._nodes[name])
        self._listed.set()
        return str(page["metadata"]["resourceVersion"])

    async def _until(
        self, probe: Callable[[], Awaitable[bool]], *, timeout: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout
        while not await probe():
            for task in self._background:
                if task.done():
                    task.result()  # re-raise whatever killed it
                    raise RuntimeError(f"{task.get_name()} stopped")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            await asyncio.sleep(0.05)

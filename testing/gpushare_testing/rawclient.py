"""A few lines of aiohttp that talk JSON to the API server with a test kubeconfig.

The simulator and the demo must not depend on the operator's own client stack (kubernetes_asyncio
lives in ``kube`` only): a simulator built on the code under test would share its bugs.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

JsonObject = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"


def _named(config: JsonObject, section: str, name: str | None) -> JsonObject:
    entries: list[JsonObject] = config.get(section) or []
    for entry in entries:
        if entry.get("name") == name:
            return entry
    if not entries:
        raise ValueError(f"kubeconfig has no {section}")
    return entries[0]


class ApiError(Exception):
    """The API server answered a request with an unexpected status."""

    def __init__(self, *, method: str, path: str, status: int, body: Any) -> None:
        super().__init__(f"{method} {path}: {status} {body!r:.500}")
        self.status = status
        self.body = body


class RawClient:
    """A minimal API client from a kubeconfig (client certificate or bearer token).

    Use it as an async context manager: the aiohttp session lives exactly as long as the block.
    """

    def __init__(self, *, kubeconfig: str | Path) -> None:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        context = _named(config, "contexts", config.get("current-context"))["context"]
        cluster = _named(config, "clusters", context.get("cluster"))["cluster"]
        user = _named(config, "users", context.get("user"))["user"]
        self.server = str(cluster["server"]).rstrip("/")
        self._ssl = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
        if "client-certificate" in user:
            self._ssl.load_cert_chain(user["client-certificate"], user["client-key"])
        self._headers = {"Accept": "application/json"}
        if "token" in user:
            self._headers["Authorization"] = f"Bearer {user['token']}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RawClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=32), headers=self._headers
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use RawClient as `async with` first")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One request; returns the status and the decoded JSON body (text if it is not JSON)."""
        headers = {} if body is None else {"Content-Type": content_type}
        data = None if body is None else orjson.dumps(body)
        async with self.session.request(
            method,
            self.server + path,
            params=params,
            data=data,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response:
            raw = await response.read()
        try:
            return response.status, orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return response.status, raw.decode(errors="replace")

    async def get(self, path: str, *, params: Mapping[str, str] | None = None) -> tuple[int, Any]:
        return await self.request("GET", path, params=params)

    async def post(
        self, path: str, body: Any, *, params: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        return await self.request("POST", path, body, params=params)

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        content_type: str = MERGE_PATCH,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        return await self.request("PATCH", path, body, params=params, content_type=content_type)

    async def delete(
        self, path: str, *, params: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        return await self.request("DELETE", path, params=params)

    async def watch(
        self, path: str, *, params: Mapping[str, str]
    ) -> AsyncGenerator[JsonObject, None]:
        """The events of one watch request, until the server ends it (``timeoutSeconds``)."""
        query = {"timeoutSeconds": "240", **params, "watch": "1"}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with self.session.get(self.server + path, params=query, timeout=timeout) as response:
            if response.status != 200:
                raise ApiError(
                    method="WATCH", path=path, status=response.status, body=await response.text()
                )
            lines = WatchLines()
            async for chunk in response.content.iter_any():
                for line in lines.feed(chunk):
                    yield orjson.loads(line)


class WatchLines:
    """Splits a watch stream into its JSON lines however the chunks fall.

    Lines are found by scanning each chunk once (not the whole pending buffer), so a 1 MiB
    object arriving in small chunks stays linear; no line length limit, unlike ``readline``.
    """

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        end = chunk.rfind(b"\n")
        if end < 0:
            self._pending += chunk
            return []
        complete = bytes(self._pending) + chunk[:end]
        self._pending = bytearray(chunk[end + 1 :])
        return [line for line in complete.split(b"\n") if line.strip()]


# -- the device-plugin config, as the config manager reads it --------------------------------

"""The device-plugin ConfigMap as the config managers see it: late.

The config manager reads the ConfigMap as files of a mounted volume, which kubelet refreshes
periodically, so its view lags the API server.  ``ConfigView`` polls the ConfigMap and exposes
``view``, which takes each new content ``sync_delay`` seconds after it was first read.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import aiohttp

from gpushare_testing.rawclient import ApiError, RawClient

__all__ = ["ConfigData", "ConfigView"]

logger = logging.getLogger(__name__)

ConfigData = dict[str, str]


class ConfigView:
    def __init__(
        self, client: RawClient, *, path: str, sync_delay: float, poll_interval: float
    ) -> None:
        self._client = client
        self._path = path
        self._sync_delay = sync_delay
        self._poll_interval = poll_interval
        self.seen: ConfigData | None = None  # the data last read from the server
        self.view: ConfigData | None = None  # what the config managers see of it
        self._queue: collections.deque[tuple[float, ConfigData]] = collections.deque()

    @property
    def pending(self) -> bool:
        """A content was read that the config managers do not see yet."""
        return bool(self._queue)

    async def read(self) -> ConfigData:
        status, body = await self._client.get(self._path)
        if status == 404:
            return {}
        if status != 200:
            raise ApiError(method="GET", path=self._path, status=status, body=body)
        return dict(body.get("data") or {})

    async def run(self) -> None:
        while True:
            try:
                configs = await self.read()
            except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
                logger.warning("reading the device-plugin ConfigMap failed: %s", exc)
            else:
                if self.seen is None:  # the agents started with the ConfigMap as it was
                    self.seen = self.view = configs
                elif configs != self.seen:
                    # kubelet refreshes the mounted volume later; the agents see it then.
                    self.seen = configs
                    self._queue.append((time.monotonic() + self._sync_delay, configs))
            now = time.monotonic()
            while self._queue and self._queue[0][0] <= now:
                self.view = self._queue.popleft()[1]
            pause = self._poll_interval
            if self._queue:
                pause = min(pause, max(0.0, self._queue[0][0] - now))
            await asyncio.sleep(pause)

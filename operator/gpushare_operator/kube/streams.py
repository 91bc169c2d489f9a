"""Reading a watch's chunked body: lines out of chunks, and fewer, bigger reads.

Apart from the informer because none of it knows about lists, sinks or retries.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp


def drop_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    return obj


class LineSplitter:
    """Split a chunked HTTP body into lines without a size limit (a Node can exceed 64 KiB)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\n" not in chunk:
            self._buffer += chunk
            return []
        # Most reads end on an event's newline: then nothing is carried over or copied twice.
        data = self._buffer + chunk if self._buffer else chunk
        *lines, self._buffer = data.split(b"\n")
        return [line for line in lines if line and not line.isspace()]


async def gather_more(response: aiohttp.ClientResponse, *, window: float) -> None:
    """Let the next events pile up in the socket for ``window`` seconds, to take them in one read.

    The API server flushes every event on its own, so each one used to cost a wake-up of the
    loop, a TLS read, an HTTP parse and a task step: about as much as decoding it.  Holding the
    socket for 20 ms (nothing an operator would notice) turns a storm of heartbeats into a few
    big reads.  aiohttp's own flow control pauses the same way when its buffer is full.
    """
    connection = response.connection
    protocol = connection.protocol if connection is not None else None
    if protocol is None or protocol.transport is None or protocol.transport.is_closing():
        return
    protocol.pause_reading()
    try:
        await asyncio.sleep(window)
    finally:
        if protocol.transport is not None and not protocol.transport.is_closing():
            protocol.resume_reading()

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
        # The start of a line still missing its end, in the pieces it came in: joined once when
        # the end arrives (appending bytes to bytes would copy it again for every piece).
        self._pieces: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if not lines:  # no newline in this chunk
            if rest:
                self._pieces.append(rest)
            return []
        if self._pieces:
            self._pieces.append(lines[0])
            lines[0] = b"".join(self._pieces)
            self._pieces = []
        if rest:
            self._pieces.append(rest)
        return [line for line in lines if line and not line.isspace()]


async def gather_more(response: aiohttp.ClientResponse, *, window: float) -> None:
    """Let the next events pile up in the socket for ``window`` seconds, to take them in one read.

    The API server flushes every event on its own, so each one used to cost a wake-up of the
    loop, a TLS read, an HTTP parse and a task step: about as much as decoding it.  Holding the
    socket for 250 ms (nothing next to the seconds a config takes to propagate) turns a storm
    of heartbeats into a few big reads; docs/reading.md has the figures.  The informer only
    holds after a small read, so the socket never holds more than one window's worth: far
    below what would make the API server drop a slow watcher.  aiohttp's own flow control
    pauses the same way when its buffer is full.
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

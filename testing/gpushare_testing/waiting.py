"""Polling helpers for tests that wait on a real API server to converge."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    until: Callable[[T], bool] = bool,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``probe`` until ``until(result)`` holds; fail with the last result on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if until(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {result!r}")
        await asyncio.sleep(interval)

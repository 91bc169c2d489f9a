"""Which event loop the operator and the webhook's process run on."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


def loop_factory(
    env: dict[str, str] | None = None,
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop unless told otherwise (``GPUSHARE_EVENT_LOOP=asyncio``) or not installed.

    Per watch event, the standard loop's selector, SSL transport and callbacks cost about as
    much as decoding the event; uvloop does the same in C (docs/reading.md has the figures).
    ``None`` means the standard loop.
    """
    choice = (os.environ if env is None else env).get("GPUSHARE_EVENT_LOOP", "uvloop")
    if choice == "asyncio":
        return None
    if choice != "uvloop":
        raise ValueError(f"GPUSHARE_EVENT_LOOP must be uvloop or asyncio, not {choice!r}")
    try:
        import uvloop
    except ImportError:  # a platform without a wheel: the standard loop does the same work
        return None
    return uvloop.new_event_loop

"""Several writes in flight at once, never two for the same object.

One write at a time caps the writer at one round trip per write (about 14 ms on an idle API
server, far more on a busy one), whatever its QPS says; a rollout over thousands of nodes then
takes minutes.  So the writer runs up to ``limit`` jobs at once, the way a controller-runtime
work queue feeds several workers: an object that is being written is *busy*; if it turns dirty
again meanwhile it is not written twice in parallel (the second write could land first and be
overwritten by the stale one) but handed back to the dirty set once the first job is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

Key = tuple[str, str]  # (kind, name)


class InFlight:
    def __init__(self, *, limit: int, again: Callable[[Key], None]) -> None:
        if limit < 1:
            raise ValueError("at least one write must be allowed in flight")
        self._slots = asyncio.Semaphore(limit)
        self._again = again  # marks an object dirty again
        self.busy: set[Key] = set()
        self._return: set[Key] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def busy_names(self, kind: str) -> set[str]:
        return {name for k, name in self.busy if k == kind}

    async def slot(self) -> None:
        """Wait for room for one more job (taken before choosing the job, so it is fresh)."""
        await self._slots.acquire()

    def release(self) -> None:
        """Give back a slot that ended up unused."""
        self._slots.release()

    def claim(self, key: Key) -> bool:
        """Mark ``key`` busy; if it already is, remember to hand it back and say no."""
        if key in self.busy:
            self._return.add(key)
            return False
        self.busy.add(key)
        return True

    def spawn(self, key: Key, job: Coroutine[Any, Any, None]) -> None:
        """Run a claimed job in the background; its slot and claim end with it."""
        task = asyncio.create_task(self._run(key, job), name=f"write {key[0]} {key[1]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run_here(self, key: Key, job: Coroutine[Any, Any, None]) -> None:
        """Run a claimed job to its end before choosing anything else (a barrier)."""
        await self._run(key, job)

    async def _run(self, key: Key, job: Coroutine[Any, Any, None]) -> None:
        try:
            await job
        finally:
            self.busy.discard(key)
            self._slots.release()
            if key in self._return:
                self._return.discard(key)
                self._again(key)

    async def drain(self, *, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every background job to end; True if they all did.

        A graceful stop lets requests already sent come back rather than cancel them: a
        cancelled request may still land, after the lease has passed to another replica."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=max(0.0, timeout))
        return not self._tasks

    async def cancel(self) -> None:
        """Stop every background job (shutdown): nothing may be left running."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

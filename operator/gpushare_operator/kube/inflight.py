"""Several writes in flight at once, each a task; the work queue keeps them one per object.

One write at a time caps the writer at one round trip per write (about 14 ms on an idle API
server, far more on a busy one), whatever its QPS says; a rollout over thousands of nodes then
takes minutes.  So the writer runs up to ``limit`` jobs at once, the way a controller-runtime
work queue feeds several workers.  That no object is written twice at once (the second write
could land first and be overwritten by the stale one) is the work queue's single-flight rule
(``core.workqueue``): a key handed out is processing until ``finished`` reports it done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

Key = tuple[str, str]  # (kind, name)


class InFlight:
    def __init__(self, *, limit: int, finished: Callable[[Key], None]) -> None:
        if limit < 1:
            raise ValueError("at least one write must be allowed in flight")
        self._slots = asyncio.Semaphore(limit)
        self._finished = finished  # tells the work queue the key is done
        self.busy: set[Key] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def slot(self) -> None:
        """Wait for room for one more job (taken before choosing the job, so it is fresh)."""
        await self._slots.acquire()

    def release(self) -> None:
        """Give back a slot that ended up unused."""
        self._slots.release()

    def spawn(self, key: Key, job: Coroutine[Any, Any, None]) -> None:
        """Run a job in the background; its slot and key end with it."""
        self.busy.add(key)
        task = asyncio.create_task(self._run(key, job), name=f"write {key[0]} {key[1]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run_here(self, key: Key, job: Coroutine[Any, Any, None]) -> None:
        """Run a job to its end before choosing anything else (a barrier)."""
        self.busy.add(key)
        await self._run(key, job)

    async def _run(self, key: Key, job: Coroutine[Any, Any, None]) -> None:
        try:
            await job
        finally:
            self.busy.discard(key)
            self._slots.release()
            self._finished(key)

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

"""Waiting for quiet: the operator has nothing left to write, and the audit log holds everything
it wrote.  What a test asserts "did not happen" it then reads from the log up to that moment.

A fixed sleep only hopes that the operator would have acted by then, and costs its full length
every time.  Quiet is a fact instead, established in rounds:

1. every leading replica's ``gpushare_write_queue_depth`` is 0 (queued, being written, held
   back and retrying all count), and at least one replica leads;
2. a marker write (a ConfigMap applied in the test's namespace) is seen in the audit log.  The
   API server logs each request before it answers it (``--audit-log-mode=blocking``), so every
   write the operator had sent and been answered before the marker is in the log before it;
3. the operator's writes before this marker are counted; quiet is reached when two rounds at
   least ``WINDOW`` apart count the same.  An event still on its way (the echo of the
   operator's own write, a change the test just made) reaches it within milliseconds, and the
   writer lets a burst settle for 0.2 s before it writes: what such an event causes lands
   inside the window, between the two markers.

A write loop never lets two rounds agree: ``quiet`` then fails after ``timeout``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

from gpushare_testing.auditlog import AuditEvent, changes_by
from gpushare_testing.controlplane import ControlPlane
from gpushare_testing.operators import RunningOperator
from gpushare_testing.waiting import eventually

POLL = 0.05  # seconds between reads of the audit log and of /metrics
WINDOW = 0.5  # seconds between the two markers that must count the same writes


async def quiet(
    plane: ControlPlane,
    operators: Sequence[RunningOperator],
    *,
    namespace: str,
    timeout: float = 30.0,
) -> list[AuditEvent]:
    """Until ``operators`` are quiet (see the module); returns the audit log before the last
    marker, which holds every write they made up to then."""
    deadline = time.monotonic() + timeout
    users = {operator.user for operator in operators}
    counted: int | None = None
    marked = 0.0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(
                f"never quiet in {timeout:g} s: {users} kept writing ({counted} writes so far)"
            )
        # The window is what is waited for here: the writes that land in it are the answer.
        await asyncio.sleep(max(0.0, marked + WINDOW - time.monotonic()))
        await empty_write_queues(operators, timeout=left)
        before = await marker(plane, namespace=namespace, timeout=max(1.0, left))
        marked = time.monotonic()
        count = len(changes_by(before, users))
        if count == counted:
            return before
        counted = count


async def empty_write_queues(operators: Sequence[RunningOperator], *, timeout: float) -> None:
    """Until one of ``operators`` leads and each one that leads has nothing left to write (a
    follower queues what it sees but never writes, so its queue does not count)."""

    async def idle() -> bool:
        leading = 0
        for operator in operators:
            metrics = await operator.metrics()
            if metrics["gpushare_leader"] == 1:
                leading += 1
                if metrics["gpushare_write_queue_depth"] != 0:
                    return False
        return leading > 0

    await eventually(idle, timeout=timeout, interval=POLL, what="an empty write queue")


async def marker(plane: ControlPlane, *, namespace: str, timeout: float) -> list[AuditEvent]:
    """Write a throwaway ConfigMap in ``namespace``; once the write is in the audit log, return
    every event logged before it."""
    name = f"quiet-{uuid.uuid4().hex[:10]}"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
    # A server-side apply, so that the name is in the URL and so in the audit event's objectRef.
    path = f"/api/v1/namespaces/{namespace}/configmaps/{name}?fieldManager=gpushare-tests"
    start = len(plane.audit_events())
    # Off the event loop: the simulator's agents run on it.
    status, raw = await asyncio.to_thread(
        plane.request, "PATCH", path, body=body, content_type="application/apply-patch+yaml"
    )
    assert status == 201, raw

    def is_marker(event: AuditEvent) -> bool:
        ref = event["objectRef"]
        return bool(ref.get("resource") == "configmaps" and ref.get("name") == name)

    async def logged() -> int | None:
        events = plane.audit_events()
        return next((i for i in range(start, len(events)) if is_marker(events[i])), None)

    index = await eventually(
        logged,
        until=lambda found: found is not None,
        timeout=timeout,
        interval=POLL,
        what=f"the marker ConfigMap {namespace}/{name} in the audit log",
    )
    assert index is not None
    return plane.audit_events()[:index]

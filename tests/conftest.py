"""Fixtures shared by every test: the real local control plane and asyncio hygiene."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings

from gpushare_testing.controlplane import ControlPlane

logger = logging.getLogger("tests")

# No per-example deadline: the machine is shared and noisy, and a slow example is no wrong
# answer (speed is measured by the benchmarks, never by a test).
settings.register_profile("gpushare", deadline=None)
settings.load_profile("gpushare")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """One etcd + kube-apiserver (+ controller manager, scheduler) for the session, RBAC on."""
    plane = ControlPlane()
    plane.start()  # logs its own startup time
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def _asyncio_task_guard() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    # One turn of the loop lets tasks that were cancelled on the way out finish.
    await asyncio.sleep(0)
    current = asyncio.current_task()
    leftover = [
        task
        for task in asyncio.all_tasks()
        if task is not current and task not in before and not task.done()
    ]
    for task in leftover:
        task.cancel()
    if leftover:
        names = ", ".join(sorted(task.get_name() for task in leftover))
        pytest.fail(f"test left {len(leftover)} asyncio task(s) running: {names}")


@pytest.fixture(autouse=True)
def _no_leftover_tasks(request: pytest.FixtureRequest) -> None:
    """Fail any async test that leaves asyncio tasks running behind it."""
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("_asyncio_task_guard")

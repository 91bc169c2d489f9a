"""Fixtures shared by every test: the real local control plane and asyncio hygiene; and how
``make test`` shares the tests out between its workers (pytest-xdist)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import settings

from gpushare_testing.controlplane import ControlPlane

logger = logging.getLogger("tests")

# No per-example deadline: the machine is shared and noisy, and a slow example is no wrong
# answer (speed is measured by the benchmarks, never by a test).
settings.register_profile("gpushare", deadline=None)
settings.load_profile("gpushare")


# Files that share one xdist worker under `make test`, one after another (see the scheduler
# below), by the group they are in.
SHARED_WORKERS = {
    # The heaviest load tests: no two of them run at once.
    "tests/integration/test_backoff.py": "load",
    "tests/integration/test_lease_load.py": "load",
    "tests/integration/test_metrics_flood.py": "load",
    # They build the wheel from the source tree: `pip wheel` writes build/ and the egg-info
    # there, and two builds at once could mix their files.
    "tests/integration/test_mig_tables.py": "in-tree-build",
    "tests/integration/test_packaging.py": "in-tree-build",
    "tests/unit/test_layout.py": "in-tree-build",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole files to each worker, as ``--dist loadfile`` does (module fixtures, such as a
    module's own control plane or the node guard, are set up once), except that the files of
    one group of ``SHARED_WORKERS`` go to one worker as one unit.  Files (and groups, where
    their first file stands) go out in collection order with ``--no-loadscope-reorder``:
    integration tests first, the many short unit files last, to even out the end.

    By path, not by ``xdist_group`` marks: ``--dist loadgroup`` reads those from suffixes it
    adds to the test ids, which the ids do not keep under pytest 9."""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_WORKERS.get(path, path)

    return FileOrGroup(config, log)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """One etcd + kube-apiserver (+ controller manager, scheduler) for the session, RBAC on:
    under ``make test``, one per xdist worker, each on free ports and a directory of its own."""
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

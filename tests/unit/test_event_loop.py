"""The operator runs on uvloop by default, and on the standard loop when told or when missing."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from gpushare_operator.app.cli import loop_factory


def test_uvloop_is_the_default() -> None:
    factory = loop_factory({})
    assert factory is uvloop.new_event_loop
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_the_standard_loop_when_asked() -> None:
    assert loop_factory({"GPUSHARE_EVENT_LOOP": "asyncio"}) is None


def test_the_standard_loop_when_uvloop_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # makes `import uvloop` fail
    assert loop_factory({}) is None


def test_a_misspelt_loop_is_an_error() -> None:
    with pytest.raises(ValueError, match="uvloop or asyncio"):
        loop_factory({"GPUSHARE_EVENT_LOOP": "uv"})


def test_a_runner_with_the_factory_runs_coroutines_on_uvloop() -> None:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    with asyncio.Runner(loop_factory=loop_factory({})) as runner:
        assert runner.run(which()).startswith("uvloop")

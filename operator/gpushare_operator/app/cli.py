"""Command line: ``python -m gpushare_operator run|version``."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Sequence

import structlog

from gpushare_operator import __version__
from gpushare_operator.app import logs, settings
from gpushare_operator.app.runner import run_operator

log = structlog.get_logger("gpushare")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpushare-operator", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the operator")
    settings.add_run_arguments(run, env=os.environ)
    commands.add_parser("version", help="print the operator's version")
    return parser


async def _run_until_signalled(config: settings.Settings) -> None:
    """Run until SIGINT/SIGTERM, then let the operator shut down in order."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await run_operator(settings=config, stop=stop)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command == "version":
        print(__version__)
        return 0
    try:
        config = settings.settings_from_args(args)
        factory = loop_factory()
    except ValueError as exc:
        print(f"gpushare-operator run: error: {exc}", file=sys.stderr)
        return 2
    logs.configure_logging(log_format=config.log_format)
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_run_until_signalled(config))
    return 0

"""How the plugin prints: aligned plain-text tables, bars on a terminal, JSON or YAML for machines.

Every command first builds one report (plain dicts and lists), then prints it: ``-o json`` and
``-o yaml`` print the report itself, the default prints text rendered from it, so the two can
never say different things.  Text carries no colour and no bars when stdout is not a terminal,
so a pipeline's log reads the same as a file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

FORMATS = ("text", "json", "yaml")
BAR_WIDTH = 12
_LISTED = 5


@dataclass(frozen=True, slots=True)
class Style:
    """What the terminal shows: bars and bold headings on a TTY, plain text elsewhere."""

    bars: bool = False
    bold: bool = False

    @classmethod
    def for_stream(cls, stream: TextIO, env: Mapping[str, str] | None = None) -> Style:
        environ = os.environ if env is None else env
        tty = stream.isatty()
        return cls(bars=tty, bold=tty and not environ.get("NO_COLOR"))

    def heading(self, text: str) -> str:
        return f"\033[1m{text}\033[0m" if self.bold else text


def emit(report: Mapping[str, Any], *, fmt: str, text: str, stream: TextIO = sys.stdout) -> None:
    """Print ``report`` as JSON or YAML, or the already rendered ``text``."""
    if fmt == "json":
        stream.write(json.dumps(report, indent=2, sort_keys=False) + "\n")
    elif fmt == "yaml":
        stream.write(yaml.safe_dump(dict(report), sort_keys=False, default_flow_style=False))
    else:
        stream.write(text if text.endswith("\n") else text + "\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, indent: str = "") -> str:
    """Columns padded to their widest cell, two spaces apart (as kubectl prints)."""
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(_width(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell + " " * (widths[i] - _width(cell)) for i, cell in enumerate(row)]
        lines.append(indent + "  ".join(padded).rstrip())
    return "\n".join(lines)


def _width(cell: str) -> int:
    """Printed width: escape sequences take no room."""
    width, escaped = 0, False
    for char in cell:
        if char == "\033":
            escaped = True
        elif escaped:
            escaped = char != "m"
        else:
            width += 1
    return width


def bar(used: int, total: int, *, width: int = BAR_WIDTH) -> str:
    """``█████░░░░░░░`` for used/total; full and marked ``!`` when used exceeds total."""
    if total <= 0:
        return "░" * width if used <= 0 else "!" + "█" * (width - 1)
    filled = min(width, round(width * used / total))
    if used and not filled:
        filled = 1  # something is allocated: never show an empty bar
    marker = "!" if used > total else ""
    return marker + "█" * (filled - len(marker)) + "░" * (width - filled)


def slots(used: int, total: int, style: Style) -> str:
    text = f"{used}/{total}"
    return f"{bar(used, total)} {text}" if style.bars else text


def duration(seconds: float) -> str:
    """``45s``, ``6m15s``, ``1h02m``: what a reader plans a maintenance window with."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def names(items: Sequence[str], *, limit: int = _LISTED) -> str:
    """``a, b, c and 12 more``: long node lists are counted, not printed, in text."""
    shown = ", ".join(items[:limit])
    more = len(items) - limit
    return f"{shown} and {more} more" if more > 0 else shown


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


@dataclass
class Trace:
    """``-v``: when each step ended, on stderr, so a slow plan says where its time went."""

    enabled: bool = False
    stream: TextIO = sys.stderr
    started: float = field(default_factory=time.monotonic)

    def mark(self, what: str) -> None:
        if self.enabled:
            self.stream.write(f"[{time.monotonic() - self.started:6.2f}s] {what}\n")

"""Durations as Kubernetes objects write them for people: ``10m``, ``90s``, ``1h30m``.

Whole hours, minutes and seconds, in that order: a subset of Go's ``time.ParseDuration`` (and of
CEL's ``duration()``, which the CRD's rule uses), so that the schema, CEL and Python read the
same text the same way.
"""

from __future__ import annotations

import re
from typing import Final

# Unanchored, backslash-free: usable in an OpenAPI pattern, in CEL and in Python alike.
DURATION_PATTERN: Final = "([0-9]{1,5}h)?([0-9]{1,5}m)?([0-9]{1,5}s)?"
DURATION_MAX_LENGTH: Final = 18
_DURATION_RE: Final = re.compile(DURATION_PATTERN)


def seconds(text: str) -> int:
    """Seconds in ``text``; ValueError when it is no such duration (the empty text included)."""
    match = _DURATION_RE.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration such as 10m, 90s or 1h30m")
    hours, minutes, secs = (int((part or "0").rstrip("hms") or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + secs

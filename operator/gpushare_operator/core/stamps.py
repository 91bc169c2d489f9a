"""RFC 3339 stamps as our statuses carry them: whole seconds, UTC, a ``Z``."""

from __future__ import annotations

import datetime
import math


def epoch_of(stamp: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 stamp; None for anything else."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339(epoch: float) -> str:
    """The stamp of a moment, truncated to its second."""
    moment = datetime.datetime.fromtimestamp(math.floor(epoch), datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

"""What the operator and the webhook's process say to each other, one JSON object a line.

Over one socket pair (``app.admissionprocess`` holds one end, ``app.admissionchild`` the
other).  The operator sends what an answer depends on, whole, each time it changes:

- ``{"pair": {"tls.crt": ..., "tls.key": ...}}``: the serving certificate, once OpenSSL took it
  in the operator too;
- ``{"offers": {"synced": ..., "offers": [[memory_mib, resource, isolation, policy], ...],
  "resources": [...]}}``: ``core.slots.reviews.Offers``.

The webhook's process reports (``Report``) every ``REPORT_INTERVAL``: whether it listens and with
which certificate, what it answered since its last report and how long each answer took, its
loop's lateness and its collections, for the operator's /metrics and /readyz.  A line is never
longer than ``MAX_LINE``; orjson writes no newline inside one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from gpushare_operator.core.slots import reviews
from gpushare_operator.core.slots.slotclasses import Isolation, Offer

MAX_LINE: Final = 1024 * 1024
REPORT_INTERVAL: Final = 0.25


def pair_line(pair: Mapping[str, str]) -> bytes:
    return orjson.dumps({"pair": dict(pair)}) + b"\n"


def offers_line(offers: reviews.Offers) -> bytes:
    return (
        orjson.dumps(
            {
                "offers": {
                    "synced": offers.synced,
                    "offers": [
                        [o.memory_mib, o.resource, o.isolation.value, o.policy]
                        for o in offers.offers
                    ],
                    "resources": sorted(offers.gpu_resources),
                }
            }
        )
        + b"\n"
    )


def offers_of(sent: Mapping[str, Any]) -> reviews.Offers:
    """The ``offers`` message's body, as the answer reads it (immutable)."""
    return reviews.Offers(
        synced=bool(sent["synced"]),
        offers=tuple(
            Offer(memory_mib=int(m), resource=str(r), isolation=Isolation(i), policy=str(p))
            for m, r, i, p in sent["offers"]
        ),
        gpu_resources=frozenset(str(r) for r in sent["resources"]),
    )


@dataclass(slots=True)
class Report:
    """What the webhook's process did since its last report."""

    listening: bool = False
    serving: str | None = None  # the fingerprint of the certificate it serves with
    # Of each answer, in seconds: its review's first byte to its last, its last byte to the
    # answer handed to the kernel, and the wait for the core the write caused beyond that
    # (``app.reviewserver.Observer``).
    answers: list[tuple[float, float, float]] = field(default_factory=list)
    # (outcome, refusal reason) of each counted answer.
    outcomes: list[tuple[str, str | None]] = field(default_factory=list)
    lag: tuple[float, float] = (0.0, 0.0)  # its loop's lateness: recent worst, worst
    collections: tuple[int, ...] = (0, 0, 0)  # per generation, since it started

    def line(self) -> bytes:
        return (
            orjson.dumps(
                {
                    "listening": self.listening,
                    "serving": self.serving,
                    "answers": self.answers,
                    "outcomes": self.outcomes,
                    "lag": self.lag,
                    "collections": self.collections,
                }
            )
            + b"\n"
        )


def report_of(line: bytes) -> Report:
    sent = orjson.loads(line)
    return Report(
        listening=bool(sent["listening"]),
        serving=sent["serving"],
        answers=[(float(a), float(b), float(c)) for a, b, c in sent["answers"]],
        outcomes=[(str(o), None if r is None else str(r)) for o, r in sent["outcomes"]],
        lag=(float(sent["lag"][0]), float(sent["lag"][1])),
        collections=tuple(int(n) for n in sent["collections"]),
    )

"""The seam between I/O code and metrics: kube reports, app decides how to count.

Keeping prometheus out of this layer keeps the informer and writer testable with a recording
fake, and lets the app layer own the registry (one per operator instance, not a global).
"""

from __future__ import annotations

from typing import Protocol


class Telemetry(Protocol):
    def event_ingested(self, kind: str, seconds: float) -> None: ...
    def informer_failed(self, kind: str, reason: str) -> None: ...
    def reconciled(self, kind: str, seconds: float) -> None: ...
    def wrote(self, kind: str, outcome: str, seconds: float) -> None: ...
    def evicted(self, result: str, count: int) -> None: ...


class NoTelemetry:
    def event_ingested(self, kind: str, seconds: float) -> None:
        return None

    def informer_failed(self, kind: str, reason: str) -> None:
        return None

    def reconciled(self, kind: str, seconds: float) -> None:
        return None

    def wrote(self, kind: str, outcome: str, seconds: float) -> None:
        return None

    def evicted(self, result: str, count: int) -> None:
        return None

"""Reading the API server's audit log: who wrote what, when, and with what answer.

Integration tests judge the operator by this log, never by its own account.  The audit policy
(``components.AUDIT_POLICY``) logs writes only, with who made them, so every event here is a
write (or a write attempt that was refused), but for lists of pods (``READS`` verbs: which pods
a client looked at) and for users in the ``components.READS_AUDITED`` group, whose reads are
logged too.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

AuditEvent = dict[str, Any]
READS = frozenset({"get", "list", "watch"})
WriteKey = tuple[str, str, str]  # (resource, name, subresource or "")


def received(event: AuditEvent) -> datetime:
    """When the API server received the request."""
    return datetime.fromisoformat(event["requestReceivedTimestamp"])


def completed(event: AuditEvent) -> datetime:
    """When its answer was complete (``stageTimestamp`` at ResponseComplete)."""
    return datetime.fromisoformat(event["stageTimestamp"])


def seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def code(event: AuditEvent) -> int:
    return int((event.get("responseStatus") or {}).get("code") or 0)


def succeeded(event: AuditEvent) -> bool:
    return 200 <= code(event) < 300


def is_lease(event: AuditEvent) -> bool:
    return bool(event["objectRef"].get("resource") == "leases")


def write_key(event: AuditEvent) -> WriteKey:
    ref = event["objectRef"]
    return (str(ref.get("resource")), str(ref.get("name")), str(ref.get("subresource") or ""))


def describe(events: Iterable[AuditEvent]) -> list[str]:
    """One line per write, for assertion messages."""
    lines = []
    for e in events:
        what = "/".join(part for part in write_key(e) if part)
        where = e["objectRef"].get("namespace") or "-"
        lines.append(f"{e['requestReceivedTimestamp']} {e['verb']} {what} in {where} -> {code(e)}")
    return lines


def is_read(event: AuditEvent) -> bool:
    return event.get("verb") in READS


def changes_by(events: Iterable[AuditEvent], users: Iterable[str]) -> list[AuditEvent]:
    """The writes of ``users`` that change the cluster or tell of a change: everything but
    reads and Lease writes, which an elector makes every retry period by design."""
    names = set(users)
    return [
        e for e in events if e["user"]["username"] in names and not is_lease(e) and not is_read(e)
    ]

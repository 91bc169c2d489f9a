"""One object an informer is narrowed to by name: the webhook's Secret, its configuration.

A sink like the others (a re-list replaces what it holds: absent from the listing means gone),
for collections of one object, whose every change matters to someone: ``on_change`` is called
after each, with the body as it is now (None: absent).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class HeldObject:
    def __init__(self, *, on_change: Callable[[Mapping[str, Any] | None], None]) -> None:
        self.body: Mapping[str, Any] | None = None  # the object as last seen; None: absent
        self.seen = False  # a first listing has answered (absent or not)
        self._on_change = on_change
        self._listed: Mapping[str, Any] | None = None
        self._listing = False

    def begin_relist(self) -> None:
        self._listing, self._listed = True, None

    def relist_item(self, obj: dict[str, Any]) -> None:
        self._listed = obj

    def end_relist(self) -> None:
        self._listing = False
        self._set(self._listed)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._set(None if event_type == "DELETED" else obj)

    def _set(self, body: Mapping[str, Any] | None) -> None:
        first = not self.seen
        self.seen = True
        if body == self.body and not first:
            return
        self.body = body
        self._on_change(body)

"""Immutable label sets that share their key layout across nodes.

A GPU node carries 50-80 labels, and nodes of one pool carry the same keys: a plain dict per
node spends ~1.5 KiB on a hash table that is the same for all of them.  A ``LabelSet`` keeps
only a tuple of (interned) values; the key → position table is shared by every set with the
same keys, and freed when the last such set goes.  Reads stay dict lookups.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar, overload

T = TypeVar("T")

_intern = sys.intern


class _Layout(dict[str, int]):
    """key → position, one per distinct key tuple; weakly cached, so unused layouts go."""

    __slots__ = ("__weakref__", "keys_tuple")

    keys_tuple: tuple[str, ...]


_layouts: weakref.WeakValueDictionary[tuple[str, ...], _Layout] = weakref.WeakValueDictionary()


def _layout(keys: tuple[str, ...]) -> _Layout:
    layout = _layouts.get(keys)
    if layout is None:
        layout = _Layout((key, index) for index, key in enumerate(keys))
        layout.keys_tuple = keys
        _layouts[keys] = layout
    return layout


class LabelSet(Mapping[str, str]):
    __slots__ = ("_layout", "_values")

    def __init__(self, raw: Mapping[str, str] | None = None) -> None:
        items = raw or {}
        keys = tuple(_intern(str(k)) for k in items)
        self._layout = _layout(keys)
        self._values = tuple(_intern(str(v)) for v in items.values())

    def __getitem__(self, key: str) -> str:
        return self._values[self._layout[key]]

    @overload
    def get(self, key: str, /) -> str | None: ...
    @overload
    def get(self, key: str, default: str, /) -> str: ...
    @overload
    def get(self, key: str, default: T, /) -> str | T: ...
    def get(self, key: str, default: Any = None, /) -> Any:
        index = self._layout.get(key)
        return default if index is None else self._values[index]

    def __contains__(self, key: object) -> bool:
        return key in self._layout

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout.keys_tuple)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LabelSet):
            if self._layout is other._layout:
                return self._values == other._values
            return dict(self.items()) == dict(other.items())
        if isinstance(other, Mapping):
            # The heartbeat fast path: a decoded body's labels, usually in the same key order.
            if tuple(other) == self._layout.keys_tuple:
                return tuple(other.values()) == self._values
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking Mapping: not hashable

    def __repr__(self) -> str:
        return f"LabelSet({dict(self.items())!r})"

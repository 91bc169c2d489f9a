"""JSON patches that change one member of a list another manager shares with us.

A Node's ``spec.taints`` and a policy's ``metadata.finalizers`` are atomic lists: a merge or
apply patch would replace them whole, dropping what others put there meanwhile.  A JSON patch
that first *tests* the list it read and then appends or removes one member either changes
exactly that member, in place, or fails (HTTP 422) and is planned again from the fresh object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

JsonPatch = list[dict[str, Any]]
T = TypeVar("T")


def _copy(items: Sequence[T]) -> list[Any]:
    return [dict(item) if isinstance(item, Mapping) else item for item in items]


def appended(path: str, current: Sequence[T], item: T) -> JsonPatch:
    """Append ``item`` to the list at ``path``, which must still be ``current``."""
    value = dict(item) if isinstance(item, Mapping) else item
    if not current:
        # The API server's RFC 6902 implementation takes a missing member as equal to null.
        return [
            {"op": "test", "path": path, "value": None},
            {"op": "add", "path": path, "value": [value]},
        ]
    return [
        {"op": "test", "path": path, "value": _copy(current)},
        {"op": "add", "path": f"{path}/-", "value": value},
    ]


def removed(path: str, current: Sequence[T], match: Callable[[T], bool]) -> JsonPatch | None:
    """Remove the members ``match`` picks from the list at ``path`` (still ``current``);
    None when there is none.  The list goes altogether when nothing else is left in it."""
    at = [i for i, item in enumerate(current) if match(item)]
    if not at:
        return None
    patch: JsonPatch = [{"op": "test", "path": path, "value": _copy(current)}]
    if len(at) == len(current):
        return [*patch, {"op": "remove", "path": path}]
    # From the end, so that the earlier indexes stay right.
    return patch + [{"op": "remove", "path": f"{path}/{i}"} for i in reversed(at)]

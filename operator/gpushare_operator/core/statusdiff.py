"""What an installed CRD drops of a status we write, and the status without it.

Helm never upgrades CRDs, so an operator may run against an older schema that prunes fields it
writes (say ``status.configReadyAt``).  Every echo of such a status then differs from the
render, looks like drift, and is rewritten, forever.  The write path compares each answer with
what it sent (:func:`dropped_paths`); a field dropped twice in a row is taken as not in the
installed schema, left out of renders and comparisons (:func:`without`), and reported.

Paths are tuples of dict keys and list indexes, e.g. ``("conditions", 0, "observedGeneration")``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

Path = tuple[str | int, ...]


def dropped_paths(written: Any, echoed: Any, *, at: Path = ()) -> frozenset[Path]:
    """Paths present in ``written`` and absent from ``echoed`` (values that differ are not
    drops: someone else may have changed them)."""
    return frozenset(_dropped(written, echoed, at))


def _dropped(written: Any, echoed: Any, at: Path) -> Iterator[Path]:
    if isinstance(written, Mapping) and isinstance(echoed, Mapping):
        for key, value in written.items():
            if key not in echoed:
                yield (*at, key)
            else:
                yield from _dropped(value, echoed[key], (*at, key))
    elif _is_list(written) and _is_list(echoed) and len(written) == len(echoed):
        for index, (mine, theirs) in enumerate(zip(written, echoed, strict=True)):
            yield from _dropped(mine, theirs, (*at, index))


def without(obj: Mapping[str, Any], paths: frozenset[Path]) -> dict[str, Any]:
    """``obj`` with ``paths`` removed; list paths match any index (a dropped field of one
    condition is dropped from every condition)."""
    if not paths:
        return dict(obj)
    out: dict[str, Any] = _without(obj, _generalised(paths))
    return out


def _generalised(paths: frozenset[Path]) -> frozenset[Path]:
    return frozenset(tuple(-1 if isinstance(p, int) else p for p in path) for path in paths)


def _without(obj: Any, paths: frozenset[Path]) -> Any:
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if (key,) in paths:
                continue
            inner = frozenset(p[1:] for p in paths if len(p) > 1 and p[0] == key)
            out[key] = _without(value, inner) if inner else value
        return out
    if _is_list(obj):
        inner = frozenset(p[1:] for p in paths if len(p) > 1 and p[0] == -1)
        return [_without(item, inner) for item in obj] if inner else list(obj)
    return obj


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def describe(paths: frozenset[Path]) -> str:
    """``status.a, status.conditions[].b`` for messages."""
    names = sorted(
        "status." + ".".join("[]" if isinstance(p, int) else p for p in path).replace(".[]", "[]")
        for path in _generalised(paths)
    )
    return ", ".join(dict.fromkeys(names))

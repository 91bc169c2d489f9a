"""Handing freed heap back to the operating system after the first list.

The first list of a large cluster decodes tens of MiB of JSON that the slim caches drop at once;
glibc keeps most of those freed pages mapped, so the process's RSS would stay at the list's
peak for good.  ``malloc_trim`` returns them.  Elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


def release_free_heap() -> bool:
    """Collect garbage, then trim the C heap; True when the trim ran."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def freeze_survivors() -> None:
    """Move what the first sync left (the caches' records, the modules) out of the collector's
    sight: a full collection would otherwise walk every cached node and pod each time, and the
    webhook's and the informers' short-lived allocations trigger collections often (a profile
    of 100 admissions a second over 5,000 cached nodes spent 3.6% of the loop in them).  The
    records hold no reference cycles: when one is replaced, reference counting frees it."""
    gc.freeze()

"""The heap trim after the first list gives freed memory back (on glibc, as in the image)."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest

from gpushare_operator.app.heap import release_free_heap


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="no C library to trim")
def test_memory_freed_after_a_big_decode_goes_back_to_the_system() -> None:
    # Like a decoded list page: many mid-sized blocks from malloc, then all freed but the last.
    blocks = [bytes(2048) + i.to_bytes(4, "little") for i in range(60_000)]
    keep = blocks[-1]
    del blocks
    before = rss_mib()
    assert release_free_heap()
    assert rss_mib() < before - 50, "the freed ~120 MiB stayed mapped"
    assert keep[-4:] == (59_999).to_bytes(4, "little")

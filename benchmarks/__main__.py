"""``make bench``: every micro-benchmark in turn, each in a fresh interpreter.

A fresh interpreter per benchmark, because one leaves gigabytes of freed arenas, frozen GC
generations and warm allocator pools behind (the pod baseline caches 50,000 whole pods), and
the next one's timings and traces must not depend on what ran before it.

Exits 0 when every benchmark ran, whatever its budgets said (a MISS is a signal, printed in
its table); non-zero only when one failed, e.g. because gpushare and a baseline disagreed.
Run ``python -m benchmarks`` for all, or name some: ``python -m benchmarks pods``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence

BENCHMARKS: dict[str, str] = {
    "ingest": "Nodes: ingest, heartbeats, label and selector changes",
    "pods": "Pods: ingest, memory, and usage per change at two cache sizes",
    "dra": "DRA: ResourceSlice and ResourceClaim ingest and memory",
    "admission": "The memory-request webhook: time and memory per admission",
    "process": "Operator process: CPU per Node event over a real control plane",
}


def commands(names: Sequence[str]) -> list[list[str]]:
    """The command line of each named benchmark, in the order given."""
    return [[sys.executable, "-m", f"benchmarks.{name}"] for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(BENCHMARKS)}")
    names = parser.parse_args(argv).names or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"no such benchmark: {', '.join(unknown)}")
    worst = 0
    for name, command in zip(names, commands(names), strict=True):
        print(f"\n## {BENCHMARKS[name]}\n", flush=True)
        worst = max(worst, subprocess.call(command))
    return worst


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks.plan_reads``: what each way of reading the plan's collections costs.

Against a running cluster (``make bench-plugin BENCH_PLUGIN_ARGS="--quick --hold 1800"``
prints its kubeconfig): the plan's Nodes, GPUNodeStates and live Pods, read in each mode the
plugin could use, one mode after the other, round after round, so that the machine's load
weighs on all alike.  Per mode: wall time, this process's CPU, and, with ``--server-pid``, the
API server's CPU over the read (``/proc/PID/stat``: utime + stime).

Modes: kube/reading.py's streaming list (a watch with ``sendInitialEvents``, from the watch
cache; pods whose bytes name no tracked resource skipped undecoded), its paged list (each page
decoded whole), and the plugin's pages (kubectl/cluster.py's ``read_pages_into``: the same
paged list, each page split undecoded and only what is worth it decoded, the next page asked
for as soon as this one's continue token is in).  Results as a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.kube import reading
from gpushare_operator.kubectl import cluster

COLLECTIONS = {
    "pods": cluster.POD_LIST,
    "nodes": cluster.NODE_LIST,
    "gpunodestates": cluster.NODE_STATE_LIST,
}
Read = Callable[[reading.Api, reading.Collection, reading.Sink], Awaitable[None]]


async def streaming(api: reading.Api, collection: reading.Collection, sink: reading.Sink) -> None:
    await reading.Reader(api=api, collection=collection, sink=sink).relist()


async def paged(api: reading.Api, collection: reading.Collection, sink: reading.Sink) -> None:
    await reading.Reader(api=api, collection=collection, sink=sink, streaming=False).relist()


async def pages(api: reading.Api, collection: reading.Collection, sink: reading.Sink) -> None:
    await cluster.read_pages_into(api, collection, sink, purpose="the benchmark")


MODES: dict[str, Read] = {
    "streaming list": streaming,
    "paged list": paged,
    "plugin's pages": pages,
}


class Counter:
    """A sink that counts (the reads are timed, not the cache's work)."""

    def __init__(self) -> None:
        self.count = 0

    def begin_relist(self) -> None:
        self.count = 0

    def relist_item(self, obj: dict[str, Any]) -> None:
        self.count += 1

    def end_relist(self) -> None:
        return None

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self.count += 1


def server_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one(
    api: reading.Api, collection: reading.Collection, read: Read, server: int | None
) -> dict[str, float]:
    sink = Counter()
    cpu, served, started = time.process_time(), server_cpu(server), time.monotonic()
    await read(api, collection, sink)
    return {
        "wall_s": time.monotonic() - started,
        "cpu_s": time.process_time() - cpu,
        "server_cpu_s": server_cpu(server) - served,
        "objects": sink.count,
    }


async def measure(
    kubeconfig: str, names: Sequence[str], rounds: int, server: int | None
) -> dict[tuple[str, str], list[dict[str, float]]]:
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    async with cluster.connected(cluster.ClusterRef(kubeconfig=kubeconfig)) as api:
        cache = ClusterCache()
        await cluster.load_policies(api, cache)  # what the pods are kept for, as in a plan
        collections = dict(COLLECTIONS)
        collections["pods"] = replace(cluster.POD_LIST, worth_decoding=cluster.asks_for(cache))
        gc.disable()  # as load_fleet does
        for _ in range(rounds):
            for name in names:
                for mode, read in MODES.items():
                    runs = results.setdefault((name, mode), [])
                    runs.append(await one(api, collections[name], read, server))
        gc.enable()
    return results


def table(results: dict[tuple[str, str], list[dict[str, float]]]) -> str:
    rows = [
        "| collection | mode | objects decoded | wall (s) | client CPU (s) | API server CPU (s) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (name, mode), runs in results.items():

        def median(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        rows.append(
            f"| {name} | {mode} | {median('objects'):.0f} | {median('wall_s'):.2f}"
            f" | {median('cpu_s'):.2f} | {median('server_cpu_s'):.2f} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan_reads", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--server-pid", type=int, default=None, help="kube-apiserver's pid")
    parser.add_argument("--rounds", type=int, default=5, help="medians of this many reads")
    parser.add_argument(
        "--collections", default=",".join(COLLECTIONS), help="a comma-separated subset"
    )
    args = parser.parse_args(argv)
    names = [n for n in args.collections.split(",") if n]
    results = asyncio.run(measure(args.kubeconfig, names, args.rounds, args.server_pid))
    print(f"medians of {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

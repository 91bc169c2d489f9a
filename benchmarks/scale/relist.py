"""Re-list of every pod through the operator's real ``Informer``: paged quorum vs streaming list.

``python -m benchmarks.scale.relist --mode paged|streaming --pid kube-apiserver=N --pid etcd=M``
runs in a fresh process (a fresh ``ClusterCache`` and heap, so neither mode inherits the other's
cache or allocator arenas): it builds the pod informer as ``app.assembly`` does (the same
``Collection``, the same ``PodSink``), lists until ``synced``, and prints one JSON line with the
wall time, its own CPU and peak-RSS growth, and the API server's and etcd's CPU over the same
window, read from ``/proc/<pid>/stat`` as ``run.Sampler`` does (reading them in this process
keeps the window exactly the listing, not this process's imports and start-up).

This is a direct full list in each mode, not one forced by a 410 Gone: the informer's re-list
after a Gone goes through the same ``_list_then_watch``, so the listing measured is the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks.scale import stats
from gpushare_operator.app.assembly import PODS
from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import PodSink
from gpushare_operator.kube import connection
from gpushare_operator.kube.informer import Informer

REPO = Path(__file__).resolve().parents[2]
MODES = {"paged": False, "streaming": True}
LABELS = {
    "paged": "paged quorum list (before)",
    "streaming": "streaming list from the watch cache (after)",
}


def _proc_cpu(pid: int) -> float:
    return stats.parse_proc_stat_cpu(Path(f"/proc/{pid}/stat").read_text())


def _rss(field: str) -> int:
    return stats.parse_proc_status(Path("/proc/self/status").read_text()).get(field, 0)


class CountingPodSink(PodSink):
    """The operator's pod sink, counting what the listing handed it: the state keeps only the
    pods that matter to sharing, so its size would understate what was listed."""

    listed = 0

    def relist_item(self, obj: dict[str, Any]) -> None:
        self.listed += 1
        super().relist_item(obj)


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


async def measure(mode: str, pids: Mapping[str, int], kubeconfig: str | None) -> dict[str, Any]:
    handle = await connection.open_handle(kubeconfig=kubeconfig)
    async with handle:
        cache = ClusterCache()
        sink = CountingPodSink(cache)
        informer = Informer(api=handle.api, collection=PODS, sink=sink, streaming=MODES[mode])
        # VmHWM is reset to the current RSS here (write "5" to clear_refs), so the peak below
        # is the listing's, not the imports'; where that is refused the growth is an upper bound.
        _reset_peak()
        rss0 = _rss("VmRSS")
        system0 = {name: _proc_cpu(pid) for name, pid in pids.items()}
        cpu0 = time.process_time()
        wall0 = time.monotonic()
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), timeout=1800)
            wall = time.monotonic() - wall0
            cpu = time.process_time() - cpu0
            system = {name: _proc_cpu(pid) - system0[name] for name, pid in pids.items()}
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return {
        "mode": mode,
        # Which listing actually ran: a server that refuses streaming lists makes the
        # informer fall back to paged, and the row must not claim otherwise.
        "list_mode": informer.list_mode,
        "pods": sink.listed,
        "pods_kept": len(cache.usage.pods),
        "wall_s": round(wall, 2),
        "lister_cpu_s": round(cpu, 2),
        "system_cpu_s": {name: round(value, 2) for name, value in system.items()},
        "rss_growth_mib": round((_rss("VmHWM") - rss0) / stats.MIB, 1),
        "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale.relist")
    parser.add_argument("--mode", choices=sorted(MODES), required=True)
    parser.add_argument("--pid", action="append", default=[], help="name=pid to charge CPU to")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    args = parser.parse_args(argv)
    pids = {name: int(pid) for name, _, pid in (p.partition("=") for p in args.pid)}
    result = asyncio.run(measure(args.mode, pids, args.kubeconfig))
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    return 0


async def run_both(
    *,
    kubeconfig: Path,
    system_pids: Mapping[str, int],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Each mode in its own process, paged first (the order does not matter: the watch cache
    is always full, and a paged list reads etcd whatever came before)."""
    out: dict[str, Any] = {}
    repo, pythonpath = str(REPO), os.environ.get("PYTHONPATH", "")
    for mode in ("paged", "streaming"):
        command = [sys.executable, "-m", "benchmarks.scale.relist", "--mode", mode]
        command += [f"--pid={name}={pid}" for name, pid in system_pids.items()]
        command += ["--kubeconfig", str(kubeconfig)]
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (repo, pythonpath)))),
        )
        stdout, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"re-list ({mode}) exited {proc.returncode}")
        out[mode] = orjson.loads(stdout.splitlines()[-1])
        log(f"  re-list {mode}: {out[mode]}")
    return out


if __name__ == "__main__":
    sys.exit(main())

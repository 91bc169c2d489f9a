"""``make bench`` (``dra``): what the ResourceSlice and ResourceClaim informers cost per event and
keep per object.

Under backend DRA the operator watches two more collections.  A ResourceSlice is one node's
devices as NVIDIA's kubelet plugin lists them (an 8-GPU H100 node: eight full GPUs, or 56 MIG
devices of seven 1g.10gb each, every device with its attributes and ``memory``); a ResourceClaim
is one pod's allocation (kube-scheduler makes one per ``nvidia.com/gpu`` pod served through a
DeviceClass, KEP 5004).  Both arrive as watch lines; the informer's real line handler
(``kube.reading.Reader``) decodes them into the cache's slim records (``core.dra.driver``,
``core.dra.draclaims``): a slice keeps its node, pool generation and each device's name, type,
memory and profile; a claim its (pool, device) pairs and the pods it serves; a claim holding no
``gpu.nvidia.com`` device is not kept at all.

Measured as ratios against ``orjson.loads`` of the same lines, in the same run (the machine is
shared): the handler's time per line over decoding alone, and the bytes still allocated per kept
record (tracemalloc).  Budgets: per line at most the stdlib's ``json.loads`` alone (the Node
heartbeat's budget in ``benchmarks.ingest``; ``orjson.loads`` is the floor and is reported); at
most 128 B per kept slice device (identical devices of different nodes share one record) and
576 B per kept claim (its uid and its pod's are 170 B of it, the dict and the node index 130 B);
no claim of another driver kept.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

import orjson

from benchmarks import verdicts
from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.cache.sinks import ClaimSink, SliceSink
from gpushare_operator.kube.reading import Collection, Reader
from gpushare_testing import draplugin
from gpushare_testing.bodyparts import managed_entry
from gpushare_testing.migtables import load_tables

Handler = Callable[[bytes], object]
TIMES: Final = verdicts.TIMES
H100: Final = "NVIDIA-H100-80GB-HBM3"
GPUS: Final = 8
NODES: Final = 500  # slices: one per node
CLAIMS: Final = 4_000  # one per GPU pod of those nodes
ROUNDS: Final = 5
AT: Final = "2026-12-01T08:00:00Z"
GFD: Final = {
    "nvidia.com/gpu.product": H100,
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/cuda.driver.major": "580",
    "nvidia.com/cuda.driver.minor": "95",
    "nvidia.com/cuda.driver.rev": "05",
}


def slice_body(index: int, *, mig: bool) -> dict[str, Any]:
    """The slice of node ``index`` as the API server serves it (metadata and managedFields)."""
    node = f"gpu-node-{index:05d}"
    layout = [["1g.10gb"] * 7] * GPUS if mig else ()
    body = draplugin.slice_body(
        node=node,
        node_uid=f"uid-{node}",
        gpus=GPUS,
        labels=GFD,
        mig=layout,
        model=load_tables()[H100] if mig else None,
    )
    metadata = body["metadata"]
    metadata.update(
        name=f"{node}-gpu.nvidia.com-{index:05x}",
        uid=f"00000000-0000-4000-8000-{index:012d}",
        resourceVersion=str(100_000 + index),
        generation=1,
        creationTimestamp=AT,
        managedFields=[managed_entry("gpu-kubelet-plugin", AT, {"spec": body["spec"]})],
    )
    return body


def claim_body(index: int, *, driver: str = draplugin.DRIVER) -> dict[str, Any]:
    """The claim kube-scheduler makes and allocates for a pod asking ``nvidia.com/gpu: 1``."""
    node = f"gpu-node-{index // GPUS:05d}"
    pod, uid = f"worker-{index:06d}", f"10000000-0000-4000-8000-{index:012d}"
    request = "container-0-request-0"
    spec = {
        "devices": {
            "requests": [
                {
                    "name": request,
                    "exactly": {
                        "deviceClassName": "gpu.gpushare.dev",
                        "allocationMode": "ExactCount",
                        "count": 1,
                    },
                }
            ]
        }
    }
    result = {"request": request, "driver": driver, "pool": node, "device": f"gpu-{index % GPUS}"}
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    status = {
        "allocation": {
            "devices": {"results": [result]},
            "nodeSelector": {"nodeSelectorTerms": [term]},
        },
        "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{pod}-extended-resources-{index:05x}",
            "namespace": "team-a",
            "uid": f"20000000-0000-4000-8000-{index:012d}",
            "resourceVersion": str(200_000 + index),
            "creationTimestamp": AT,
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                managed_entry("kube-scheduler", AT, {"spec": spec}),
                managed_entry("kube-scheduler", AT, {"status": status}, subresource="status"),
            ],
        },
        "spec": spec,
        "status": status,
    }


def lines(bodies: Sequence[dict[str, Any]]) -> list[bytes]:
    return [orjson.dumps({"type": "ADDED", "object": body}) for body in bodies]


def handler(kind: str) -> tuple[ClusterCache, Handler]:
    """A fresh cache and the informers' real line handler into it."""
    cache = ClusterCache()
    if kind == "ResourceSlice":
        sink: Any = SliceSink(cache)
        path = "/apis/resource.k8s.io/v1/resourceslices"
    else:
        sink, path = ClaimSink(cache), "/apis/resource.k8s.io/v1/resourceclaims"
    reader = Reader(
        api=cast(Any, None),  # _handle_line never touches the API
        collection=Collection(path=path, kind=kind),
        sink=sink,
    )
    return cache, reader._handle_line


def per_line(handle: Handler, watch: Sequence[bytes]) -> float:
    """Mean ns per line of one pass, the collector off (as in the other benchmarks)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for line in watch:
            handle(line)
        return (time.perf_counter_ns() - start) / len(watch)
    finally:
        gc.enable()


def ratios(kind: str, watch: Sequence[bytes]) -> tuple[float, float]:
    """Best-of-rounds handler time over best-of-rounds ``json.loads`` and ``orjson.loads``,
    interleaved round by round."""
    ours, stdlib, floor = [], [], []
    for _ in range(ROUNDS):
        stdlib.append(per_line(json.loads, watch))
        floor.append(per_line(orjson.loads, watch))
        _, handle = handler(kind)  # a fresh cache each round: every line is an add
        ours.append(per_line(handle, watch))
    return min(ours) / min(stdlib), min(ours) / min(floor)


def kept_bytes(kind: str, watch: Sequence[bytes], *, warm: Sequence[bytes] = ()) -> int:
    """Bytes still allocated once ``watch`` is in the cache (the cache made, and ``warm``
    ingested, before tracing: what is allocated once per process is not per object)."""
    cache, handle = handler(kind)
    for line in warm:
        handle(line)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for line in watch:
            handle(line)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del cache
    return after - before


def kept_records(watch: Sequence[bytes]) -> int:
    """How many claims the cache keeps after ``watch``."""
    cache, handle = handler("ResourceClaim")
    for line in watch:
        handle(line)
    return len(cache.dra.claims)


def measure() -> dict[str, Any]:
    full = lines([slice_body(i, mig=False) for i in range(NODES)])
    migs = lines([slice_body(i, mig=True) for i in range(NODES)])
    # Twice as many claims: the first half warms orjson's bounded key cache (managedFields'
    # ``k:{"uid":…}`` keys are new on every claim), which is no claim's cost.
    claims = lines([claim_body(i) for i in range(2 * CLAIMS)])
    foreign = lines([claim_body(i, driver="nic.example.com") for i in range(CLAIMS)])
    timed = {
        "slice": ratios("ResourceSlice", full),
        "mig_slice": ratios("ResourceSlice", migs),
        "claim": ratios("ResourceClaim", claims[:CLAIMS]),
    }
    return {
        **{f"{k}_over_json": json_ratio for k, (json_ratio, _) in timed.items()},
        **{f"{k}_over_orjson": orjson_ratio for k, (_, orjson_ratio) in timed.items()},
        "bytes_per_slice_device": kept_bytes("ResourceSlice", full) / (NODES * GPUS),
        "bytes_per_mig_slice_device": kept_bytes("ResourceSlice", migs) / (NODES * GPUS * 7),
        "bytes_per_claim": kept_bytes("ResourceClaim", claims[CLAIMS:], warm=claims[:CLAIMS])
        / CLAIMS,
        "foreign_claims_kept": kept_records(foreign),
        "slice_line_bytes": len(full[0]),
        "mig_slice_line_bytes": len(migs[0]),
        "claim_line_bytes": len(claims[0]),
    }


# (measure, key, unit, budget)
BUDGETS: Final[tuple[verdicts.Budget, ...]] = (
    ("slice line ÷ json.loads (8 GPUs)", "slice_over_json", "x", 1.0),
    ("MIG slice line ÷ json.loads (56 devices)", "mig_slice_over_json", "x", 1.0),
    ("claim line ÷ json.loads", "claim_over_json", "x", 1.0),
    ("memory per kept slice device (full GPU)", "bytes_per_slice_device", "B", 128),
    ("memory per kept slice device (MIG)", "bytes_per_mig_slice_device", "B", 128),
    ("memory per kept claim", "bytes_per_claim", "B", 576),
    ("claims of another driver kept", "foreign_claims_kept", "", 0),
)


def table(report: dict[str, Any]) -> str:
    rows = verdicts.budget_rows(report, BUDGETS)
    rows.append(
        f"\nPer line over orjson.loads (reported, not judged): slice"
        f" {report['slice_over_orjson']:.2f}{TIMES}, MIG slice"
        f" {report['mig_slice_over_orjson']:.2f}{TIMES}, claim"
        f" {report['claim_over_orjson']:.2f}{TIMES}."
    )
    rows.append(
        f"\n{NODES:,} slices, {CLAIMS:,} claims; a watch line of {report['slice_line_bytes']:,} B"
        f" (8 GPUs), {report['mig_slice_line_bytes']:,} B (56 MIG devices), a claim's"
        f" {report['claim_line_bytes']:,} B."
    )
    return "\n".join(rows)


def main() -> int:
    report = measure()
    print(table(report))
    print(json.dumps({k: round(v, 3) for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

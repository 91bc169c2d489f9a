"""The scale benchmark's cluster: what is created, and the load generators that act on it.

Everything here talks to the API server through ``RawClient`` (plain aiohttp), never through the
operator's client stack: the load must not share the code under test.  Node and pod bodies are
``testing.bodies``' realistic ones without managedFields (the server records its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from gpushare_operator.core.api import models
from gpushare_testing import bodies, podbodies
from gpushare_testing.rawclient import ApiError, RawClient

POOLS = ("inference", "training", "batch", "research", "dev")
RACKS = ("r0", "r1", "r2", "r3")
HALF_LABEL = "bench.gpushare.dev/half"
RACK_LABEL = "bench.gpushare.dev/rack"
POD_NAMESPACES = tuple(f"bench-{i}" for i in range(10))
CHURN_NAMESPACE = "bench-churn"
DEVICE_PLUGIN_NAMESPACE = "gpu-operator"
OPERATOR_NAMESPACE = "gpushare-system"
CONFIGMAP = "gpushare-device-plugin-configs"
ROLLOUT_POLICY = "rollout"
SHARED_EVERY = 5  # every 5th pod asks for a shared GPU slot: 20 %
# The rows that compare the writer with the kopf-native variant measure how fast a change is
# written, not how it is paced: the bench's policies roll out unpaced (every node at once, no
# canary), and both variants run with --max-unavailable 100%.  The nodes are never Verified here
# (no GPU Feature Discovery), so a paced rollout would stop after its first batch.  The paced
# rollout has its own phase, with a GFD responder (paced.py).
UNPACED: dict[str, Any] = {"maxUnavailable": "100%", "canary": 0}
UNPACED_CLUSTER = "100%"  # --max-unavailable of the variants and the primer
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
POLICIES_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.POLICY_PLURAL}"
NODE_STATES_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.NODE_STATE_PLURAL}"
REPO = Path(__file__).resolve().parents[2]


def node_name(index: int) -> str:
    return f"gpu-{POOLS[index % len(POOLS)]}-{index:05d}"


def node_labels(index: int) -> dict[str, str]:
    """The bench's own labels: which rack (policy) and which half (the rollout) a node is in."""
    return {
        RACK_LABEL: RACKS[(index // len(POOLS)) % len(RACKS)],
        HALF_LABEL: "a" if index % 2 == 0 else "b",
    }


def node_body(index: int) -> dict[str, Any]:
    return bodies.gpu_node(
        name=node_name(index),
        pool=POOLS[index % len(POOLS)],
        managed_fields=False,
        extra_labels=node_labels(index),
    )


def policy_bodies() -> list[dict[str, Any]]:
    """20 policies over 5 pools: per pool a base, two rack overrides and a loser (conflicts).

    Every node is governed (base matches the whole pool); racks r0/r1 win on priority 20; the
    ``wide`` policy matches racks r2/r3 at priority 5 and loses them all to the base, so policy
    statuses carry conflicts, as in a real cluster with overlapping selectors.
    """
    out = []
    for pool in POOLS:
        specs: list[tuple[str, dict[str, Any], int, str, int]] = [
            ("base", {"matchLabels": {"pool": pool}}, 10, "TimeSlicing", 2),
            ("rack0", {"matchLabels": {"pool": pool, RACK_LABEL: "r0"}}, 20, "TimeSlicing", 4),
            ("rack1", {"matchLabels": {"pool": pool, RACK_LABEL: "r1"}}, 20, "MPS", 4),
            (
                "wide",
                {
                    "matchExpressions": [
                        {"key": "pool", "operator": "In", "values": [pool]},
                        {"key": RACK_LABEL, "operator": "In", "values": ["r2", "r3"]},
                    ]
                },
                5,
                "TimeSlicing",
                8,
            ),
        ]
        for suffix, selector, priority, strategy, replicas in specs:
            out.append(policy(f"{pool}-{suffix}", selector, priority, strategy, replicas))
    return out


def policy(
    name: str, selector: dict[str, Any], priority: int, strategy: str, replicas: int
) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector,
            "priority": priority,
            "strategy": strategy,
            "replicas": replicas,
            "renameByDefault": True,  # pods ask for nvidia.com/gpu.shared, as bodies make them
            "rollout": dict(UNPACED),
        },
    }


def rollout_policy() -> dict[str, Any]:
    """The new higher-priority policy of the rollout phase: half the nodes, a new config key."""
    return policy(ROLLOUT_POLICY, {"matchLabels": {HALF_LABEL: "a"}}, 1000, "TimeSlicing", 3)


def expected_policy(index: int, *, rollout: bool) -> str:
    """Which policy wins node ``index`` (the bench's own answer, checked against GNS status)."""
    labels = node_labels(index)
    if rollout and labels[HALF_LABEL] == "a":
        return ROLLOUT_POLICY
    pool = POOLS[index % len(POOLS)]
    rack = labels[RACK_LABEL]
    suffix = {"r0": "rack0", "r1": "rack1"}.get(rack, "base")
    return f"{pool}-{suffix}"


def pod_body(index: int, *, nodes: int, namespace: str | None = None) -> dict[str, Any]:
    """Pod ``index``, bound to a node round-robin; every ``SHARED_EVERY``-th one is shared."""
    ns = namespace or POD_NAMESPACES[index % len(POD_NAMESPACES)]
    node = node_name(index % nodes)
    name = f"pod-{index:06d}"
    if index % SHARED_EVERY == 0:
        body = podbodies.shared_gpu_pod(name=name, node=node, namespace=ns, managed_fields=False)
    else:
        body = podbodies.plain_pod(name=name, node=node, namespace=ns, managed_fields=False)
    metadata = body["metadata"]
    for key in ("uid", "creationTimestamp", "generateName", "ownerReferences"):
        metadata.pop(key, None)  # the server assigns these; a foreign owner would be GC'd
    body.pop("status", None)  # a create resets it to Pending anyway
    return body


# -- requests in bulk ------------------------------------------------------------------------


async def bounded(
    jobs: Iterable[Callable[[], Awaitable[None]]],
    *,
    concurrency: int = 32,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Run ``jobs`` with at most ``concurrency`` in flight, without making all tasks upfront.

    50,000 pending tasks holding 5 KB bodies each would be a few hundred MiB of the bench's own
    memory; a fixed set of workers pulling from one iterator keeps it flat.
    """
    iterator = iter(jobs)
    done = 0

    async def worker() -> None:
        nonlocal done
        for job in iterator:
            await job()
            done += 1
            if progress is not None and done % 1000 == 0:
                progress(done)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def create(
    client: RawClient, path: str, body: Mapping[str, Any], *, ok: Iterable[int] = (201,)
) -> Any:
    for attempt in range(20):
        try:
            status, answer = await client.post(path, body)
        except (aiohttp.ClientError, TimeoutError):
            await asyncio.sleep(0.5 * (attempt + 1))
            continue
        if status in ok or status == 409:
            return answer
        if status in (429, 500, 503, 504):
            await asyncio.sleep(0.5 * (attempt + 1))
            continue
        raise ApiError(method="POST", path=path, status=status, body=answer)
    raise TimeoutError(f"POST {path} kept failing")


async def apply_crds(client: RawClient) -> None:
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        await create(client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for plural in (models.POLICY_PLURAL, models.NODE_STATE_PLURAL):
        name = f"{plural}.{models.GROUP}"
        for _ in range(300):
            status, crd = await client.get(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conditions = (crd or {}).get("status", {}).get("conditions") or []
            if status == 200 and any(
                c["type"] == "Established" and c["status"] == "True" for c in conditions
            ):
                break
            await asyncio.sleep(0.1)
    # Discovery of the new group lags the Established condition by a moment.
    for _ in range(300):
        status, _ = await client.get(POLICIES_PATH)
        if status == 200:
            return
        await asyncio.sleep(0.1)


async def create_namespaces(client: RawClient) -> None:
    names = (DEVICE_PLUGIN_NAMESPACE, OPERATOR_NAMESPACE, CHURN_NAMESPACE, *POD_NAMESPACES)
    for name in names:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await create(client, "/api/v1/namespaces", body)


async def create_nodes(client: RawClient, count: int, *, log: Callable[[str], None]) -> None:
    async def one(index: int) -> None:
        await create(client, "/api/v1/nodes", node_body(index))

    await bounded(
        (functools_partial(one, i) for i in range(count)),
        progress=lambda n: log(f"  {n:,}/{count:,} nodes"),
    )


async def create_pods(
    client: RawClient, count: int, *, nodes: int, log: Callable[[str], None]
) -> None:
    async def one(index: int) -> None:
        body = pod_body(index, nodes=nodes)
        await create(client, f"/api/v1/namespaces/{body['metadata']['namespace']}/pods", body)

    await bounded(
        (functools_partial(one, i) for i in range(count)),
        progress=lambda n: log(f"  {n:,}/{count:,} pods") if n % 5000 == 0 else None,
    )


def functools_partial(
    fn: Callable[[int], Awaitable[None]], index: int
) -> Callable[[], Awaitable[None]]:
    """A zero-argument job for ``bounded`` (a lambda in a generator would bind late)."""

    async def job() -> None:
        await fn(index)

    return job


async def create_policies(client: RawClient, items: Iterable[Mapping[str, Any]]) -> None:
    for item in items:
        await create(client, POLICIES_PATH, item)


async def delete(client: RawClient, path: str) -> None:
    status, body = await client.delete(path)
    if status not in (200, 202, 404):
        raise ApiError(method="DELETE", path=path, status=status, body=body)


# -- what the variants leave behind, and resetting it -----------------------------------------


async def list_all(client: RawClient, path: str, *, limit: int = 500) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params = {"limit": str(limit)}
    while True:
        status, page = await client.get(path, params=params)
        if status != 200:
            raise ApiError(method="LIST", path=path, status=status, body=page)
        items.extend(page["items"])
        token = page["metadata"].get("continue")
        if not token:
            return items
        params = {"limit": str(limit), "continue": token}


async def policy_statuses(client: RawClient) -> dict[str, dict[str, Any]]:
    """Each policy's status without timestamps: what 'its status changed' compares."""
    out = {}
    for item in await list_all(client, POLICIES_PATH):
        status = dict(item.get("status") or {})
        status["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in status.get("conditions") or []
        ]
        out[item["metadata"]["name"]] = status
    return out


async def drop_config_keys(client: RawClient, *, prefix: str) -> list[str]:
    """Remove the device-plugin ConfigMap's keys starting with ``prefix`` (a merge patch)."""
    path = f"/api/v1/namespaces/{DEVICE_PLUGIN_NAMESPACE}/configmaps/{CONFIGMAP}"
    status, body = await client.get(path)
    if status != 200:
        return []
    keys = [key for key in body.get("data") or {} if key.startswith(prefix)]
    if keys:
        status, answer = await client.patch(path, {"data": dict.fromkeys(keys)})
        if status != 200:
            raise ApiError(method="PATCH", path=path, status=status, body=answer)
    return keys


# -- GPUNodeState watcher: what the operator published, and when it showed up ---------------


@dataclass
class Published:
    """The last GPUNodeState status seen per node, and change times, from one watch."""

    phase: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    pods: dict[str, int] = field(default_factory=dict)
    # (node, pods count) → monotonic times it was seen: the pod-churn lag matches these.
    pod_seen: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    # The config key each node's status names: a replicas change keeps the policy, so only
    # the key tells the delayed rollout's nodes that moved from those that did not yet.
    keys: dict[str, str | None] = field(default_factory=dict)
    events: int = 0
    # Every status seen, by "phase/Ready reason": what the writes said (the audit log says only
    # that a status was written), for the paced rollout's split of its status writes.
    said: dict[str, int] = field(default_factory=dict)

    def observe(self, obj: Mapping[str, Any], *, deleted: bool = False) -> None:
        name = str(obj.get("metadata", {}).get("name"))
        self.events += 1
        if deleted:
            self.phase.pop(name, None)
            self.pods.pop(name, None)
            self.keys.pop(name, None)
            return
        status = obj.get("status") or {}
        self.phase[name] = (status.get("policy"), status.get("phase"))
        ready = [c for c in status.get("conditions") or () if c.get("type") == "Ready"]
        said = f"{status.get('phase')}/{ready[0].get('reason') if ready else None}"
        self.said[said] = self.said.get(said, 0) + 1
        self.keys[name] = status.get("configKey")
        pods = int(status.get("pods") or 0)
        if self.pods.get(name) != pods:
            self.pods[name] = pods
            self.pod_seen.setdefault((name, pods), []).append(time.monotonic())

    def converged(self, expected: Mapping[str, str]) -> bool:
        """Every node shows its expected policy, Applied (or better: GFD is not simulated)."""
        for name, policy in expected.items():
            seen = self.phase.get(name)
            if seen is None or seen[0] != policy or seen[1] not in ("Applied", "Verified"):
                return False
        return True

    def said_since(self, before: Mapping[str, int]) -> dict[str, int]:
        """Statuses seen since ``before`` (a copy of ``said``), by "phase/Ready reason"."""
        return {
            k: v - before.get(k, 0) for k, v in sorted(self.said.items()) if v > before.get(k, 0)
        }

    def verified(self, expected: Mapping[str, str]) -> bool:
        """Every node shows its expected policy, Verified (with GFD simulated: ``gfd.py``)."""
        return self.missing(expected, phase="Verified") == 0

    def missing(self, expected: Mapping[str, str], *, phase: str = "Applied") -> int:
        return sum(
            1
            for name, policy in expected.items()
            if (self.phase.get(name) or (None, None)) != (policy, phase)
        )


async def watch_published(client: RawClient, published: Published) -> None:
    """List then watch GPUNodeStates forever (re-listing on expiry), feeding ``published``."""
    while True:
        try:
            status, page = await client.get(NODE_STATES_PATH)
            if status != 200:
                raise ApiError(method="LIST", path=NODE_STATES_PATH, status=status, body=page)
            for item in page["items"]:
                published.observe(item)
            version = page["metadata"]["resourceVersion"]
            while True:
                params = {"resourceVersion": version, "allowWatchBookmarks": "true"}
                watch = client.watch(NODE_STATES_PATH, params=params)
                async with contextlib.aclosing(watch) as events:
                    async for event in events:
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            raise ApiError(method="WATCH", path="", status=410, body=obj)
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            published.observe(obj, deleted=event["type"] == "DELETED")
        except asyncio.CancelledError:
            raise
        except Exception:  # expired or dropped: list again
            await asyncio.sleep(0.2)


# -- the audit log: writes by user, read incrementally -----------------------------------------


class AuditTail:
    """Reads the API server's audit log from where it left off, counting writes per user.

    ``ControlPlane.audit_events`` parses the whole file every call; after 50,000 pod creates
    and a heartbeat storm that is hundreds of MiB, so this keeps an offset and skips (without
    parsing) every line that does not mention a user of interest.
    """

    def __init__(self, path: Path, users: Iterable[str]) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.users = {u: f'"username":"{u}"'.encode() for u in users}
        self.writes: dict[str, list[tuple[float, str]]] = {u: [] for u in self.users}

    def poll(self) -> None:
        if not self.path.exists():
            return
        stat = self.path.stat()
        if stat.st_ino != self.inode or stat.st_size < self.offset:
            # Rotated (kube-apiserver rotates its audit log at ~100 MB): finish the old file,
            # kept beside it as audit-<time>.log, then read the new one from its start.
            rotated = sorted(self.path.parent.glob(f"{self.path.stem}-*{self.path.suffix}"))
            if self.inode is not None and rotated:
                self._read(rotated[-1])
            self.inode, self.offset = stat.st_ino, 0
        self._read(self.path)

    def _read(self, path: Path) -> None:
        with path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[: end + 1].splitlines():
            for user, needle in self.users.items():
                if needle in line:
                    self._count(user, orjson.loads(line))
                    break

    def _count(self, user: str, event: Mapping[str, Any]) -> None:
        if event.get("stage") != "ResponseComplete":
            return
        ref = event.get("objectRef") or {}
        kind = ref.get("resource", "?")
        if ref.get("subresource"):
            kind += "/" + ref["subresource"]
        stamp = epoch(str(event.get("stageTimestamp", "")))
        self.writes[user].append((stamp, f"{event.get('verb')} {kind}"))

    def between(self, user: str, start: float, end: float) -> list[tuple[float, str]]:
        """Writes by ``user`` whose response completed in [start, end] (epoch seconds)."""
        self.poll()
        return [w for w in self.writes[user] if start <= w[0] <= end]


def epoch(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def summarize_writes(writes: Iterable[tuple[float, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, what in writes:
        counts[what] = counts.get(what, 0) + 1
    return dict(sorted(counts.items()))


# -- load generators ---------------------------------------------------------------------------


async def heartbeat_storm(
    client: RawClient,
    nodes: int,
    *,
    period: float = 10.0,
    duration: float = 60.0,
    concurrency: int = 32,
) -> dict[str, float]:
    """Patch every node's status (kubelet's conditions) once per ``period`` for ``duration``.

    A strategic-merge patch of the conditions' heartbeat times, as kubelet sends it.  Patches are
    paced evenly over each period; if the API server cannot keep up the achieved rate says so.
    """
    started = time.monotonic()
    sent = 0
    failed = 0
    rounds = int(duration // period)
    names = [node_name(i) for i in range(nodes)]
    interval = period / max(nodes, 1)

    async def patch(name: str) -> None:
        nonlocal sent, failed
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "status": {
                "conditions": [
                    {"type": kind, "lastHeartbeatTime": at} for kind in bodies.KUBELET_CONDITIONS
                ]
            }
        }
        try:
            status, _ = await client.patch(
                f"/api/v1/nodes/{name}/status",
                body,
                content_type=STRATEGIC_MERGE,
                params={"fieldManager": "kubelet"},
            )
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        if status == 200:
            sent += 1
        else:
            failed += 1

    gate = asyncio.Semaphore(concurrency)
    pending: set[asyncio.Task[None]] = set()

    async def guarded(name: str) -> None:
        async with gate:
            await patch(name)

    for beat in range(rounds):
        round_start = started + beat * period
        for index, name in enumerate(names):
            due = round_start + index * interval
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            while len(pending) >= concurrency * 4:  # back-pressure: do not queue unboundedly
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            task = asyncio.create_task(guarded(name))
            pending.add(task)
            task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
    elapsed = time.monotonic() - started
    return {
        "patches": sent,
        "failed": failed,
        "seconds": round(elapsed, 1),
        "patches_per_s": round(sent / elapsed, 1),
        "intended_per_s": round(nodes / period, 1),
    }


@dataclass
class ChurnResult:
    creates: int = 0
    deletes: int = 0
    failed: int = 0
    # (node, expected pods count, monotonic time the change was acknowledged by the API)
    expectations: list[tuple[str, int, float]] = field(default_factory=list)
    seconds: float = 0.0


async def pod_churn(
    client: RawClient,
    *,
    nodes: int,
    base_pods: Mapping[str, int],
    rate: float = 100.0,
    duration: float = 60.0,
    lifetime: float | None = None,
    concurrency: int = 64,
) -> ChurnResult:
    """Create ``rate`` pods/s for ``duration`` s, deleting each ``lifetime`` s after it was made.

    Once the first deletes start this is ``2 * rate`` pod changes per second (the issue's 200/s).
    Pods go round-robin over the nodes, so a node sees its next change only after
    ``nodes / rate`` s; ``lifetime`` defaults to half of that, so that a node's create and delete
    are never folded into one status write and each expected pods count is observable.  Every
    5th pod asks for a shared slot (20 %): those are the changes whose published-status lag is
    measured (a plain pod changes no status and must cost no write).
    """
    life = lifetime if lifetime is not None else max(1.0, min(30.0, nodes / rate / 2))
    result = ChurnResult()
    counts = dict(base_pods)
    started = time.monotonic()
    gate = asyncio.Semaphore(concurrency)
    tasks: set[asyncio.Task[None]] = set()
    total = int(rate * duration)

    async def change(index: int, *, create_it: bool) -> None:
        body = pod_body(index, nodes=nodes, namespace=CHURN_NAMESPACE)
        name, node = body["metadata"]["name"], body["spec"]["nodeName"]
        shared = index % SHARED_EVERY == 0
        path = f"/api/v1/namespaces/{CHURN_NAMESPACE}/pods"
        async with gate:
            try:
                if create_it:
                    status, _ = await client.post(path, body)
                    good = status == 201
                else:
                    status, _ = await client.delete(
                        f"{path}/{name}", params={"gracePeriodSeconds": "0"}
                    )
                    good = status in (200, 202)
            except (aiohttp.ClientError, TimeoutError):
                good = False
        acknowledged = time.monotonic()
        if not good:
            result.failed += 1
            return
        if create_it:
            result.creates += 1
        else:
            result.deletes += 1
        if shared:
            counts[node] = counts.get(node, 0) + (1 if create_it else -1)
            result.expectations.append((node, counts[node], acknowledged))

    schedule: list[tuple[float, int, bool]] = []
    for index in range(total):
        at = index / rate
        schedule.append((at, index, True))
        schedule.append((at + life, index, False))
    schedule.sort()
    for at, index, create_it in schedule:
        delay = started + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(change(index, create_it=create_it))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    result.seconds = time.monotonic() - started
    return result


def churn_lags(
    expectations: Iterable[tuple[str, int, float]],
    seen: Mapping[tuple[str, int], list[float]],
    *,
    deadline: float,
) -> tuple[list[float], int]:
    """Lag of each pod change from the API's answer until the node's published status shows it.

    A status "shows" change ``i`` on a node once it shows the pods count after ``i`` or after any
    later change ``j`` on that node (published after ``j`` was made): the writer coalesces, and a
    create followed by a delete may rightly be published as one status, never as the in-between
    count.  Returns the lags and how many changes were still unpublished at ``deadline``
    (reported apart: a p99 over the published ones alone would flatter a writer that fell behind).
    """
    by_node: dict[str, list[tuple[float, int]]] = {}
    for node, count, at in expectations:
        by_node.setdefault(node, []).append((at, count))
    lags: list[float] = []
    missing = 0
    for node, changes in by_node.items():
        changes.sort()
        # Walking backwards: the earliest publication of this change or any later one.
        earliest = math.inf
        for at, count in reversed(changes):
            shown = [t for t in seen.get((node, count), []) if at - 0.05 <= t <= deadline]
            if shown:
                earliest = min(earliest, shown[0])
            if earliest < math.inf:
                lags.append(max(0.0, earliest - at))
            else:
                missing += 1
    return lags, missing


@contextlib.asynccontextmanager
async def background(coro: Awaitable[None]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.ensure_future(coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)

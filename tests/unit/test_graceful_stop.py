"""The stop order, against an in-memory API: no new write, the sent ones land, then release.

The operator's own ``Assembly.stop()`` runs with its real writer and its real elector (in its
thread); only ``kube.http.request`` is a fake, which notes when each write was sent, when it
landed, whether it was cancelled on the way, and when the Lease was handed back.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpushare_operator.app.assembly import STOP_MARGIN, Assembly
from gpushare_operator.app.settings import parse_settings
from gpushare_operator.kube import http
from gpushare_operator.kube.connection import ApiHandle
from gpushare_testing.builders import node, policy
from gpushare_testing.fakeapi import FakeApi
from gpushare_testing.waiting import eventually

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/gpushare-operator"
NODES = 24
RENEW_DEADLINE = 2.0


class RecordingApi(FakeApi):
    """Lease requests answered as the fake API server does; every other request is a write
    that takes ``delay`` seconds to land."""

    def __init__(self, *, delay: float, nodes: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.delay = delay
        self.nodes = nodes
        self.log: list[tuple[str, str]] = []  # (what happened, method + path)

    async def request(
        self, api: object, *, method: str, path: str, body: Any = None, **_: Any
    ) -> Any:
        if path.startswith(LEASE.rsplit("/", 1)[0]):
            result = await super().request(api, method=method, path=path, body=body)
            if method == "PUT" and not body["spec"]["holderIdentity"]:
                self.log.append(("released", path))
            return result
        what = f"{method} {path}"
        self.log.append(("sent", what))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            # On a real connection the request may land all the same, at any later time.
            self.log.append(("cancelled", what))
            raise
        self.log.append(("landed", what))
        if method == "PATCH" and path.startswith("/api/v1/nodes/"):
            current = self.nodes[path.rsplit("/", 1)[1]]
            current["metadata"]["labels"].update(body["metadata"].get("labels") or {})
            return copy.deepcopy(current)
        return copy.deepcopy(body) if isinstance(body, dict) else {}

    def since(self, index: int, what: str) -> list[str]:
        return [item for event, item in self.log[index:] if event == what]


def operator(monkeypatch: pytest.MonkeyPatch, *, delay: float) -> tuple[Assembly, RecordingApi]:
    bodies = {f"n{i}": node(f"n{i}") for i in range(NODES)}
    api = RecordingApi(delay=delay, nodes=copy.deepcopy(bodies))
    monkeypatch.setattr(http, "request", api.request)
    settings = parse_settings(
        [
            "--identity=a",
            "--namespace=ops",
            "--lease-duration=3",
            f"--renew-deadline={RENEW_DEADLINE}",
            "--retry-period=0.1",
            # Far more writes than get done before the stop: most jobs wait for a token.
            "--write-qps=20",
            "--write-burst=1",
            "--write-concurrency=4",
        ],
        env={},
    )
    handle = ApiHandle(configuration=client.Configuration(), api=None)  # type: ignore[arg-type]
    op = Assembly(settings=settings, handle=handle)
    cache = op.cache
    cache.upsert_policy(policy("p"))
    key = cache.policies["p"].config_key
    assert key is not None
    cache.set_config_data({key: "x", "default": "y"}, initial=True)
    for body in bodies.values():
        cache.upsert_node(body)
    cache.config_synced = True
    return op, api


async def start_writing(op: Assembly, api: RecordingApi, *, sent: int) -> None:
    # What _write_when_synced does once the caches are synced.
    op._spawn("elector", op.gate.run())
    op._spawn("bootstrap", op.writer.run())

    async def writes_sent() -> int:
        return len(api.since(0, "sent"))

    await eventually(writes_sent, until=lambda n: n >= sent, timeout=10, what="writes sent")


async def test_stop_lets_sent_writes_land_then_releases_and_sends_nothing_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op, api = operator(monkeypatch, delay=0.3)
    await start_writing(op, api, sent=6)
    assert op.gate.is_leader()
    on_the_wire = len(api.since(0, "sent")) - len(api.since(0, "landed"))
    assert on_the_wire > 0  # the stop meets writes in flight
    stop_at = len(api.log)

    await op.stop()

    assert api.since(0, "cancelled") == []  # nothing sent was cut off...
    assert sorted(api.since(0, "sent")) == sorted(api.since(0, "landed"))  # ...all of it landed
    assert api.since(stop_at, "sent") == []  # no write started once the stop began
    assert api.log[-1][0] == "released"  # and the lease went back after the last of them
    assert api.objects[LEASE]["spec"]["holderIdentity"] == ""
    assert not op.gate.is_leader()
    assert op.writer.backlog > 0  # writes were still queued: refused, not sent
    assert op._tasks == {}


async def test_writes_that_do_not_come_back_in_time_keep_the_lease_from_being_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op, api = operator(monkeypatch, delay=30.0)  # the API server stopped answering
    await start_writing(op, api, sent=1)
    started = time.monotonic()

    await op.stop()

    took = time.monotonic() - started
    # Bounded by the time left before the renew deadline, less the margin; not by the writes.
    assert took < RENEW_DEADLINE - STOP_MARGIN + 0.5, took
    assert api.since(0, "cancelled") != []
    assert "released" not in {event for event, _ in api.log}
    # Not released: a follower waits for the lease to run out, past any cancelled request.
    assert api.objects[LEASE]["spec"]["holderIdentity"] == "a"
    assert op._tasks == {}


async def test_a_follower_stops_at_once_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op, api = operator(monkeypatch, delay=0.3)
    api.objects[LEASE] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpushare-operator", "namespace": "ops", "resourceVersion": "1"},
        "spec": {"holderIdentity": "b", "leaseDurationSeconds": 60, "renewTime": "x"},
    }
    op._spawn("elector", op.gate.run())
    op._spawn("bootstrap", op.writer.run())

    async def election_rounds() -> int:
        return sum(1 for method, path in api.calls if method == "GET" and path == LEASE)

    # A few election rounds, each finding that b holds it: the writer had its chances to write.
    await eventually(election_rounds, until=lambda rounds: rounds >= 3, what="election rounds")
    started = time.monotonic()
    await op.stop()
    assert time.monotonic() - started < 1.0
    assert api.log == []
    assert api.objects[LEASE]["spec"]["holderIdentity"] == "b"

"""How the plugin reads the pods, without a cluster: pages split undecoded, the next page asked
for before this one is handled, a 410 starting over, a 403 named; and the plugin benchmark's
kubectl baseline (its interleaving and its verdict)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from benchmarks import plugin_plan

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.kube import http
from gpushare_operator.kubectl import cluster
from gpushare_operator.kubectl.permissions import MissingPermission

GPU = "nvidia.com/gpu"


def a_pod(index: int, *, gpu: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod as the API server writes it (metadata first); a GPU one asks for a GPU, every one
    tolerates the GPU taint and selects GPU nodes, as pods on GPU nodes do."""
    resources = {"requests": {"cpu": "1", **({GPU: "1"} if gpu else {})}}
    return {
        "metadata": {"name": f"pod-{index}", "namespace": "ns", "uid": f"uid-{index}"},
        "spec": {
            "nodeName": "n0",
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "containers": [{"name": "c", "resources": resources}],
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
            **(extra or {}),
        },
        "status": {"phase": "Running"},
    }


def page(items: Sequence[dict[str, Any]], token: str = "", *, sort_keys: bool = False) -> bytes:
    metadata: dict[str, Any] = {"resourceVersion": "7"}
    if token:
        metadata["continue"] = token
    body = {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": list(items)}
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS if sort_keys else 0) + b"\n"


def worth() -> Any:
    return cluster.asks_for(ClusterCache())


# -- a page, split ------------------------------------------------------------------------------


def items_of(raw: bytes, worth_decoding: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    metadata, items = cluster.paged_items(raw, worth_decoding)
    return metadata, list(items)


def test_a_page_is_split_and_only_the_pods_asking_for_a_tracked_resource_are_decoded() -> None:
    pods = [a_pod(i, gpu=i % 3 == 0) for i in range(9)]
    raw = page(pods, "next")
    # A pod that asks for no GPU is never decoded: even bytes that are no JSON go unnoticed.
    raw = raw.replace(b'"name":"pod-1",', b'"name":"pod-1",,,', 1)
    metadata, items = items_of(raw, worth())
    assert metadata == {"resourceVersion": "7", "continue": "next"}
    assert items == [p for p in pods if p["metadata"]["name"] in {"pod-0", "pod-3", "pod-6"}]
    assert items_of(page([]), worth()) == ({"resourceVersion": "7"}, [])
    assert items_of(page(pods), None)[1] == pods  # no test: every object


def test_a_cut_inside_a_pod_has_the_page_decoded_whole() -> None:
    """An array inside a pod whose objects start with "metadata": the page is cut there too,
    the halves do not decode, and the page is decoded whole (the sink drops what it keeps
    nothing of, and keeps one of the pod given twice)."""
    tricky = a_pod(2, gpu=True, extra={"x": [{"metadata": {"a": 1}}, {"metadata": {"b": 2}}]})
    pods = [a_pod(0, gpu=True), a_pod(1, gpu=False), tricky, a_pod(3, gpu=False)]
    metadata, items = items_of(page(pods, "t"), worth())
    assert metadata == {"resourceVersion": "7", "continue": "t"}
    assert items == [pods[0], *pods]


def test_a_page_laid_out_otherwise_is_decoded_whole() -> None:
    pods = [a_pod(0, gpu=True), a_pod(1, gpu=False)]
    metadata, items = items_of(page(pods, "t", sort_keys=True), worth())
    assert metadata["continue"] == "t"
    assert items == [orjson.loads(orjson.dumps(p, option=orjson.OPT_SORT_KEYS)) for p in pods]
    with pytest.raises(orjson.JSONDecodeError):
        items_of(page(pods)[:-20], worth())  # cut short: an error, never fewer pods


def test_only_a_tracked_resource_as_a_key_makes_a_pod_worth_decoding() -> None:
    asks = worth()
    assert not asks(orjson.dumps(a_pod(0, gpu=False)))  # toleration, node selector: no
    assert asks(orjson.dumps(a_pod(0, gpu=True)))
    limits = {"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}
    assert asks(orjson.dumps({"spec": {"initContainers": [limits]}}))
    mig = {"name": "c", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}
    assert asks(orjson.dumps({"spec": {"containers": [mig]}}))


# -- the pages, read ----------------------------------------------------------------------------


class Content:
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        chunk, self.body = self.body[:100], self.body[100:]
        return chunk

    async def read(self) -> bytes:
        await asyncio.sleep(0)
        rest, self.body = self.body, b""
        return rest


class Response:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.reason, self.headers = status, "", {}
        self.content = Content(body)
        self.closed = False

    async def read(self) -> bytes:
        return await self.content.read()

    def close(self) -> None:
        self.closed = True

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class Server:
    """Pages of ``size`` pods; ``refuse`` answers (status, body) to the requests it names
    (by continue token, "" for the first page), once each."""

    def __init__(
        self, pods: Sequence[dict[str, Any]], *, size: int, refuse: dict[str, int] | None = None
    ) -> None:
        self.pods, self.size = list(pods), size
        self.refuse = dict(refuse or {})
        self.events: list[str] = []
        self.responses: list[Response] = []

    async def open_request(self, api: Any, **request: Any) -> Response:
        query = dict(request["query"])
        assert request["path"] == "/api/v1/pods"
        assert query["fieldSelector"] == cluster.LIVE_PODS
        assert query["limit"] == str(self.size)
        token = query.get("continue", "")
        self.events.append(f"ask {token or 'first'}")
        await asyncio.sleep(0)
        if token in self.refuse:
            status = self.refuse.pop(token)
            response = Response(status, orjson.dumps({"message": f"refused {status}"}))
        else:
            start = int(token or 0)
            end = start + self.size
            more = str(end) if end < len(self.pods) else ""
            response = Response(200, page(self.pods[start:end], more))
        self.responses.append(response)
        return response


class Sink:
    def __init__(self, events: list[str], *, fail: bool = False) -> None:
        self.events, self.fail = events, fail
        self.names: list[str] = []

    def begin_relist(self) -> None:
        self.events.append("begin")
        self.names = []

    def relist_item(self, obj: dict[str, Any]) -> None:
        if self.fail:
            raise RuntimeError("the sink fails")
        self.events.append(f"got {obj['metadata']['name']}")
        self.names.append(obj["metadata"]["name"])

    def end_relist(self) -> None:
        self.events.append("end")

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        raise AssertionError("a list applies no events")


def serve(monkeypatch: pytest.MonkeyPatch, server: Server) -> Any:
    monkeypatch.setattr(http, "open_request", server.open_request)
    pods = cluster.POD_LIST
    return dataclasses.replace(pods, page_size=server.size, worth_decoding=worth())


async def test_the_next_page_is_asked_for_before_this_one_is_handled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = Server([a_pod(i, gpu=i % 2 == 0) for i in range(5)], size=2)
    collection = serve(monkeypatch, server)
    sink = Sink(server.events)
    await cluster.read_pages_into(None, collection, sink, purpose="the pods")
    assert server.events == [
        "begin",
        "ask first",
        "ask 2",
        "got pod-0",
        "ask 4",
        "got pod-2",
        "got pod-4",
        "end",
    ]
    assert all(r.closed for r in server.responses)


async def test_an_expired_continue_token_starts_the_list_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = Server([a_pod(i, gpu=True) for i in range(4)], size=2, refuse={"2": 410})
    collection = serve(monkeypatch, server)
    sink = Sink(server.events)
    await cluster.read_pages_into(None, collection, sink, purpose="the pods")
    assert sink.names == ["pod-0", "pod-1", "pod-2", "pod-3"]
    assert server.events[:6] == ["begin", "ask first", "ask 2", "got pod-0", "got pod-1", "begin"]
    assert server.events[-1] == "end"


async def test_a_403_is_missing_permission_to_list_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    server = Server([a_pod(i, gpu=True) for i in range(4)], size=2, refuse={"2": 403})
    collection = serve(monkeypatch, server)
    with pytest.raises(MissingPermission) as refused:
        await cluster.read_pages_into(None, collection, Sink([]), purpose="the pods")
    assert str(refused.value).startswith(
        "missing permission: list pods in every namespace (needed for the pods)"
    )
    first = Server([], size=2, refuse={"": 410})  # a 410 without a continue token: an error
    with pytest.raises(http.ApiError):
        await cluster.read_pages_into(None, serve(monkeypatch, first), Sink([]), purpose="p")


async def test_a_failure_leaves_no_page_open(monkeypatch: pytest.MonkeyPatch) -> None:
    server = Server([a_pod(i, gpu=True) for i in range(6)], size=2)
    collection = serve(monkeypatch, server)
    with pytest.raises(RuntimeError, match="the sink fails"):
        await cluster.read_pages_into(None, collection, Sink([], fail=True), purpose="p")
    await asyncio.sleep(0.01)  # the page asked for in advance: cancelled, or closed
    assert server.events == ["ask first", "ask 2"]
    assert all(r.closed for r in server.responses)


# -- the benchmark's baseline -------------------------------------------------------------------


def test_plan_and_kubectl_runs_alternate() -> None:
    order: list[str] = []

    def plan(index: int) -> dict[str, Any]:
        order.append(f"plan {index}")
        return {"wall_s": 1.0}

    def kubectl() -> dict[str, Any]:
        order.append("kubectl")
        return {"wall_s": 2.0}

    plans, baselines = plugin_plan.interleaved(plan, kubectl, 3)
    assert order == ["plan 0", "kubectl", "plan 1", "kubectl", "plan 2", "kubectl"]
    assert len(plans) == len(baselines) == 3


def test_the_plan_passes_at_most_as_slow_as_kubectl() -> None:
    plan = [{"wall_s": w, "peak_rss_mib": 120.0, "cpu_s": 4.0} for w in (2.0, 3.0, 9.0)]
    fast = [{"wall_s": w, "peak_rss_mib": 700.0, "cpu_s": 8.0} for w in (6.0, 8.0, 7.0)]
    slow = [{"wall_s": w, "peak_rss_mib": 700.0, "cpu_s": 8.0} for w in (2.0, 2.5, 2.9)]
    assert plugin_plan.versus(plan, fast) == {"ratio": 0.429, "budget": 1.0, "verdict": "PASS"}
    assert plugin_plan.versus(plan, slow)["verdict"] == "MISS"
    rows = plugin_plan.table(plan, 5000, 50000, fast).splitlines()
    assert "| 3.0 (2.0-9.0) |" in rows[2]
    assert "| 7.0 (6.0-8.0) |" in rows[3]
    assert rows[4].endswith("| 0.43x | ≤ 1.0x | PASS |")
    assert "| 0.43x" not in plugin_plan.table(plan, 5000, 50000)  # no baseline: no ratio

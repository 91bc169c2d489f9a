"""What the read path does with one watch line, without a server: failures name their object."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from gpushare_operator.kube import http
from gpushare_operator.kube.reading import INITIAL_EVENTS_END, Collection, EventFailed, Gone, Reader


class ListSink:
    def __init__(self, *, poison: str | None = None) -> None:
        self.poison = poison
        self.calls: list[tuple[str, str]] = []

    def _record(self, what: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name == self.poison:
            raise ValueError("poisoned")
        self.calls.append((what, name))

    def begin_relist(self) -> None:
        self.calls.append(("begin", ""))

    def relist_item(self, obj: dict[str, Any]) -> None:
        self._record("item", obj)

    def end_relist(self) -> None:
        self.calls.append(("end", ""))

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._record(event_type, obj)


def reader(sink: ListSink, *, on_listed: Any = None) -> Reader:
    collection = Collection(path="/api/v1/nodes", kind="Node")
    # Never touches the API.
    return Reader(api=cast(Any, None), collection=collection, sink=sink, on_listed=on_listed)


def line(kind: str, name: str, version: str, **metadata: Any) -> bytes:
    obj = {"metadata": {"name": name, "resourceVersion": version, **metadata}}
    return orjson.dumps({"type": kind, "object": obj})


def test_an_undecodable_line_fails_as_an_event_without_a_name() -> None:
    with pytest.raises(EventFailed) as failed:
        reader(ListSink())._handle_line(b'{"type": "MODIFIED", "obj')
    assert failed.value.name is None
    assert isinstance(failed.value.__cause__, orjson.JSONDecodeError)


def test_a_sink_failure_names_the_object_and_keeps_the_cause() -> None:
    sink = ListSink(poison="bad")
    subject = reader(sink)
    subject._handle_line(line("ADDED", "good", "5"))
    with pytest.raises(EventFailed) as failed:
        subject._handle_line(line("MODIFIED", "bad", "6"))
    assert (failed.value.event, failed.value.name) == ("MODIFIED", "bad")
    assert isinstance(failed.value.__cause__, ValueError)
    assert sink.calls == [("ADDED", "good")]


def test_initial_events_are_list_items_until_the_closing_bookmark() -> None:
    sink = ListSink()
    synced: list[bool] = []
    subject = reader(sink, on_listed=lambda: synced.append(True))
    subject._initial = True
    subject._handle_line(line("ADDED", "a", "3"))
    subject._handle_line(line("ADDED", "b", "4"))
    subject._handle_line(line("BOOKMARK", "", "7"))  # an ordinary bookmark: still listing
    assert not subject.listed and not synced
    end = line("BOOKMARK", "", "9", annotations={INITIAL_EVENTS_END: "true"})
    subject._handle_line(end)
    subject._handle_line(line("MODIFIED", "a", "10"))
    assert sink.calls == [("item", "a"), ("item", "b"), ("end", ""), ("MODIFIED", "a")]
    assert subject.listed and synced == [True]
    assert subject.resource_version == "10"
    assert subject.stats.events == 1  # listed objects are not counted as events


def test_error_events_are_gone_or_api_errors() -> None:
    subject = reader(ListSink())
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410}}
    with pytest.raises(Gone) as expired:
        subject._handle_line(orjson.dumps(gone))
    assert expired.value.status == 410  # an ApiError, as the plugin reports any
    throttled = {"type": "ERROR", "object": {"kind": "Status", "code": 429}}
    with pytest.raises(http.ApiError) as error:
        subject._handle_line(orjson.dumps(throttled))
    assert error.value.status == 429


class _Body:
    """The part of an aiohttp response the reader consumes: its chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = self
        self._chunks = chunks

    async def iter_any(self) -> Any:
        for chunk in self._chunks:
            yield chunk


async def test_a_one_shot_list_ends_at_its_bookmark_and_decodes_only_what_is_worth_it() -> None:
    sink = ListSink()
    collection = Collection(
        path="/api/v1/pods", kind="Pod", worth_decoding=lambda raw: b"nvidia.com/gpu" in raw
    )
    subject = Reader(api=cast(Any, None), collection=collection, sink=sink)
    gpu = line("ADDED", "gpu", "3", labels={"asks": "nvidia.com/gpu"})
    plain = line("ADDED", "plain", "4")
    end = line("BOOKMARK", "", "9", annotations={INITIAL_EVENTS_END: "true"})
    after = line("MODIFIED", "gpu", "10", labels={"asks": "nvidia.com/gpu"})
    stream = b"\n".join([gpu, plain, end, after, b""])
    subject._initial = True
    response = _Body([stream[:7], stream[7:]])  # a line split across reads, as sockets do
    await subject._consume(cast(Any, response), until_listed=True)
    assert sink.calls == [("item", "gpu"), ("end", "")]  # not "plain", and nothing after the end
    assert subject.listed and subject.resource_version == "9"

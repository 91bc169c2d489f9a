"""What the informer does with one watch line, without a server: failures name their object."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from gpushare_operator.kube import http
from gpushare_operator.kube.informer import INITIAL_EVENTS_END, EventFailed, Gone, Informer, Target


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


def informer(sink: ListSink) -> Informer:
    target = Target(path="/api/v1/nodes", kind="Node")
    return Informer(api=cast(Any, None), target=target, sink=sink)  # never touches the API


def line(kind: str, name: str, version: str, **metadata: Any) -> bytes:
    obj = {"metadata": {"name": name, "resourceVersion": version, **metadata}}
    return orjson.dumps({"type": kind, "object": obj})


def test_an_undecodable_line_fails_as_an_event_without_a_name() -> None:
    with pytest.raises(EventFailed) as failed:
        informer(ListSink())._handle_line(b'{"type": "MODIFIED", "obj')
    assert failed.value.name is None
    assert isinstance(failed.value.__cause__, orjson.JSONDecodeError)


def test_a_sink_failure_names_the_object_and_keeps_the_cause() -> None:
    sink = ListSink(poison="bad")
    subject = informer(sink)
    subject._handle_line(line("ADDED", "good", "5"))
    with pytest.raises(EventFailed) as failed:
        subject._handle_line(line("MODIFIED", "bad", "6"))
    assert (failed.value.event, failed.value.name) == ("MODIFIED", "bad")
    assert isinstance(failed.value.__cause__, ValueError)
    assert sink.calls == [("ADDED", "good")]


def test_initial_events_are_list_items_until_the_closing_bookmark() -> None:
    sink = ListSink()
    subject = informer(sink)
    subject._initial = True
    subject._handle_line(line("ADDED", "a", "3"))
    subject._handle_line(line("ADDED", "b", "4"))
    subject._handle_line(line("BOOKMARK", "", "7"))  # an ordinary bookmark: still listing
    assert not subject.synced.is_set()
    end = line("BOOKMARK", "", "9", annotations={INITIAL_EVENTS_END: "true"})
    subject._handle_line(end)
    subject._handle_line(line("MODIFIED", "a", "10"))
    assert sink.calls == [("item", "a"), ("item", "b"), ("end", ""), ("MODIFIED", "a")]
    assert subject.synced.is_set()
    assert subject.resource_version == "10"
    assert subject.stats.events == 1  # listed objects are not counted as events


def test_error_events_are_gone_or_api_errors() -> None:
    subject = informer(ListSink())
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410}}
    with pytest.raises(Gone):
        subject._handle_line(orjson.dumps(gone))
    throttled = {"type": "ERROR", "object": {"kind": "Status", "code": 429}}
    with pytest.raises(http.ApiError) as error:
        subject._handle_line(orjson.dumps(throttled))
    assert error.value.status == 429

"""Logs (structlog, one pipeline for our and kopf's lines) and rate-limited Events."""

from __future__ import annotations

import json
import logging

import pytest
import structlog
from structlog.testing import capture_logs

from gpushare_operator.app import logs
from gpushare_operator.kube import http
from gpushare_operator.kube.events import EventRecorder, ObjectRef
from gpushare_testing.builders import Clock
from gpushare_testing.fakeapi import FakeApi

POLICY = ObjectRef("gpushare.dev/v1alpha1", "GPUSharingPolicy", "inference", "uid-1")


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(http, "request", fake.request)
    return fake


def recorder(clock: Clock, **kwargs: float) -> EventRecorder:
    return EventRecorder(api=None, clock=clock, **kwargs)  # type: ignore[arg-type]


async def test_same_event_is_posted_once_per_window(api: FakeApi) -> None:
    clock = Clock(0.0)
    events = recorder(clock, dedupe_window=600)
    for _ in range(5):
        await events.post(ref=POLICY, type_="Warning", reason="Conflict", message="n1 won by a")
    clock.now += 601
    await events.post(ref=POLICY, type_="Warning", reason="Conflict", message="n1 won by a")
    assert events.posted == 2
    assert events.dropped == 4
    assert all(path == "/api/v1/namespaces/default/events" for _, path in api.calls)


async def test_the_dedupe_memory_forgets_what_is_past_its_window(api: FakeApi) -> None:
    clock = Clock(0.0)
    events = recorder(clock, dedupe_window=600, per_second=100, burst=100)
    for round_ in range(5):  # nodes come and go: each round's events are about new objects
        for i in range(50):
            ref = ObjectRef("v1", "Node", f"n{round_}-{i}", f"uid-{round_}-{i}")
            await events.post(ref=ref, type_="Normal", reason="Applied", message="applied")
        clock.now += 400
    assert events.posted == 250
    assert events.remembered <= 100  # the last two rounds at most, not all five


async def test_a_flapping_condition_cannot_flood(api: FakeApi) -> None:
    clock = Clock(0.0)
    events = recorder(clock, per_second=1, burst=5)
    for i in range(100):  # 100 distinct messages in one instant
        await events.post(ref=POLICY, type_="Warning", reason="Conflict", message=f"flap {i}")
    assert events.posted == 5
    clock.now += 3  # the bucket refills at one per second
    for i in range(100, 110):
        await events.post(ref=POLICY, type_="Warning", reason="Conflict", message=f"flap {i}")
    assert events.posted == 8


async def test_namespaced_objects_get_events_in_their_namespace(api: FakeApi) -> None:
    lease = ObjectRef("coordination.k8s.io/v1", "Lease", "gpushare-operator", "", "ops")
    await recorder(Clock(0.0)).post(ref=lease, type_="Normal", reason="LeaderElected", message="a")
    [(_, path)] = api.calls
    assert path == "/api/v1/namespaces/ops/events"
    [event] = api.objects.values()
    assert event["involvedObject"]["namespace"] == "ops"


async def test_a_failed_event_is_logged_with_kind_and_name(api: FakeApi) -> None:
    api.fail_with = 403
    with capture_logs() as captured:
        await recorder(Clock(0.0)).post(ref=POLICY, type_="Warning", reason="Conflict", message="x")
    [line] = captured
    assert line["kind"] == "GPUSharingPolicy"
    assert line["name"] == "inference"
    assert line["log_level"] == "warning"


def test_json_logs_route_kopf_through_the_same_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure_logging(log_format="json")
    try:
        logging.getLogger("kopf.objects").info("handler succeeded")  # per-event chatter: silenced
        logging.getLogger("kopf._core.reactor").warning("watch restarted")
        structlog.get_logger("gpushare").info("synced", kind="Node", name="n1")
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers.clear()
    assert [line["event"] for line in lines] == ["watch restarted", "synced"]
    assert lines[0]["logger"] == "kopf._core.reactor"
    assert lines[0]["level"] == "warning"
    assert lines[1]["kind"] == "Node"
    assert lines[1]["name"] == "n1"
    assert all("timestamp" in line for line in lines)


def test_console_logs_are_key_value(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure_logging(log_format="console")
    try:
        structlog.get_logger("gpushare").warning("write failed", kind="Node", name="n1")
        text = capsys.readouterr().err
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers.clear()
    assert "write failed" in text
    assert "kind=Node" in text
    assert "name=n1" in text

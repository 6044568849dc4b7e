"""An outage is a few lines however long it lasts and however many users it has (R2)."""

from __future__ import annotations

import logging

import pytest

from sasflow.outage import Outage


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.outage"]


def test_an_hour_of_failed_attempts_is_one_line_down_one_per_30s_and_one_back(
        clock: _Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.outage")
    outage = Outage(logging.getLogger("test.outage"), "the store", clock=clock)
    outage.recovered()  # connected all along: nothing to say
    assert _lines(caplog) == [] and not outage.ongoing

    for _ in range(3600):  # an attempt a second for an hour
        outage.failed(ConnectionRefusedError(111, "Connection\n refused"))
        clock.now += 1.0
    assert outage.ongoing and outage.failures == 3600
    assert isinstance(outage.last, ConnectionRefusedError)
    outage.recovered()

    lines = _lines(caplog)
    assert lines[0] == ("the store is unreachable ([Errno 111] Connection refused);"
                        " reconnecting until it is back")
    # the first, a reminder at 30 s, 60 s, ... 3570 s, and back
    assert len(lines) == 1 + (3600 - 1) // 30 + 1
    assert lines[1] == ("the store still unreachable after 30s (31 attempts;"
                        " [Errno 111] Connection refused); reconnecting")
    assert lines[-1] == "the store is reachable again after 3600.0s"
    assert not outage.ongoing and outage.failures == 0 and outage.last is None


def test_an_outage_shared_by_consumers_ends_when_every_one_is_through(
        clock: _Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.outage")
    outage = Outage(logging.getLogger("test.outage"), "Redis", clock=clock)
    for consumer in ("replies", "requests", "gone"):
        outage.failed(ConnectionError("lost"), by=consumer)
    assert len(_lines(caplog)) == 1  # one line for the transport, not one per consumer

    outage.recovered(by="replies")
    assert outage.ongoing  # two consumers still fail: not back yet
    outage.left("gone")  # this one stopped while down: not waited for
    clock.now += 2.5
    outage.recovered(by="requests")
    assert not outage.ongoing
    assert _lines(caplog)[1:] == ["Redis is reachable again after 2.5s"]

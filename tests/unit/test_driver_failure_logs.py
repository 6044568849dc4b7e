"""Failures that come in numbers are said once per cause, then counted (R2)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sasflow import App, Step
from sasflow.agent import AgentRequest
from sasflow.errors import TransportError
from sasflow.outage import Repeats
from sasflow.scheduler import Scheduler
from sasflow.transport.memory import MemoryTransport

TASKS = 40


class _RefusingTransport(MemoryTransport):
    """Accepts consumers, refuses every publish: the broker is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 0

    async def publish(self, queue: str, body: bytes) -> None:
        self.refusals += 1
        try:
            raise ConnectionRefusedError(111, "Connect call failed")
        except ConnectionRefusedError as error:
            raise TransportError(f"cannot publish to {queue}: unreachable") from error


async def test_many_drivers_failing_on_a_lost_broker_log_one_line_and_drop_their_tasks(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Every driver's publish fails for the same cause: one error line in all (not a
    traceback per driver), and each failed driver still drops its task from the held
    set, leaving it to the supervisor."""
    caplog.set_level(logging.INFO, logger="sasflow.scheduler")
    app = App(store=db_url)

    @app.agent("remote")
    def remote(req: AgentRequest) -> dict[str, str]:
        return {}

    app.workflow("wf", steps=[Step("s", agent="remote", timeout=60.0)])
    transport = _RefusingTransport()
    scheduler = Scheduler(app._store, transport, app._plans(), instance_id="sched-1")
    running = asyncio.create_task(scheduler.run())
    try:
        for i in range(TASKS):
            await app.asubmit("wf", {}, task_id=f"t{i}")
        async with asyncio.timeout(30):  # a hang guard
            while transport.refusals < TASKS or scheduler.in_flight:
                await asyncio.sleep(0.005)
        assert not scheduler._held
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await app._store.close()
    said = [r for r in caplog.records
            if r.name == "sasflow.scheduler" and r.levelno >= logging.WARNING]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "TransportError: cannot publish" in said[0].getMessage()
    assert said[0].exc_info is None  # a line, not a traceback


def test_repeats_says_each_cause_once_then_a_count_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    """Two causes, a hundred failures each within the interval: two lines; past the
    interval, one more line per cause with the count since."""
    now = [0.0]
    repeats = Repeats(logging.getLogger("test.repeats"), "drivers", every=30.0,
                      clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="test.repeats")
    for _ in range(100):
        repeats.failed(TransportError("broker gone"))
        repeats.failed(KeyError("step"))
    assert [r.getMessage() for r in caplog.records] == [
        "drivers: TransportError: broker gone", "drivers: KeyError: 'step'"]
    now[0] = 31.0
    repeats.failed(TransportError("broker still gone"))
    assert caplog.records[-1].getMessage() == (
        "drivers: 100 more TransportError in 31s (last: broker still gone)")

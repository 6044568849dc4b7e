"""The supervisor's sweep as an operator sees it (S7, E9, R4): what it logs, what it reads."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sasflow.model import TaskState, idempotency_key
from sasflow.plan import Plan
from sasflow.store.listing import TaskQuery
from sasflow.store.records import Instance, NewTask
from sasflow.store.sqlite import SQLiteStore
from sasflow.supervisor import Supervisor
from sasflow.workflow import Step, Workflow

ORDER = Workflow.declare("order", [Step("reserve", "inventory", 5.0)], agents=["inventory"])
PLANS = {"order": Plan(ORDER, frozenset())}


class Clock:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(str(tmp_path / "store.db"), clock=Clock())
    yield opened
    await opened.close()


async def test_each_batch_of_recoveries_is_one_log_line_naming_tasks_steps_and_why(
        store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    """1.8: recoveries are logged: one info line per batch with the count by outcome
    and the first few tasks with their step and why, the rest counted."""
    for n in range(8):
        await store.submit(NewTask(task_id=f"t{n}", workflow="order", input_json=b"{}",
                                   steps=[("reserve", "inventory",
                                           idempotency_key(f"t{n}", "reserve"))]))
    await store.claim("gone", 10, PLANS)
    clock = store.clock
    assert isinstance(clock, Clock)
    clock.now += 6
    supervisor = Supervisor(store, PLANS, instance_id="sup-1")
    with caplog.at_level(logging.INFO, logger="sasflow.supervisor"):
        assert await supervisor.tick() == 8
    [line] = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
    assert line.startswith("recovered 8 expired task(s) (8 pending): t0 (reserve: expired (1x):")
    assert "t4 (reserve" in line and "t5" not in line and line.endswith("and 3 more")
    assert {t.state for t in await store.list_tasks(TaskQuery())} == {TaskState.PENDING}


async def test_the_leader_forgets_instances_silent_for_long_once_an_hour(
        store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    """Pods come and go with new ids: the leader deletes the rows of instances silent
    for longer than `forget_instances_after`, with one log line, and looks again only
    an hour later."""
    clock = store.clock
    assert isinstance(clock, Clock)
    for name in ("pod-a", "pod-b"):
        await store.beat(Instance(instance_id=name, host="h", pid=1, roles=["scheduler"],
                                  agents=[], workflows={}, lease=10.0))
    clock.now += 601
    supervisor = Supervisor(store, PLANS, instance_id="sup-1", forget_instances_after=600)
    with caplog.at_level(logging.INFO, logger="sasflow.supervisor"):
        await supervisor.tick()
    assert await store.instances() == []
    assert any("forgot 2 instance(s) silent for 600s" in r.getMessage()
               for r in caplog.records)
    await store.beat(Instance(instance_id="pod-c", host="h", pid=1, roles=["scheduler"],
                              agents=[], workflows={}, lease=10.0))
    clock.now += 1800  # pod-c silent for 30 minutes: gone, but the next look is not due
    await supervisor.tick()
    assert [i.instance_id for i in await store.instances()] == ["pod-c"]
    clock.now += 1801  # an hour since the first look
    await supervisor.tick()
    assert await store.instances() == []

"""Payloads over the transport's message limit, end to end on every transport (SPEC R3, U7).

An agent's result that does not fit in a reply, or a request that outgrew the
limit with the results it carries, is a permanent failure of that step which
names the size and the limit: the task goes the workflow's on_failure way, and
the remote call is made once, never again because its reply could not be sent.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sasflow import App, PermanentError, Step
from sasflow.agent import AgentRequest
from sasflow.model import Task, TaskState
from support.backends import TRANSPORTS

MiB = 1024 * 1024


@pytest.fixture(params=sorted(TRANSPORTS))
def transport_url(request: pytest.FixtureRequest) -> str:
    return TRANSPORTS[request.param]()


@dataclass
class Shop:
    """An app whose `big` agent returns `size` bytes for an order that asks for it."""

    app: App
    big: str  # the agent's name, private to the test on a shared broker
    calls: dict[str, int] = field(default_factory=dict)  # task id -> calls of `big`
    released: list[str] = field(default_factory=list)  # reserve's compensations, by task


def shop(store: str, transport: str, *, on_failure: str, size: int) -> Shop:
    app = App(store=store, transport=transport)
    run = uuid.uuid4().hex[:8]
    made = Shop(app=app, big=f"big-{run}")

    @app.agent(f"reserve-{run}")
    def reserve(req: AgentRequest) -> dict[str, str]:
        return {"reserved": req.task_id}

    @reserve.compensator
    def release(req: AgentRequest) -> None:
        made.released.append(req.task_id)

    # one at a time: a request handled again would come before any later one
    @app.agent(made.big, attempts=3, concurrency=1)
    def big(req: AgentRequest) -> str:
        made.calls[req.task_id] = made.calls.get(req.task_id, 0) + 1
        return "x" * (size if req.input.get("big") else 10)

    app.workflow("order", steps=[Step("reserve", agent=f"reserve-{run}", timeout=60.0),
                                 Step("big", agent=made.big, timeout=60.0)],
                 on_failure=on_failure, max_failures=3)
    return made


@pytest.fixture
async def running() -> AsyncIterator[Callable[[App], None]]:
    """Run an app's worker (every role) for the rest of the test."""
    workers: list[tuple[App, asyncio.Task[None]]] = []

    def start(app: App) -> None:
        workers.append((app, asyncio.create_task(app.arun(supervisor_interval=0.2))))

    yield start
    for app, worker in workers:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await app._store.close()
        await app._transport.close()


def over_the_limit(message: str, what: str, limit: int) -> int:
    """The size `message` names for `what`, once it says it is over `limit`."""
    found = re.search(rf"{what} of (\d+) bytes is over the message limit of {limit} bytes",
                      message)
    assert found is not None, message
    return int(found[1])


async def finish(made: Shop, input: Any, task_id: str) -> Task:
    await made.app.asubmit("order", input, task_id=task_id)
    return await made.app.await_(task_id, timeout=120)


async def assert_called_once_then_quiet(made: Shop, task_id: str) -> None:
    """The oversized step's agent ran once; a later request of the same agent, served
    after anything handled again would have been, finds it still at one call."""
    assert made.calls[task_id] == 1
    after = await finish(made, {}, f"{task_id}-after")
    assert after.state is TaskState.PROCESSED
    assert made.calls == {task_id: 1, f"{task_id}-after": 1}


async def test_a_result_over_the_limit_is_compensated_with_the_size_and_called_once(
        tmp_path: Path, transport_url: str, running: Callable[[App], None]) -> None:
    """A 2 MiB result: one call, the step fails naming size and limit, and the completed
    step before it is undone once (on_failure="compensate")."""
    made = shop(f"sqlite:///{tmp_path / 'shop.db'}", transport_url, on_failure="compensate",
                size=2 * MiB)
    running(made.app)
    task = await finish(made, {"big": True}, "order-1")
    assert task.state is TaskState.COMPENSATED
    assert task.error is not None
    assert over_the_limit(task.error, "result", 1048576) > 2 * MiB
    assert task.step("big").state.value == "failed"
    assert made.released == ["order-1"]
    await assert_called_once_then_quiet(made, "order-1")


async def test_a_result_over_the_limit_is_an_error_and_an_alert_naming_the_size(
        tmp_path: Path, transport_url: str, running: Callable[[App], None]) -> None:
    """on_failure="error": the task is in error and the operator's alert says why."""
    made = shop(f"sqlite:///{tmp_path / 'shop.db'}", transport_url, on_failure="error",
                size=2 * MiB)
    running(made.app)
    task = await finish(made, {"big": True}, "order-2")
    assert task.state is TaskState.ERROR
    [alert] = await made.app.aalerts()
    assert alert.task_id == "order-2"
    assert over_the_limit(alert.message, "result", 1048576) > 2 * MiB
    assert made.released == []
    await assert_called_once_then_quiet(made, "order-2")



async def test_a_compensation_whose_request_outgrew_the_limit_is_an_error_and_an_alert(
        tmp_path: Path, transport_url: str, running: Callable[[App], None]) -> None:
    """Undoing a step sends the results and its own result again: when that does not
    fit, the compensation fails for good with the size, and the operator is alerted;
    nothing loops and the compensator is never called."""
    app = App(store=f"sqlite:///{tmp_path / 'undo.db'}", transport=transport_url,
              max_payload_bytes=64 * 1024)
    run = uuid.uuid4().hex[:8]
    undone: list[str] = []

    @app.agent(f"fill-{run}")
    def fill(req: AgentRequest) -> str:
        return "y" * 25_000

    @fill.compensator
    def empty(req: AgentRequest) -> None:
        undone.append(req.step)

    @app.agent(f"refuse-{run}")
    def refuse(req: AgentRequest) -> None:
        raise PermanentError("no")

    app.workflow("undo", steps=[Step("s1", agent=f"fill-{run}", timeout=60.0),
                                Step("s2", agent=f"fill-{run}", timeout=60.0),
                                Step("s3", agent=f"refuse-{run}", timeout=60.0)],
                 on_failure="compensate")
    running(app)
    await app.asubmit("undo", {}, task_id="undo-1")
    task = await app.await_("undo-1", timeout=120)
    assert task.state is TaskState.ERROR
    assert task.error is not None
    assert task.error.startswith("compensation of s2 failed: request of")
    assert over_the_limit(task.error, "request", 65536) > 75_000
    assert undone == []
    [alert] = await app.aalerts()
    assert alert.message == task.error


async def test_results_that_outgrow_the_limit_fail_the_next_step_before_it_is_sent(
        tmp_path: Path, transport_url: str, running: Callable[[App], None]) -> None:
    """Each result fits, but the next request carries them all: that step fails for
    good, naming the size and the limit, and its agent is never called."""
    app = App(store=f"sqlite:///{tmp_path / 'grow.db'}", transport=transport_url,
              max_payload_bytes=64 * 1024)
    run = uuid.uuid4().hex[:8]
    calls: list[str] = []

    @app.agent(f"fill-{run}")
    def fill(req: AgentRequest) -> str:
        calls.append(req.step)
        return "y" * 40_000

    app.workflow("grow", steps=[Step(f"s{i}", agent=f"fill-{run}", timeout=60.0)
                                for i in range(1, 4)], on_failure="error")
    running(app)
    await app.asubmit("grow", {}, task_id="grow-1")
    task = await app.await_("grow-1", timeout=120)
    assert task.state is TaskState.ERROR
    assert calls == ["s1", "s2"]
    assert task.error is not None
    assert task.error.startswith("step s3 failed: request of")
    assert over_the_limit(task.error, "request", 65536) > 80_000
    assert [s.state.value for s in task.steps] == ["completed", "completed", "failed"]
    [alert] = await app.aalerts()
    assert alert.message == task.error

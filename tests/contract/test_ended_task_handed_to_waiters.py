"""A client waiting for a task that a scheduler of its own process ends is handed
the ended task as the write left it, with no read of the store
(signals.py `ending`, scheduler.py, client.py `await_`), on every store.

The proof has two halves: the task handed over equals what the store then reads,
field for field (its `updated_at` and every step's result and error included),
and the waiter did not read the store at all: it came while a scheduler of its
process drove the task, so that scheduler tells it of the end, or that it let go
of the task (and then the waiter reads). A waiter that comes after the end reads
the store, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sasflow import AgentRequest, App, PermanentError, Step, Task, TaskState, client
from sasflow.errors import InvalidTransitionError
from sasflow.model import terminal
from sasflow.transition import Transition
from support.backends import STORES

STEP_TIMEOUT = 600.0  # nothing here is about a step running out of time
WAIT = 60.0


@pytest.fixture(params=sorted(STORES))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return STORES[request.param](tmp_path)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    made = threading.Event()
    yield made
    made.set()


@pytest.fixture
def app(store_url: str, gate: threading.Event) -> Iterator[App]:
    made = App(store=store_url)

    @made.agent("gate")
    def held(req: AgentRequest) -> dict[str, Any]:
        assert gate.wait(WAIT)
        return {"opened": True, "n": req.input["n"], "ratio": 0.1}

    @held.compensator
    def release(req: AgentRequest) -> dict[str, Any]:
        return {"released": req.result["n"]}

    @made.agent("inventory")
    def reserve(req: AgentRequest) -> dict[str, Any]:
        if req.input["n"] < 0:
            raise PermanentError(f"cannot reserve {req.input['n']} items")
        return {"reserved": req.input["n"], "items": ["a", "b"], "none": None}

    made.workflow("gated", steps=[
        Step("hold", agent="gate", timeout=STEP_TIMEOUT),
        Step("reserve", agent="inventory", timeout=STEP_TIMEOUT)])
    made.workflow("gated-or-error", on_failure="error", steps=[
        Step("hold", agent="gate", timeout=STEP_TIMEOUT),
        Step("reserve", agent="inventory", timeout=STEP_TIMEOUT)])
    made.workflow("ready", steps=[Step("reserve", agent="inventory", timeout=STEP_TIMEOUT)])
    made.start()
    # once a task has run, the scheduler runs: the tests' tasks are claimed for it
    # as they are submitted, so it drives each before its waiter comes
    made.wait(made.submit("ready", {"n": 0}), timeout=WAIT)
    yield made
    made.stop()


@pytest.fixture(autouse=True)
def no_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter reads once, then waits to be told: its reads now and then (the net
    for a lost notice) would race the end they are here to tell apart."""
    monkeypatch.setattr(client, "_FIRST_LOOK_S", WAIT)


class Reads(list[TaskState]):
    """The states `app.aget` reads (what `await_` reads the store with), as they come."""

    def __init__(self) -> None:
        super().__init__()
        self.came = asyncio.Event()

    def add(self, state: TaskState) -> None:
        self.append(state)
        self.came.set()

    async def at_least(self, count: int) -> None:
        async with asyncio.timeout(WAIT):
            while len(self) < count:
                self.came.clear()
                await self.came.wait()


class Waiting:
    """How many waiters have come to wait (`await_` registered them), as they come."""

    def __init__(self) -> None:
        self.count = 0
        self.came = asyncio.Event()

    async def at_least(self, count: int) -> None:
        async with asyncio.timeout(WAIT):
            while self.count < count:
                self.came.clear()
                await self.came.wait()


def counting_waiters(app: App, monkeypatch: pytest.MonkeyPatch) -> Waiting:
    """A spy on the waiters this app's `await_` registers from now on."""
    waiting = Waiting()
    register = app._signals.waiting

    @contextlib.asynccontextmanager
    async def counted(task_id: str) -> AsyncIterator[Any]:
        async with register(task_id) as waiter:
            waiting.count += 1
            waiting.came.set()
            yield waiter

    monkeypatch.setattr(app._signals, "waiting", counted)
    return waiting


def counting_reads(app: App, monkeypatch: pytest.MonkeyPatch) -> Reads:
    """A spy on this one app's reads from now on."""
    reads = Reads()
    read: Callable[[str], Awaitable[Task]] = app.aget

    async def counted(task_id: str) -> Task:
        task = await read(task_id)
        reads.add(task.state)
        return task

    monkeypatch.setattr(app, "aget", counted)
    return reads


@pytest.mark.parametrize(("workflow", "n", "ending"), [
    ("gated", 3, TaskState.PROCESSED),
    ("gated", -1, TaskState.COMPENSATED),  # the first step undone
    ("gated-or-error", -1, TaskState.ERROR)])
async def test_a_waiter_is_handed_the_ended_task_as_the_store_holds_it(
        app: App, gate: threading.Event, workflow: str, n: int, ending: TaskState,
        monkeypatch: pytest.MonkeyPatch) -> None:
    task_id = await app.asubmit(workflow, {"n": n})
    reads, waiters = counting_reads(app, monkeypatch), counting_waiters(app, monkeypatch)
    waiting = asyncio.ensure_future(app.await_(task_id, timeout=WAIT))
    await waiters.at_least(1)  # waiting, the task not ended
    gate.set()
    handed = await waiting
    assert reads == []  # driven here, and handed over: no read at all
    stored = await app.aget(task_id)
    assert handed.state is ending
    assert handed == stored


async def test_each_waiter_has_its_own_copy(app: App, gate: threading.Event,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    task_id = await app.asubmit("gated", {"n": 1})
    reads, waiters = counting_reads(app, monkeypatch), counting_waiters(app, monkeypatch)
    waiting = [asyncio.ensure_future(app.await_(task_id, timeout=WAIT)) for _ in range(2)]
    await waiters.at_least(2)
    gate.set()
    first, second = await asyncio.gather(*waiting)
    assert reads == []
    assert first == second
    assert first.steps[1].result is not second.steps[1].result
    first.steps[1].result["reserved"] = 99
    assert second.steps[1].result["reserved"] == 1


@pytest.mark.parametrize(("n", "ending"), [
    (2, TaskState.PROCESSED),
    (-1, TaskState.COMPENSATED)])  # the first step undone
async def test_a_waiter_after_a_final_end_is_answered_without_a_read(
        app: App, gate: threading.Event, n: int, ending: TaskState,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A task that a scheduler of this process ended in a final state is kept as
    written (ended_here.py): a client that comes to wait after the end, on the loop
    or blocking in a thread, reads nothing, and is given what the store holds, a
    copy of its own each time. No operator action moves the task again, so the kept
    end stays what the store holds."""
    gate.set()
    task_id = await app.asubmit("gated", {"n": n})
    done = await app.await_(task_id, timeout=WAIT)
    assert done.state is ending
    reads = counting_reads(app, monkeypatch)
    again = await app.await_(task_id, timeout=WAIT)
    blocking = await asyncio.to_thread(app.wait, task_id, WAIT)
    assert reads == []  # neither read the store
    assert again == blocking == done == await app.aget(task_id)
    again.steps[0].result = {"changed": "by its caller"}
    assert app.wait(task_id, timeout=WAIT) == done  # the next caller's copy is untouched
    for operate in (app.aretry, app.acompensate, app.acancel):
        with pytest.raises(InvalidTransitionError):
            await operate(task_id, by="test", reason="a final state has no way out")
    assert await app.await_(task_id, timeout=WAIT) == await app.aget(task_id)


async def test_a_waiter_after_an_end_in_error_reads_the_store(
        app: App, gate: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    """Error is not final: an operator may retry the task (E8), so a client that comes
    after that end reads the store, and sees the retry."""
    gate.set()
    task_id = await app.asubmit("gated-or-error", {"n": -1})
    done = await app.await_(task_id, timeout=WAIT)
    assert done.state is TaskState.ERROR
    reads = counting_reads(app, monkeypatch)
    again = await app.await_(task_id, timeout=WAIT)
    assert reads == [TaskState.ERROR]
    assert again == done == await app.aget(task_id)
    retried = await app.aretry(task_id, by="test", reason="the input was fixed")
    assert retried.state is TaskState.PENDING
    after = await app.await_(task_id, timeout=WAIT)  # it fails again: the same input
    assert after.state is TaskState.ERROR
    assert after.updated_at > done.updated_at  # the retry's end, read, not the first one


async def test_an_end_not_written_is_read(app: App, gate: threading.Event,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's ending write finds the task changed (an operator cancelled it
    meanwhile) and writes nothing: the waiters it would have handed the task to are
    told so, and read what the store holds."""
    store = app._store
    apply = store.apply

    async def cancelled_first(transition: Transition) -> bool:
        if terminal(transition.state):  # the scheduler's end, about to be written
            task = await store.get(transition.task_id)
            assert task is not None
            assert await apply(app._plans()[task.workflow].cancel(task, store.now()))
        return await apply(transition)

    task_id = await app.asubmit("gated", {"n": 4})
    reads, waiters = counting_reads(app, monkeypatch), counting_waiters(app, monkeypatch)
    waiting = asyncio.ensure_future(app.await_(task_id, timeout=WAIT))
    await waiters.at_least(1)
    monkeypatch.setattr(store, "apply", cancelled_first)  # for this one task
    gate.set()
    ended = await waiting
    assert ended.state is TaskState.CANCELLED
    assert reads == [TaskState.CANCELLED]  # read once told, not handed over
    assert ended == await app.aget(task_id)


async def test_a_waiter_reads_once_its_scheduler_lets_go(app: App, gate: threading.Event,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's write of the first step's reply finds the task taken away and
    lets go of it: the waiter that counted on being told of the end reads at once (the
    notices and the polling net are silent: nothing ended, and the first look is
    WAIT away)."""
    store = app._store
    apply = store.apply

    async def taken_away(transition: Transition) -> bool:
        if transition.task_id == task_id:
            return False  # as a write fenced off by another's claim
        return await apply(transition)

    task_id = await app.asubmit("gated", {"n": 5})
    reads, waiters = counting_reads(app, monkeypatch), counting_waiters(app, monkeypatch)
    waiting = asyncio.ensure_future(app.await_(task_id, timeout=WAIT))
    await waiters.at_least(1)
    monkeypatch.setattr(store, "apply", taken_away)
    gate.set()
    await reads.at_least(1)
    assert reads == [TaskState.PROCESSING]  # not ended: it waits on
    assert not waiting.done()
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


async def test_a_waiter_of_a_task_not_driven_here_reads_it_first(
        store_url: str, app: App, gate: threading.Event,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A client without roles (another process's, as a web app beside the workers)
    reads the task as it comes to wait, then is told of the end by the store."""
    task_id = await app.asubmit("gated", {"n": 6})
    elsewhere = App(store=store_url)
    try:
        reads = counting_reads(elsewhere, monkeypatch)
        waiting = asyncio.ensure_future(elsewhere.await_(task_id, timeout=WAIT))
        await reads.at_least(1)
        assert reads == [TaskState.PROCESSING]
        gate.set()
        ended = await waiting
        assert ended.state is TaskState.PROCESSED
        assert reads == [TaskState.PROCESSING, TaskState.PROCESSED]
    finally:
        await elsewhere.aclose()  # its store may live on this loop


async def test_a_final_end_a_waiter_read_is_kept_for_the_next_waiter(
        store_url: str, app: App, gate: threading.Event,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A final end that a waiter read from the store is what every later read returns,
    so it is kept: the next waiter of that client reads nothing. Here the client has
    no roles (a web app beside the workers); the same holds for a waiter that came
    while the ending write was on its way and found the end before the scheduler
    that wrote it had kept it (SQLite's writer tells waiters as it commits)."""
    gate.set()
    task_id = await app.asubmit("gated", {"n": 7})
    done = await app.await_(task_id, timeout=WAIT)
    assert done.state is TaskState.PROCESSED
    elsewhere = App(store=store_url)
    try:
        reads = counting_reads(elsewhere, monkeypatch)
        first = await elsewhere.await_(task_id, timeout=WAIT)
        assert reads == [TaskState.PROCESSED]
        again = await elsewhere.await_(task_id, timeout=WAIT)
        assert reads == [TaskState.PROCESSED]  # kept from the first: not read again
        assert again == first == done
    finally:
        await elsewhere.aclose()  # its store may live on this loop

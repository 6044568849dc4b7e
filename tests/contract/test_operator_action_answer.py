"""An operator action (retry, compensate, cancel) answers the task as the action left
it, on every store. The schedulers it wakes may move the task on before the caller
hears back; a read after the write would answer with their move instead, or not,
by a race (operations.py `_operate`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from sasflow import App, PermanentError, Step, TaskState
from sasflow.model import Task
from sasflow.transition import Transition
from support.backends import STORES

SCHEDULER = "a-scheduler-elsewhere"


@pytest.fixture(params=sorted(STORES))
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    made = App(store=STORES[request.param](tmp_path))

    @made.agent("inventory")
    def reserve(_: object) -> None:
        raise PermanentError("never run here: no roles are started")

    made.workflow("order", on_failure="error", steps=[Step("reserve", agent="inventory")])
    yield made
    made.close()


async def in_error(app: App) -> Task:
    """A task whose one step failed for good, as a scheduler's writes leave it."""
    store, plan = app._store, app._plans()["order"]
    task = await app.aget(await app.asubmit("order", {"n": -1}))
    claim = plan.claim(task, SCHEDULER, store.now())
    assert await store.apply(claim)
    task = await app.aget(task.task_id)
    failed = plan.reply(task, SCHEDULER, False, None, "cannot reserve -1", store.now())
    assert await store.apply(failed)
    task = await app.aget(task.task_id)
    assert task.state is TaskState.ERROR
    return task


def claimed_at_once(app: App, monkeypatch: pytest.MonkeyPatch) -> list[Task]:
    """After each operator action applies, a scheduler claims the task before the
    action's caller hears back; what the store held between the two, each time."""
    store, plan = app._store, app._plans()["order"]
    between: list[Task] = []
    apply: Callable[[Transition], Awaitable[bool]] = store.apply

    async def then_claimed(transition: Transition) -> bool:
        if not await apply(transition):
            return False
        if transition.actor.startswith("operator"):
            task = await store.get(transition.task_id)
            assert task is not None
            between.append(task)
            assert await apply(plan.claim(task, SCHEDULER, store.now()))
        return True

    monkeypatch.setattr(store, "apply", then_claimed)
    return between


async def test_a_retry_answers_the_task_it_made_pending(
        app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    task = await in_error(app)
    between = claimed_at_once(app, monkeypatch)
    retried = await app.aretry(task.task_id, by="test", reason="the input was fixed")
    assert retried.state is TaskState.PENDING and retried.locked_by is None
    assert [retried] == between  # field for field, the row the retry wrote
    now = await app.aget(task.task_id)  # what the store holds after the claim
    assert now.state is TaskState.PROCESSING and now.locked_by == SCHEDULER
    assert any(entry.why and entry.why.endswith("the input was fixed")
               for entry in await app.ahistory(task.task_id))

"""The scheduler's claim loop, in-process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sasflow.scheduler as scheduler_module
from sasflow import App, Step
from sasflow.agent import AgentRequest
from sasflow.model import Task


def counting_claims(app: App) -> list[int]:
    """The limit of every claim the app's store is asked for, as they come."""
    claims: list[int] = []
    claim = app._store.claim

    async def counted(owner: str, limit: int, rules: Any) -> list[Task]:
        claims.append(limit)
        return await claim(owner, limit, rules)

    app._store.claim = counted  # type: ignore[method-assign]
    return claims

async def test_a_wake_up_while_every_slot_is_busy_claims_nothing(db_url: str) -> None:
    """With every slot taken, a wake-up is taken in (the event is cleared) without a
    claim; the waiting task is claimed once a slot frees."""
    app = App(store=db_url)
    release = asyncio.Event()

    @app.agent("held")
    async def held(req: AgentRequest) -> dict[str, str]:
        await release.wait()
        return {}

    app.workflow("wf", steps=[Step("s", agent="held", timeout=30.0)])
    worker = app._worker(concurrency=1, roles=["scheduler", "agent"])
    scheduler = worker.scheduler
    assert scheduler is not None
    claims = counting_claims(app)
    running = asyncio.create_task(worker.run())
    try:
        await app.asubmit("wf", {}, task_id="t1")
        async with asyncio.timeout(60):  # a hang guard, not a speed claim
            while scheduler.in_flight == 0:
                await asyncio.sleep(0.01)
        await app.asubmit("wf", {}, task_id="t2")  # wakes the loop: no slot is free
        before = len(claims)
        async with asyncio.timeout(60):  # a hang guard, not a speed claim
            while scheduler._wake.is_set():  # the loop took the wake-up in
                await asyncio.sleep(0.001)
        assert len(claims) == before  # ... and claimed nothing: no slot was free
        assert (await app.aget("t2")).state.value == "pending"
        release.set()
        first = await app.await_("t1", timeout=30)
        second = await app.await_("t2", timeout=30)
        assert (first.state.value, second.state.value) == ("processed", "processed")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await app._store.close()


async def test_tasks_held_at_shutdown_are_handed_back_without_a_failure(db_url: str) -> None:
    """Stopping a worker releases the tasks it holds at once: pending, unlocked, 0 failures."""
    app = App(store=db_url)

    @app.agent("slow")
    async def slow(req: AgentRequest) -> dict[str, str]:
        await asyncio.sleep(30)
        return {}

    app.workflow("wf", steps=[Step("s", agent="slow", timeout=60.0)])
    worker = app._worker(roles=["scheduler", "agent"])
    running = asyncio.create_task(worker.run())
    await app.asubmit("wf", {}, task_id="t1")
    async with asyncio.timeout(60):  # a hang guard, not a speed claim
        while (await app.aget("t1")).state.value != "processing":
            await asyncio.sleep(0.01)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    task = await app.aget("t1")
    assert (task.state.value, task.locked_by, task.failure_count) == ("pending", None, 0)
    assert task.steps[0].state.value == "pending"
    history = await app.ahistory("t1")
    assert "released" in (history[-2].why or "")
    await app._store.close()


async def test_a_claim_that_commits_as_the_worker_stops_is_handed_back(db_url: str) -> None:
    """Stopped while its claim is on the way back from the store, the scheduler still
    knows what it took and hands it back: nothing stays locked until it expires."""
    app = App(store=db_url)

    @app.agent("noop")
    async def noop(req: AgentRequest) -> dict[str, str]:
        return {}

    app.workflow("wf", steps=[Step("s", agent="noop", timeout=60.0)])
    worker = app._worker(roles=["scheduler"])
    committed, stopping = asyncio.Event(), asyncio.Event()
    claim = app._store.claim

    async def late_answer(owner: str, limit: int, rules: Any) -> list[Task]:
        claimed = await claim(owner, limit, rules)
        if claimed:
            committed.set()
            await stopping.wait()  # the answer comes back after the stop was asked for
        return claimed

    app._store.claim = late_answer  # type: ignore[method-assign]
    await app.asubmit("wf", {}, task_id="t1")
    running = asyncio.create_task(worker.run())
    await committed.wait()
    assert (await app.aget("t1")).locked_by is not None
    running.cancel()
    stopping.set()
    await asyncio.gather(running, return_exceptions=True)
    task = await app.aget("t1")
    assert (task.state.value, task.locked_by, task.failure_count) == ("pending", None, 0)
    await app._store.close()


async def test_a_finished_task_costs_no_claim_when_the_last_claim_took_all_there_was(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that ends frees a slot; the loop looks for work then only if its last
    claim may have left some for want of slots (here it took the only task)."""
    monkeypatch.setattr(scheduler_module, "_FIRST_POLL", 600.0)  # no polling in the test
    app = App(store=db_url)
    done = asyncio.Event()

    @app.agent("remote")
    async def remote(req: AgentRequest) -> dict[str, str]:
        return {}

    app.workflow("wf", steps=[Step("s", agent="remote", timeout=60.0)])
    worker = app._worker(concurrency=4, roles=["scheduler", "agent"])
    scheduler = worker.scheduler
    assert scheduler is not None
    claims = counting_claims(app)
    finished = scheduler._driver_done

    def driver_done(task_id: str, driver: asyncio.Task[None]) -> None:
        finished(task_id, driver)
        done.set()

    scheduler._driver_done = driver_done  # type: ignore[method-assign]
    running = asyncio.create_task(worker.run())
    try:
        await app.asubmit("wf", {}, task_id="t1")
        assert (await app.await_("t1", timeout=30)).state.value == "processed"
        async with asyncio.timeout(10):  # a hang guard, not a speed claim
            await done.wait()
        before = len(claims)
        for _ in range(5):  # let a woken loop run, were it woken
            await asyncio.sleep(0)
        assert not scheduler._wake.is_set()
        assert len(claims) == before
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await app._store.close()

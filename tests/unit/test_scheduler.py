"""The scheduler's claim loop, in-process."""

from __future__ import annotations

import asyncio

from sasflow import App, Step
from sasflow.agent import AgentRequest


async def test_a_wake_up_while_every_slot_is_busy_does_not_starve_the_loop(db_url: str) -> None:
    """With all slots taken, a wake-up must not make the claim loop spin without yielding."""
    app = App(store=db_url)

    @app.agent("slow")
    async def slow(req: AgentRequest) -> dict[str, str]:
        await asyncio.sleep(0.5)
        return {}

    app.workflow("wf", steps=[Step("s", agent="slow", timeout=5.0)])
    worker = app.worker(concurrency=1, roles=["scheduler", "agent"])
    running = asyncio.create_task(worker.run())
    try:
        await app.asubmit("wf", {}, task_id="t1")
        await app.asubmit("wf", {}, task_id="t2")
        assert worker.scheduler is not None
        async with asyncio.timeout(5):
            while worker.scheduler.in_flight == 0:
                await asyncio.sleep(0.01)
        worker.scheduler.wake()
        ticks = 0
        for _ in range(5):  # a spinning claim loop would never give these a turn
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 5
        first = await app.await_("t1", timeout=5)
        second = await app.await_("t2", timeout=5)
        assert (first.state.value, second.state.value) == ("processed", "processed")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await app.store.close()


async def test_tasks_held_at_shutdown_are_handed_back_without_a_failure(db_url: str) -> None:
    """Stopping a worker releases the tasks it holds at once: pending, unlocked, 0 failures."""
    app = App(store=db_url)

    @app.agent("slow")
    async def slow(req: AgentRequest) -> dict[str, str]:
        await asyncio.sleep(30)
        return {}

    app.workflow("wf", steps=[Step("s", agent="slow", timeout=60.0)])
    worker = app.worker(roles=["scheduler", "agent"])
    running = asyncio.create_task(worker.run())
    await app.asubmit("wf", {}, task_id="t1")
    async with asyncio.timeout(5):
        while (await app.aget("t1")).state.value != "processing":
            await asyncio.sleep(0.01)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    task = await app.aget("t1")
    assert (task.state.value, task.locked_by, task.failure_count) == ("pending", None, 0)
    assert task.steps[0].state.value == "pending"
    history = await app.ahistory("t1")
    assert "released" in (history[-2].why or "")
    await app.store.close()

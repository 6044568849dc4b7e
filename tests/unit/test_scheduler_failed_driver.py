"""A task driver that fails lets go of its task: the supervisor recovers it."""

from __future__ import annotations

import asyncio

from sasflow import App, Step
from sasflow.agent import AgentRequest
from sasflow.errors import TransportError
from sasflow.scheduler import Scheduler
from sasflow.transport.memory import MemoryTransport


class _RefusingTransport(MemoryTransport):
    """Accepts consumers, refuses every publish: the broker is gone mid-task."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = asyncio.Event()

    async def publish(self, queue: str, body: bytes) -> None:
        self.refused.set()
        raise TransportError(f"cannot publish to {queue}: the broker is gone")


async def test_a_failed_driver_drops_its_task_from_the_held_set_and_leaves_it_to_expire(
        db_url: str) -> None:
    """The driver's publish raises: the task leaves `_held` at once, and stopping the
    scheduler does not hand it back (it stays processing until the supervisor, after
    its complete-by, releases it and counts the failure)."""
    app = App(store=db_url)

    @app.agent("remote")
    def remote(req: AgentRequest) -> dict[str, str]:
        return {}

    app.workflow("wf", steps=[Step("s", agent="remote", timeout=60.0)])
    transport = _RefusingTransport()
    scheduler = Scheduler(app._store, transport, app._plans(), instance_id="sched-1")
    running = asyncio.create_task(scheduler.run())
    try:
        await app.asubmit("wf", {}, task_id="t1")
        async with asyncio.timeout(10):
            await transport.refused.wait()
            while scheduler.in_flight:  # the driver has ended, with its error
                await asyncio.sleep(0.005)
        assert "t1" not in scheduler._held
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    task = await app.aget("t1")
    assert (task.state.value, task.locked_by, task.failure_count) == (
        "processing", "sched-1", 0)
    await app._store.close()

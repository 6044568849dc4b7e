"""A request's reply ends the scheduler's wait, whether or not its publish is confirmed yet.

RabbitMQ confirms a persistent message once its consumer acked it, and an agent
acks a request after its reply is confirmed: the request's confirm comes after
the reply. A transport that says so (`publish_soon`, transport/amqp.py) has the
scheduler wait for the reply or for the publish to fail, whichever comes first.
Shown with an in-process transport that delivers at once and confirms a request
only when the test says.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sasflow import App, Step
from sasflow.agent import AgentRequest, AgentRuntime
from sasflow.errors import TransportError
from sasflow.model import TaskState
from sasflow.scheduler import Scheduler
from sasflow.transport import agent_queue
from sasflow.transport.memory import MemoryTransport

HANG_GUARD = 60.0  # fails a hang, bounds nothing


class _LateConfirms(MemoryTransport):
    """Delivers each message at once; confirms a request only when `confirm_all` is
    called, or fails it before delivering when `refuse` is set. Replies (to any other
    queue) are confirmed as they are delivered."""

    def __init__(self, agent: str) -> None:
        super().__init__()
        self.requests = agent_queue(agent)
        self.unconfirmed: list[asyncio.Future[None]] = []
        self.refuse = False
        self.refused = asyncio.Event()
        self._delivering: set[asyncio.Future[None]] = set()

    def publish_soon(self, queue: str, body: bytes) -> asyncio.Future[None]:
        confirm: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if queue == self.requests and self.refuse:
            self.refused.set()
            confirm.set_exception(TransportError(f"cannot publish to {queue}: refused"))
            return confirm
        self._delivering.add(delivering := asyncio.ensure_future(super().publish(queue, body)))
        delivering.add_done_callback(self._delivering.discard)
        if queue == self.requests:
            self.unconfirmed.append(confirm)
        else:
            confirm.set_result(None)
        return confirm

    async def publish(self, queue: str, body: bytes) -> None:
        await self.publish_soon(queue, body)  # (a scheduler that awaited this would hang)

    def confirm_all(self, error: Exception | None = None) -> None:
        for confirm in self.unconfirmed:
            if not confirm.done():
                if error is None:
                    confirm.set_result(None)
                else:
                    confirm.set_exception(error)
        self.unconfirmed.clear()


@dataclass
class _Run:
    """An app's scheduler and agents over a `_LateConfirms`, with task t1 submitted."""

    app: App
    transport: _LateConfirms
    scheduler: Scheduler
    scheduling: asyncio.Task[None]
    serving: asyncio.Task[None]


@contextlib.asynccontextmanager
async def _run(db_url: str, remote: Any, *, refuse: bool = False) -> AsyncIterator[_Run]:
    app = App(store=db_url)
    app.agent("remote")(remote)
    app.workflow("wf", steps=[Step("one", agent="remote", timeout=60.0),
                              Step("two", agent="remote", timeout=60.0)])
    transport = _LateConfirms("remote")
    transport.refuse = refuse
    scheduler = Scheduler(app._store, transport, app._plans(), instance_id="sched-1")
    agents = AgentRuntime(transport, list(app.agents.values()))
    run = _Run(app, transport, scheduler, asyncio.create_task(scheduler.run()),
               asyncio.create_task(agents.run()))
    try:
        await app.asubmit("wf", {}, task_id="t1")
        yield run
    finally:
        await _stopped(run.scheduling, run.serving)
        await app._store.close()


async def _stopped(*running: asyncio.Task[None]) -> None:
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


async def test_a_task_runs_to_its_end_while_no_request_of_it_is_confirmed(db_url: str) -> None:
    def remote(req: AgentRequest) -> dict[str, str]:
        return {"step": req.step}

    async with _run(db_url, remote) as run:
        async with asyncio.timeout(HANG_GUARD):
            task = await run.app.await_("t1")
        assert task.state is TaskState.PROCESSED
        assert [s.result for s in task.steps] == [{"step": "one"}, {"step": "two"}]
        assert len(run.transport.unconfirmed) == 2  # both requests sent, neither confirmed


async def test_a_failure_to_publish_after_the_reply_is_in_changes_nothing(db_url: str) -> None:
    """The publish's error is read and dropped: the task stays processed, and asyncio
    reports no exception that was never retrieved."""
    def remote(req: AgentRequest) -> dict[str, str]:
        return {}

    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda loop, context: unretrieved.append(context))
    try:
        async with _run(db_url, remote) as run:
            async with asyncio.timeout(HANG_GUARD):
                await run.app.await_("t1")
            run.transport.confirm_all(TransportError("the connection went before the confirm"))
            gc.collect()  # a failed future nobody read reports itself as it is collected
            assert unretrieved == []
            task = await run.app.aget("t1")
            assert task is not None and task.state is TaskState.PROCESSED
    finally:
        loop.set_exception_handler(None)


async def test_a_request_that_cannot_be_published_fails_its_driver(db_url: str) -> None:
    """No reply can come: the publish's error ends the wait, and the task is left to
    the supervisor, as when `publish` raises (test_scheduler_failed_driver.py)."""
    def remote(req: AgentRequest) -> dict[str, str]:
        return {}

    async with _run(db_url, remote, refuse=True) as run:
        async with asyncio.timeout(HANG_GUARD):
            await run.transport.refused.wait()
            while run.scheduler.in_flight:  # the driver has ended, with its error
                await asyncio.sleep(0.005)
        assert "t1" not in run.scheduler._held
        await _stopped(run.scheduling)
        task = await run.app.aget("t1")
        assert task is not None
        assert (task.state, task.locked_by, task.failure_count) == (
            TaskState.PROCESSING, "sched-1", 0)


async def test_a_driver_stopped_before_the_reply_cancels_its_unconfirmed_request(
        db_url: str) -> None:
    """A request still waiting to be sent is not sent after its driver stopped (a
    bundle not yet on its way drops a cancelled message, transport/amqp_bundle.py)."""
    called = asyncio.Event()
    hold = asyncio.Event()

    async def remote(req: AgentRequest) -> dict[str, str]:
        called.set()
        await hold.wait()
        return {}

    async with _run(db_url, remote) as run:
        try:
            async with asyncio.timeout(HANG_GUARD):
                await called.wait()
            [request] = run.transport.unconfirmed
            await _stopped(run.scheduling)
            assert request.cancelled()
        finally:
            hold.set()

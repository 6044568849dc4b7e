"""A task released by the supervisor while its scheduler still waits for the reply of
its expired attempt, then claimed back by that same scheduler, runs to its end there.

Found under load in CI: the first attempt's driver, still waiting, ended its wait at
the attempt's complete-by after the task had been claimed back, and took the new
attempt's place in the replies awaited. The new attempt's reply was then dropped,
and the step ran a third time. A scheduler now keeps one driver a task: claiming it
back stops the stale one.

Shown with the store's clock injected (the supervisor's expiry) and the loop's own
clock for the scheduler's waits: the new attempt replies only once the first one's
wait would have ended, and before its own does.
"""

from __future__ import annotations

import asyncio
import time

from sasflow import App, Step
from sasflow.agent import AgentRequest, AgentRuntime
from sasflow.deadlines import RESOLUTION
from sasflow.model import TaskState
from sasflow.scheduler import Scheduler
from sasflow.supervisor import Supervisor
from sasflow.transport.memory import MemoryTransport

GUARD = 120.0  # fails a hang, bounds nothing
# The step's timeout. The first attempt's wait ends this long after it is sent; the
# task is claimed back half-way through it, so the second attempt's wait ends half of
# it after the first's: the room its reply has, however loaded the machine.
TIMEOUT = 6.0


async def test_a_task_claimed_back_while_its_old_driver_waits_runs_to_its_end(
        db_url: str) -> None:
    now = [time.time()]
    app = App(store=db_url, clock=lambda: now[0])
    calls: list[int] = []
    first_sent = asyncio.Event()
    second_sent = asyncio.Event()
    second_may_reply = asyncio.Event()
    hang = asyncio.Event()  # never set: the first attempt never replies

    @app.agent("remote")
    async def remote(req: AgentRequest) -> dict[str, int]:
        calls.append(req.attempt)
        if len(calls) == 1:
            first_sent.set()
            await hang.wait()
        second_sent.set()
        await second_may_reply.wait()
        return {"calls": len(calls)}

    app.workflow("wf", steps=[Step("one", agent="remote", timeout=TIMEOUT)],
                 retry_backoff=0.0)
    transport = MemoryTransport()
    scheduler = Scheduler(app._store, transport, app._plans(), instance_id="sched-1")
    agents = AgentRuntime(transport, list(app.agents.values()))
    supervisor = Supervisor(app._store, app._plans(), instance_id="sup-1")
    running = [asyncio.create_task(scheduler.run()), asyncio.create_task(agents.run())]
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(GUARD):
            await app.asubmit("wf", {}, task_id="t1")
            await first_sent.wait()
            first_sent_at = loop.time()
            await asyncio.sleep(TIMEOUT / 2)
            now[0] += TIMEOUT + 1.0  # on the store's clock its complete-by has passed
            assert await supervisor.sweep() == 1  # released, and claimed back here
            await second_sent.wait()
            # the first attempt's wait would end now (on the loop's clock), the second's not
            await asyncio.sleep(max(0.0, first_sent_at + TIMEOUT + RESOLUTION - loop.time()))
            second_may_reply.set()
            task = await app.await_("t1")
        assert task.state is TaskState.PROCESSED
        assert task.steps[0].result == {"calls": 2}
        assert len(calls) == 2  # no third attempt
    finally:
        hang.set()
        second_may_reply.set()
        for job in running:
            job.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await app._store.close()

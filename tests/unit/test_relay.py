"""The worker's outbox relay publishes a batch at once (worker.py `_publish_statuses`):
in order, each publish started before the next; what went out is acked even when
another message of the batch failed, and the failure is raised for the relay to
back off."""

from __future__ import annotations

from typing import Any

import pytest

from sasflow import AgentRequest, Step, TransportError
from sasflow.agent import AgentFunction
from sasflow.store.memory import MemoryStore
from sasflow.store.records import NewTask
from sasflow.transport.dead_letter import DeadLetter
from sasflow.transport.memory import MemoryTransport
from sasflow.worker import Worker
from sasflow.workflow import Workflow
from support.backends import FakeClock


class _Broker(MemoryTransport):
    """In-process queues that say they are shared (so a worker relays), recording the
    order publishes start in, and failing those to one queue."""

    shared = True

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing
        self.started: list[str] = []

    async def publish(self, queue: str, body: bytes) -> None:
        self.started.append(queue)
        if queue == self.failing:
            raise TransportError(f"{queue}: the broker went away")
        await super().publish(queue, body)

    async def keep_dead_letter(self, letter: DeadLetter) -> None:
        raise AssertionError("nothing here is refused for good")


async def test_a_batch_goes_out_in_order_and_what_went_out_is_acked() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    broker = _Broker(failing="app-2")
    for n, queue in enumerate(["app-1", "app-2", "app-3", "app-1"]):
        await store.submit(NewTask(task_id=f"t{n}", workflow="w", input_json=b"{}",
                                   steps=[("one", "echo", f"t{n}.one")], reply_to=queue))

    async def echo(req: AgentRequest) -> Any:
        return None

    worker = Worker(store=store, transport=broker,
                    workflows={"w": Workflow.declare("w", [Step("one", "echo")],
                                                     agents=["echo"])},
                    agents={"echo": AgentFunction("echo", echo)})
    messages = await store.take_outbox(None, 256)
    assert [m.queue for m in messages] == ["app-1", "app-2", "app-3", "app-1"]
    with pytest.raises(TransportError, match="app-2"):
        await worker._publish_statuses(messages)
    assert broker.started == ["app-1", "app-2", "app-3", "app-1"]
    clock.advance(60)  # the leases of what was not acked end
    assert [m.queue for m in await store.take_outbox(None, 256)] == ["app-2"]

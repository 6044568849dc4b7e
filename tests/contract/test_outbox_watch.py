"""The outbox's readers are told when status messages are written (E11), on every
store, and need not look for them (outbox.py).

A relay or status stream used to take the outbox every 20-50 ms, a write each
time. These tests show the word that replaced it: a reader on one store instance
is told of what another instance (as another process would) wrote, and with the
readers' own look put off for an hour, every status of a task still reaches an
application listening over each transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sasflow import AgentRequest, App, Step
from sasflow import outbox as outbox_module
from sasflow.messages import decode_status
from sasflow.store.records import submitted as submitted_task
from sasflow.store.rows import reports_status
from sasflow.transition import applied
from support.backends import APP_TRANSPORTS, STORES, app_transport
from support.statuses import statuses_until_processed
from support.stores import PLANS, Clock, StoreFactory, applies, claim_one, new_task
from support.tasks import running

WAIT_S = 30.0  # only ever reached if the word never comes


class Told:
    """Counts the words a watcher hears, and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    def __call__(self) -> None:
        self.count += 1
        self._changed.set()

    async def beyond(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while self.count <= count:
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def watching(store: Any, told: Told) -> AsyncIterator[None]:
    async with running(store.watch_outbox(told)):
        await told.beyond(0)  # listening now: the first word comes once it does
        yield


async def test_a_reader_is_told_of_status_messages_another_instance_writes(
        make_store: StoreFactory, clock: Clock) -> None:
    """The submission's "received" and a step's "step_completed", each written by
    another store instance, each reach the reader's watch; what it then takes is
    what was written."""
    reader, writer = make_store(clock=clock), make_store(clock=clock)
    told = Told()
    async with watching(reader, told):
        heard = told.count
        assert await writer.submit(new_task("order-1", reply_to="app-1"))
        await told.beyond(heard)
        [received] = await reader.take_outbox(["app-1"], 10)
        assert decode_status(received.body).event == "received"
        await reader.ack_outbox([received.id])

        task = await claim_one(writer, "s1")
        heard = told.count
        await applies(writer, task, PLANS["order"].reply(task, "s1", True, {"sku": 1}, None,
                                                         clock.now))
        await told.beyond(heard)
        [completed] = await reader.take_outbox(["app-1"], 10)
        assert (decode_status(completed.body).event, decode_status(completed.body).step) == (
            "step_completed", "reserve")


def test_only_writes_that_carry_status_messages_report_them() -> None:
    """A submission reports one with a reply_to; a transition, when it has events and
    a reply_to. The others wake no reader."""
    assert reports_status(new_task("a", reply_to="app-1"))
    assert not reports_status(new_task("b"))
    task = submitted_task(new_task("a", reply_to="app-1"), 0.0)
    start = PLANS["order"].claim(task, "s1", 0.0)
    # what a step's reply with and without a reply_to plans
    done = PLANS["order"].reply(applied(task, start), "s1", True, {"sku": 1}, None, 1.0)
    assert done.events and done.reply_to == "app-1"
    assert reports_status(done)
    assert not reports_status(msgspec.structs.replace(done, reply_to=None))
    assert not reports_status(msgspec.structs.replace(done, events=[]))


@pytest.mark.parametrize("transport", APP_TRANSPORTS)
@pytest.mark.parametrize("store", ["postgres", "sqlite"])
async def test_every_status_reaches_the_application_with_no_look(
        store: str, transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the readers' look put off for an hour, a task's statuses still reach
    `alisten`, received to processed: over in-process queues the status stream reads
    the outbox when told; over a broker the worker's relay does, and publishes them."""
    monkeypatch.setattr(outbox_module, "LOOK_S", 3600.0)
    run = uuid.uuid4().hex[:10]
    app = App(store=STORES[store](tmp_path), transport=app_transport(transport, run))

    @app.agent(f"echo-{run}")
    async def echo(req: AgentRequest) -> Any:
        return req.input

    app.workflow("echo", [Step("one", agent=f"echo-{run}"), Step("two", agent=f"echo-{run}")])
    roles = asyncio.create_task(app.arun(instance_id=f"outbox-{run}"))
    try:
        queue = f"shop-{run}"
        listening = app.alisten(queue)
        task_id = await app.asubmit("echo", {"n": 1}, reply_to=queue)
        events = [(s.event, s.step) for s in await statuses_until_processed(listening, task_id)]
        assert events == [("received", None), ("step_completed", "one"),
                          ("step_completed", "two"), ("processed", None)]
    finally:
        roles.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await roles
        await app._transport.close()
        await app._store.close()

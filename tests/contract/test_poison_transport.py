"""One poison message on a scheduler's reply queue or an agent's request queue, on every
transport, under a running App (SPEC R3, U7).

Before: a non-JSON reply was redelivered about 1,600 times a second on RabbitMQ
(with a traceback each time) and re-added about 2,000 times a second on Redis,
burning most of a core until someone purged the queue. Now it is a dead letter
on its first delivery, logged once, and the worker goes on serving tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sasflow import (
    AgentRequest,
    App,
    ConfigurationError,
    PayloadError,
    Step,
    TaskState,
    UnknownTaskError,
)
from sasflow.transport import DeadLetter, agent_queue, reply_queue
from sasflow.transport.amqp import AmqpTransport
from support.backends import APP_TRANSPORTS, app_transport, dead_letter_name
from support.services import RABBITMQ
from support.statuses import statuses_until_processed

INSTANCE = "poison-worker"


@dataclass
class Running:
    app: App
    replies: str  # its scheduler's reply queue


@pytest.fixture(params=APP_TRANSPORTS)
async def running(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Running]:
    """An App with one agent, running all roles in this event loop, on a private store,
    private queues and private dead letters."""
    run = uuid.uuid4().hex[:10]
    # agents' queues are private to the test through their names
    shop = App(store=f"sqlite:///{tmp_path / 'poison.db'}",
               transport=app_transport(request.param, run))

    @shop.agent(f"echo-{run}")
    async def echo(req: AgentRequest) -> Any:
        return req.input

    shop.workflow("echo", [Step("echo", agent=f"echo-{run}", timeout=30.0)])
    instance = f"{INSTANCE}-{run}"
    roles = asyncio.create_task(shop.arun(instance_id=instance))
    yield Running(shop, reply_queue(instance))
    roles.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await roles
    with contextlib.suppress(Exception):
        await shop._transport.purge_dead_letters()
    if request.param == "rabbitmq":
        await _delete_amqp(dead_letter_name(run))
    await shop._transport.close()
    await shop._store.close()


async def _delete_amqp(name: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(RABBITMQ)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(name)
        await channel.exchange_delete(name)


async def dead_letters_of(app: App, queues: set[str]) -> dict[str, DeadLetter]:
    """Wait until each of `queues` has its dead letter (positive signal; hang guard only)."""
    async with asyncio.timeout(30.0):
        while True:
            found = {d.queue: d for d in await app._transport.dead_letters()}
            if queues <= set(found):
                return found
            await asyncio.sleep(0.05)


def about(queue: str, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING and queue in record.getMessage()


class _Warned(logging.Handler):
    """Sets `event` (in `loop`, from whichever thread logs) at a warning about `queue`."""

    def __init__(self, queue: str, loop: asyncio.AbstractEventLoop, event: asyncio.Event
                 ) -> None:
        super().__init__(logging.WARNING)
        self.queue, self.loop, self.event = queue, loop, event

    def emit(self, record: logging.LogRecord) -> None:
        if about(self.queue, record):
            self.loop.call_soon_threadsafe(self.event.set)


async def warned_once(caplog: pytest.LogCaptureFixture, queue: str) -> None:
    """The warning about `queue`'s dead letter is one line without a traceback. It is
    logged once the letter is kept (the broker confirmed it), so a reader of the dead
    letters can see the letter a moment before the line: waited for, as it is logged
    (hang guard only)."""
    warned = asyncio.Event()
    watch = _Warned(queue, asyncio.get_running_loop(), warned)
    # added before looking, so no line slips between; after caplog's handler, so caplog
    # has a record by the time this one tells of it
    logging.getLogger().addHandler(watch)
    try:
        if not any(about(queue, r) for r in caplog.records):
            async with asyncio.timeout(30.0):
                await warned.wait()
    finally:
        logging.getLogger().removeHandler(watch)
    lines = [r for r in caplog.records if about(queue, r)]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]


async def test_poison_on_the_reply_and_request_queues_is_dead_lettered_once_and_work_goes_on(
        running: Running, caplog: pytest.LogCaptureFixture) -> None:
    """A body that is no reply (on the scheduler's reply queue) and one that is no request
    (on the agent's queue) are each delivered once, kept with the reason, logged in one
    line without a traceback; tasks submitted before and after are processed."""
    caplog.set_level(logging.INFO)
    app, replies = running.app, running.replies
    (agent,) = app.agents
    requests = agent_queue(agent)
    before = await app.asubmit("echo", {"n": 1})
    assert (await app.await_(before, timeout=30)).state is TaskState.PROCESSED
    await app._transport.publish(replies, b"{not json at all")
    await app._transport.publish(requests, b'{"task_id": 7}')  # JSON, but no request
    letters = await dead_letters_of(app, {replies, requests})
    after = await app.asubmit("echo", {"n": 2})
    assert (await app.await_(after, timeout=30)).state is TaskState.PROCESSED
    assert letters[replies].deliveries == letters[requests].deliveries == 1
    assert letters[replies].body == b"{not json at all"
    assert letters[replies].reason.startswith("MalformedMessage: not a reply")
    assert letters[requests].reason.startswith(f"MalformedMessage: not a request for {agent}")
    if not app._transport.shared:  # in-process queues die with the process: the store keeps them
        assert {d.queue for d in await app._store.dead_letters()} == {replies, requests}
    for queue in (replies, requests):
        await warned_once(caplog, queue)


async def test_a_malformed_status_message_does_not_end_listening(
        running: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`app.alisten(queue)` decodes defensively: a body on the application's status queue
    that is no status (on the embedded default, a row of the store's outbox) is a dead
    letter, logged once, not an error raised into the listener, which goes on with the
    statuses after it."""
    caplog.set_level(logging.INFO)
    app = running.app
    queue = f"shop-{uuid.uuid4().hex[:8]}"
    if app._transport.shared:
        await app._transport.publish(queue, b"<status>not json</status>")
    else:  # the embedded default reads the store's outbox: a bad row written there
        with contextlib.closing(sqlite3.connect(tmp_path / "poison.db")) as db, db:
            db.execute("INSERT INTO outbox (queue, body, created_at) VALUES (?, ?, 0)",
                       (queue, b"<status>not json</status>"))
    task_id = await app.asubmit("echo", {"n": 3}, reply_to=queue)
    events = [s.event for s in await statuses_until_processed(app.alisten(queue), task_id)]
    assert events[0] == "received" and events[-1] == "processed"
    letters = await dead_letters_of(app, {queue})
    assert letters[queue].reason.startswith("MalformedMessage: not a status message")
    assert letters[queue].body == b"<status>not json</status>"
    await warned_once(caplog, queue)


@pytest.mark.parametrize("running", ["rabbitmq", "redis"], indirect=True)
async def test_a_status_message_the_broker_refuses_is_dead_lettered_and_the_rest_go_on(
        running: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The relay's one bad message (R3): outbox rows the broker refuses for good (a body
    over the transport's limit; on RabbitMQ a queue name beginning 'amq.' too, written
    by hand as a release before this one could have) each go to the dead letters,
    logged once, and the statuses written after them reach their application. Sent
    again instead, each would hold back the rows taken with it until their lease ends."""
    caplog.set_level(logging.INFO)
    app = running.app
    run = uuid.uuid4().hex[:8]
    refused = {f"big-{run}": b"x" * (app._transport.max_message_bytes + 1)}
    if isinstance(app._transport, AmqpTransport):
        refused[f"amq.poison-{run}"] = b'{"event": "processed"}'
    with contextlib.closing(sqlite3.connect(tmp_path / "poison.db")) as db, db:
        db.executemany("INSERT INTO outbox (queue, body, created_at) VALUES (?, ?, 0)",
                       list(refused.items()))
    queue = f"shop-{run}"
    listening = app.alisten(queue)
    task_id = await app.asubmit("echo", {"n": 4}, reply_to=queue)
    events = [s.event for s in await statuses_until_processed(listening, task_id)]
    assert events[0] == "received" and events[-1] == "processed"
    letters = await dead_letters_of(app, set(refused))
    for name, body in refused.items():
        assert letters[name].body == body
        assert letters[name].reason.startswith("MessageRefused: ")
        await warned_once(caplog, name)


@pytest.mark.parametrize("reply_to, why", [
    ("amq.shop", "names beginning 'amq.' are RabbitMQ's own"),
    ("s" * 256, "longer than RabbitMQ's 255 bytes"),
    ("é" * 128, "longer than RabbitMQ's 255 bytes")])
def test_a_reply_to_the_broker_cannot_have_is_refused_at_submission(
        reply_to: str, why: str, tmp_path: Path) -> None:
    """Bad input, refused in one line before anything is written: a reply_to RabbitMQ
    would never take (its statuses would have nowhere to go). The transport is not
    even reached: the names are RabbitMQ's rules, known here."""
    app = App(store=f"sqlite:///{tmp_path / 'names.db'}",
              transport="amqp://guest:guest@127.0.0.1:1/")  # never connected to

    @app.agent("echo")
    async def echo(req: AgentRequest) -> Any:
        return req.input

    app.workflow("echo", [Step("echo", agent="echo")])
    try:
        with pytest.raises(PayloadError, match=why):
            app.submit("echo", {"n": 1}, task_id="t-1", reply_to=reply_to)
        with pytest.raises(UnknownTaskError):
            app.get("t-1")
        assert app.submit("echo", {"n": 1}, task_id="t-1", reply_to="s" * 255) == "t-1"
    finally:
        app.close()


async def test_an_agent_the_broker_could_never_reach_stops_the_worker_at_start(
        tmp_path: Path) -> None:
    """An agent whose queue name RabbitMQ cannot have (over 255 bytes) is a
    configuration error at the worker's start, in one line, before the broker is
    reached: running, every request to it would be refused and its tasks would only
    expire. Over in-process queues the same name is fine."""
    long_name = "a" * 250

    def app_on(transport: str) -> App:
        app = App(store=f"sqlite:///{tmp_path / 'far.db'}", transport=transport)

        @app.agent(long_name)
        async def far(req: AgentRequest) -> Any:
            return req.input

        app.workflow("far", [Step("one", agent=long_name)])
        return app

    app = app_on("amqp://guest:guest@127.0.0.1:1/")  # never connected to
    try:
        with pytest.raises(ConfigurationError, match="longer than RabbitMQ's 255 bytes"):
            async with asyncio.timeout(30):
                await app.arun(instance_id="far-worker")
    finally:
        await app.aclose()
    app = app_on("memory")
    try:
        task_id = await app.asubmit("far", {"n": 1})
        roles = asyncio.create_task(app.arun(instance_id="near-worker"))
        assert (await app.await_(task_id, timeout=30)).state is TaskState.PROCESSED
        roles.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await roles
    finally:
        await app.aclose()

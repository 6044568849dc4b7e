"""The in-process transport: a consumer runs at most `prefetch` handlers at once; its dead
letters when the store cannot take them (SPEC R3)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sasflow.errors import StoreError
from sasflow.transport import MalformedMessage
from sasflow.transport.dead_letter import DeadLetter, DeliveryPolicy, ListBox
from sasflow.transport.memory import MemoryTransport
from support.tasks import running


class DownStore(ListBox):
    """A store that is unreachable when a dead letter comes."""

    async def add_dead_letter(self, letter: DeadLetter) -> None:
        raise StoreError("database is locked")


@contextlib.asynccontextmanager
async def consuming(transport: MemoryTransport, handler: Any, *, prefetch: int
                    ) -> AsyncIterator[None]:
    """`transport` consuming queue "q" with `handler` while inside, stopped after."""
    async with running(transport.consume("q", handler, prefetch=prefetch)):
        yield


async def test_a_dead_letter_the_store_refuses_is_kept_in_the_process_and_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Neither lost nor retried hot: kept in memory, two log lines (why, and the letter),
    and the consumer goes on with the next message."""
    caplog.set_level(logging.INFO)
    transport = MemoryTransport(dead_letter_box=DownStore)
    handled: list[bytes] = []

    async def handler(body: bytes) -> None:
        if body == b"garbage":
            raise MalformedMessage("not a reply")
        handled.append(body)

    async with consuming(transport, handler, prefetch=1):
        for body in (b"garbage", b"fine"):
            await transport.publish("q", body)
        async with asyncio.timeout(5):
            while not handled or not transport.stranded.letters:
                await asyncio.sleep(0.01)
    assert handled == [b"fine"]
    assert [(d.queue, d.body, d.deliveries) for d in transport.stranded.letters] == [
        ("q", b"garbage", 1)]
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 2 and "database is locked" in loud[0], loud


async def test_a_consumer_runs_at_most_prefetch_handlers_at_once() -> None:
    """Three slots: three handlers start, the fourth only once one has returned, and
    every message is handled in the end."""
    transport = MemoryTransport()
    gates = [asyncio.Event() for _ in range(10)]
    running, most, started = 0, 0, asyncio.Queue[int]()
    handled: list[int] = []
    all_handled = asyncio.Event()

    async def handler(body: bytes) -> None:
        nonlocal running, most
        n = int(body)
        running += 1
        most = max(most, running)
        started.put_nowait(n)
        await gates[n].wait()
        running -= 1
        handled.append(n)
        if len(handled) == len(gates):
            all_handled.set()

    async with consuming(transport, handler, prefetch=3):
        for n in range(10):
            await transport.publish("q", str(n).encode())
        async with asyncio.timeout(60):
            first = [await started.get() for _ in range(3)]
            assert sorted(first) == [0, 1, 2] and running == 3
            gates[first[0]].set()  # one returns: the next may start
            assert await started.get() == 3
            for gate in gates:
                gate.set()
            await all_handled.wait()
    assert most == 3
    assert sorted(handled) == list(range(10))


async def test_a_message_that_comes_while_every_handler_is_busy_starts_at_once() -> None:
    """The handlers are started as the messages need them: one that comes while the
    others are all held is taken at once, up to the prefetch."""
    transport = MemoryTransport()
    held = asyncio.Event()
    started: asyncio.Queue[int] = asyncio.Queue()

    async def handler(body: bytes) -> None:
        started.put_nowait(int(body))
        await held.wait()

    try:
        async with consuming(transport, handler, prefetch=3):
            async with asyncio.timeout(60):
                for n in range(3):  # each only once the ones before are held
                    await transport.publish("q", str(n).encode())
                    assert await started.get() == n
    finally:
        held.set()


async def test_messages_handled_one_after_another_need_no_task_each() -> None:
    """A hundred messages, each handled before the next is sent: the consumer keeps
    the handlers they needed at once (one, and one waiting), not a task a message."""
    transport = MemoryTransport()
    handled: asyncio.Queue[int] = asyncio.Queue()

    async def handler(body: bytes) -> None:
        handled.put_nowait(int(body))

    loop = asyncio.get_running_loop()
    made = 0

    def counted(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> Any:
        nonlocal made
        made += 1
        return asyncio.Task(coro, loop=loop, **options)

    loop.set_task_factory(counted)
    try:
        async with consuming(transport, handler, prefetch=50):
            async with asyncio.timeout(60):
                for n in range(100):
                    await transport.publish("q", str(n).encode())
                    assert await handled.get() == n
    finally:
        loop.set_task_factory(None)
    assert made <= 1 + 2  # the consumer, then its handlers


async def test_a_failure_whose_handling_fails_stops_no_later_message(
        caplog: pytest.LogCaptureFixture) -> None:
    """One bad message, and a fault in handling its failure (here the delivery policy
    raises): that message is lost and said in the log, and the consumer's handlers
    go on to the next ones."""

    class Broken(DeliveryPolicy):
        def exhausted(self, deliveries: int) -> bool:
            raise RuntimeError("policy store unreachable")

    transport = MemoryTransport(policy=Broken())
    handled: asyncio.Queue[bytes] = asyncio.Queue()

    async def handler(body: bytes) -> None:
        if body == b"bad":
            raise ValueError("cannot read it")
        handled.put_nowait(body)

    async with consuming(transport, handler, prefetch=1):
        for body in (b"bad", b"good", b"also good"):
            await transport.publish("q", body)
        async with asyncio.timeout(60):
            assert [await handled.get(), await handled.get()] == [b"good", b"also good"]
    assert "could not handle the failure of a message on q" in caplog.text

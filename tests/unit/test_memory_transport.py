"""The in-process transport: a consumer runs at most `prefetch` handlers at once; its dead
letters when the store cannot take them (SPEC R3)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from sasflow.errors import StoreError
from sasflow.transport import MalformedMessage
from sasflow.transport.dead_letter import DeadLetter, ListBox
from sasflow.transport.memory import MemoryTransport


class DownStore(ListBox):
    """A store that is unreachable when a dead letter comes."""

    async def add_dead_letter(self, letter: DeadLetter) -> None:
        raise StoreError("database is locked")


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

    consumer = asyncio.create_task(transport.consume("q", handler, prefetch=1))
    try:
        for body in (b"garbage", b"fine"):
            await transport.publish("q", body)
        async with asyncio.timeout(5):
            while not handled or not transport.stranded.letters:
                await asyncio.sleep(0.01)
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
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

    consumer = asyncio.create_task(transport.consume("q", handler, prefetch=3))
    try:
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
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
    assert most == 3
    assert sorted(handled) == list(range(10))

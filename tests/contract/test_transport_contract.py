"""The transport contract (SPEC S4, E5, E11): run against every transport.

Delivery is at least once: a handler that raises, or is cancelled, has its
message delivered again. Queue names are private to each test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import pytest

from sasflow.errors import TransportError
from sasflow.transport import Transport, agent_queue

Handler = Callable[[bytes], Awaitable[None]]
QueueName = Callable[[str], str]


class TransportFactory(Protocol):
    def __call__(self, max_message_bytes: int = ...) -> Transport: ...


class Consumers:
    """Consumers started by a test, all cancelled at its end."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, queue: str, handler: Handler, prefetch: int = 1) -> asyncio.Task[None]:
        task = asyncio.create_task(self.transport.consume(queue, handler, prefetch=prefetch))
        self.tasks.append(task)
        return task

    async def stop(self, task: asyncio.Task[None]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def consumers(transport: Transport) -> AsyncIterator[Consumers]:
    started = Consumers(transport)
    yield started
    for task in started.tasks:
        await started.stop(task)


class Collector:
    """A handler that records bodies and lets a test wait for a count."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self._changed = asyncio.Event()

    async def __call__(self, body: bytes) -> None:
        self.bodies.append(body)
        self._changed.set()

    async def until(self, count: int) -> list[bytes]:
        async with asyncio.timeout(5.0):
            while len(self.bodies) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.bodies


class InFlight:
    """Counts the handlers running at once (`async with`), and the most there were."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    async def __aenter__(self) -> int:
        self.now += 1
        self.peak = max(self.peak, self.now)
        return self.now

    async def __aexit__(self, *exc: object) -> None:
        self.now -= 1


async def quiet(seconds: float = 0.1) -> None:
    """Give a transport the chance to (wrongly) deliver something."""
    await asyncio.sleep(seconds)


async def test_messages_are_delivered_in_order(transport: Transport, consumers: Consumers,
                                               queue_name: QueueName) -> None:
    """One consumer with prefetch 1 receives a queue's messages in publishing order."""
    queue = queue_name("requests")
    sent = [f"m{n}".encode() for n in range(20)]
    for body in sent[:10]:
        await transport.publish(queue, body)
    got = Collector()
    consumers.start(queue, got)  # messages published before consuming are kept ...
    for body in sent[10:]:
        await transport.publish(queue, body)  # ... and so are those published after
    assert await got.until(20) == sent


async def test_a_raising_handler_gets_the_message_again(transport: Transport,
                                                         consumers: Consumers,
                                                         queue_name: QueueName) -> None:
    """A message whose handler raised was not acked: it is delivered again, not lost."""
    queue = queue_name("requests")
    attempts: dict[bytes, int] = {}
    done = Collector()

    async def flaky(body: bytes) -> None:
        attempts[body] = attempts.get(body, 0) + 1
        if attempts[body] < 3:
            raise RuntimeError("handler crashed")
        await done(body)

    consumers.start(queue, flaky)
    await transport.publish(queue, b"payload")
    assert await done.until(1) == [b"payload"]
    assert attempts == {b"payload": 3}


async def test_a_message_in_flight_when_consuming_stops_is_redelivered(
        transport: Transport, consumers: Consumers, queue_name: QueueName) -> None:
    """Nothing is lost: a consumer cancelled mid-message leaves it for the next consumer."""
    queue = queue_name("requests")
    started = asyncio.Event()

    async def stuck(body: bytes) -> None:
        started.set()
        await asyncio.sleep(60)

    first = consumers.start(queue, stuck)
    await transport.publish(queue, b"unfinished")
    async with asyncio.timeout(5.0):
        await started.wait()
    await consumers.stop(first)
    got = Collector()
    consumers.start(queue, got)
    assert await got.until(1) == [b"unfinished"]


async def test_prefetch_bounds_messages_in_flight(transport: Transport, consumers: Consumers,
                                                  queue_name: QueueName) -> None:
    """At most `prefetch` messages are being handled at once; the rest wait their turn."""
    queue = queue_name("requests")
    release, filled = asyncio.Event(), asyncio.Event()
    running = InFlight()
    done = Collector()

    async def slow(body: bytes) -> None:
        async with running as now:
            if now == 3:
                filled.set()
            await release.wait()
        await done(body)

    for n in range(10):
        await transport.publish(queue, f"m{n}".encode())
    consumers.start(queue, slow, prefetch=3)
    async with asyncio.timeout(5.0):
        await filled.wait()
    await quiet()
    assert (running.now, running.peak) == (3, 3)
    release.set()
    assert sorted(await done.until(10)) == sorted(f"m{n}".encode() for n in range(10))
    assert running.peak == 3


async def test_a_message_over_the_size_limit_is_refused_clearly(
        make_transport: TransportFactory, queue_name: QueueName) -> None:
    """Over max_message_bytes: TransportError naming the size, the limit and the queue."""
    transport = make_transport(max_message_bytes=100)
    queue = queue_name("requests")
    await transport.publish(queue, b"x" * 100)  # exactly at the limit is fine
    with pytest.raises(TransportError) as caught:
        await transport.publish(queue, b"x" * 101)
    message = str(caught.value)
    assert "101 bytes" in message
    assert "100 bytes" in message
    assert queue in message
    assert transport.max_message_bytes == 100


async def test_messages_reach_only_the_queue_they_were_sent_to(
        transport: Transport, consumers: Consumers, queue_name: QueueName) -> None:
    """Replies are routed by queue name: each scheduler gets its own replies only."""
    mine, theirs = queue_name("reply.s1"), queue_name("reply.s2")
    got_mine, got_theirs = Collector(), Collector()
    consumers.start(mine, got_mine)
    consumers.start(theirs, got_theirs)
    await transport.publish(mine, b"for s1")
    await transport.publish(theirs, b"for s2 (a)")
    await transport.publish(theirs, b"for s2 (b)")
    assert await got_mine.until(1) == [b"for s1"]
    assert await got_theirs.until(2) == [b"for s2 (a)", b"for s2 (b)"]
    await quiet()
    assert got_mine.bodies == [b"for s1"]


async def test_cancelling_consume_stops_delivery(transport: Transport, consumers: Consumers,
                                                 queue_name: QueueName) -> None:
    """A cancelled consumer gets nothing more; the messages wait for the next one."""
    queue = queue_name("requests")
    got = Collector()
    task = consumers.start(queue, got)
    await transport.publish(queue, b"before")
    await got.until(1)
    assert transport.has_consumer(queue)
    await consumers.stop(task)
    assert task.done()
    assert not transport.has_consumer(queue)
    await transport.publish(queue, b"after")
    await quiet()
    assert got.bodies == [b"before"]
    later = Collector()
    consumers.start(queue, later)
    assert await later.until(1) == [b"after"]


async def test_has_consumer_follows_consumers(transport: Transport, consumers: Consumers,
                                              queue_name: QueueName) -> None:
    """has_consumer: this process consumes the queue exactly while a consumer runs."""
    queue = queue_name("requests")
    assert not transport.has_consumer(queue)
    task = consumers.start(queue, Collector())
    await asyncio.sleep(0)
    assert transport.has_consumer(queue)
    await consumers.stop(task)
    assert not transport.has_consumer(queue)


async def test_many_concurrent_publishes_to_an_agent_queue_all_arrive(
        transport: Transport, consumers: Consumers, queue_name: QueueName) -> None:
    """Hundreds published at once to sasflow's own queue (a transport may pack them
    together): each is delivered, and `prefetch` still bounds the handlers running."""
    queue = agent_queue(queue_name("bundled").replace(".", "-"))
    sent = [f"m{n}".encode() for n in range(300)]
    running = InFlight()
    done = Collector()

    async def slow(body: bytes) -> None:
        async with running:
            await asyncio.sleep(0.001)
        await done(body)

    await asyncio.gather(*(transport.publish(queue, body) for body in sent))
    consumers.start(queue, slow, prefetch=5)
    assert sorted(await done.until(300)) == sorted(sent)
    await quiet()
    assert len(done.bodies) == 300
    assert 1 <= running.peak <= 5


async def test_a_raising_handler_gets_its_message_again_among_many(
        transport: Transport, consumers: Consumers, queue_name: QueueName) -> None:
    """Published together with others to sasflow's own queue, a message whose handler
    raised comes again; the others are handled once each."""
    queue = agent_queue(queue_name("bundled").replace(".", "-"))
    sent = [f"m{n}".encode() for n in range(50)]
    calls: dict[bytes, int] = {}
    done = Collector()

    async def flaky(body: bytes) -> None:
        calls[body] = calls.get(body, 0) + 1
        if body == b"m7" and calls[body] < 3:
            raise RuntimeError("handler crashed")
        await done(body)

    await asyncio.gather(*(transport.publish(queue, body) for body in sent))
    consumers.start(queue, flaky, prefetch=64)
    assert sorted(await done.until(50)) == sorted(sent)
    await quiet()
    assert calls.pop(b"m7") == 3
    assert set(calls.values()) == {1}

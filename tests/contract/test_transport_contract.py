"""The transport contract (SPEC S4, E5, E11): run against every transport.

Delivery is at least once: a handler that raises, or is cancelled, has its
message delivered again. A message no handler can take goes, after a bounded
number of deliveries, to the dead letters (R3). Queue names are private to each
test.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import pytest

from sasflow.errors import TransportError
from sasflow.transport import (
    DeadLetter,
    ImmediateHandler,
    MalformedMessage,
    Transport,
    agent_queue,
    reply_queue,
)
from sasflow.transport.memory import MemoryTransport

Handler = Callable[[bytes], Awaitable[None]]
HANG_GUARD = 60.0  # only a hang fails on it: a loaded machine is slow, never this slow
MARKER = b"marker"
QueueName = Callable[[str], str]


class TransportFactory(Protocol):
    def __call__(self, max_message_bytes: int = ..., **url_options: str) -> Transport: ...


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
        self.take(body)

    def take(self, body: bytes) -> None:
        self.bodies.append(body)
        self._changed.set()

    async def until(self, count: int) -> list[bytes]:
        async with asyncio.timeout(HANG_GUARD):
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


def handler_of(style: str, now: Callable[[bytes], None]) -> Handler:
    """`now` as a handler of `style`: ``immediate`` (an ImmediateHandler, which a
    transport may call as the message is read) or ``awaited`` (a coroutine function)."""
    if style == "immediate":
        return ImmediateHandler(now)

    async def awaited(body: bytes) -> None:
        now(body)
    return awaited


STYLES = pytest.mark.parametrize("style", ["awaited", "immediate"])


def consumes(transport: Transport, queue: str) -> bool:
    """Whether a consumer of `queue` runs in this process, read from the transport's
    own count of them (the simulated transport keeps it per queue)."""
    counts = getattr(transport, "_consumed", None)
    if counts is not None:
        return bool(counts.get(queue, 0) > 0)
    found = transport._queues.get(queue)  # type: ignore[attr-defined]
    return found is not None and found.consumers > 0


async def behind_a_marker(transport: Transport, queue: str, got: Collector) -> list[bytes]:
    """What `got` received before a marker published to `queue` now reached it: a
    transport that was to deliver something more (a duplicate, a stray) has done so."""
    await transport.publish(queue, MARKER)
    async with asyncio.timeout(HANG_GUARD):
        while MARKER not in got.bodies:
            got._changed.clear()
            await got._changed.wait()
    return [body for body in got.bodies if body != MARKER]


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
    async with asyncio.timeout(HANG_GUARD):
        await started.wait()
    await consumers.stop(first)
    got = Collector()
    consumers.start(queue, got)
    assert await got.until(1) == [b"unfinished"]


async def test_prefetch_bounds_messages_in_flight(transport: Transport, consumers: Consumers,
                                                  queue_name: QueueName) -> None:
    """At most `prefetch` messages are being handled at once; the rest wait their turn
    (another consumer can take them)."""
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
    async with asyncio.timeout(HANG_GUARD):
        await filled.wait()
    # a second consumer takes what the first left waiting: once every message is being
    # handled by the first or was taken by the second, the first had its chance to
    # take a fourth
    rest = Collector()
    second = consumers.start(queue, rest, prefetch=10)
    async with asyncio.timeout(HANG_GUARD):
        while running.now + len(rest.bodies) < 10:
            await asyncio.sleep(0.01)
    assert (running.now, running.peak, len(rest.bodies)) == (3, 3, 7)
    await consumers.stop(second)
    # and, released, the first takes more, never more than 3 at once
    for n in range(10, 20):
        await transport.publish(queue, f"m{n}".encode())
    release.set()
    assert sorted(await done.until(13) + rest.bodies) == sorted(
        f"m{n}".encode() for n in range(20))
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
    assert await behind_a_marker(transport, mine, got_mine) == [b"for s1"]


async def test_cancelling_consume_stops_delivery(transport: Transport, consumers: Consumers,
                                                 queue_name: QueueName) -> None:
    """A cancelled consumer gets nothing more; the messages wait for the next one."""
    queue = queue_name("requests")
    got = Collector()
    task = consumers.start(queue, got)
    await transport.publish(queue, b"before")
    await got.until(1)
    assert consumes(transport, queue)
    await consumers.stop(task)
    assert task.done()
    assert not consumes(transport, queue)
    await transport.publish(queue, b"after")
    later = Collector()
    consumers.start(queue, later)
    # "after" waited for the next consumer: the cancelled one, had it been still
    # taking messages, would have had it first
    assert await later.until(1) == [b"after"]
    assert got.bodies == [b"before"]


async def test_a_message_handled_as_its_consumer_stops_is_not_delivered_again(
        transport: Transport, consumers: Consumers, queue_name: QueueName) -> None:
    """A handler that ends while its consumer is being stopped has its message settled
    all the same: the stop does not put back what was handled (it would run again)."""
    queue = queue_name("stopping")
    handled, later = Collector(), Collector()
    stopping: list[asyncio.Task[None]] = []

    async def handled_then_stopped(body: bytes) -> None:
        stopping[0].cancel()  # the stop comes as the handler ends
        await handled(body)

    await transport.publish(queue, b"handled")
    stopping.append(consumers.start(queue, handled_then_stopped))
    async with asyncio.timeout(HANG_GUARD):
        await asyncio.gather(stopping[0], return_exceptions=True)
    await transport.publish(queue, b"after")
    consumers.start(queue, later)
    assert await later.until(1) == [b"after"]  # "handled" would have come first
    assert handled.bodies == [b"handled"]


async def test_a_queue_is_consumed_exactly_while_a_consumer_runs(
        transport: Transport, consumers: Consumers, queue_name: QueueName) -> None:
    """This process consumes the queue exactly while a consumer runs."""
    queue = queue_name("requests")
    assert not consumes(transport, queue)
    task = consumers.start(queue, Collector())
    await asyncio.sleep(0)
    assert consumes(transport, queue)
    await consumers.stop(task)
    assert not consumes(transport, queue)


async def test_an_immediate_handler_gets_each_of_many_concurrent_publishes_once(
        transport: Transport, consumers: Consumers, queue_name: QueueName) -> None:
    """A handler that never waits (a scheduler's, of its replies) gets each of hundreds
    published at once to a reply queue, where a transport may pack them together.
    The in-process transport calls it in its consumer's own task: no task a message."""
    queue = reply_queue(queue_name("immediate").replace(".", "-"))
    sent = [f"r{n}".encode() for n in range(300)]
    done = Collector()
    tasks: set[asyncio.Task[object] | None] = set()

    def take(body: bytes) -> None:
        tasks.add(asyncio.current_task())
        done.take(body)

    consumer = consumers.start(queue, ImmediateHandler(take), prefetch=8)
    await asyncio.gather(*(transport.publish(queue, body) for body in sent))
    assert sorted(await done.until(len(sent))) == sorted(sent)
    assert sorted(await behind_a_marker(transport, queue, done)) == sorted(sent)
    if isinstance(transport, MemoryTransport):
        assert tasks == {consumer}


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
    assert len(await behind_a_marker(transport, queue, done)) == 300
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
    assert len(await behind_a_marker(transport, queue, done)) == 50
    calls.pop(MARKER)
    assert calls.pop(b"m7") == 3
    assert set(calls.values()) == {1}


# ---------------------------------------------------------------- dead letters (R3, U7)
MAX_DELIVERIES = 3
BACKOFF = 0.05  # seconds before the second delivery, doubling after each


@pytest.fixture
async def bounded(make_transport: TransportFactory) -> AsyncIterator[Transport]:
    """A transport that gives up on a message after MAX_DELIVERIES failed deliveries."""
    yield make_transport(max_deliveries=str(MAX_DELIVERIES), redelivery_backoff=str(BACKOFF))


@pytest.fixture
async def bounded_consumers(bounded: Transport) -> AsyncIterator[Consumers]:
    started = Consumers(bounded)
    yield started
    for task in started.tasks:
        await started.stop(task)


async def dead_letter_of(transport: Transport, queue: str) -> DeadLetter:
    """Wait for the dead letter taken from `queue` (a positive signal, under a hang guard)."""
    async with asyncio.timeout(HANG_GUARD):
        while True:
            letters = [d for d in await transport.dead_letters() if d.queue == queue]
            if letters:
                assert len(letters) == 1, letters
                return letters[0]
            await asyncio.sleep(0.02)


def loud_lines(caplog: pytest.LogCaptureFixture, queue: str) -> list[logging.LogRecord]:
    """What was logged about `queue` at WARNING or above."""
    return [r for r in caplog.records
            if r.levelno >= logging.WARNING and queue in r.getMessage()]


@pytest.mark.parametrize("kind", ["requests", "replies"])
@STYLES
async def test_a_malformed_message_is_dead_lettered_at_once_and_consuming_goes_on(
        bounded: Transport, bounded_consumers: Consumers, queue_name: QueueName, kind: str,
        style: str, caplog: pytest.LogCaptureFixture) -> None:
    """A body the handler cannot decode is delivered once, kept as a dead letter with its
    reason, logged in one line without a traceback; the messages after it are handled."""
    caplog.set_level(logging.DEBUG)
    queue = (agent_queue if kind == "requests" else reply_queue)(
        queue_name("poison").replace(".", "-"))
    calls: dict[bytes, int] = {}
    good = Collector()

    def decoding(body: bytes) -> None:
        calls[body] = calls.get(body, 0) + 1
        if body.startswith(b"\xff"):
            raise MalformedMessage(f"not a request: {body!r} does not decode")
        good.take(body)

    bounded_consumers.start(queue, handler_of(style, decoding), prefetch=8)
    for body in (b"before", b"\xff{not json", b"after"):
        await bounded.publish(queue, body)
    letter = await dead_letter_of(bounded, queue)
    await good.until(2)
    assert calls[b"\xff{not json"] == 1
    assert (letter.deliveries, letter.body) == (1, b"\xff{not json")
    assert letter.reason.startswith("MalformedMessage: not a request")
    assert letter.first_seen <= letter.at
    await bounded.publish(queue, b"later")
    await good.until(3)
    assert sorted(good.bodies) == [b"after", b"before", b"later"]
    lines = loud_lines(caplog, queue)
    assert len(lines) == 1 and lines[0].exc_info is None
    assert letter.id in lines[0].getMessage()


@pytest.mark.parametrize("kind", ["requests", "replies"])
@STYLES
async def test_a_handler_that_keeps_raising_is_retried_up_to_the_bound_then_dead_lettered(
        bounded: Transport, bounded_consumers: Consumers, queue_name: QueueName, kind: str,
        style: str, caplog: pytest.LogCaptureFixture) -> None:
    """A well-formed message whose handler raises every time is delivered MAX_DELIVERIES
    times, each after a longer backoff (never hot), then dead-lettered with the error's
    text; good messages keep flowing, and the log holds one line for it."""
    caplog.set_level(logging.DEBUG)
    queue = (agent_queue if kind == "requests" else reply_queue)(
        queue_name("failing").replace(".", "-"))
    seen: list[float] = []
    good = Collector()
    loop = asyncio.get_running_loop()

    def handler(body: bytes) -> None:
        if body == b"bad":
            seen.append(loop.time())
            raise RuntimeError("the remote said no")
        good.take(body)

    bounded_consumers.start(queue, handler_of(style, handler), prefetch=4)
    await bounded.publish(queue, b"bad")
    for n in range(5):
        await bounded.publish(queue, f"good{n}".encode())
    letter = await dead_letter_of(bounded, queue)
    assert len(seen) == MAX_DELIVERIES == letter.deliveries
    assert letter.reason == "RuntimeError: the remote said no"
    assert letter.body == b"bad"
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert all(gap >= BACKOFF * 2 ** n * 0.9 for n, gap in enumerate(gaps)), gaps
    await bounded.publish(queue, b"later")
    await good.until(6)
    assert len(seen) == MAX_DELIVERIES  # handled "later": the bad one did not come back
    lines = loud_lines(caplog, queue)
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]


async def test_a_handler_that_recovers_before_the_bound_leaves_no_dead_letter(
        bounded: Transport, bounded_consumers: Consumers, queue_name: QueueName) -> None:
    """Failing fewer times than the bound, a message is handled and nothing is kept."""
    queue = queue_name("flaky")
    attempts = 0
    done = Collector()

    async def flaky(body: bytes) -> None:
        nonlocal attempts
        attempts += 1
        if attempts < MAX_DELIVERIES:
            raise RuntimeError("not yet")
        await done(body)

    bounded_consumers.start(queue, flaky)
    await bounded.publish(queue, b"payload")
    assert await done.until(1) == [b"payload"]
    assert attempts == MAX_DELIVERIES
    assert [d for d in await bounded.dead_letters() if d.queue == queue] == []


async def test_dead_letters_are_listed_shown_whole_and_purged(
        bounded: Transport, bounded_consumers: Consumers, queue_name: QueueName) -> None:
    """An operator sees each dead letter by its id, body whole, and can clear them all;
    an unknown id is None; a listing leaves the letters in place."""
    queue = queue_name("operator")

    async def refuse(body: bytes) -> None:
        raise MalformedMessage("unreadable")

    bounded_consumers.start(queue, refuse)
    big = b"x" * 5000
    await bounded.publish(queue, big)
    letter = await dead_letter_of(bounded, queue)
    assert await bounded.dead_letter(letter.id) == letter
    assert (await bounded.dead_letters(limit=10)) == [letter]  # still there after a look
    assert await bounded.dead_letter(letter.id + "0") is None
    assert await bounded.dead_letter("no such id") is None
    assert await bounded.purge_dead_letters() == 1
    assert await bounded.dead_letters() == []

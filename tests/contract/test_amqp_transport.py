"""What the RabbitMQ transport promises beyond the shared contract (SPEC S4, issue 3).

Run against the real broker at 127.0.0.1:5672. A process killed with SIGKILL
leaves its unacked message to another consumer; ``publish`` returns only once
the broker confirmed (shown by holding back the broker's answers in a loopback
proxy); messages are persistent in durable queues; a severed connection is
restored, consumers included.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustConnection
from pamqp.commands import Basic

from sasflow.errors import MissingExtraError, TransportError
from sasflow.transport import Transport, agent_queue, amqp, open_transport
from sasflow.transport.amqp_bundle import BUNDLE_TYPE
from sasflow.transport.amqp_wire import WireAddress
from sasflow.transport.amqp_wire_consume import ConsumingWire
from sasflow.transport.amqp_wire_publish import WirePublisher
from sasflow.transport.base import ImmediateHandler
from support.faultproxy import FaultProxy, fault_proxy

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
# queues expire once unused; those a test creates are also deleted at its end
OPTIONS = "?queue_expires=20&reconnect_interval=0.1"
URL = BROKER + OPTIONS


@pytest.fixture
async def broker(rabbitmq_server: str) -> AsyncIterator[AbstractRobustConnection]:
    """A plain aio-pika connection to look at the broker from outside the transport."""
    connection = await aio_pika.connect_robust(BROKER)
    yield connection
    await connection.close()


@pytest.fixture
async def queue(broker: AbstractRobustConnection) -> AsyncIterator[str]:
    """A queue name private to this test; the queue is deleted at its end."""
    name = f"amqp-test.{uuid.uuid4().hex[:12]}"
    yield name
    channel = await broker.channel()
    await channel.queue_delete(name)
    await channel.close()


@pytest.fixture
async def own_queue(broker: AbstractRobustConnection) -> AsyncIterator[str]:
    """Like `queue`, but one of sasflow's own (an agent's request queue)."""
    name = agent_queue(f"amqp-test-{uuid.uuid4().hex[:12]}")
    yield name
    channel = await broker.channel()
    await channel.queue_delete(name)
    await channel.close()


@pytest.fixture
async def transports(rabbitmq_server: str) -> AsyncIterator[Callable[..., Transport]]:
    opened: list[Transport] = []

    def make(url: str = URL) -> Transport:
        transport = open_transport(url)
        opened.append(transport)
        return transport

    yield make
    for transport in opened:
        await transport.close()


async def all_before_marker(transport: Transport, queue: str, got: list[bytes]) -> list[bytes]:
    """What the consumer got before a marker published now reached it: whatever was
    delivered (or delivered again) ahead of it has arrived."""
    await transport.publish(queue, MARKER)
    await until(lambda: MARKER in got)
    return [body for body in got if body != MARKER]


async def message_count(broker: AbstractRobustConnection, queue: str) -> int:
    channel = await broker.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        count = declared.declaration_result.message_count
        assert count is not None
        return count
    finally:
        await channel.close()


@contextlib.asynccontextmanager
async def consuming(transport: Transport, queue: str, prefetch: int
                    ) -> AsyncIterator[list[bytes]]:
    """Consume `queue` into a list for the length of the block."""
    got: list[bytes] = []

    async def collect(body: bytes) -> None:
        got.append(body)

    consumer = asyncio.create_task(transport.consume(queue, collect, prefetch=prefetch))
    try:
        yield got
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)


HANG_GUARD = 60.0  # only a hang fails on it: a loaded machine is slow, never this slow
MARKER = b"marker"


def received(got: list[bytes], count: int) -> bool:
    return len(got) >= count


async def until(predicate: Callable[[], object], seconds: float = HANG_GUARD) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.01)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    """A FaultProxy to the machine's RabbitMQ: it can hold back the broker's answers
    (`hold-answers`) or cut the line (`reset`)."""
    with fault_proxy(5672) as started:
        yield started


CONSUMER = """
import asyncio, sys
from sasflow.transport import open_transport

async def main():
    transport = open_transport(sys.argv[1])

    async def stuck(body):
        print("got", body.decode(), flush=True)
        await asyncio.sleep(3600)

    await transport.consume(sys.argv[2], stuck, prefetch=1)

asyncio.run(main())
"""


BUNDLE_CONSUMER = """
import asyncio, sys
from sasflow.transport import open_transport

async def main():
    transport = open_transport(sys.argv[1])

    async def handle(body):
        if body.decode() == sys.argv[3]:
            print("stuck", body.decode(), flush=True)
            await asyncio.sleep(3600)
        print("done", body.decode(), flush=True)

    await transport.consume(sys.argv[2], handle, prefetch=64)

asyncio.run(main())
"""


async def test_a_killed_consumers_unacked_message_goes_to_another_consumer(
        transports: Callable[..., Transport], queue: str) -> None:
    """A consumer process killed with SIGKILL before acking: another consumer gets the message."""
    transport = transports()
    await transport.publish(queue, b"unfinished")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CONSUMER, URL, queue, stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(HANG_GUARD):
            line = await process.stdout.readline()
        assert line == b"got unfinished\n"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        await process.wait()
    async with consuming(transport, queue, prefetch=1) as got:
        await until(lambda: got)
        assert got == [b"unfinished"]


async def test_messages_published_together_to_sasflows_queues_travel_as_bundles(
        transports: Callable[..., Transport], own_queue: str, queue: str,
        broker: AbstractRobustConnection) -> None:
    """200 concurrent publishes to an agent's queue become a few broker messages; to an
    application's queue, 200 plain ones. Either way the consumer gets all 200, once."""
    transport = transports()
    sent = [f"m{n}".encode() for n in range(200)]
    await asyncio.gather(*(transport.publish(own_queue, body) for body in sent))
    await asyncio.gather(*(transport.publish(queue, body) for body in sent))
    assert 2 <= await message_count(broker, own_queue) <= 20
    assert await message_count(broker, queue) == 200
    plain = await (await broker.channel()).declare_queue(queue, passive=True)
    first = await plain.get(timeout=5)
    assert first.body == b"m0" and first.content_type is None  # any AMQP client reads it
    await first.nack(requeue=True)
    for name in (own_queue, queue):
        async with consuming(transport, name, prefetch=50) as got:
            await until(partial(received, got, 200))
            assert sorted(await all_before_marker(transport, name, got)) == sorted(sent), name


async def test_a_killed_consumers_unacked_bundle_goes_whole_to_another_consumer(
        transports: Callable[..., Transport], own_queue: str) -> None:
    """SIGKILL while one message of a bundle is still being handled: the bundle was
    not acked, so its messages come again, those already handled included."""
    transport = transports()
    sent = [f"m{n}".encode() for n in range(30)]
    await asyncio.gather(*(transport.publish(own_queue, body) for body in sent))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BUNDLE_CONSUMER, URL, own_queue, "m15",
        stdout=asyncio.subprocess.PIPE)
    handled: set[bytes] = set()
    try:
        assert process.stdout is not None
        async with asyncio.timeout(HANG_GUARD):
            while (line := await process.stdout.readline()) != b"stuck m15\n":
                assert line.startswith(b"done "), line
                handled.add(line.split()[1])
        await asyncio.sleep(0.2)  # the rest of its bundles are handled and acked
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        await process.wait()
    assert process.stdout is not None
    handled |= {line.split()[1] for line in (await process.stdout.read()).splitlines()}
    async with consuming(transport, own_queue, prefetch=64) as got:
        await until(lambda: set(got) | handled >= set(sent))
        again = await all_before_marker(transport, own_queue, got)
        assert b"m15" in again
        assert set(again) & handled, "the stuck message's bundle-mates came again"
        assert len(again) == len(set(again))
        assert set(again) | handled == set(sent)


async def test_a_malformed_bundle_is_dead_lettered_at_once_and_consuming_goes_on(
        transports: Callable[..., Transport], own_queue: str,
        broker: AbstractRobustConnection) -> None:
    """A message marked as a bundle that does not decode goes to the dead-letter exchange
    on its first delivery (handing it out again would not help); the messages after it
    are handled."""
    dead_letters = f"amqp-test.{uuid.uuid4().hex[:12]}.dead-letters"
    transport = transports(f"{URL}&dead_letters={dead_letters}")
    await transport.publish(own_queue, b"declares the queue")
    channel = await broker.channel()
    await channel.default_exchange.publish(
        aio_pika.Message(b"\xc1 not msgpack", content_type=BUNDLE_TYPE,
                         delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key=own_queue)
    await transport.publish(own_queue, b"after")
    try:
        async with consuming(transport, own_queue, prefetch=4) as got:
            await until(lambda: b"after" in got)
            async with asyncio.timeout(HANG_GUARD):
                while not (letters := await transport.dead_letters()):
                    await asyncio.sleep(0.02)
            assert got == [b"declares the queue", b"after"]
        assert [(d.queue, d.deliveries, d.body) for d in letters] == [
            (own_queue, 1, b"\xc1 not msgpack")]
        assert letters[0].reason.startswith("MalformedMessage: not a bundle")
        assert await message_count(broker, own_queue) == 0
    finally:
        await channel.queue_delete(dead_letters)
        await channel.exchange_delete(dead_letters)
        await channel.close()


async def test_a_consumer_stopped_while_dead_lettering_finishes_first(
        transports: Callable[..., Transport], own_queue: str,
        broker: AbstractRobustConnection, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer stopped while a message's dead letter is on its way to the broker
    sends it, then acks the message, before its channel closes. Cancelled with the
    consumer instead, the letter was never sent (or, confirmed, never logged) and the
    unacked message went back to the queue, to be dead-lettered again."""
    dead_letters = f"amqp-test.{uuid.uuid4().hex[:12]}.dead-letters"
    transport = transports(f"{URL}&dead_letters={dead_letters}")
    assert isinstance(transport, amqp.AmqpTransport)
    await transport.publish(own_queue, b"declares the queue")
    reached, release = asyncio.Event(), asyncio.Event()
    confirmed = transport._confirmed

    async def held(queue: str, body: bytes, properties: amqp.Properties, *,
                   to_dead_letters: bool) -> None:
        if to_dead_letters:
            reached.set()
            await release.wait()
        await confirmed(queue, body, properties, to_dead_letters=to_dead_letters)

    monkeypatch.setattr(transport, "_confirmed", held)
    channel = await broker.channel()
    await channel.default_exchange.publish(
        aio_pika.Message(b"\xc1 not msgpack", content_type=BUNDLE_TYPE,
                         delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key=own_queue)
    try:
        consumer = asyncio.create_task(transport.consume(own_queue, _ignore, prefetch=4))
        async with asyncio.timeout(HANG_GUARD):
            await reached.wait()
        consumer.cancel()
        release.set()  # while the consumer stops
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        assert [(d.queue, d.body) for d in await transport.dead_letters()] == [
            (own_queue, b"\xc1 not msgpack")]
        assert await message_count(broker, own_queue) == 0  # acked: not back in the queue
    finally:
        await channel.queue_delete(dead_letters)
        await channel.exchange_delete(dead_letters)
        await channel.close()


async def _ignore(body: bytes) -> None:
    pass


async def test_publish_returns_only_once_the_broker_confirmed(
        transports: Callable[..., Transport], proxy: FaultProxy, queue: str,
        broker: AbstractRobustConnection) -> None:
    """The broker has the message but its confirm is held back: publish keeps waiting."""
    transport = transports(f"amqp://guest:guest@127.0.0.1:{proxy.port}/{OPTIONS}")
    await transport.publish(queue, b"first")  # connected, queue declared
    proxy.set_mode("hold-answers")
    sending = asyncio.create_task(transport.publish(queue, b"second"))
    counted = 0

    async def broker_has_both() -> None:
        nonlocal counted
        while (counted := await message_count(broker, queue)) < 2:
            await asyncio.sleep(0.01)

    async with asyncio.timeout(HANG_GUARD):
        await broker_has_both()
    await until(lambda: proxy.held)  # the broker answered (its confirm): held back
    assert not sending.done(), "publish returned before the broker's confirm arrived"
    proxy.set_mode("pass")
    async with asyncio.timeout(HANG_GUARD):
        await sending
    assert counted == 2


@pytest.mark.parametrize("kind", ["own", "plain"])
async def test_publish_soon_sends_at_once_and_ends_once_the_broker_confirmed(
        proxy: FaultProxy, queue: str, own_queue: str,
        broker: AbstractRobustConnection, kind: str) -> None:
    """What a scheduler's request rests on (scheduler.py): the message reaches the broker
    without anyone waiting, and the future ends only with the confirm."""
    target = own_queue if kind == "own" else queue
    transport = amqp.AmqpTransport(f"amqp://guest:guest@127.0.0.1:{proxy.port}/{OPTIONS}")
    try:
        await transport.publish(target, b"first")  # connected, queue declared
        proxy.set_mode("hold-answers")
        sent = transport.publish_soon(target, b"second")
        async with asyncio.timeout(HANG_GUARD):
            while await message_count(broker, target) < 2:
                await asyncio.sleep(0.01)
        await until(lambda: proxy.held)  # the broker answered (its confirm): held back
        assert not sent.done(), "the future ended before the broker's confirm arrived"
        proxy.set_mode("pass")
        async with asyncio.timeout(HANG_GUARD):
            await sent
        with pytest.raises(TransportError, match="over the limit"):
            transport.publish_soon(target, b"x" * (transport.max_message_bytes + 1))
    finally:
        await transport.close()


async def test_the_work_an_immediate_handler_wakes_runs_before_the_ack(
        transports: Callable[..., Transport], own_queue: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler's reply handler only wakes the step's driver, which then writes the
    transition: the driver gets the loop before the ack is sent, so the ack's write to
    the socket is not on the task's path."""
    transport = transports()
    assert isinstance(transport, amqp.AmqpTransport)
    order: list[str] = []
    woken = asyncio.Event()
    write_settled = ConsumingWire._write_settled

    def settled(self: ConsumingWire) -> None:  # the acks' write to the socket
        order.append("ack")
        write_settled(self)

    async def driver() -> None:  # as a scheduler's driver waits for its reply
        await woken.wait()
        order.append("woken work")

    monkeypatch.setattr(ConsumingWire, "_write_settled", settled)
    waiting = asyncio.create_task(driver())
    consumer = asyncio.create_task(transport.consume(
        own_queue, ImmediateHandler(lambda body: woken.set()), prefetch=4))
    try:
        await transport.publish(own_queue, b"a reply")
        await until(lambda: "ack" in order)
        assert order == ["woken work", "ack"]
    finally:
        consumer.cancel()
        waiting.cancel()
        await asyncio.gather(consumer, waiting, return_exceptions=True)


async def test_a_queue_deleted_under_its_consumer_is_declared_again_and_consumed(
        transports: Callable[..., Transport], own_queue: str,
        broker: AbstractRobustConnection) -> None:
    """The broker cancels the consumer of a queue that an operator deleted; the
    consumer sets itself up again (the queue declared anew) and takes what comes."""
    transport = transports()
    handled: list[bytes] = []

    async def handle(body: bytes) -> None:
        handled.append(body)

    consumer = asyncio.create_task(transport.consume(own_queue, handle, prefetch=4))
    try:
        await transport.publish(own_queue, b"before")
        await until(lambda: handled == [b"before"])
        channel = await broker.channel()
        await channel.queue_delete(own_queue)
        await channel.close()
        await transport.publish(own_queue, b"after")  # declared again by the publisher
        await until(lambda: handled == [b"before", b"after"])
        assert not consumer.done()
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)


async def test_messages_are_persistent_in_durable_queues(
        transports: Callable[..., Transport], queue: str,
        broker: AbstractRobustConnection) -> None:
    """Messages survive a broker restart: persistent delivery mode, durable queue."""
    await transports().publish(queue, b"keep me")
    channel = await broker.channel()
    try:
        declared = await channel.declare_queue(
            queue, durable=True, arguments={"x-expires": 20_000})  # same: accepted
        message = await declared.get(timeout=5)
        assert message.body == b"keep me"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        await message.nack(requeue=True)
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await channel.declare_queue(queue, durable=False, arguments={"x-expires": 20_000})
    finally:
        with contextlib.suppress(Exception):
            await channel.close()


async def test_a_queue_deleted_under_the_publisher_is_declared_again(
        transports: Callable[..., Transport], queue: str,
        broker: AbstractRobustConnection) -> None:
    """Publishing to a queue removed since it was declared recreates it; nothing is dropped."""
    transport = transports()
    await transport.publish(queue, b"one")
    channel = await broker.channel()
    await channel.queue_delete(queue)
    await channel.close()
    await transport.publish(queue, b"two")
    assert await message_count(broker, queue) == 1


async def test_consuming_and_publishing_resume_after_the_connection_is_cut(
        transports: Callable[..., Transport], proxy: FaultProxy, queue: str) -> None:
    """A lost broker connection is restored (robust): the consumer and publisher go on."""
    transport = transports(f"amqp://guest:guest@127.0.0.1:{proxy.port}/{OPTIONS}")
    async with consuming(transport, queue, prefetch=4) as got:
        await transport.publish(queue, b"before")
        await until(lambda: got == [b"before"])
        proxy.set_mode("reset")  # every connection dropped, as a broker restart does
        proxy.set_mode("pass")
        await transport.publish(queue, b"after")  # waits for the reconnect, then sends
        await until(lambda: b"after" in got)
        assert transport._consumed[queue] > 0  # type: ignore[attr-defined]  # still consumed


async def test_a_body_larger_than_a_frame_arrives_whole(
        transports: Callable[..., Transport], queue: str) -> None:
    """The transport's own publisher (amqp_wire_publish.py) cuts a body into frames of the size
    the broker tuned (128 KiB): 300 KB arrive as they left."""
    transport = transports()
    body = os.urandom(300_000)
    async with consuming(transport, queue, prefetch=1) as got:
        await transport.publish(queue, body)
        await until(lambda: got == [body])


async def test_the_publishing_connection_gives_up_a_broker_it_no_longer_hears(
        proxy: FaultProxy, broker: AbstractRobustConnection, queue: str) -> None:
    """The transport's own publishing connection heartbeats: with the broker's answers
    held back (its side still hears ours, so it keeps the connection), a waiting publish
    fails within two heartbeats instead of waiting for ever, and the next goes out on
    a new connection. The failed one reached the broker: sent again, it is there twice,
    at least once as the transport promises."""
    channel = await broker.channel()
    await channel.declare_queue(queue, durable=True)
    await channel.close()
    wire = WirePublisher(WireAddress(f"amqp://guest:guest@127.0.0.1:{proxy.port}/?heartbeat=1"),
                         connect_timeout=HANG_GUARD)
    try:
        await wire.publish(queue, b"one", Basic.Properties(delivery_mode=2))
        proxy.set_mode("hold-answers")
        with pytest.raises(ConnectionError, match="two heartbeats"):
            await asyncio.wait_for(wire.publish(queue, b"two", Basic.Properties(delivery_mode=2)),
                                   HANG_GUARD)
        proxy.set_mode("pass")
        await wire.publish(queue, b"three", Basic.Properties(delivery_mode=2))
        assert await message_count(broker, queue) == 3
    finally:
        await wire.close()


async def test_a_body_over_the_limit_is_refused_before_connecting() -> None:
    """The size check needs no broker: nothing is sent, the error names the limit."""
    transport = open_transport("amqp://guest:guest@127.0.0.1:1/", max_message_bytes=10)
    try:
        with pytest.raises(TransportError, match="11 bytes to q is over the limit of 10 bytes"):
            await transport.publish("q", b"x" * 11)
    finally:
        await transport.close()


async def test_an_unreachable_broker_is_a_transport_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Publishing to a port with no broker waits for it (R2: it may be restarting), then,
    after the publish's patience, fails with TransportError naming the cause, password
    hidden."""
    monkeypatch.setattr(amqp, "_PUBLISH_PATIENCE", 1.0)
    transport = open_transport("amqp://guest:secret@127.0.0.1:1/")
    try:
        with pytest.raises(TransportError, match=r"RabbitMQ at .* unreachable for 1s") as caught:
            await transport.publish("q", b"x")
        assert "Connect call failed" in str(caught.value)
        assert "secret" not in str(caught.value)
    finally:
        await transport.close()


def test_without_aio_pika_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """No aio-pika installed: MissingExtraError with the pip install line."""
    monkeypatch.setitem(sys.modules, "aio_pika", None)
    monkeypatch.delitem(sys.modules, "sasflow.transport.amqp", raising=False)
    with pytest.raises(MissingExtraError, match=r"pip install 'sasflow\[rabbitmq\]'"):
        open_transport("amqp://guest:guest@127.0.0.1:5672/")


@pytest.fixture
async def dead_letters(broker: AbstractRobustConnection) -> AsyncIterator[str]:
    """A dead-letter exchange and queue name private to this test, deleted at its end."""
    name = f"amqp-test.{uuid.uuid4().hex[:12]}.dead-letters"
    yield name
    channel = await broker.channel()
    await channel.queue_delete(name)
    await channel.exchange_delete(name)
    await channel.close()


async def test_the_broker_holds_a_failing_message_once_then_only_its_dead_letter(
        transports: Callable[..., Transport], queue: str, dead_letters: str,
        broker: AbstractRobustConnection) -> None:
    """Counted by the broker: while a failing message is retried its queue holds it once
    (republished, then the original acked; never a copy more), and once the bound is
    reached the queue is empty and the dead-letter queue holds one message carrying
    its queue, reason and count."""
    transport = transports(f"{URL}&max_deliveries=3&redelivery_backoff=0.05"
                           f"&dead_letters={dead_letters}")
    calls = 0

    async def failing(body: bytes) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("no such order")

    await transport.publish(queue, b"order-17")
    consumer = asyncio.create_task(transport.consume(queue, failing, prefetch=1))
    try:
        async with asyncio.timeout(HANG_GUARD):
            while not (letters := await transport.dead_letters()):
                assert await message_count(broker, queue) <= 1
                await asyncio.sleep(0.01)
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
    assert calls == 3
    assert [(d.queue, d.deliveries, d.reason, d.body) for d in letters] == [
        (queue, 3, "ValueError: no such order", b"order-17")]
    assert await message_count(broker, queue) == 0
    assert await message_count(broker, dead_letters) == 1  # a look left it in place


async def test_a_message_the_broker_redelivered_counts_one_delivery_more(
        transports: Callable[..., Transport], queue: str, dead_letters: str,
        broker: AbstractRobustConnection) -> None:
    """A consumer that died holding a message (its channel closed unacked) leaves it
    flagged redelivered: with a bound of 2, the first failure here is its second
    delivery, and it is a dead letter at once."""
    transport = transports(f"{URL}&max_deliveries=2&dead_letters={dead_letters}")
    await transport.publish(queue, b"held by the dead")
    channel = await broker.channel()
    held = await (await channel.get_queue(queue)).get(no_ack=False)
    assert held is not None and not held.redelivered
    await channel.close()  # dies holding it: the broker puts it back, flagged
    calls = 0

    async def failing(body: bytes) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("still broken")

    consumer = asyncio.create_task(transport.consume(queue, failing, prefetch=1))
    try:
        async with asyncio.timeout(HANG_GUARD):
            while not (letters := await transport.dead_letters()):
                await asyncio.sleep(0.01)
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
    assert calls == 1
    assert [(d.deliveries, d.body) for d in letters] == [(2, b"held by the dead")]


async def test_dead_letters_survive_the_transport_and_are_read_by_another(
        transports: Callable[..., Transport], queue: str, dead_letters: str) -> None:
    """The dead-letter queue is durable and the count travels in the message: a second
    transport (another process, an operator's `sasflow dead-letters`) reads the letter
    the first one wrote, in order, and can purge it."""
    url = f"{URL}&max_deliveries=1&dead_letters={dead_letters}"
    first = transports(url)

    async def failing(body: bytes) -> None:
        raise RuntimeError(f"cannot handle {body.decode()}")

    for n in range(3):
        await first.publish(queue, f"m{n}".encode())
    consumer = asyncio.create_task(first.consume(queue, failing, prefetch=1))
    try:
        async with asyncio.timeout(HANG_GUARD):
            while len(await first.dead_letters()) < 3:
                await asyncio.sleep(0.01)
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
    await first.close()
    second = transports(url)
    letters = await second.dead_letters(limit=2)
    assert [d.body for d in letters] == [b"m0", b"m1"]
    assert letters[1].reason == "RuntimeError: cannot handle m1"
    assert await second.dead_letter(letters[1].id) == letters[1]
    assert await second.purge_dead_letters() == 3

"""What one RabbitMQ message costs a process in each AMQP client, one at a time.

A single task's path over RabbitMQ is a chain of hops, each waited for before the
next: a step's request published and delivered, then its reply. So what a hop costs
is the CPU of one message taken alone, not of a batch. This puts the transport's
client beside another maintained one and beside the framing both could rest on:

  aiormq   what the transport used before its own connections: `basic_publish`
           on a confirming channel, `basic_consume` and `basic_ack`
  pika     pika's AsyncioConnection on the same loop, the same three verbs
           (extra ``bench``: ``pip install -e '.[bench]'``)
  lean     a protocol layer's floor (`Lean`): an asyncio.Protocol that frames
           with pamqp and answers from data_received, the least a layer of
           sasflow's own would do (no reconnection, heartbeats or flow control)
  wire     what the transport uses now (transport/amqp_wire*.py): its
           publisher's confirming connection and a consumer's connection, each
           delivery acked at the loop's next turn as the transport does
  pamqp    no I/O: the frames of a publish marshalled and those of a delivery
           unmarshalled by pamqp, the protocol library both aiormq and a client
           of sasflow's own would frame with

Two measures a way, per message, alternating the ways in each round:

  publish  a persistent, mandatory 200-byte message published (to a queue nobody
           consumes) and its confirm awaited, then the next
  hop      the same published to a queue this process consumes, delivered and
           acked, then the next: one hop of a task's path, both ends in one
           process

Each is timed as the process's CPU and as wall time, medians over --rounds, and
counted once as the Python and C function calls the process makes for it (a
profile hook), the loop's own included.

Usage: python bench/amqp_client_floor.py [--rounds 5] [--n 2000]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import urlsplit

import aio_pika
import common as C
from amqp_publish_cost import on_a_workers_loop
from distributed import AMQP_URL
from pamqp import body as pamqp_body
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.commands import Basic, Channel, Confirm, Connection, Queue

from sasflow.transport.amqp_wire import WireAddress, open_wire
from sasflow.transport.amqp_wire_consume import ConsumingWire
from sasflow.transport.amqp_wire_publish import PublishingWire

BODY = b"x" * 200
Op = Callable[[], Awaitable[object]]


class Aiormq:
    """The transport's way before: aiormq's verbs on aio-pika's underlying channels."""

    async def open(self, queues: tuple[str, str]) -> None:
        self.connection = await aio_pika.connect(AMQP_URL)
        publishing = await self.connection.channel(publisher_confirms=True)
        for queue in queues:
            await publishing.declare_queue(queue, durable=True)
        self.publisher = await publishing.get_underlay_channel()
        self.consumer = await (await self.connection.channel()).get_underlay_channel()
        self.queues = queues
        self.delivered: asyncio.Future[None] | None = None

        async def on_message(message: Any) -> None:
            await message.channel.basic_ack(message.delivery_tag)
            if self.delivered is not None:
                self.delivered.set_result(None)
        self.consuming = (await self.consumer.basic_consume(queues[1], on_message)).consumer_tag

    async def publish(self, queue: str) -> None:
        await self.publisher.basic_publish(BODY, exchange="", routing_key=queue,
                                           properties=Basic.Properties(delivery_mode=2),
                                           mandatory=True)

    async def close(self) -> None:
        await self.consumer.basic_cancel(self.consuming)
        for queue in self.queues:
            await self.publisher.queue_delete(queue)
        await self.connection.close()


class Pika:
    """pika's asyncio adapter, its callbacks turned into futures."""

    async def open(self, queues: tuple[str, str]) -> None:
        import pika
        from pika.adapters.asyncio_connection import AsyncioConnection

        self.pika, loop = pika, asyncio.get_running_loop()
        opened: asyncio.Future[Any] = loop.create_future()
        self.connection = AsyncioConnection(
            pika.URLParameters(AMQP_URL.rstrip("/") + "/%2F"), custom_ioloop=loop,
            on_open_callback=opened.set_result,
            on_open_error_callback=lambda _c, error: opened.set_exception(
                RuntimeError(str(error))))
        await opened
        self.publisher = await self._channel()
        self.confirms: collections.deque[asyncio.Future[None]] = collections.deque()
        await self._call(self.publisher.confirm_delivery, self._confirmed)
        for queue in queues:
            await self._call(self.publisher.queue_declare, queue, durable=True)
        self.consumer = await self._channel()
        self.queues = queues
        self.delivered: asyncio.Future[None] | None = None

        def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            channel.basic_ack(method.delivery_tag)
            if self.delivered is not None:
                self.delivered.set_result(None)
        self.consuming = self.consumer.basic_consume(queues[1], on_message)

    async def _channel(self) -> Any:
        opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.connection.channel(on_open_callback=opened.set_result)
        return await opened

    @staticmethod
    async def _call(verb: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        verb(*args, callback=done.set_result, **kwargs)
        return await done

    def _confirmed(self, frame: Any) -> None:
        # one at a time here: each confirm answers the oldest publish waiting
        self.confirms.popleft().set_result(None)

    async def publish(self, queue: str) -> None:
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.confirms.append(confirmed)
        self.publisher.basic_publish("", queue, BODY, mandatory=True,
                                     properties=self.pika.BasicProperties(delivery_mode=2))
        await confirmed

    async def close(self) -> None:
        await self._call(self.consumer.basic_cancel, self.consuming)
        for queue in self.queues:
            await self._call(self.publisher.queue_delete, queue)
        closed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.connection.add_on_close_callback(lambda *_: closed.set_result(None))
        self.connection.close()
        await closed


class Lean:
    """The floor of a protocol layer of one's own: an `asyncio.Protocol` that frames
    with pamqp, answers from `data_received`, and writes each publish as one write.

    Only what the two measures need: the handshake (PLAIN, no heartbeats), two
    channels, confirms, one consumer, acks. No reconnection, no flow control, no
    returns: a measuring stick for what such a layer would cost, not a client.
    """

    async def open(self, queues: tuple[str, str]) -> None:
        url = urlsplit(AMQP_URL)
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.replies: dict[int, collections.deque[asyncio.Future[Any]]] = (
            collections.defaultdict(collections.deque))
        self.confirms: dict[int, asyncio.Future[None]] = {}
        self.published = 0
        self.delivery: tuple[Any, int, list[bytes]] | None = None
        self.delivered: asyncio.Future[None] | None = None
        self.credentials = f"\0{url.username or 'guest'}\0{url.password or 'guest'}"
        self.transport, _ = await loop.create_connection(
            lambda: _LeanWire(self), url.hostname or "127.0.0.1", url.port or 5672)
        await self.opened
        await self.call(1, Channel.Open())
        await self.call(1, Confirm.Select())
        await self.call(2, Channel.Open())
        for queue in queues:
            await self.call(1, Queue.Declare(queue=queue, durable=True))
        self.queues = queues
        self.consuming = (await self.call(2, Basic.Consume(queue=queues[1]))).consumer_tag

    def call(self, channel: int, method: Any) -> asyncio.Future[Any]:
        """Send a synchronous method; its answer, in order (AMQP answers them in order)."""
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.replies[channel].append(answer)
        self.transport.write(pamqp_frame.marshal(method, channel))
        return answer

    async def publish(self, queue: str) -> None:
        self.published += 1
        confirmed = self.confirms[self.published] = asyncio.get_running_loop().create_future()
        self.transport.write(b"".join((
            pamqp_frame.marshal(Basic.Publish(exchange="", routing_key=queue, mandatory=True), 1),
            pamqp_frame.marshal(pamqp_header.ContentHeader(
                0, len(BODY), Basic.Properties(delivery_mode=2)), 1),
            pamqp_frame.marshal(pamqp_body.ContentBody(BODY), 1))))
        await confirmed

    def received(self, channel: int, frame: Any) -> None:
        if isinstance(frame, Basic.Deliver):
            self.delivery = (frame, 0, [])
        elif isinstance(frame, pamqp_header.ContentHeader) and self.delivery is not None:
            self.delivery = (self.delivery[0], frame.body_size, [])
            if frame.body_size == 0:
                self.delivered_whole(channel)
        elif isinstance(frame, pamqp_body.ContentBody) and self.delivery is not None:
            self.delivery[2].append(frame.value)
            if sum(map(len, self.delivery[2])) >= self.delivery[1]:
                self.delivered_whole(channel)
        elif isinstance(frame, Basic.Ack):  # a confirm, of one publish or all up to it
            tags = range(min(self.confirms), frame.delivery_tag + 1) if frame.multiple else (
                frame.delivery_tag,)
            for tag in tags:
                confirmed = self.confirms.pop(tag, None)
                if confirmed is not None:
                    confirmed.set_result(None)
        elif isinstance(frame, Connection.Start):
            self.transport.write(pamqp_frame.marshal(Connection.StartOk(
                client_properties={"product": "sasflow bench"}, response=self.credentials), 0))
        elif isinstance(frame, Connection.Tune):
            self.transport.write(pamqp_frame.marshal(Connection.TuneOk(
                channel_max=frame.channel_max, frame_max=frame.frame_max, heartbeat=0), 0))
            self.transport.write(pamqp_frame.marshal(Connection.Open(virtual_host="/"), 0))
        elif isinstance(frame, Connection.OpenOk):
            self.opened.set_result(None)
        elif isinstance(frame, Connection.Close | Channel.Close):
            raise RuntimeError(f"the broker closed channel {channel}: {frame.reply_text}")
        elif self.replies[channel]:
            self.replies[channel].popleft().set_result(frame)

    def delivered_whole(self, channel: int) -> None:
        assert self.delivery is not None
        tag = self.delivery[0].delivery_tag
        self.delivery = None
        self.transport.write(pamqp_frame.marshal(Basic.Ack(delivery_tag=tag), channel))
        if self.delivered is not None:
            self.delivered.set_result(None)

    async def close(self) -> None:
        await self.call(2, Basic.Cancel(consumer_tag=self.consuming))
        for queue in self.queues:
            await self.call(1, Queue.Delete(queue=queue))
        await self.call(0, Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                             method_id=0))
        self.transport.close()


class OwnWire:
    """The transport's way now: its own publishing and consuming connections."""

    async def open(self, queues: tuple[str, str]) -> None:
        address = WireAddress(AMQP_URL)
        self.publisher = await open_wire(address, lambda: PublishingWire(address), within=10)
        await self.publisher.call(Confirm.Select(), Confirm.SelectOk)
        for queue in queues:
            await self.publisher.call(Queue.Declare(queue=queue, durable=True), Queue.DeclareOk)
        self.consumer = await open_wire(
            address, lambda: ConsumingWire(address, self.on_delivery), within=10)
        await self.consumer.consume(queues[1], arguments={}, prefetch=64)
        self.queues = queues
        self.delivered: asyncio.Future[None] | None = None

    def on_delivery(self, wire: ConsumingWire, tag: int, _redelivered: bool,
                    _properties: Basic.Properties, _body: bytes) -> None:
        wire.ack(tag)
        if self.delivered is not None:
            self.delivered.set_result(None)

    async def publish(self, queue: str) -> None:
        await self.publisher.publish(queue, BODY, Basic.Properties(delivery_mode=2))

    async def close(self) -> None:
        self.consumer.stop()
        await self.consumer.close()
        for queue in self.queues:
            await self.publisher.call(Queue.Delete(queue=queue), Queue.DeleteOk)
        await self.publisher.close()


class _LeanWire(asyncio.Protocol):
    """`Lean`'s bytes: frames cut from the stream, each handed over as it completes."""

    def __init__(self, client: Lean) -> None:
        self.client = client
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transport writes, but is no asyncio.Transport to isinstance)
        cast(asyncio.WriteTransport, transport).write(
            pamqp_frame.marshal(pamqp_header.ProtocolHeader(), 0))

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        at = 0
        # a frame: type (1 byte), channel (2), size (4), payload, end marker (1)
        while len(buffer) - at >= 8:
            end = at + 8 + int.from_bytes(buffer[at + 3:at + 7])
            if len(buffer) < end:
                break
            _used, channel, frame = pamqp_frame.unmarshal(buffer[at:end])
            at = end
            self.client.received(channel, frame)
        self.buffer = buffer[at:]


def marshal_a_publish() -> bytes:
    return b"".join((
        pamqp_frame.marshal(Basic.Publish(exchange="", routing_key="q", mandatory=True), 1),
        pamqp_frame.marshal(pamqp_header.ContentHeader(
            0, len(BODY), Basic.Properties(delivery_mode=2)), 1),
        pamqp_frame.marshal(pamqp_body.ContentBody(BODY), 1)))


DELIVERY = b"".join((
    pamqp_frame.marshal(Basic.Deliver(consumer_tag="ctag1.0", delivery_tag=1, exchange="",
                                      routing_key="q"), 1),
    pamqp_frame.marshal(pamqp_header.ContentHeader(
        0, len(BODY), Basic.Properties(delivery_mode=2)), 1),
    pamqp_frame.marshal(pamqp_body.ContentBody(BODY), 1)))


def unmarshal_a_delivery() -> None:
    at = 0
    while at < len(DELIVERY):
        used, _channel, _frame = pamqp_frame.unmarshal(DELIVERY[at:])
        at += used


async def framed_publish() -> None:
    marshal_a_publish()
    pamqp_frame.unmarshal(pamqp_frame.marshal(Basic.Ack(delivery_tag=1), 1))  # its confirm


async def framed_hop() -> None:
    marshal_a_publish()
    pamqp_frame.unmarshal(pamqp_frame.marshal(Basic.Ack(delivery_tag=1), 1))
    unmarshal_a_delivery()
    pamqp_frame.marshal(Basic.Ack(delivery_tag=1), 1)  # the consumer's ack


CLIENTS: dict[str, type[Aiormq | Pika | Lean | OwnWire]] = {
    "aiormq": Aiormq, "pika": Pika, "lean": Lean, "wire": OwnWire}


def publish_of(client: Aiormq | Pika | Lean | OwnWire) -> Op:
    """Publish to the queue nobody consumes."""
    return lambda: client.publish(client.queues[0])


def hop_of(client: Aiormq | Pika | Lean | OwnWire) -> Op:
    """Publish to the consumed queue, and wait for the delivery (acked)."""
    async def hop() -> None:
        client.delivered = asyncio.get_running_loop().create_future()
        await client.publish(client.queues[1])
        await client.delivered
    return hop


async def timed(op: Op, n: int) -> tuple[float, float]:
    """CPU and wall µs an op, `n` ops one after another."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        await op()
    return ((time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6)


async def counted(op: Op, n: int) -> float:
    """Function calls an op, Python's and C's, the loop's own included."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1
    sys.setprofile(count)
    try:
        for _ in range(n):
            await op()
    finally:
        sys.setprofile(None)
    return calls / n


async def measure(rounds: int, n: int, ways: list[str]) -> dict[str, Any]:
    clients: dict[str, Aiormq | Pika | Lean | OwnWire] = {}
    ops: dict[str, dict[str, Op]] = {}
    for way in ways:
        if way == "pamqp":
            ops[way] = {"publish": framed_publish, "hop": framed_hop}
            continue
        client = clients[way] = CLIENTS[way]()
        name = f"bench-client-floor-{way}-{uuid.uuid4().hex[:8]}"
        await client.open((f"{name}-kept", f"{name}-consumed"))
        ops[way] = {"publish": publish_of(client), "hop": hop_of(client)}
    found: dict[str, dict[str, dict[str, list[float]]]] = {
        way: {m: {"cpu_us": [], "wall_us": []} for m in ("publish", "hop")} for way in ways}
    calls: dict[str, dict[str, float]] = {way: {} for way in ways}
    try:
        for way in ways:  # warm, then count once
            for measure_name, op in ops[way].items():
                await timed(op, 300)
                calls[way][measure_name] = round(await counted(op, 500), 1)
        for round_no in range(rounds):
            order = ways[round_no % len(ways):] + ways[:round_no % len(ways)]
            for way in order:
                for measure_name, op in ops[way].items():
                    cpu, wall = await timed(op, n)
                    found[way][measure_name]["cpu_us"].append(round(cpu, 1))
                    found[way][measure_name]["wall_us"].append(round(wall, 1))
    finally:
        for client in clients.values():
            await client.close()
    return {"medians": {way: {m: {k: round(statistics.median(v), 1) for k, v in kinds.items()}
                              | {"calls": calls[way][m]} for m, kinds in by.items()}
                        for way, by in found.items()},
            "runs": found}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000, help="ops a measurement")
    ap.add_argument("--ways", default="aiormq,pika,lean,wire,pamqp")
    a = ap.parse_args()
    found = on_a_workers_loop(measure(a.rounds, a.n, a.ways.split(",")))
    C.emit({"bench": "amqp_client_floor", "n": a.n, "rounds": a.rounds, **found})


if __name__ == "__main__":
    main()

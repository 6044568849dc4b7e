"""The CPU a RabbitMQ delivery costs the consuming process, three ways.

A queue is filled with --n persistent 200-byte messages first; then a consumer
(prefetch 64) takes them all, acking each, and the process's CPU time a message
is read:

  aio_pika   aio-pika's `Queue.consume`: a message object and a task of its own a
             delivery, on top of aiormq's (how the transport consumed before);
  aiormq     aiormq's `basic_consume` on aio-pika's underlying channel;
  sasflow    `AmqpTransport.consume` with a handler that does nothing: the
             transport on the path (PYTHONPATH=OTHER/src for another tree).

The ways alternate within each round, each on a queue of its own; medians over
--rounds.

Usage: python bench/amqp_consume_cost.py [--rounds 4] [--n 5000]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import aio_pika
import common as C
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from aiormq.abc import DeliveredMessage
from amqp_publish_cost import cpu_a_message, on_a_workers_loop
from distributed import AMQP_URL

from sasflow.transport.amqp import AmqpTransport

BODY = b"x" * 200
PREFETCH = 64


async def _fill(connection: AbstractRobustConnection, queue: str, n: int) -> None:
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(queue, durable=True)
    await asyncio.gather(*(channel.default_exchange.publish(
        aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key=queue) for _ in range(n)))
    await channel.close()


async def _one(connection: AbstractRobustConnection, transport: AmqpTransport, way: str,
               n: int) -> float:
    """The CPU µs a message for `way` to take `n` messages off a queue of its own."""
    queue = f"bench-consume-cost-{uuid.uuid4().hex[:8]}"
    await _fill(connection, queue, n)
    taken = 0
    all_taken = asyncio.Event()

    def count() -> None:
        nonlocal taken
        taken += 1
        if taken == n:
            all_taken.set()

    channel = await connection.channel()
    await channel.set_qos(prefetch_count=PREFETCH)
    declared = await channel.declare_queue(queue, durable=True)
    started = time.process_time()
    consumer: asyncio.Task[None] | None = None
    if way == "aio_pika":
        async def on_message(message: AbstractIncomingMessage) -> None:
            await message.ack()
            count()
        await declared.consume(on_message)
    elif way == "aiormq":
        underlay = await channel.get_underlay_channel()

        async def on_delivery(message: DeliveredMessage) -> None:
            assert message.delivery_tag is not None
            await underlay.basic_ack(message.delivery_tag)
            count()
        await underlay.basic_consume(queue, on_delivery, no_ack=False)
    else:
        async def handle(body: bytes) -> None:
            count()
        consumer = asyncio.create_task(transport.consume(queue, handle, prefetch=PREFETCH))
    await all_taken.wait()
    spent = (time.process_time() - started) / n * 1e6
    if consumer is not None:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
    await declared.delete(if_unused=False, if_empty=False)
    await channel.close()
    return spent


async def measure(rounds: int, n: int) -> dict[str, list[float]]:
    connection = await aio_pika.connect_robust(AMQP_URL)
    transport = AmqpTransport(AMQP_URL)
    found: dict[str, list[float]] = {"aio_pika": [], "aiormq": [], "sasflow": []}
    try:
        for _ in range(rounds):
            for way in found:
                found[way].append(await _one(connection, transport, way, n))
    finally:
        await transport.close()
        await connection.close()
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--n", type=int, default=5000)
    a = ap.parse_args()
    found = on_a_workers_loop(measure(a.rounds, a.n))
    C.emit({"bench": "amqp_consume_cost", "n": a.n, "prefetch": PREFETCH,
            **cpu_a_message(found)})


if __name__ == "__main__":
    main()

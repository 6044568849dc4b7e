"""The CPU a confirmed RabbitMQ publish costs the publishing process, three ways.

A relay publishing an application's statuses (worker.py), and a scheduler or an
agent publishing what it cannot bundle, pay this for every message:

  aio_pika   an `aio_pika.Message` published through the channel's default
             exchange (how the transport published before);
  aiormq     aiormq's `basic_publish` on aio-pika's underlying channel, with
             the message's properties built directly;
  sasflow    `AmqpTransport.publish` to a status queue: the transport on the
             path (PYTHONPATH=OTHER/src for another tree).

Each way publishes --batch persistent 200-byte messages at once (`gather`), as the
relay does, and waits for their confirms; --batches batches a round; the process's
CPU time a message. The ways alternate within each round; medians over --rounds.

Usage: python bench/amqp_publish_cost.py [--rounds 5] [--batches 20] [--batch 256]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import aio_pika
import common as C
from distributed import AMQP_URL
from pamqp.commands import Basic

from sasflow.event_loops import new_event_loop
from sasflow.transport.amqp import AmqpTransport

BODY = b"x" * 200
T = TypeVar("T")


async def measure(rounds: int, batches: int, batch: int) -> dict[str, list[float]]:
    queue = f"bench-publish-cost-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(AMQP_URL)
    channel = await connection.channel(publisher_confirms=True)
    declared = await channel.declare_queue(queue, durable=True)
    underlay = await channel.get_underlay_channel()
    transport = AmqpTransport(AMQP_URL)
    ways: dict[str, Callable[[], Awaitable[object]]] = {
        "aio_pika": lambda: channel.default_exchange.publish(
            aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=queue, mandatory=True),
        "aiormq": lambda: underlay.basic_publish(
            BODY, exchange="", routing_key=queue,
            properties=Basic.Properties(delivery_mode=2), mandatory=True),
        "sasflow": lambda: transport.publish(queue, BODY),
    }
    found: dict[str, list[float]] = {name: [] for name in ways}
    try:
        await transport.publish(queue, b"warm-up")  # its connection and declaration
        for _ in range(rounds):
            for name, publish in ways.items():
                started = time.process_time()
                for _ in range(batches):
                    await asyncio.gather(*(publish() for _ in range(batch)))
                found[name].append((time.process_time() - started) / (batches * batch) * 1e6)
            await declared.purge()
    finally:
        await declared.delete(if_unused=False, if_empty=False)
        await transport.close()
        await connection.close()
    return found


def on_a_workers_loop(measured: Coroutine[Any, Any, T]) -> T:
    """Run `measured` on the loop a worker runs on (uvloop's where installed)."""
    loop = new_event_loop()
    try:
        return loop.run_until_complete(measured)
    finally:
        loop.close()


def cpu_a_message(found: dict[str, list[float]]) -> dict[str, Any]:
    """Each way's median over the rounds, and the rounds."""
    return {"cpu_us_a_message": {way: round(statistics.median(v), 1) for way, v in found.items()},
            "rounds_us": {way: [round(x, 1) for x in v] for way, v in found.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    found = on_a_workers_loop(measure(a.rounds, a.batches, a.batch))
    C.emit({"bench": "amqp_publish_cost", "batch": a.batch, "batches": a.batches,
            **cpu_a_message(found)})


if __name__ == "__main__":
    main()

"""The floor of one RabbitMQ hop with aio-pika, the client library the transport uses.

One connection, a publishing channel and a consuming one, a durable queue; one
300-byte message at a time: the time from `publish` to the consumer's callback
(the hop a step's request or reply makes), and to the publisher's confirm. Four
ways: persistent or transient message, with or without publisher confirms.
sasflow's transport sends persistent messages with confirms (transport/amqp.py),
so its hops (task_path.py) are compared with that row.

Usage: python bench/amqp_hop.py [--n 300]
Prints one JSON line (ms, medians, the first 20 messages dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import aio_pika
import common as C
from distributed import AMQP_URL

DROPPED = 20


async def hop(n: int, persistent: bool, confirms: bool) -> dict[str, float]:
    mode = aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
    connection = await aio_pika.connect(AMQP_URL)
    try:
        publisher = await connection.channel(publisher_confirms=confirms)
        consumer = await connection.channel(publisher_confirms=False)
        queue = await consumer.declare_queue(f"bench.hop.{uuid.uuid4().hex}", durable=True)
        delivered: asyncio.Queue[float] = asyncio.Queue()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            delivered.put_nowait(time.perf_counter())
            await message.ack()

        tag = await queue.consume(on_message)
        hops, confirmed = [], []
        for _ in range(n + DROPPED):
            t0 = time.perf_counter()
            publishing = asyncio.ensure_future(publisher.default_exchange.publish(
                aio_pika.Message(b"x" * 300, delivery_mode=mode), routing_key=queue.name))
            hops.append(await delivered.get() - t0)
            await publishing
            confirmed.append(time.perf_counter() - t0)
        await queue.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()
    return {"delivered_ms": round(statistics.median(hops[DROPPED:]) * 1000, 3),
            "confirmed_ms": round(statistics.median(confirmed[DROPPED:]) * 1000, 3)}


async def measure(n: int) -> dict[str, Any]:
    return {f"{'persistent' if p else 'transient'}_{'confirms' if c else 'no_confirms'}":
            await hop(n, p, c) for p in (True, False) for c in (True, False)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    a = ap.parse_args()
    C.emit({"bench": "amqp_hop", "n": a.n, "hops": asyncio.run(measure(a.n))})


if __name__ == "__main__":
    main()

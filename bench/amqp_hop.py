"""The floor of one RabbitMQ hop with aio-pika, the client library the transport uses.

One connection, a publishing channel and a consuming one, a durable queue; one
300-byte message at a time: the time from `publish` to the consumer's callback
(the hop a step's request or reply makes), and to the publisher's confirm. Four
ways: persistent or transient message, with or without publisher confirms.
sasflow's transport sends persistent messages with confirms (transport/amqp.py),
so its hops (task_path.py) are compared with that row.

With --round-trip, a step's two hops instead, as a scheduler and an agent make
them: a request published to a queue that another process (on uvloop, as
`sasflow worker`) consumes, answering each with a reply it publishes before it
acks the request; the time from the request's publish to the reply's delivery,
the same four ways. That is the floor of task_path.py --agents-elsewhere's
round trip.

Usage: python bench/amqp_hop.py [--n 300] [--round-trip]
Prints one JSON line (ms, medians, the first 20 messages dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
import uuid
from typing import Any

import aio_pika
import common as C
from distributed import AMQP_URL

DROPPED = 20


async def hop(n: int, persistent: bool, confirms: bool) -> dict[str, float]:
    mode = _mode(persistent)
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


def _mode(persistent: bool) -> aio_pika.DeliveryMode:
    return aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT


async def _echo(requests: str, replies: str, persistent: bool, confirms: bool,
                ready: Any) -> None:
    """The agent's side: each request answered by a reply, then acked."""
    connection = await aio_pika.connect(AMQP_URL)
    publisher = await connection.channel(publisher_confirms=confirms)
    consumer = await connection.channel(publisher_confirms=False)
    await consumer.set_qos(prefetch_count=64)
    queue = await consumer.declare_queue(requests, durable=True)
    await publisher.declare_queue(replies, durable=True)

    async def on_request(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        await publisher.default_exchange.publish(
            aio_pika.Message(message.body, delivery_mode=_mode(persistent)), routing_key=replies)
        await message.ack()

    await queue.consume(on_request)
    ready.set()
    await asyncio.Future()


def _echo_process(*args: Any) -> None:
    import uvloop

    uvloop.run(_echo(*args))


async def round_trip(n: int, persistent: bool, confirms: bool) -> dict[str, float]:
    tag = uuid.uuid4().hex
    requests, replies = f"bench.rt.req.{tag}", f"bench.rt.rep.{tag}"
    ready = multiprocessing.Event()
    agent = multiprocessing.Process(target=_echo_process,
                                    args=(requests, replies, persistent, confirms, ready))
    agent.start()
    connection = await aio_pika.connect(AMQP_URL)
    try:
        publisher = await connection.channel(publisher_confirms=confirms)
        consumer = await connection.channel(publisher_confirms=False)
        await consumer.set_qos(prefetch_count=64)
        request_queue = await publisher.declare_queue(requests, durable=True)
        reply_queue = await consumer.declare_queue(replies, durable=True)
        delivered: asyncio.Queue[float] = asyncio.Queue()

        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            delivered.put_nowait(time.perf_counter())
            await message.ack()

        await reply_queue.consume(on_reply)
        await asyncio.get_running_loop().run_in_executor(None, ready.wait)
        trips = []
        for _ in range(n + DROPPED):
            t0 = time.perf_counter()
            await publisher.default_exchange.publish(
                aio_pika.Message(b"x" * 300, delivery_mode=_mode(persistent)),
                routing_key=requests)
            trips.append(await delivered.get() - t0)
        agent.terminate()
        agent.join()
        for queue in (request_queue, reply_queue):
            await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()
    return {"round_trip_ms": round(statistics.median(trips[DROPPED:]) * 1000, 3)}


async def measure(n: int, trips: bool) -> dict[str, Any]:
    how = round_trip if trips else hop
    return {f"{'persistent' if p else 'transient'}_{'confirms' if c else 'no_confirms'}":
            await how(n, p, c) for p in (True, False) for c in (True, False)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--round-trip", action="store_true",
                    help="a request and its reply, the reply from another process")
    a = ap.parse_args()
    if a.round_trip:
        import uvloop  # as sasflow's own loops run (event_loops.py)

        C.emit({"bench": "amqp_hop", "n": a.n,
                "round_trips": uvloop.run(measure(a.n, trips=True))})
        return
    C.emit({"bench": "amqp_hop", "n": a.n, "hops": asyncio.run(measure(a.n, trips=False))})


if __name__ == "__main__":
    main()

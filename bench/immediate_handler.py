"""The in-process transport's cost of one reply: handled as a task, or called in place.

N bodies published to a reply queue (a yield to the loop every 64, as replies
arrive in bursts), consumed by a handler that only counts them: an awaited one
(a task a message, the slot taken and given back) and an `ImmediateHandler`
(called in the consumer's own task). The CPU a message, on the loop sasflow runs
on (uvloop where installed); rounds alternate the two.

Usage: python bench/immediate_handler.py [--n 100000] [--rounds 3]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import common as C

from sasflow.event_loops import new_event_loop
from sasflow.transport.base import Handler, ImmediateHandler, reply_queue
from sasflow.transport.memory import MemoryTransport

BURST = 64


async def cost(n: int, immediate: bool) -> float:
    transport, queue = MemoryTransport(), reply_queue("bench")
    done = asyncio.get_running_loop().create_future()
    got = 0

    def now(body: bytes) -> None:
        nonlocal got
        got += 1
        if got == n:
            done.set_result(None)

    async def awaited(body: bytes) -> None:
        now(body)

    handler: Handler = ImmediateHandler(now) if immediate else awaited
    consumer = asyncio.create_task(transport.consume(queue, handler, prefetch=1024))
    await asyncio.sleep(0)
    cpu0 = time.process_time()
    for i in range(n):
        await transport.publish(queue, b"reply")
        if i % BURST == BURST - 1:
            await asyncio.sleep(0)
    await done
    cpu = time.process_time() - cpu0
    consumer.cancel()
    return cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    runs: dict[str, list[float]] = {"awaited": [], "immediate": []}
    for _ in range(a.rounds):
        for kind in runs:
            loop = new_event_loop()
            try:
                runs[kind].append(round(loop.run_until_complete(
                    cost(a.n, kind == "immediate")), 2))
            finally:
                loop.close()
    C.emit({"bench": "immediate_handler", "n": a.n, "us_per_message": runs,
            "medians": {kind: statistics.median(v) for kind, v in runs.items()}})


if __name__ == "__main__":
    main()

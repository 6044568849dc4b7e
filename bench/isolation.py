"""What isolation="process" costs a sync agent call, against a thread.

A no-op agent function, called one call at a time: in the agent runtime's
thread pool, in a warm worker process (`--calls` calls each, default 2,000),
and the first call of a new pool with no process started (cold) and with its
spare process already started (warm). Prints one JSON line:
``{"isolation": {thread_median_us, process_median_us, process_p99_us,
first_call_cold_ms, first_call_spare_ms, calls}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sasflow.agent import AgentRequest
from sasflow.isolation import FunctionRef, ProcessPool
from sasflow.messages import Request
from sasflow.model import Phase, idempotency_key


def noop(req: AgentRequest) -> int:
    return os.getpid()


def request() -> Request:
    return Request(task_id="t1", step="s", phase=Phase.DO, agent="bench", epoch=1,
                   input={"order_id": 42}, results={}, idempotency_key=idempotency_key("t1", "s"),
                   complete_by=time.time() + 3600, reply_to="sasflow.reply.bench")


async def first_call(ref: FunctionRef, *, spare: bool) -> float:
    pool = ProcessPool("bench", 1, preload=[ref])
    if spare:
        pool.warm()
        await asyncio.sleep(3)  # time for the spare to start: not part of the call
    started = time.perf_counter()
    await pool.call(ref, request(), 1)
    elapsed = time.perf_counter() - started
    await pool.close()
    return elapsed


async def measure(calls: int) -> dict[str, Any]:
    ref = FunctionRef.of(noop, agent="bench")
    loop = asyncio.get_running_loop()
    threads = ThreadPoolExecutor(max_workers=64)
    req = AgentRequest(request(), 1)
    in_thread = []
    for _ in range(calls):
        started = time.perf_counter()
        await loop.run_in_executor(threads, noop, req)
        in_thread.append(time.perf_counter() - started)
    threads.shutdown()
    pool = ProcessPool("bench", 1, preload=[ref])
    await pool.call(ref, request(), 1)  # the process starts here
    in_process = []
    for _ in range(calls):
        started = time.perf_counter()
        await pool.call(ref, request(), 1)
        in_process.append(time.perf_counter() - started)
    await pool.close()
    in_process.sort()
    return {"thread_median_us": round(statistics.median(in_thread) * 1e6),
            "process_median_us": round(statistics.median(in_process) * 1e6),
            "process_p99_us": round(in_process[int(0.99 * len(in_process))] * 1e6),
            "first_call_cold_ms": round(await first_call(ref, spare=False) * 1e3, 1),
            "first_call_spare_ms": round(await first_call(ref, spare=True) * 1e3, 1),
            "calls": calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    print(json.dumps({"isolation": asyncio.run(measure(args.calls))}))


if __name__ == "__main__":
    main()

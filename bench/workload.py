"""The benchmark workload, the same as the peers' (../shared/bench/peers):

workflow ``wf3`` = 3 sequential steps, each a no-op async agent returning a small
dict, or (the "10 ms remote call" variant) sleeping 10 ms with asyncio.sleep
first. What a step does is read from the task's input, as the peers pass it as
arguments::

    {"sleep": 0.01}                       every step sleeps 10 ms
    {"step2_sleep": 2.0,                  step 2 sleeps 2 s (crash test)
     "effects": PATH, "starts": PATH}     each step appends "task_id step_no" to
                                          `starts` when it begins, to `effects`
                                          when it finishes

Also the worker process of the crash test:
``python bench/workload.py --store URL --ready FILE`` runs all roles (scheduler,
agents, supervisor) with `App.arun` until SIGTERM, and writes FILE once it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from typing import Any

from common import append_line

from sasflow import AgentRequest, App, Step, TaskState

WORKFLOW = "wf3"
AGENT = "bench-step"
STEP_NAMES = ("step1", "step2", "step3")


def time_one_by_one(app: App, n: int, warm_up: int = 5) -> tuple[list[float], int]:
    """Submit `warm_up + n` single wf3 tasks one at a time, each awaited: the seconds of
    the last `n` (submit -> terminal state seen by the client), and how many did not
    end processed."""
    samples: list[float] = []
    failed = 0
    for i in range(warm_up + n):
        t0 = time.perf_counter()
        task = app.wait(app.submit(WORKFLOW, None), timeout=30)
        took = time.perf_counter() - t0
        failed += task.state is not TaskState.PROCESSED
        if i >= warm_up:
            samples.append(took)
    return samples, failed


def make_app(store: str | None, *, step_timeout: float = 10.0, agent: str = AGENT,
             transport: str | None = None) -> App:
    """An App with the agent and workflow `wf3`, over the store at `store`.

    `agent` names the agent (and so its queue on a broker transport: the
    distributed benchmarks give each measurement a private one); `transport` is
    the App's transport URL (None: in-process)."""
    app = App(store=store, transport=transport)

    # One agent serves the three steps, as the peers use one step function. Its
    # prefetch is left high so the scheduler's concurrency is the only limit.
    @app.agent(agent, concurrency=4096)
    async def run_step(req: AgentRequest) -> dict[str, Any]:
        options = req.input or {}
        number = STEP_NAMES.index(req.step) + 1
        line = f"{req.task_id} {number}\n"
        append_line(options.get("starts"), line)
        pause = options.get("step2_sleep", 0.0) if number == 2 else 0.0
        pause = pause or options.get("sleep", 0.0)
        if pause:
            await asyncio.sleep(pause)
        append_line(options.get("effects"), line)
        return {"task": req.task_id, "step": number, "ok": True}

    app.workflow(WORKFLOW, [Step(name, agent, timeout=step_timeout)
                            for name in STEP_NAMES])
    return app


def announce(path: str) -> None:
    """Write this process's PID to `path`, atomically (the parent polls for it)."""
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


async def serve(args: argparse.Namespace) -> None:
    """Run every role until SIGTERM/SIGINT or --max-s; announce readiness in a file."""
    app = make_app(args.store, step_timeout=args.step_timeout)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    roles = asyncio.create_task(app.arun(
        concurrency=args.concurrency, supervisor_interval=args.supervisor_interval,
        instance_id=args.instance_id or None, heartbeat=args.heartbeat,
        heartbeat_lease=args.heartbeat_lease))
    # ready once a task went through this store (whichever worker ran it)
    warm = await app.asubmit(WORKFLOW, None, task_id=f"warm-{os.getpid()}")
    await app.await_(warm, timeout=60)
    await asyncio.to_thread(announce, args.ready)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(args.max_s):
            await stop.wait()
    roles.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await roles
    await asyncio.to_thread(app.close)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store", required=True)
    ap.add_argument("--ready", required=True, help="file written once the roles run")
    ap.add_argument("--instance-id", default="")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--supervisor-interval", type=float, default=0.5)
    ap.add_argument("--step-timeout", type=float, default=3.0)
    ap.add_argument("--heartbeat", type=float, default=2.0)
    ap.add_argument("--heartbeat-lease", type=float, default=None)
    ap.add_argument("--max-s", type=float, default=170.0, help="exit after this long anyway")
    started = time.monotonic()
    asyncio.run(serve(ap.parse_args()))
    print(f"worker {os.getpid()} stopped after {time.monotonic() - started:.1f}s",
          file=sys.stderr)


if __name__ == "__main__":
    main()

"""What the roles' loop runs a completed step, counted rather than timed.

On a noisy 2-core machine a change worth a few percent of a step's CPU is lost in
the spread of any timed row (roles_cpu.py's runs of one tree differ by 10-20%).
Counts do not move from run to run: this one counts, on the roles' loop alone,
the Python and C function calls (a profile hook) and the asyncio tasks made (a
task factory) while the roles run N wf3 no-op tasks submitted first, in-process
on SQLite, and divides by the 3 N completed steps. With ``--src`` (checkouts, comma-separated;
an empty one is this one) each tree is counted in a child of its own, so a change's count
can be put beside the commit before it.

With ``--modes`` the same count is made with metrics on, with tracing (an SDK
provider whose sampler keeps ``--sample`` of the tasks, its spans dropped), or
both: what the instrumentation adds to a step, in calls.

Usage: python bench/loop_calls_per_step.py [--n 2000] [--src ,DIR]
           [--modes off,metrics,tracing,both] [--sample 0.01]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from typing import Any

import common as C

STUCK_S = 300.0


def count(n: int, mode: str, sample: float) -> dict[str, float]:
    from workload import WORKFLOW, make_app

    if mode in ("tracing", "both"):
        from observability import _trace_into_nothing

        _trace_into_nothing(sample)  # before the roles start: each looks for one then

    path = os.path.join(C.scratch_dir("loop-calls"), f"s{os.getpid()}.db")
    C.remove_db(path)
    app = make_app(C.store_url(path))
    try:
        ids = [app.submit(WORKFLOW, None) for _ in range(n)]  # nothing runs yet
        counted = {"calls": 0, "tasks": 0}

        def calls(frame: Any, event: str, arg: Any) -> None:
            if event in ("call", "c_call"):
                counted["calls"] += 1

        def tasks(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
            counted["tasks"] += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        app.start(concurrency=1024, metrics=mode in ("metrics", "both"))
        loop = app._loop.loop
        started, stopped = threading.Event(), threading.Event()

        def start_counting() -> None:
            loop.set_task_factory(tasks)
            sys.setprofile(calls)  # this thread's: the roles' loop only
            started.set()

        def stop_counting() -> None:
            sys.setprofile(None)
            loop.set_task_factory(None)
            stopped.set()

        loop.call_soon_threadsafe(start_counting)
        started.wait()
        t0 = time.perf_counter()
        for task_id in ids:
            app.wait(task_id, timeout=STUCK_S)
        loop.call_soon_threadsafe(stop_counting)
        stopped.wait()
        elapsed = time.perf_counter() - t0
    finally:
        app.stop()
        C.remove_db(path)
    steps = 3 * n
    return {"calls_per_step": round(counted["calls"] / steps, 1),
            "tasks_per_step": round(counted["tasks"] / steps, 2),
            "elapsed_s": round(elapsed, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--src", default="", help="checkouts, comma-separated (empty: this one)")
    ap.add_argument("--modes", default="off",
                    help="comma-separated: off, metrics (app.start(metrics=True)), tracing (an"
                         " SDK provider, spans dropped), both")
    ap.add_argument("--sample", type=float, default=0.01,
                    help="the share of tasks traced (a ratio sampler below 1)")
    ap.add_argument("--mode", default="off", help=argparse.SUPPRESS)
    ap.add_argument("--role", default="main", choices=["main", "one"])
    a = ap.parse_args()
    if a.role == "one":
        C.emit(count(a.n, a.mode, a.sample))
        return
    results = {f"{src or 'this'} {mode}": C.run_child(
        "loop_calls_per_step.py", ["--role", "one", "--n", str(a.n), "--mode", mode,
                                   "--sample", str(a.sample)], STUCK_S, src=src or None)
        for src in a.src.split(",") for mode in a.modes.split(",")}
    C.emit({"bench": "loop_calls_per_step", "n": a.n, "sample": a.sample, "runs": results})


if __name__ == "__main__":
    main()

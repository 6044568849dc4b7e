"""Throughput: N wf3 tasks, all roles in-process, on a fresh SQLite file.

For each durability (synchronous NORMAL, FULL), submission style and variant
(no-op steps, 10 ms steps), a child process starts the roles with
`app.start(concurrency=C)` (a background thread), runs a short warm-up, then
times submit-all + await-all:

  sequential  one `app.submit` after another (as the peers submit), then
              `app.wait` on each in order;
  concurrent  an asyncio client keeping up to 256 `asubmit` in flight (a web
              app under load), then `await app.await_` on each in order;
  presubmitted  all N submitted first with no roles running, then the roles are
              started and timed until all N are done: what the roles alone can
              do, with no client competing for the interpreter.

wf/s = N / elapsed; steps/s = 3 x wf/s (each task completes 3 steps).
Keys: tp_noop / tp_sleep10ms are the peers' protocol (sequential, NORMAL);
tp_concurrent_*, tp_presubmitted_*, tp_full_* (and tp_full_concurrent_*, ...) are
the other settings.

Usage: python bench/throughput.py [--n 5000] [--concurrency 256]
                                  [--syncs normal,full] [--styles sequential,concurrent]
       python bench/throughput.py --concurrency 64,256,1024 --syncs normal --variants noop
                                  (compare scheduler concurrencies)
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import common as C
from workload import WORKFLOW, make_app

from sasflow import TaskState

DEFAULT_CONCURRENCY = 1024  # best of 64/256/1024 (bench/README.md)
CLIENT_IN_FLIGHT = 256
WARM_UP = 20
STUCK_S = 60.0  # tasks finish roughly in submission order: one this late is stuck
VARIANTS = {"noop": 0.0, "sleep10ms": 0.01}


def key_for(sync: str, style: str, variant: str) -> str:
    return "tp" + ("_full" if sync == "full" else "") + (
        f"_{style}" if style != "sequential" else "") + f"_{variant}"


# ---------------------------------------------------------------- one measurement
def measure(a: argparse.Namespace, **start: Any) -> dict[str, Any]:
    """One row; `start` adds options to `app.start` (observability.py: metrics=True)."""
    path = os.path.join(C.scratch_dir("throughput"), f"tp-{os.getpid()}.db")
    C.remove_db(path)
    app = make_app(C.store_url(path, a.sync))
    task_input = {"sleep": a.sleep} if a.sleep else None
    if a.style == "presubmitted":
        return _presubmitted(a, app, path, task_input, start)
    app.start(concurrency=a.concurrency, **start)
    try:
        for _ in range(WARM_UP):  # the writer thread, reader connections, agent queues
            app.wait(app.submit(WORKFLOW, task_input), timeout=STUCK_S)
        t0, c0 = time.perf_counter(), time.process_time()
        with C.Collections() as collections:
            if a.style == "sequential":
                ids = [app.submit(WORKFLOW, task_input) for _ in range(a.n)]
                t_sub = time.perf_counter() - t0
                tasks = [app.wait(i, timeout=STUCK_S) for i in ids]
            else:
                t_sub, tasks = asyncio.run(_concurrent(app, a.n, task_input, t0))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    except Exception as error:
        # the roles may be wedged, and app.stop() with them: report and leave at once
        C.emit({"error": repr(error), "submission": a.style, "sleep_s": a.sleep,
                "durability": C.DURABILITY[a.sync], "concurrency": a.concurrency})
        C.remove_db(path)
        os._exit(1)
    app.stop()
    C.remove_db(path)
    not_done = sum(1 for t in tasks if t.state is not TaskState.PROCESSED)
    return {"n": a.n, "sleep_s": a.sleep, "submission": a.style,
            "durability": C.DURABILITY[a.sync], "concurrency": a.concurrency,
            "elapsed_s": round(elapsed, 3), "submit_s": round(t_sub, 3),
            "wf_per_s": round(a.n / elapsed, 1), "steps_per_s": round(3 * a.n / elapsed, 1),
            "cpu_us_per_step": _per_step(cpu, a.n), "not_processed": not_done,
            "collections": collections.summary()}


def _presubmitted(a: argparse.Namespace, app: Any, path: str, task_input: Any,
                  start: dict[str, Any]) -> dict[str, Any]:
    async def submit_all() -> list[str]:
        return [await app.asubmit(WORKFLOW, task_input) for _ in range(a.n)]

    async def wait_all() -> list[Any]:  # in the roles' own loop: no client thread at all
        return [await app.await_(i, timeout=STUCK_S) for i in ids]

    ids = app._loop.run(submit_all())  # no roles running yet: nothing is claimed
    t0, c0 = time.perf_counter(), time.process_time()
    with C.Collections() as collections:
        app.start(concurrency=a.concurrency, **start)
        tasks = app._loop.run(wait_all())
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    app.stop()
    C.remove_db(path)
    not_done = sum(1 for t in tasks if t.state is not TaskState.PROCESSED)
    return {"n": a.n, "sleep_s": a.sleep, "submission": a.style,
            "durability": C.DURABILITY[a.sync], "concurrency": a.concurrency,
            "elapsed_s": round(elapsed, 3), "submit_s": 0.0,
            "wf_per_s": round(a.n / elapsed, 1), "steps_per_s": round(3 * a.n / elapsed, 1),
            "cpu_us_per_step": _per_step(cpu, a.n), "not_processed": not_done,
            "collections": collections.summary()}


def _per_step(cpu_s: float, n: int) -> float:
    """The process's CPU time (all its threads: client, roles, SQLite) per completed
    step: what the rate costs, apart from the waits it also counts."""
    return round(cpu_s / (3 * n) * 1e6, 1)


async def _concurrent(app: Any, n: int, task_input: Any, t0: float
                      ) -> tuple[float, list[Any]]:
    async def one() -> str:
        task_id: str = await app.asubmit(WORKFLOW, task_input)
        return task_id

    ids = await C.in_flight(n, CLIENT_IN_FLIGHT, one)
    t_sub = time.perf_counter() - t0
    return t_sub, [await app.await_(i, timeout=STUCK_S) for i in ids]


# ---------------------------------------------------------------- orchestration
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="main", choices=["main", "one"])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--concurrency", default=str(DEFAULT_CONCURRENCY),
                    help="scheduler concurrency; a comma list compares several")
    ap.add_argument("--syncs", default="normal,full")
    ap.add_argument("--styles", default="sequential,concurrent,presubmitted")
    ap.add_argument("--variants", default="noop,sleep10ms")
    ap.add_argument("--budget-s", type=float, default=600.0, help="bound for the whole run")
    ap.add_argument("--child-timeout-s", type=float, default=180.0,
                    help="bound for one measurement")
    # one measurement (child process)
    ap.add_argument("--sync", default="normal", choices=sorted(C.DURABILITY))
    ap.add_argument("--style", default="sequential",
                    choices=["sequential", "concurrent", "presubmitted"])
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()
    if a.role == "one":
        a.concurrency = int(a.concurrency)
        C.emit(measure(a))
        return

    deadline = C.Deadline(a.budget_s)
    concurrencies = [int(c) for c in a.concurrency.split(",")]
    out: dict[str, Any] = {"peer": "sasflow", "backend": "sqlite", "bench": "throughput",
                           "n": a.n, "durability": C.DURABILITY["normal"],
                           "settings": {"concurrency": concurrencies[0],
                                        "client_in_flight": CLIENT_IN_FLIGHT,
                                        "roles": "in-process, app.start() background thread",
                                        "warm_up": WARM_UP}}
    runs: dict[str, Any] = {}
    for concurrency in concurrencies:
        for sync in a.syncs.split(","):
            for style in a.styles.split(","):
                for variant in a.variants.split(","):
                    args = ["--role", "one", "--n", str(a.n), "--concurrency", str(concurrency),
                            "--sync", sync, "--style", style, "--sleep",
                            str(VARIANTS[variant])]
                    left = deadline.left()
                    bound = min(left - 5, a.child_timeout_s)
                    result = C.run_child("throughput.py", [*args, "--budget-s", str(bound - 5)],
                                         timeout=bound) if left > 15 else {
                                             "error": "skipped: out of time"}
                    key = key_for(sync, style, variant)
                    if len(concurrencies) > 1:
                        runs.setdefault(key, {})[str(concurrency)] = result
                    else:
                        out[key] = result
    if runs:
        out["by_concurrency"] = runs
    C.emit(out)


if __name__ == "__main__":
    main()

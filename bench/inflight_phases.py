"""Where the time of the 256-in-flight row goes, on PostgreSQL (in-process roles).

distributed.py's `concurrent` row submits N tasks with up to 256 `asubmit` in
flight from a loop of its own (as a web app beside `app.start()`'s roles), then
awaits each in order. This runs that row, and the same submissions awaited all
at once (`gathered`: one `await_` per task, together, as many clients would
wait), and the roles alone on N tasks submitted first (`presubmitted`), each in
a child of its own on a database of its own, rounds alternated. A thread counts
the terminal tasks every 20 ms on a connection of its own, as `presubmitted`
waits for its end (distributed.wait_all_terminal): each count reads the state
index of every task ended so far, so both pay it alike. Each measurement says
when the submissions ended, when the roles had ended every task, and when the
client held them all; and the CPU a completed step of the process, of the local
PostgreSQL server's processes, and of the whole machine (pg_worker.machine_busy).
--no-watch leaves the watch out (its reads weigh on the server it measures).

Usage: python bench/inflight_phases.py [--n 5000] [--rounds 3]
           [--styles inorder,gathered,presubmitted] [--no-watch]
Prints one JSON line: every measurement, and the medians per style.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from typing import Any

import common as C

IN_FLIGHT = 256
STYLES = ("inorder", "gathered", "presubmitted")
STUCK_S = 120.0
POLL_S = 0.02  # the watch's, as distributed.wait_all_terminal polls


def server_cpu() -> float:
    """Seconds of CPU time the processes named postgres on this machine have used,
    those that ended included: a backend's time is added to the postmaster's
    children's time (cutime, cstime) when it exits, as when a pool replaces its
    connections."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                name, _, rest = f.read().partition(") ")
        except OSError:  # gone meanwhile
            continue
        if name.endswith("(postgres"):
            fields = rest.split()
            total += sum(map(int, fields[11:15]))  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def measure(n: int, style: str, watch_on: bool = True) -> dict[str, Any]:
    from distributed import DEFAULT_CONCURRENCY, WARM_UP, Deployment, Observer, wait_all_terminal
    from pg_worker import machine_busy
    from workload import WORKFLOW

    with Deployment("memory") as d:
        app = d.app()
        options = {"roles": d.roles(), "concurrency": DEFAULT_CONCURRENCY,
                   "instance_id": d.instance("scheduler")}
        if style == "presubmitted":
            async def submit_all() -> list[str]:
                return [await app.asubmit(WORKFLOW, None) for _ in range(n)]

            app._loop.run(submit_all())  # no scheduler yet: nothing is claimed
            cpu0, busy0, server0 = time.process_time(), machine_busy(), server_cpu()
            t0 = time.perf_counter()
            app.start(**options)
            wait_all_terminal(d.store_url, n)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            busy, server = machine_busy() - busy0, server_cpu() - server0
            app.stop()
            return {"style": style, "elapsed_s": round(elapsed, 3),
                    "steps_per_s": round(3 * n / elapsed, 1),
                    "cpu_us_per_step": round(cpu / (3 * n) * 1e6, 1),
                    "server_cpu_us_per_step": round(server / (3 * n) * 1e6, 1),
                    "machine_cpu_us_per_step": round(busy / (3 * n) * 1e6, 1)}
        app.start(**options)
        for _ in range(WARM_UP):
            app.wait(app.submit(WORKFLOW, None), timeout=STUCK_S)
        ended: list[float] = []
        watching = threading.Event()

        def watch() -> None:  # until every task of the window is terminal
            observer = Observer(d.store_url, "")
            try:
                while not watching.is_set():
                    if observer.all_terminal() >= n + WARM_UP:
                        ended.append(time.perf_counter())
                        return
                    time.sleep(POLL_S)
            finally:
                observer.close()

        watcher = threading.Thread(target=watch)
        cpu0, busy0, server0 = time.process_time(), machine_busy(), server_cpu()
        t0 = time.perf_counter()
        if watch_on:
            watcher.start()

        async def client() -> float:
            async def one() -> str:
                return await app.asubmit(WORKFLOW, None)

            ids = await C.in_flight(n, IN_FLIGHT, one)
            submitted = time.perf_counter()
            if style == "inorder":
                for task_id in ids:
                    await app.await_(task_id, timeout=STUCK_S)
            else:
                await asyncio.gather(*(app.await_(i, timeout=STUCK_S) for i in ids))
            return submitted

        submitted = asyncio.run(client())
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        busy, server = machine_busy() - busy0, server_cpu() - server0
        watching.set()
        if watch_on:
            watcher.join()
        app.stop()
        return {"style": style, "elapsed_s": round(elapsed, 3),
                "submissions_end_s": round(submitted - t0, 3),
                "roles_end_s": round(ended[0] - t0, 3) if ended else None,
                "steps_per_s": round(3 * n / elapsed, 1),
                "cpu_us_per_step": round(cpu / (3 * n) * 1e6, 1),
                "server_cpu_us_per_step": round(server / (3 * n) * 1e6, 1),
                "machine_cpu_us_per_step": round(busy / (3 * n) * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="main", choices=["main", "one"])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--styles", default=",".join(STYLES))
    ap.add_argument("--style", default="inorder", choices=STYLES)
    ap.add_argument("--no-watch", action="store_true",
                    help="no watch thread (then no roles_end_s)")
    a = ap.parse_args()
    if a.role == "one":
        C.emit(measure(a.n, a.style, watch_on=not a.no_watch))
        return
    styles = [s for s in a.styles.split(",") if s]
    runs: list[dict[str, Any]] = []
    for r in range(a.rounds):
        for style in styles:
            args = ["--role", "one", "--n", str(a.n), "--style", style,
                    *(["--no-watch"] if a.no_watch else [])]
            result = C.run_child("inflight_phases.py", args, timeout=STUCK_S * 3)
            result["round"] = r + 1
            runs.append(result)
    medians = {style: {key: C.median_of([run[key] for run in runs
                                         if run.get("style") == style and run.get(key)])
                       for key in ("steps_per_s", "elapsed_s", "submissions_end_s",
                                   "roles_end_s", "cpu_us_per_step", "server_cpu_us_per_step",
                                   "machine_cpu_us_per_step")
                       if any(run.get(key) for run in runs if run.get("style") == style)}
               for style in styles}
    C.emit({"bench": "inflight_phases", "n": a.n, "in_flight": IN_FLIGHT, "runs": runs,
            "medians": medians})


if __name__ == "__main__":
    main()

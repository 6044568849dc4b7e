"""What a client pays to read tasks back on the PostgreSQL store.

A private database (as bench/distributed.py makes one), N wf3 tasks submitted with
no roles running, then N reads in a row from one asyncio client: `app.aget` (one
task with its steps, what `app.wait` does once a task is done), and `app.asubmit`
and the blocking `app.submit` for comparison; microseconds per call, the median
of --rounds passes. Reads are what the client-bound throughput rows (sequential,
concurrent) spend after each task, so they are measured on their own here.

Usage: python bench/pg_reads.py [--n 2000] [--rounds 3]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import common as C
from distributed import Deployment, server_settings
from workload import WORKFLOW


def per_call_us(seconds: float, n: int) -> float:
    return round(seconds / n * 1e6, 1)


def measure(n: int, rounds: int) -> dict[str, Any]:
    with Deployment("memory") as d:
        app = d.app()
        samples: dict[str, list[float]] = {"aget": [], "asubmit": [], "submit": []}

        async def reads(ids: list[str]) -> float:
            t0 = time.perf_counter()
            for task_id in ids:
                await app.aget(task_id)
            return time.perf_counter() - t0

        async def submits() -> tuple[float, list[str]]:
            t0 = time.perf_counter()
            ids = [await app.asubmit(WORKFLOW, None) for _ in range(n)]
            return time.perf_counter() - t0, ids

        try:
            for _ in range(rounds):
                took, ids = app._loop.run(submits())
                samples["asubmit"].append(per_call_us(took, n))
                samples["aget"].append(per_call_us(app._loop.run(reads(ids)), n))
                t0 = time.perf_counter()
                for _ in range(n):
                    app.submit(WORKFLOW, None)
                samples["submit"].append(per_call_us(time.perf_counter() - t0, n))
        finally:
            app.close()
    return {name: {"median_us": statistics.median(values), "runs_us": values}
            for name, values in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    C.emit({"peer": "sasflow", "backend": "pg", "bench": "pg_reads", "n": a.n,
            "server": server_settings(), "reads": measure(a.n, a.rounds)})


if __name__ == "__main__":
    main()

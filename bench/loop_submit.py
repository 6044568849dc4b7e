"""Submissions from another event loop than the store's, on PostgreSQL.

A web app's loop that submits while the roles run in `app.start()`'s background
thread calls into the store's loop from another thread. This times N `asubmit`
with up to 256 in flight and no roles running (nothing is claimed), from the
app's own background loop (`home`: the store's loop) and from a loop of the
caller's (`other`: `asyncio.run` in the main thread): wall time and the process's
CPU per submission. Each measurement runs in a child of its own, on a database of
its own (distributed.py's Deployment); rounds alternate the places and the trees
(``--src ,DIR`` measures another checkout's `src` in the same rounds).

Usage: python bench/loop_submit.py [--n 5000] [--rounds 3] [--src ,DIR]
Prints one JSON line: every measurement, and the medians per (place, tree).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import common as C

IN_FLIGHT = 256
PLACES = ("other", "home")


def measure(n: int, place: str) -> dict[str, Any]:
    from distributed import Deployment
    from workload import WORKFLOW

    with Deployment("memory") as d:
        app = d.app()
        app._loop.run(app.asubmit(WORKFLOW, None))  # the store opened in its loop

        async def submit_all() -> tuple[float, float]:
            async def one() -> str:
                return await app.asubmit(WORKFLOW, None)

            t0, c0 = time.perf_counter(), time.process_time()
            await C.in_flight(n, IN_FLIGHT, one)
            return time.perf_counter() - t0, time.process_time() - c0

        if place == "other":
            elapsed, cpu = asyncio.run(submit_all())
        else:
            elapsed, cpu = app._loop.run(submit_all())
        app.close()
    return {"place": place, "n": n, "wall_us": round(elapsed / n * 1e6, 1),
            "cpu_us": round(cpu / n * 1e6, 1)}


def child(src: str | None, n: int, place: str, timeout: float) -> dict[str, Any]:
    result = C.run_child("loop_submit.py", ["--role", "one", "--n", str(n), "--place", place],
                         timeout, src=src)
    return {"place": place, **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="main", choices=["main", "one"])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--place", default="other", choices=PLACES)
    ap.add_argument("--src", default="", help="comma-separated trees; empty: this one")
    ap.add_argument("--budget-s", type=float, default=900.0)
    a = ap.parse_args()
    if a.role == "one":
        C.emit(measure(a.n, a.place))
        return
    deadline = C.Deadline(a.budget_s)
    trees = [s or None for s in a.src.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(a.rounds):
        for tree in trees:
            for place in PLACES:
                if deadline.left() < 10:
                    break
                key = f"{place}@{tree or 'this'}"
                runs.setdefault(key, []).append(
                    child(tree, a.n, place, min(300.0, deadline.left())))
    medians = {key: {metric: round(C.median_of([r[metric] for r in found if metric in r]
                                               or [0.0]), 1)
                     for metric in ("wall_us", "cpu_us")}
               for key, found in runs.items()}
    C.emit({"bench": "loop_submit", "n": a.n, "in_flight": IN_FLIGHT, "runs": runs,
            "medians": medians})


if __name__ == "__main__":
    main()

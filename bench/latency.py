"""Latency: 100 sequential single wf3 tasks (no-op steps), all roles in-process.

Each sample is submit -> terminal state visible to the client (`app.submit`
then `app.wait`), one task at a time; 5 warm-up samples are dropped. Measured
on a fresh SQLite file for synchronous NORMAL (`latency_noop`, the peers' key)
and FULL (`latency_full_noop`), each in its own child process.

Usage: python bench/latency.py [--n 100] [--syncs normal,full]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import common as C
from throughput import DEFAULT_CONCURRENCY
from workload import make_app, time_one_by_one

WARM_UP = 5


def measure(a: argparse.Namespace) -> dict[str, Any]:
    path = os.path.join(C.scratch_dir("latency"), f"lat-{os.getpid()}.db")
    C.remove_db(path)
    app = make_app(C.store_url(path, a.sync))
    app.start(concurrency=DEFAULT_CONCURRENCY)
    try:
        samples, failed = time_one_by_one(app, a.n, WARM_UP)
    finally:
        app.stop()
        C.remove_db(path)
    return {**C.lat_summary(samples), "durability": C.DURABILITY[a.sync],
            "not_processed": failed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="main", choices=["main", "one"])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--syncs", default="normal,full")
    ap.add_argument("--sync", default="normal", choices=sorted(C.DURABILITY))
    ap.add_argument("--budget-s", type=float, default=170.0)
    a = ap.parse_args()
    if a.role == "one":
        C.emit(measure(a))
        return
    deadline = C.Deadline(a.budget_s)
    out: dict[str, Any] = {"peer": "sasflow", "backend": "sqlite", "bench": "latency",
                           "durability": C.DURABILITY["normal"],
                           "settings": {"concurrency": DEFAULT_CONCURRENCY,
                                        "roles": "in-process, app.start() background thread",
                                        "measure": "app.submit -> app.wait, one at a time",
                                        "warm_up_dropped": WARM_UP}}
    for sync in a.syncs.split(","):
        key = "latency_noop" if sync == "normal" else f"latency_{sync}_noop"
        left = deadline.left()
        out[key] = C.run_child("latency.py", ["--role", "one", "--n", str(a.n), "--sync", sync],
                               timeout=left - 5) if left > 10 else {
                                   "error": "skipped: out of time"}
    C.emit(out)


if __name__ == "__main__":
    main()

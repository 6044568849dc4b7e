"""Latency of the embedded default as the README deploys it: an application that
submits and waits, and a separate ``sasflow worker`` process that runs the task,
over one SQLite file and the worker's in-process queues.

Each sample is submit -> terminal state seen by the application (`app.submit`
then `app.wait`), one task at a time, wf3 with no-op steps; 5 warm-up samples
dropped. Nothing of the roles runs in the application's process, so every
wake-up (the worker finding the task, the application finding it done) crosses
processes.

Usage: python bench/split_latency.py [--n 100] [--runs 3]
Prints one JSON line: p50/p95 per run and the median p50 over the runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import common as C
from workload import WORKFLOW, make_app, time_one_by_one

WARM_UP = 5
APP_REF = os.path.join(C.HERE, "agent_app.py") + ":app"


def _worker(store: str, log: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sasflow.cli", "worker", APP_REF, "--store", store,
             "--instance-id", f"split-{os.getpid()}", "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, cwd=C.HERE)


def measure(n: int) -> dict[str, Any]:
    scratch = C.scratch_dir("split")
    path = os.path.join(scratch, f"split-{os.getpid()}.db")
    C.remove_db(path)
    store = C.store_url(path)
    app = make_app(store)  # declarations and the client only: no roles started here
    worker = _worker(store, os.path.join(scratch, f"worker-{os.getpid()}.log"))
    try:
        # the worker is up once it has run a task
        app.wait(app.submit(WORKFLOW, None), timeout=60)
        samples, failed = time_one_by_one(app, n, WARM_UP)
    finally:
        C.stop_proc(worker)
        app.close()
        C.remove_db(path)
    return {**C.lat_summary(samples), "not_processed": failed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    runs = [measure(a.n) for _ in range(a.runs)]
    C.emit({"bench": "split_latency", "backend": "sqlite, app + sasflow worker",
            "runs": runs, "p50_ms_median": C.median_of([r["p50_ms"] for r in runs])})


if __name__ == "__main__":
    main()

"""The supervisor's looks on PostgreSQL with many tasks in flight and none expired.

Each (tree, size) in a fresh database (``bench_<pid>_<n>``, dropped after): the
schema made by that tree's store, then, by SQL, ENDED processed tasks and IN_FLIGHT
tasks locked by a live scheduler, their step's complete-by an hour ahead, then
ANALYZE. Timed, each the median of --calls calls through the store:
  expired      `store.expired(1000, ["wf3"])`: the sweep that finds nothing, asked
               by workflow as the supervisor asks (R4);
  next_expiry  `store.next_expiry(["wf3"])`: when the earliest complete-by falls due;
  and the two asked across all workflows (`*_any_ms`: `sasflow health` and
  `sasflow db` ask `next_expiry()` once, as a probe).
A supervisor asks the first two about once an interval (1 s by default). --src as in
pg_worker.py: ``--src ,/path/to/other/checkout`` measures this tree and that one,
alternating.

Usage: python bench/pg_sweep.py [--in-flight 1000,10000,100000] [--ended 100000]
           [--calls 50] [--src DIR,DIR]
Env: BENCH_PG_URL (admin connection, default postgresql://postgres@127.0.0.1:5432/postgres).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import common as C
import psycopg
from distributed import Deployment


def fill(url: str, ended: int, in_flight: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tasks (task_id, workflow, input, state, cursor, available_at,"
                     " created_at, updated_at, version)"
                     " SELECT 'ended-' || g, 'wf3', 'null', 'processed', 2, 0, 0, 0, 'v'"
                     " FROM generate_series(1, %s) g", (ended,))
        conn.execute("INSERT INTO tasks (task_id, workflow, input, state, cursor, locked_by,"
                     " complete_by, available_at, epoch, created_at, updated_at, version)"
                     " SELECT 'busy-' || g, 'wf3', 'null', 'processing', 1, 'scheduler-1',"
                     " extract(epoch FROM now()) + 3600 + g * 0.001, 0, 1, 0, 0, 'v'"
                     " FROM generate_series(1, %s) g", (in_flight,))
        conn.execute("INSERT INTO steps (task_id, phase, idx, name, agent, state,"
                     " idempotency_key, updated_at)"
                     " SELECT task_id, 'do', i, 'step' || (i + 1), 'bench-step', 'pending',"
                     " task_id || '/' || i, 0 FROM tasks, generate_series(0, 2) i")
        if conn.execute("SELECT 1 FROM information_schema.columns WHERE table_name = 'tasks'"
                        " AND column_name = 'sweep_at'").fetchone():
            # (the schema 11 supervisor's bound: the claim sets it to the complete-by)
            conn.execute("UPDATE tasks SET sweep_at = complete_by WHERE locked_by IS NOT NULL")
        conn.execute("ANALYZE tasks, steps")


async def timed(url: str, ended: int, in_flight: int, calls: int) -> dict[str, Any]:
    from sasflow.store.postgres import PostgresStore
    store = PostgresStore(url)
    try:
        assert await store.get("warm-up") is None  # the schema is made
        fill(url, ended, in_flight)
        found: dict[str, list[float]] = {}
        for _ in range(calls):
            for name, workflows in (("", ["wf3"]), ("_any", None)):
                t0 = time.perf_counter()
                assert await store.expired(1000, workflows) == []
                t1 = time.perf_counter()
                assert await store.next_expiry(workflows) is not None
                t2 = time.perf_counter()
                found.setdefault(f"expired{name}", []).append(t1 - t0)
                found.setdefault(f"next_expiry{name}", []).append(t2 - t1)
        return {f"{name}_ms": round(statistics.median(values) * 1e3, 3)
                for name, values in found.items()}
    finally:
        await store.close()


def measure(src: str, ended: int, in_flight: int, calls: int) -> dict[str, Any]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.path.join(src, "src")
    with Deployment("memory") as d:  # (its private database, dropped after)
        out = subprocess.run([sys.executable, __file__, "--role", "child",
                              "--url", d.store_url, "--ended", str(ended),
                              "--in-flight", str(in_flight), "--calls", str(calls)],
                             env=env, cwd=C.HERE, check=True, stdout=subprocess.PIPE,
                             text=True, timeout=600).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in-flight", default="1000,10000,100000")
    ap.add_argument("--ended", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--src", default="")
    ap.add_argument("--role", default="main", choices=["main", "child"])
    ap.add_argument("--url", default="")
    args = ap.parse_args()
    if args.role == "child":
        print(json.dumps(asyncio.run(timed(args.url, args.ended, int(args.in_flight),
                                           args.calls))))
        return
    runs: dict[str, Any] = {}
    for in_flight in [int(n) for n in args.in_flight.split(",")]:
        for src in args.src.split(","):
            label = f"{in_flight}@{src or 'this'}"
            runs[label] = measure(src, args.ended, in_flight, args.calls)
            print(label, runs[label], file=sys.stderr)
    print(json.dumps({"peer": "sasflow", "backend": "pg", "bench": "pg_sweep",
                      "ended": args.ended, "calls": args.calls, "runs": runs}))


if __name__ == "__main__":
    main()

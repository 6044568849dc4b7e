"""Supervisor sweep time on big stores (100k and 1M task records).

A store file is built by bulk-inserting rows (sqlite3 executemany) into the
schema the store itself creates: 1% of the tasks are locked by a dead worker,
processing step 2 with a complete-by in the past; 9% are pending; 90% are
processed. Every task has its 3 step rows (history rows are left out: the
sweep never reads them). The built file is cached in the scratch dir, keyed by
its size and the schema's migrations, and copied before each timed sweep.

Timed, per store size:
  expired_1pct   `Supervisor.sweep()` recovering all the expired tasks (reads
                 them in batches of 1000, one fenced release each, group-committed);
                 median over --runs copies of the file
  none_expired   a sweep that finds nothing: `store.expired(1000)` returning
                 empty, and the whole `Supervisor.sweep()`, median of 20 runs each.
                 The store's clock is set before every complete-by, so the locked
                 1% are still there (not expired) and the index is not empty.

Usage: python bench/sweep.py [--sizes 100000,1000000] [--runs 3]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import sqlite3
import statistics
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any

import common as C
from workload import STEP_NAMES, WORKFLOW, make_app

from sasflow.store import open_store
from sasflow.store.sqlite import SQLiteStore
from sasflow.supervisor import Supervisor

BUILD_VERSION = "1"  # bump when the rows built below change
BATCH = 1000  # the supervisor's default batch
NONE_RUNS = 20
DEAD_WORKER = "dead-worker"
EXPIRED_EVERY, PENDING_EVERY = 100, 11  # 1% expired; about 9% pending; the rest processed


def schema_tag() -> str:
    folder = resources.files("sasflow.store.migrations") / "sqlite"
    digest = hashlib.sha256(BUILD_VERSION.encode())
    for f in sorted(folder.iterdir(), key=lambda f: f.name):
        if f.name.endswith(".sql"):
            digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()[:12]


def kind(i: int) -> str:
    if i % EXPIRED_EVERY == 0:
        return "expired"
    return "pending" if i % PENDING_EVERY == 0 else "processed"


def _rows(n: int, t0: float) -> tuple[Iterator[tuple[Any, ...]], Iterator[tuple[Any, ...]]]:
    result = '{"ok":true}'

    def tasks() -> Iterator[tuple[Any, ...]]:
        for i in range(n):
            k, tid, at = kind(i), f"t{i:08d}", t0 - n + i
            if k == "expired":  # step 2 running, complete-by 1-2 h ago
                yield (tid, WORKFLOW, "null", "processing", "do", 1, DEAD_WORKER,
                       t0 - 3600 - (i % 3600), at, 0, 1, None, None, at, at)
            elif k == "pending":
                yield (tid, WORKFLOW, "null", "pending", "do", 0, None, None, at, 0, 0,
                       None, None, at, at)
            else:
                yield (tid, WORKFLOW, "null", "processed", "do", 2, None, None, at, 0, 1,
                       None, None, at, at)

    def steps() -> Iterator[tuple[Any, ...]]:
        for i in range(n):
            k, tid, at = kind(i), f"t{i:08d}", t0 - n + i
            for idx, name in enumerate(STEP_NAMES):
                key = f"{i:08x}-0000-5000-8000-{idx:012x}"
                if k == "processed" or (k == "expired" and idx == 0):
                    yield (tid, "do", idx, name, "bench-step", "completed", 1, 0, at + 10,
                           key, result, at)
                elif k == "expired" and idx == 1:
                    yield (tid, "do", idx, name, "bench-step", "running", 1, 0,
                           t0 - 3600 - (i % 3600), key, None, at)
                else:
                    yield (tid, "do", idx, name, "bench-step", "pending", 0, 0, None, key,
                           None, at)

    return tasks(), steps()


def build(path: str, n: int) -> float:
    """Create the schema with the store itself, then bulk-insert the rows."""
    started = time.perf_counter()
    C.remove_db(path)
    SQLiteStore(path).close_sync()  # its writer connection applies the migrations
    t0 = time.time()
    tasks, steps = _rows(n, t0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")  # a scratch file: rebuilt if it is torn
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO tasks (task_id, workflow, input, state, phase, cursor, locked_by,"
        " complete_by, available_at, failure_count, epoch, reply_to, error, created_at,"
        " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", tasks)
    conn.executemany(
        "INSERT INTO steps (task_id, phase, idx, name, agent, state, attempts, failure_count,"
        " complete_by, idempotency_key, result, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", steps)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


def cached_store(n: int) -> tuple[str, float, bool, float]:
    """The built file for `n` tasks (built now if missing): its path, how long the
    build took, whether it came from the cache, and its size in MB."""
    path = os.path.join(C.scratch_dir("sweep"), f"store-{n}-{schema_tag()}.db")
    cached = os.path.exists(path + ".done")
    if cached:
        with open(path + ".done") as f:
            built = float(f.read())
    else:
        built = build(path, n)
        with open(path + ".done", "w") as f:
            f.write(f"{built:.3f}\n")
    return path, built, cached, os.path.getsize(path) / 1e6


async def time_expired_sweep(path: str, n: int) -> dict[str, Any]:
    app = make_app(C.store_url(path))
    store = open_store(C.store_url(path))
    supervisor = Supervisor(store, app._plans(), instance_id="bench-sweeper", batch=BATCH)
    try:
        t0 = time.perf_counter()
        recovered = await supervisor.sweep()
        took = time.perf_counter() - t0
        left = len(await store.expired(BATCH))
    finally:
        await store.close()
    return {"sweep_s": took, "recovered": recovered, "still_expired": left}


async def time_none_expired(path: str, before_all: float) -> dict[str, Any]:
    """`before_all`: a time before every complete-by, used as the store's clock, so
    the locked tasks are there but none has expired."""
    app = make_app(C.store_url(path))
    store = open_store(C.store_url(path), clock=lambda: before_all)
    supervisor = Supervisor(store, app._plans(), instance_id="bench-sweeper", batch=BATCH)
    expired_ms, sweep_ms = [], []
    try:
        for _ in range(NONE_RUNS):
            t0 = time.perf_counter()
            found = await store.expired(BATCH)
            expired_ms.append((time.perf_counter() - t0) * 1000)
            assert not found, "the 'none expired' store has expired tasks"
            t0 = time.perf_counter()
            recovered = await supervisor.sweep()
            sweep_ms.append((time.perf_counter() - t0) * 1000)
            assert recovered == 0
    finally:
        await store.close()
    return {"runs": NONE_RUNS, "expired_query_ms": round(statistics.median(expired_ms), 3),
            "sweep_ms": round(statistics.median(sweep_ms), 3)}


def measure(n: int, runs: int) -> dict[str, Any]:
    path, built, cached, size_mb = cached_store(n)
    work = path + f".work-{os.getpid()}.db"
    sweeps = []
    try:
        for _ in range(runs):
            C.remove_db(work)
            shutil.copyfile(path, work)
            sweeps.append(asyncio.run(time_expired_sweep(work, n)))
        none = asyncio.run(time_none_expired(path, os.path.getmtime(path) - 10**7))
    finally:
        C.remove_db(work)
    expired = n // EXPIRED_EVERY + (1 if n % EXPIRED_EVERY else 0)
    sweep_s = statistics.median(s["sweep_s"] for s in sweeps)
    return {
        "tasks": n, "expired": expired, "file_mb": round(size_mb, 1),
        "build_s": round(built, 1), "build_cached": cached,
        "expired_1pct": {"runs": runs, "sweep_s": round(sweep_s, 3),
                         "per_expired_us": round(sweep_s / expired * 1e6, 1),
                         "recovered": [s["recovered"] for s in sweeps],
                         "still_expired_after": [s["still_expired"] for s in sweeps]},
        "none_expired": none,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--runs", type=int, default=3, help="timed sweeps of the 1%% expired case")
    ap.add_argument("--role", default="main", choices=["main", "one"])
    ap.add_argument("--size", type=int, default=100000)
    ap.add_argument("--budget-s", type=float, default=400.0)
    a = ap.parse_args()
    if a.role == "one":
        C.emit(measure(a.size, a.runs))
        return
    deadline = C.Deadline(a.budget_s)
    out: dict[str, Any] = {"peer": "sasflow", "backend": "sqlite", "bench": "sweep",
                           "durability": C.DURABILITY["normal"],
                           "settings": {"batch": BATCH, "mix": "1% expired (locked, step 2 "
                                        "running, complete-by past), ~9% pending, "
                                        "~90% processed; 3 step rows per task"}}
    sweep: dict[str, Any] = {}
    for n in (int(s) for s in a.sizes.split(",")):
        label = f"{n // 1000}k" if n < 1_000_000 else f"{n / 1e6:g}M"
        left = deadline.left()
        sweep[label] = C.run_child("sweep.py", ["--role", "one", "--size", str(n),
                                                "--runs", str(a.runs)],
                                   timeout=left - 5) if left > 15 else {
                                       "error": "skipped: out of time"}
    out["sweep"] = sweep
    C.emit(out)


if __name__ == "__main__":
    main()

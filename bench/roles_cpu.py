"""The roles' own CPU and the garbage collector's share of it, a completed step on
PostgreSQL, for one or more source trees side by side.

Each measurement is a child process that, on a fresh database: submits N wf3
no-op tasks through one App, closes it, makes a second App (as a `sasflow
worker` starts with nothing submitted by itself) and times `app.start()` until
the store holds all N processed (polled every 20 ms on a connection of its own).
It reports, over that span, its process's CPU time a completed step (all its
threads: the roles', the store's), the collector's time a step per generation
(`gc.callbacks`) and how many collections ran; the PostgreSQL server's CPU is not
in it. Rounds alternate the trees (``--src ,../other`` runs this tree's sasflow
and the other's), medians per tree.

The counts of collections barely move from run to run of the same tree (a
few percent); the CPU a step swings by about 10% on a 2-core machine, the
throughput rows by 20%: judge a change by several rounds' medians and paired
ratios.

  --gc-tuned  each child freezes its heap and raises the youngest generation's
              threshold to 10,000 before starting the roles, as `sasflow worker`
              does (--gc-threshold): what is left is the Python a step runs.

Usage: python bench/roles_cpu.py [--n 10000] [--rounds 3] [--src ,DIR] [--gc-tuned]
           [--concurrency 1024]
Env: BENCH_PG_URL (admin connection, default postgresql://postgres@127.0.0.1:5432/postgres).
Prints one JSON line; a table of medians goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import common as C
import psycopg
from distributed import PG_ADMIN, with_database
from pg_worker import submit_all
from workload import make_app

from sasflow import App

POLL_S = 0.02
ROLES_CONCURRENCY = 1024  # as bench/pg_worker.py's in-process roles


def run_roles(url: str, n: int, gc_tuned: bool, concurrency: int) -> dict[str, Any]:
    """One measurement, in this (child) process."""
    submit_all(url, n)
    app: App = make_app(url)
    spent = [0.0, 0.0, 0.0]
    runs = [0, 0, 0]
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - started[0]
            runs[info["generation"]] += 1

    if gc_tuned:
        gc.freeze()
        gc.set_threshold(10_000, 10, 10)
    gc.callbacks.append(timed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    app.start(concurrency=concurrency)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM tasks WHERE state = 'processed'").fetchone()
                if row and int(row[0]) >= n:
                    break
                time.sleep(POLL_S)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        gc.callbacks.remove(timed)
        app.stop()
    steps = 3 * n
    return {"steps_per_s": round(steps / wall, 1),
            "cpu_us_per_step": round(1e6 * cpu / steps, 1),
            "gc_us_per_step": [round(1e6 * s / steps, 1) for s in spent],
            "gc_collections": runs}


def measure(src: str | None, n: int, gc_tuned: bool, concurrency: int) -> dict[str, Any]:
    name = f"bench_roles_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        env = dict(os.environ)
        if src:
            env["PYTHONPATH"] = os.path.join(os.path.abspath(src), "src")
        cmd = [sys.executable, __file__, "--role", "child", "--url",
               with_database(PG_ADMIN, name), "--n", str(n),
               "--concurrency", str(concurrency)] + (
            ["--gc-tuned"] if gc_tuned else [])
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                              check=True)
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="main", choices=["main", "child"])
    ap.add_argument("--url")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--src", default="", help="comma-separated trees; empty: this one")
    ap.add_argument("--gc-tuned", action="store_true")
    ap.add_argument("--concurrency", type=int, default=ROLES_CONCURRENCY,
                    help="the scheduler's")
    a = ap.parse_args()
    if a.role == "child":
        C.emit(run_roles(a.url, a.n, a.gc_tuned, a.concurrency))
        return
    trees = [s or None for s in a.src.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {str(t or "this"): [] for t in trees}
    for round_ in range(a.rounds):
        for tree in trees if round_ % 2 == 0 else list(reversed(trees)):
            result = measure(tree, a.n, a.gc_tuned, a.concurrency)
            runs[str(tree or "this")].append(result)
            print(f"round {round_ + 1} {tree or 'this'}: {result}", file=sys.stderr)
    medians = {tree: {
        "steps_per_s": statistics.median(r["steps_per_s"] for r in rs),
        "cpu_us_per_step": statistics.median(r["cpu_us_per_step"] for r in rs),
        "gc_us_per_step": statistics.median(sum(r["gc_us_per_step"]) for r in rs)}
        for tree, rs in runs.items()}
    print("| tree | steps/s | CPU µs a step | of which GC |\n|---|---:|---:|---:|",
          file=sys.stderr)
    for tree, m in medians.items():
        print(f"| {tree} | {m['steps_per_s']:,.0f} | {m['cpu_us_per_step']:.1f} |"
              f" {m['gc_us_per_step']:.1f} |", file=sys.stderr)
    C.emit({"bench": "roles_cpu", "n": a.n, "rounds": a.rounds, "gc_tuned": a.gc_tuned,
            "concurrency": a.concurrency,
            "runs": runs, "medians": medians})


if __name__ == "__main__":
    main()

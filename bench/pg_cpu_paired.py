"""CPU per completed step on PostgreSQL of two source trees, run at the same time.

bench/pg_worker.py runs the trees one after the other, and on a shared machine
the rounds of one tree spread more than the trees differ (docs/benchmarks.md:
one tree's in-process rounds read 254 to 538 µs of the machine's CPU a step in
one sitting). Here the trees run side by side, so that whatever slows the machine
slows both at once, and the figure is their ratio within each round.

Each round, per tree: a fresh database (``bench_<pid>_<n>``, dropped after), N
wf3 no-op tasks submitted with nothing running (by a child of that tree), then
both trees' roles started together, in-process as bench/pg_worker.py's
``inprocess`` mode (`app.start(concurrency=1024)`, the in-process transport),
the starting order alternating by round. The window opens once both have
completed a step and closes when the first tree has all its tasks terminal: the
other then runs alone on a quieter machine, which is left out. Over the window,
per tree: its steps completed (``steps`` rows of phase do completed, counted on
its database at both ends) and its CPU (the roles' process and the server
backends connected to its database, /proc/PID/stat, looked at every 50 ms, as
pg_worker.py's ``own``). What the server does for everyone (WAL writer,
checkpointer) is no tree's; pg_worker.py's ``wal_bytes_per_step`` counts the WAL.

Usage: python bench/pg_cpu_paired.py --src ,/path/to/other/checkout [--n 10000]
           [--rounds 6]
Env: BENCH_PG_URL (admin connection), as bench/distributed.py.
Prints one JSON line per round, then one summary line: per tree the median CPU a
step, and each tree's median ratio to the first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import common as C
from distributed import Deployment, Observer, server_settings
from pg_worker import merge_cpu, own_cpu
from throughput import STUCK_S

LOOK_S = 0.05
PG_WORKER = os.path.join(C.HERE, "pg_worker.py")


class Tree:
    """One source tree's run in a round: its database, its roles, what it spent."""

    def __init__(self, src: str | None, deployment: Deployment) -> None:
        self.src = src
        self.d = deployment
        self.env = dict(os.environ)
        if src:
            self.env["PYTHONPATH"] = os.path.join(src, "src")
        self.proc: subprocess.Popen[bytes] | None = None
        self.watch: Observer | None = None
        self.cpu: dict[int, float] = {}

    @property
    def label(self) -> str:
        return self.src or "this"

    def submit(self, n: int) -> None:
        subprocess.run([sys.executable, PG_WORKER, "--role", "submit", "--url",
                        self.d.store_url, "--n", str(n)], env=self.env, check=True,
                       cwd=C.HERE, timeout=600)
        self.watch = Observer(self.d.store_url, "")

    def start(self) -> None:
        log = os.path.join(self.d.log_dir, f"pg_cpu_paired_{self.d.tag}.log")
        with open(log, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, PG_WORKER, "--role", "inprocess", "--url", self.d.store_url],
                stdout=logf, stderr=subprocess.STDOUT, env=self.env, cwd=C.HERE)
        self.d.procs.append(self.proc)

    def look(self) -> dict[int, float]:
        assert self.watch is not None and self.proc is not None
        now = own_cpu(self.watch, self.d.db, self.proc.pid)
        merge_cpu(self.cpu, now)
        return dict(self.cpu)

    def steps_done(self) -> int:
        assert self.watch is not None
        row = self.watch.conn.execute("SELECT count(*) FROM steps WHERE phase = 'do'"
                                      " AND state = 'completed'").fetchone()
        return 0 if row is None else int(row[0])

    def ended(self, n: int) -> bool:
        assert self.watch is not None
        return self.watch.all_terminal() >= n

    def check(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise SystemExit(f"{self.label}: its roles exited (rc={self.proc.returncode})")


def wait_until(trees: list[Tree], done: Callable[[], bool], end: float, what: str, *,
               looking: bool = False) -> None:
    """Until `done()`, every LOOK_S; a tree whose roles exited, or `end` passed, ends the
    bench with `what`."""
    while not done():
        for tree in trees:
            tree.check()
            if looking:
                tree.look()
        if time.monotonic() > end:
            raise SystemExit(what)
        time.sleep(LOOK_S)


def one_round(srcs: list[str | None], n: int, first: int) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        trees = [Tree(src, stack.enter_context(Deployment("memory"))) for src in srcs]
        for tree in trees:
            tree.submit(n)
        for tree in trees[first:] + trees[:first]:
            tree.start()
        try:
            end = time.monotonic() + STUCK_S
            wait_until(trees, lambda: all(tree.steps_done() > 0 for tree in trees), end,
                       "no step completed")
            cpu0 = [tree.look() for tree in trees]
            steps0 = [tree.steps_done() for tree in trees]
            # each look keeps the CPU of a backend that closes before the window ends
            wait_until(trees, lambda: any(tree.ended(n) for tree in trees), end,
                       "no tree ended", looking=True)
            cpu1 = [tree.look() for tree in trees]
            steps1 = [tree.steps_done() for tree in trees]
        finally:
            for tree in trees:
                if tree.watch is not None:
                    tree.watch.close()
    out: dict[str, Any] = {"bench": "pg_cpu_paired", "first": trees[first].label,
                           "load_avg": os.getloadavg()[0]}
    for tree, c0, c1, s0, s1 in zip(trees, cpu0, cpu1, steps0, steps1, strict=True):
        spent = sum(cpu - c0.get(pid, 0.0) for pid, cpu in c1.items())
        out[tree.label] = {"steps": s1 - s0,
                           "cpu_us_per_step": round(spent / max(1, s1 - s0) * 1e6, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True,
                    help="comma-separated source trees ('' is this one), two or more")
    ap.add_argument("--n", type=int, default=10000, help="tasks per tree and round")
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    srcs = [s or None for s in a.src.split(",")]
    if len(srcs) < 2:
        raise SystemExit("--src names two trees or more")
    rounds = []
    for r in range(a.rounds):
        result = one_round(srcs, a.n, r % len(srcs))
        C.emit(result)
        rounds.append(result)
    labels = [s or "this" for s in srcs]
    summary: dict[str, Any] = {"bench": "pg_cpu_paired", "n": a.n, "rounds": a.rounds,
                               "server": server_settings()}
    for label in labels:
        figures = [r[label]["cpu_us_per_step"] for r in rounds]
        ratios = [r[label]["cpu_us_per_step"] / r[labels[0]]["cpu_us_per_step"]
                  for r in rounds]
        summary[label] = {"cpu_us_per_step_median": statistics.median(figures),
                          "ratio_to_first_median": round(statistics.median(ratios), 3),
                          "ratios": [round(x, 3) for x in ratios]}
    C.emit(summary)


if __name__ == "__main__":
    main()

"""Recovery after SIGKILL: two worker processes share one SQLite store; one dies.

Two worker processes (bench/workload.py: scheduler + agents + supervisor via
`App.arun`, supervisor interval 0.5 s, step timeout 3 s) run over the same
store. The client submits 200 wf3 tasks whose step 2 sleeps 2 s; each step
appends "task_id step_no" to a `starts` file when it begins and to an `effects`
file when it finishes (one O_APPEND write). About 1 s after the submission
one worker is SIGKILLed and NOT restarted (by default the one whose
supervisor does not lead; --kill-leader kills the leader): the survivor's supervisor must
find the dead worker's expired steps and release them, and the survivor's
scheduler run them again.

Reported (same keys as the peers' crash test):
  recovery_s_from_kill   kill -> all 200 tasks terminal
  released_s_from_kill   kill -> no task still locked by the dead worker (the
                         supervisor has requested recovery of all of them)
  lost / duplicated      effects never written / written more than once
                         (the peers' count_effects); a step killed after its
                         effect but before its reply was recorded runs again:
                         at-least-once, which is why steps carry an idempotency key
  target_bound_s         the earlier of the step timeout and the heartbeat lease, +
                         supervisor interval + 1 s: the bound for
                         released_s_from_kill; the tasks then still need their
                         re-run (step 2 sleeps 2 s again), hence
  target_total_s         target_bound_s + step-2 sleep, the bound for recovery_s_from_kill
  released_by            how the survivor's supervisor found them: "heartbeat"
                         (the dead worker's lease lapsed) or "expiry" (complete-by),
                         from the history's reasons

The dead worker's steps are found by whichever comes first: their complete-by
(the default 3 s timeout), or the end of its heartbeat lease (R2). With a long
timeout, `--step-timeout 300 --heartbeat 0.5 --heartbeat-lease 2` measures the
second: recovery then costs the lease, not the timeout.

Usage: python bench/recovery.py [--n 200] [--step-timeout 3] [--supervisor-interval 0.5]
                                [--heartbeat 2] [--heartbeat-lease 10]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from typing import Any

import common as C
from workload import WORKFLOW, make_app

TERMINAL = ("processed", "error", "compensated", "cancelled")
STEP2_SLEEP = 2.0
KILLED, SURVIVOR = "bench-worker-killed", "bench-worker-survivor"


def spawn_worker(a: argparse.Namespace, url: str, instance: str, ready: str,
                 log: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as logf:
        return subprocess.Popen(
            [sys.executable, os.path.join(C.HERE, "workload.py"), "--store", url,
             "--ready", ready, "--instance-id", instance,
             "--concurrency", str(a.concurrency),
             "--supervisor-interval", str(a.supervisor_interval),
             "--step-timeout", str(a.step_timeout), "--max-s", str(a.budget_s),
             "--heartbeat", str(a.heartbeat), "--heartbeat-lease", str(a.lease)],
            stdout=logf, stderr=subprocess.STDOUT)


def wait_ready(path: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited early rc={proc.returncode}")
        if time.monotonic() > end:
            raise TimeoutError(f"worker not ready in {timeout}s")
        time.sleep(0.02)


class Observer:
    """Reads the store file directly (read-only, WAL: never in the workers' way)."""

    def __init__(self, path: str, prefix: str) -> None:
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        self.prefix = prefix

    def terminal(self) -> int:
        marks = ", ".join("?" * len(TERMINAL))
        return int(self.conn.execute(
            f"SELECT count(*) FROM tasks WHERE task_id LIKE ? AND state IN ({marks})",
            (self.prefix + "%", *TERMINAL)).fetchone()[0])

    def locked_by(self, owner: str) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM tasks WHERE task_id LIKE ? AND locked_by = ?",
            (self.prefix + "%", owner)).fetchone()[0])

    def states(self) -> dict[str, int]:
        rows = self.conn.execute("SELECT state, count(*) FROM tasks WHERE task_id LIKE ?"
                                 " GROUP BY state", (self.prefix + "%",)).fetchall()
        return {state: n for state, n in rows}

    def released_by(self) -> dict[str, int]:
        """How the tasks were recovered: by the heartbeat lease or by expiry."""
        rows = self.conn.execute(
            "SELECT why FROM history WHERE task_id LIKE ? AND step IS NULL"
            " AND (why LIKE '%heartbeat lease%' OR why LIKE '%expired%')",
            (self.prefix + "%",)).fetchall()
        heartbeat = sum("heartbeat lease" in why for (why,) in rows)
        return {"heartbeat": heartbeat, "expiry": len(rows) - heartbeat}

    def lease_holder(self) -> str | None:
        row = self.conn.execute("SELECT holder FROM leases WHERE name = 'supervisor'").fetchone()
        return None if row is None else str(row[0])


def crash_test(a: argparse.Namespace, deadline: C.Deadline) -> dict[str, Any]:
    d = C.scratch_dir("recovery", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    db = os.path.join(d, "store.db")
    url = C.store_url(db, "normal")
    effects, starts = os.path.join(d, "effects.txt"), os.path.join(d, "starts.txt")
    # one after the other, so the schema exists before the second opens the file; the
    # first one started takes the supervisor lease
    order = [(KILLED, "killed"), (SURVIVOR, "survivor")]
    if not a.kill_leader:
        order.reverse()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    client = None
    try:
        for instance, name in order:
            ready = os.path.join(d, f"ready-{name}")
            procs[instance] = spawn_worker(a, url, instance, ready,
                                           os.path.join(d, f"{name}.log"))
            wait_ready(ready, procs[instance], 60)
        victim = procs[KILLED]
        prefix = f"crash-{uuid.uuid4().hex[:8]}-"
        ids = [f"{prefix}{i}" for i in range(a.n)]
        task_input = {"step2_sleep": STEP2_SLEEP, "effects": effects, "starts": starts}
        client = make_app(url, step_timeout=a.step_timeout)  # submits only: no roles
        watch = Observer(db, prefix)
        t0 = time.perf_counter()
        for task_id in ids:
            client.submit(WORKFLOW, task_input, task_id=task_id)
        t_sub = time.perf_counter() - t0
        time.sleep(1.0)
        held_at_kill = watch.locked_by(KILLED)
        leader_at_kill = watch.lease_holder()
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        t_kill = time.perf_counter()
        before = C.count_effects(effects, ids)
        released_at = done_at = None
        done = 0
        while deadline.left() > 5:
            now = time.perf_counter()
            if released_at is None and watch.locked_by(KILLED) == 0:
                released_at = now
            done = watch.terminal()
            if done >= len(ids):
                done_at = now
                break
            time.sleep(0.05)
        time.sleep(0.5)  # let any stray duplicate appends land
        counts = C.count_effects(effects, ids)
        n_starts = C.count_effects(starts, ids)["lines"]
        states = watch.states()
        released_by = watch.released_by()
    finally:
        if client is not None:
            client.close()
        for proc in procs.values():
            C.stop_proc(proc)
    bound = min(a.step_timeout, a.lease) + a.supervisor_interval + 1.0
    recovery = None if done_at is None else round(done_at - t_kill, 3)
    released = None if released_at is None else round(released_at - t_kill, 3)
    return {
        "n": len(ids), "submit_s": round(t_sub, 3), "completed": done, "states": states,
        "recovery_s_from_kill": recovery, "released_s_from_kill": released,
        "held_by_killed_worker_at_kill": held_at_kill,
        "killed_worker_was_supervisor_leader": leader_at_kill == KILLED,
        "effects_done_at_kill": before["lines"], "lost": counts["lost"],
        "duplicated": counts["duplicated"], "step_starts": n_starts,
        "target_bound_s": bound, "target_total_s": bound + STEP2_SLEEP,
        "released_by": released_by,
        "released_within_bound": released is not None and released <= bound,
        "recovered_within_total": recovery is not None and recovery <= bound + STEP2_SLEEP,
        "durability": C.DURABILITY["normal"], "scratch": d,
        "settings": (f"2 worker processes (scheduler+agents+supervisor, concurrency "
                     f"{a.concurrency}), one SIGKILLed and not restarted; supervisor interval "
                     f"{a.supervisor_interval:g} s, step timeout {a.step_timeout:g} s, "
                     f"heartbeat {a.heartbeat:g} s (lease {a.lease:g} s), "
                     f"step 2 sleeps {STEP2_SLEEP:g} s"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--step-timeout", type=float, default=3.0)
    ap.add_argument("--supervisor-interval", type=float, default=0.5)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--kill-leader", action="store_true",
                    help="kill the worker whose supervisor leads (the survivor's must"
                         " first wait for the lease to run out)")
    ap.add_argument("--heartbeat", type=float, default=2.0,
                    help="seconds between each worker's heartbeats")
    ap.add_argument("--heartbeat-lease", type=float, default=None,
                    help="a worker silent this long counts as gone (default: 5 heartbeats)")
    ap.add_argument("--budget-s", type=float, default=120.0)
    a = ap.parse_args()
    a.lease = a.heartbeat_lease if a.heartbeat_lease is not None else 5 * a.heartbeat
    deadline = C.Deadline(a.budget_s)
    out: dict[str, Any] = {"peer": "sasflow", "backend": "sqlite", "bench": "recovery",
                           "durability": C.DURABILITY["normal"]}
    try:
        out["crash"] = crash_test(a, deadline)
    except Exception as error:  # keep the JSON line coming
        out["crash"] = {"error": repr(error)}
    C.emit(out)


if __name__ == "__main__":
    main()

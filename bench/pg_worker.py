"""Completed steps/s and machine CPU per step on PostgreSQL, all tasks submitted
first, for a `sasflow worker` started with its default settings or for the roles
in-process; pgbench's single-row-update rate with 8 clients in the same run.

  worker     ``sasflow worker bench/agent_app.py:app --store URL``: every role, the
             in-process transport, every setting its default (--worker-args adds
             options, to compare);
  inprocess  the roles in a child process (`app.start(concurrency=1024)`), as
             bench/distributed.py's presubmitted row.

Each round, per mode: a fresh database (``bench_<pid>_<n>``, dropped after), N wf3
no-op tasks submitted with nothing running, then the roles started. The clock
starts when the first task leaves `pending` (the worker's start-up is not
throughput) and stops when the store holds all N terminal, polled every 10 ms on
a connection of its own. CPU per completed step, over the same span: the
machine's (/proc/stat busy time, every process: PostgreSQL's too, and on a shared
machine whatever else runs), that less the bench's own looking (this process and
its observer's backend, whose count of ended tasks every 10 ms costs more the
longer a run takes: ``bench_cpu_us_per_step``), and the run's own (the roles' process and the server
backends connected to the run's database, /proc/PID/stat, looked at every 50 ms
so that a connection closed during the run still counts). Rounds alternate the
modes and the --src trees, each tree first in turn (``--src ,/path/to/other/checkout``
runs this tree's sasflow and that one's: the figure before a change), so a busy
machine hurts each alike; medians per (mode, src), and each tree's median ratio to
the first tree's run of the same round (``paired``, of the machine's CPU less the
bench's).

Usage: python bench/pg_worker.py [--n 5000] [--rounds 3] [--modes worker,inprocess]
           [--src DIR,DIR] [--pgbench-seconds 10] [--worker-args "--concurrency 64"]
Env: BENCH_PG_URL (admin connection, default postgresql://postgres@127.0.0.1:5432/postgres).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import common as C
import psycopg
from distributed import APP_REF, PG_ADMIN, ROOT, Deployment, Observer, server_settings
from pgbench import SCHEMA, STEP_UPDATE, run_pgbench
from throughput import DEFAULT_CONCURRENCY, STUCK_S
from workload import WORKFLOW

POLL_S = 0.01
OWN_EVERY = 5  # polls between looks at the run's processes


def machine_busy() -> float:
    """Seconds of CPU time the machine has spent busy (all CPUs, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """Seconds of CPU time process `pid` has used (all its threads), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def own_cpu(watch: Observer, db: str, roles_pid: int) -> dict[int, float]:
    """CPU so far of the roles' process and of the server's backends serving it (all
    connections to the run's database but the observer's own)."""
    rows = watch.conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s"
                              " AND pid <> pg_backend_pid()", (db,)).fetchall()
    return {pid: process_cpu(pid) for pid in [roles_pid, *(int(r[0]) for r in rows)]}


def merge_cpu(seen: dict[int, float], now: dict[int, float]) -> None:
    """Keep in `seen` each process's latest CPU: a backend the store closes during the
    window (it replaces its connections when it plans again, store/postgres/plans.py)
    is gone from the last look, with the CPU it spent."""
    for pid, cpu in now.items():
        seen[pid] = max(seen.get(pid, 0.0), cpu)


def submit_all(url: str, n: int) -> None:
    from workload import make_app
    app = make_app(url)
    try:
        async def submit() -> None:
            for _ in range(n):
                await app.asubmit(WORKFLOW, None)

        app._loop.run(submit())
    finally:
        app.close()


def measure(mode: str, src: str | None, n: int, worker_args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.path.join(src, "src")
    with Deployment("memory") as d:
        # submitted by a child of the same tree as the roles (the schema is its)
        subprocess.run([sys.executable, __file__, "--role", "submit", "--url", d.store_url,
                        "--n", str(n)], env=env, check=True, cwd=C.HERE, timeout=300)
        if mode == "worker":
            cmd = [sys.executable, "-m", "sasflow.cli", "worker", APP_REF,
                   "--store", d.store_url, "--log-level", "warning", *worker_args]
        else:
            cmd = [sys.executable, __file__, "--role", "inprocess", "--url", d.store_url]
        log = os.path.join(d.log_dir, f"pg_worker_{d.tag}.log")
        with open(log, "ab") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                    cwd=ROOT if mode == "worker" else C.HERE)
        d.procs.append(proc)
        watch = Observer(d.store_url, "")
        try:
            end = time.monotonic() + STUCK_S
            while not _started(watch):
                if proc.poll() is not None or time.monotonic() > end:
                    return {"error": f"no task started (rc={proc.poll()}, log {log})"}
                time.sleep(POLL_S)
            t0, busy0 = time.perf_counter(), machine_busy()
            # the bench's own looking (this process, and its observer's backend, whose
            # count of ended tasks every POLL_S grows with the table) is no step's cost
            observer = watch.conn.info.backend_pid
            looking0 = time.process_time() + process_cpu(observer)
            wal0 = wal_lsn(watch)
            own0 = own_cpu(watch, d.db, proc.pid)
            own1, polls = dict(own0), 0
            while watch.all_terminal() < n:
                if proc.poll() is not None or time.monotonic() > end:
                    return {"error": f"not all terminal (rc={proc.poll()}, log {log})"}
                polls += 1
                if polls % OWN_EVERY == 0:
                    merge_cpu(own1, own_cpu(watch, d.db, proc.pid))
                time.sleep(POLL_S)
            elapsed, busy = time.perf_counter() - t0, machine_busy() - busy0
            looking = time.process_time() + process_cpu(observer) - looking0
            wal = wal_lsn(watch) - wal0
            merge_cpu(own1, own_cpu(watch, d.db, proc.pid))
            proc.terminate()  # its backends report their counts as they exit
            proc.wait(timeout=60)
            hot = hot_updates(watch)
        finally:
            watch.close()
    own = sum(cpu - own0.get(pid, 0.0) for pid, cpu in own1.items())
    roles = own1[proc.pid] - own0[proc.pid]
    return {"steps_per_s": round(3 * n / elapsed, 1), "elapsed_s": round(elapsed, 3),
            "machine_cpu_us_per_step": round(busy / (3 * n) * 1e6, 1),
            "bench_cpu_us_per_step": round(looking / (3 * n) * 1e6, 1),
            "machine_less_bench_cpu_us_per_step": round((busy - looking) / (3 * n) * 1e6, 1),
            "own_cpu_us_per_step": round(own / (3 * n) * 1e6, 1),
            "roles_cpu_us_per_step": round(roles / (3 * n) * 1e6, 1),
            "wal_bytes_per_step": round(wal / (3 * n)), **hot,
            "load_avg": os.getloadavg()[0]}


def wal_lsn(watch: Observer) -> int:
    """The server's WAL position in bytes (the whole server: the run's database is the
    only one busy)."""
    row = watch.conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def hot_updates(watch: Observer) -> dict[str, float]:
    """Of the run's updates of task and step rows, the share made in place (HOT: no
    index entry written), read once the roles' backends have exited."""
    rows = watch.conn.execute("SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                              " WHERE relname IN ('tasks', 'steps')").fetchall()
    return {f"{name}_hot_share": round(hot / upd, 3) if upd else 0.0 for name, upd, hot in rows}


def _started(watch: Observer) -> bool:
    try:
        row = watch.conn.execute("SELECT EXISTS (SELECT 1 FROM tasks"
                                 " WHERE state <> 'pending')").fetchone()
    except psycopg.errors.UndefinedTable:
        return False
    return bool(row and row[0])


def run_inprocess(url: str) -> None:
    """The roles of this process until SIGTERM (the parent watches the store)."""
    import signal

    from workload import make_app
    app = make_app(url)
    app.start(concurrency=DEFAULT_CONCURRENCY)
    try:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        app.stop()


def pgbench_c8(seconds: float) -> float | None:
    url_db = f"bench_pgbench_{os.getpid()}"
    from distributed import with_database
    url = with_database(PG_ADMIN, url_db)
    with tempfile.TemporaryDirectory(prefix="sasflow-pgbench-") as tmp:
        script = os.path.join(tmp, "step_update.sql")
        with open(script, "w") as f:
            f.write(STEP_UPDATE)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{url_db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{url_db}"')
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(SCHEMA)
                conn.execute("VACUUM ANALYZE step_state")
            tps = run_pgbench(url, script, 8, seconds).get("tps")
        finally:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{url_db}" WITH (FORCE)')
    return tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="worker,inprocess")
    ap.add_argument("--src", default="", help="other checkouts to measure, comma-separated"
                    " ('' = this one)")
    ap.add_argument("--pgbench-seconds", type=float, default=10.0, help="0: no pgbench")
    ap.add_argument("--worker-args", default="", help="options added to `sasflow worker`")
    ap.add_argument("--role", default="main", choices=["main", "submit", "inprocess"])
    ap.add_argument("--url", default="")
    a = ap.parse_args()
    if a.role == "submit":
        submit_all(a.url, a.n)
        return
    if a.role == "inprocess":
        run_inprocess(a.url)
        return
    srcs = [s or None for s in a.src.split(",")]
    modes = a.modes.split(",")
    runs: dict[str, list[dict[str, Any]]] = {}
    pgbench: list[float] = []
    for r in range(a.rounds):
        if a.pgbench_seconds > 0:
            tps = pgbench_c8(a.pgbench_seconds)
            if tps is not None:
                pgbench.append(tps)
        for mode in modes:
            # each tree first in turn: none always follows pgbench, or goes last
            for src in srcs[r % len(srcs):] + srcs[:r % len(srcs)]:
                key = f"{mode}@{src or 'this'}"
                runs.setdefault(key, []).append(
                    measure(mode, src, a.n, shlex.split(a.worker_args)))
    out: dict[str, Any] = {"peer": "sasflow", "backend": "pg", "bench": "pg_worker",
                           "n": a.n, "rounds": a.rounds, "server": server_settings(),
                           "worker_args": a.worker_args, "runs": runs}
    if pgbench:
        out["pgbench_c8_tps_median"] = statistics.median(pgbench)
        out["pgbench_c8_tps"] = pgbench
    first = f"{modes[0]}@{srcs[0] or 'this'}"
    for key, results in runs.items():
        good = [r for r in results if "error" not in r]
        pairs = [r["machine_less_bench_cpu_us_per_step"]
                 / f["machine_less_bench_cpu_us_per_step"]
                 for r, f in zip(results, runs[first], strict=True)
                 if "error" not in r and "error" not in f]
        if good:
            rate = statistics.median(r["steps_per_s"] for r in good)
            out[key] = {"steps_per_s_median": rate,
                        "machine_less_bench_cpu_us_per_step_median": statistics.median(
                            r["machine_less_bench_cpu_us_per_step"] for r in good),
                        "machine_cpu_us_per_step_median": statistics.median(
                            r["machine_cpu_us_per_step"] for r in good),
                        "own_cpu_us_per_step_median": statistics.median(
                            r["own_cpu_us_per_step"] for r in good),
                        "paired_machine_cpu_ratio_median": round(statistics.median(pairs), 3)
                        if pairs else None,
                        "of_pgbench_c8": round(rate / statistics.median(pgbench), 3)
                        if pgbench else None}
    C.emit(out)


if __name__ == "__main__":
    main()

"""What an idle `sasflow worker` costs on PostgreSQL: its CPU, its backends' CPU and
the transactions it commits a second, with no task to run.

Each round, per tree (``--src ,/path/to/other/checkout``: this tree and that one,
first in turn): a fresh database and private broker queues (distributed.py's
Deployment), one ``sasflow worker`` with ``--roles`` over ``--transport``,
started and left to settle (its queue consumed, then `--settle` seconds), then
watched for `--seconds`: the worker's CPU (/proc/PID/stat), that of the server
backends connected to its database, and the database's committed transactions
(pg_stat_database, read once the worker stopped and its backends reported).
Medians per tree.

With --stream instead: the embedded default, an application on a SQLite file
with its roles started and `app.listen(queue)` waiting for a status that never
comes (the in-process queues read the outbox itself), in a child process; its CPU
over `--seconds`.

Usage: python bench/idle_worker.py [--rounds 3] [--seconds 20] [--settle 3]
           [--roles agent] [--transport amqp|redis] [--stream] [--src DIR,DIR]
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import common as C
from distributed import Deployment, Observer, agent_queue
from pg_worker import merge_cpu, own_cpu, process_cpu


def measure(transport: str, roles: str, src: str | None, seconds: float,
            settle: float) -> dict[str, float]:
    if src:
        os.environ["PYTHONPATH"] = os.path.join(src, "src")
    else:
        os.environ.pop("PYTHONPATH", None)
    with Deployment(transport) as d:
        proc = d.spawn(roles, d.instance("idle"))
        d.wait_consumers(agent_queue(d.agent), 1, [proc])
        time.sleep(settle)  # its start-up done: migrations, first beat, listeners
        watch = Observer(d.store_url, "")
        try:
            commits0 = _commits(watch, d.db)
            cpu0 = own_cpu(watch, d.db, proc.pid)
            cpu1 = dict(cpu0)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(0.5)
                merge_cpu(cpu1, own_cpu(watch, d.db, proc.pid))
            C.stop_proc(proc)
            time.sleep(1.0)  # the backends' last counts reach pg_stat_database
            commits = _commits(watch, d.db) - commits0
        finally:
            watch.close()
    worker = cpu1[proc.pid] - cpu0[proc.pid]
    backends = sum(cpu - cpu0.get(pid, 0.0) for pid, cpu in cpu1.items() if pid != proc.pid)
    return {"worker_cpu_ms_per_s": round(worker / seconds * 1e3, 2),
            "backends_cpu_ms_per_s": round(backends / seconds * 1e3, 2),
            # (the stop's own commits included: a few, alike for every tree)
            "commits_per_s": round(commits / seconds, 2)}


def measure_stream(src: str | None, seconds: float, settle: float) -> dict[str, float]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.path.join(src, "src")
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.Popen([sys.executable, __file__, "--role", "stream", "--url",
                                 C.store_url(os.path.join(scratch, "idle.db"))],
                                env=env, cwd=C.HERE, stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            proc.stdout.readline()  # "listening"
            time.sleep(settle)
            cpu0 = process_cpu(proc.pid)
            time.sleep(seconds)
            cpu = process_cpu(proc.pid) - cpu0
        finally:
            C.stop_proc(proc)
    return {"app_cpu_ms_per_s": round(cpu / seconds * 1e3, 2)}


def run_stream(url: str) -> None:
    """An application's roles, and a listener of a status queue nothing is sent to."""
    import threading

    from workload import make_app
    app = make_app(url)
    app.start()
    listening = app.listen("nobody-sends-here")
    threading.Thread(target=lambda: next(iter(listening), None), daemon=True).start()
    print("listening", flush=True)
    threading.Event().wait()


def _commits(watch: Observer, db: str) -> int:
    row = watch.conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                             (db,)).fetchone()
    return int(row[0]) if row else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--roles", default="agent")
    ap.add_argument("--transport", default="amqp", choices=["amqp", "redis"])
    ap.add_argument("--stream", action="store_true",
                    help="the embedded default's status stream instead (SQLite)")
    ap.add_argument("--src", default="", help="other checkouts to measure, comma-separated"
                    " (empty: this tree)")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "stream":
        run_stream(a.url)
        return
    srcs = [s or None for s in a.src.split(",")]
    runs: dict[str, list[dict[str, float]]] = {}
    for r in range(a.rounds):
        for src in srcs[r % len(srcs):] + srcs[:r % len(srcs)]:
            runs.setdefault(src or "this", []).append(
                measure_stream(src, a.seconds, a.settle) if a.stream
                else measure(a.transport, a.roles, src, a.seconds, a.settle))
    C.emit({"peer": "sasflow", "backend": "sqlite" if a.stream else "pg",
            "bench": "idle_worker", "stream": a.stream,
            "transport": a.transport, "roles": a.roles, "seconds": a.seconds,
            "rounds": a.rounds, "medians": {
                tree: {key: statistics.median(run[key] for run in rs) for key in rs[0]}
                for tree, rs in runs.items()}, "runs": runs})


if __name__ == "__main__":
    main()

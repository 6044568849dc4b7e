"""What one poison message costs a running worker (SPEC R3; issue 8, item 1.3).

Starts a real ``sasflow worker`` process (bench/agent_app.py, all roles, a fresh
SQLite store) on a broker transport, measures its CPU time over a window while
idle, then publishes one non-JSON body to its scheduler's reply queue and one to
its agent's request queue, waits for the positive signal (both are dead letters)
and measures the same window again. CPU time is read from /proc/PID/stat (user +
system ticks of the process, all its threads). Also counts the log lines the
worker wrote in each window.

  python bench/poison_cpu.py --transport redis|amqp [--window 10]

Prints one JSON line: ``{"poison_cpu": {transport: {idle_cpu_pct, poisoned_cpu_pct,
above_idle_pct, dead_lettered, log_lines_idle, log_lines_poisoned,
log_lines_since_injection, ...}}}``.
With ``--worker-src DIR`` the worker runs another checkout's sources (for the
figure before the fix; there no dead letter ever comes, so the second window
starts ``--patience`` seconds after the injection instead).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from common import emit, scratch_dir, stop_proc

from sasflow.transport import agent_queue, open_transport, reply_queue

HERE = Path(__file__).resolve().parent
URLS = {"redis": "redis://127.0.0.1:6379/15?prefix=bench-poison-{run}:",
        "amqp": "amqp://guest:guest@127.0.0.1:5672/?queue_expires=60"
                "&dead_letters=bench-poison-{run}.dead-letters"}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (/proc/PID/stat fields 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def lines(path: Path) -> int:
    return len(path.read_text(errors="replace").splitlines())


def window(pid: int, log: Path, seconds: float) -> tuple[float, int]:
    """CPU percent of one core over `seconds`, and the log lines written meanwhile."""
    cpu, logged, start = cpu_seconds(pid), lines(log), time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    return 100.0 * (cpu_seconds(pid) - cpu) / elapsed, lines(log) - logged


async def inject_and_wait(url: str, queues: tuple[str, str], patience: float) -> bool:
    """Publish the poison; True once both queues have a dead letter (False after patience)."""
    transport = open_transport(url)
    try:
        for queue, body in zip(queues, (b"{not json at all", b'{"task_id": 7}'), strict=True):
            await transport.publish(queue, body)
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            try:
                found = {d.queue for d in await transport.dead_letters()}
            except AttributeError:  # a transport from before dead letters
                found = set()
            if set(queues) <= found:
                return True
            await asyncio.sleep(0.05)
        return False
    finally:
        await transport.close()


def measure(kind: str, a: argparse.Namespace) -> dict[str, Any]:
    run = uuid.uuid4().hex[:10]
    url = URLS[kind].format(run=run)
    agent, instance = f"bench-poison-{run}", f"bench-poison-{run}"
    scratch = Path(scratch_dir(f"poison-{run}"))
    log = scratch / "worker.log"
    env = {**os.environ, "SASFLOW_BENCH_AGENT": agent,
           "PYTHONPATH": os.pathsep.join(filter(None, [a.worker_src, str(HERE)]))}
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "sasflow.cli", "worker", f"{HERE / 'agent_app.py'}:app",
             "--store", f"sqlite:///{scratch / 'store.db'}", "--transport", url,
             "--instance-id", instance],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while "starting" not in log.read_text():
            if worker.poll() is not None or time.monotonic() > deadline:
                return {"error": "the worker did not start", "log": log.read_text()[-800:]}
            time.sleep(0.05)
        time.sleep(1.0)  # past start-up: connections open, consumers registered
        idle, idle_lines = window(worker.pid, log, a.window)
        queues = (reply_queue(instance), agent_queue(agent))
        before = lines(log)
        dead = asyncio.run(inject_and_wait(url, queues, a.patience))
        poisoned, poisoned_lines = window(worker.pid, log, a.window)
        since_injection = lines(log) - before
        return {"idle_cpu_pct": round(idle, 2), "poisoned_cpu_pct": round(poisoned, 2),
                "above_idle_pct": round(poisoned - idle, 2), "dead_lettered": dead,
                "log_lines_idle": idle_lines, "log_lines_poisoned": poisoned_lines,
                "log_lines_since_injection": since_injection,
                "log_bytes": log.stat().st_size, "window_s": a.window,
                "worker_src": a.worker_src or "this checkout"}
    finally:
        stop_proc(worker)
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=sorted(URLS), action="append")
    ap.add_argument("--window", type=float, default=10.0, help="seconds per measurement")
    ap.add_argument("--patience", type=float, default=10.0,
                    help="seconds to wait for the dead letters")
    ap.add_argument("--worker-src", default=None,
                    help="run the worker from this source directory (e.g. a checkout of main)")
    a = ap.parse_args()
    emit({"peer": "sasflow", "poison_cpu": {
        kind: measure(kind, a) for kind in (a.transport or sorted(URLS))}})


if __name__ == "__main__":
    main()

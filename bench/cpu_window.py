"""The machine's CPU while a benchmark runs, whole and by process, in a window of its run.

Starts COMMAND, waits --start seconds (its set-up over: servers started,
warm-up done), then reads the machine's busy CPU time (/proc/stat) and every
process's (/proc/PID/stat: user + system) at the start and at the end of a
--window-second window, and prints the busy cores and each process's CPU seconds
in the window, by command line (a process tree's children share their parent's).
COMMAND runs on to its end; its last output line (a benchmark's JSON) is kept.

What it is for: a latency run (one task at a time) is a chain of processes
handing a task on; the busy cores times the mean latency is the CPU a task
costs, all processes and servers included, and the processes' shares tell whose
it is. Run it on sasflow's and a peer's latency run alike, with enough tasks that
the window falls inside the measured loop.

Usage: python bench/cpu_window.py [--start 20] [--window 10] -- COMMAND...
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import time

import common as C

TICKS = os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, tuple[str, float]]:
    """Every process's command line (or name) and CPU seconds so far."""
    found: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = command or stat[stat.index("(") + 1:stat.rindex(")")]
        found[int(entry)] = (name[:100], (int(fields[11]) + int(fields[12])) / TICKS)
    return found


def machine() -> tuple[float, float]:
    """CPU seconds of the machine so far: all, and idle (idle + iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(n) for n in f.readline().split()[1:]]
    return sum(ticks) / TICKS, (ticks[3] + ticks[4]) / TICKS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=float, default=20.0)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=C.HERE)
    time.sleep(a.start)
    before, (all_before, idle_before) = processes(), machine()
    started = time.monotonic()
    time.sleep(a.window)
    after, (all_after, idle_after) = processes(), machine()
    window = time.monotonic() - started
    if run.poll() is not None:
        raise SystemExit("the command ended before the window did: give it more work")
    busy = (all_after - all_before) - (idle_after - idle_before)
    by_command: dict[str, float] = collections.defaultdict(float)
    for pid, (name, cpu) in after.items():
        if pid in before:
            by_command[name] += cpu - before[pid][1]
    output = run.communicate()[0].decode(errors="replace").strip().splitlines()
    busiest = sorted(by_command.items(), key=lambda item: -item[1])[:8]
    C.emit({"bench": "cpu_window", "command": " ".join(command), "window_s": round(window, 2),
            "busy_cores": round(busy / window, 3),
            "processes": {name: round(cpu, 2) for name, cpu in busiest if cpu >= 0.05},
            "result": json.loads(output[-1]) if output and output[-1].startswith("{") else None})


if __name__ == "__main__":
    main()

"""The demo's worker processes, as a platform runs them (`sasflow demo`).

Each worker is a ``sasflow worker`` process logging to a file of its own; the
demo starts them, finds the one holding the most tasks, SIGKILLs it and starts
a replacement (``--chaos``), notices one that died on its own, and always stops
them all on exit: SIGTERM first, SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

__all__ = ["Workers"]


class Workers:
    """The worker processes, each logging to its own file; always stopped on exit."""

    def __init__(self, command: Sequence[str], env: dict[str, str], logs: Path) -> None:
        self.command, self.env, self.logs = list(command), env, logs
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.killed: set[int] = set()
        self._files: list[Path] = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> int:
        log = self.logs / f"worker-{len(self._files) + 1}.log"
        self._files.append(log)
        with log.open("wb") as sink:
            proc = subprocess.Popen(self.command, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=sink, stderr=subprocess.STDOUT)
        self.procs[proc.pid] = proc
        return proc.pid

    def busiest(self, locked_by: list[str]) -> tuple[int, int]:
        """The live worker holding the most tasks (instance ids embed the pid)."""
        live = [pid for pid, p in self.procs.items() if p.poll() is None]
        held = {pid: sum(f"-{pid}-" in owner for owner in locked_by) for pid in live}
        victim = max(live, key=lambda pid: held[pid])
        return victim, held[victim]

    def replace(self, pid: int) -> int:
        self.killed.add(pid)
        self.procs[pid].send_signal(signal.SIGKILL)
        self.procs[pid].wait()
        return self.start()

    def crashed(self) -> tuple[int, int] | None:
        for pid, proc in self.procs.items():
            code = proc.poll()
            if code is not None and pid not in self.killed:
                return pid, code
        return None

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every worker, then SIGKILL whichever is still running after `grace`."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        end = time.monotonic() + grace
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def print_logs(self, out: TextIO, lines: int = 20) -> None:
        for log in self._files:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                print(f"--- {log.name} (last {len(tail)} lines)", file=out)
                print("\n".join(tail), file=out)


"""One child process of a test, and its log: the one process harness of the suite.

A `Process` is a `sasflow worker` (or an application script, or any command)
started with its stdout and stderr in a log file. The test can wait for a line
in that log, signal it, freeze (SIGSTOP) and thaw (SIGCONT) it, kill it
(SIGKILL), or stop it (SIGTERM, then its exit status). Every wait is bounded by
a hang guard and fails with the log; the clusters of support/ keep their
processes in a list and kill what is left at teardown, whatever happened.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from signal import SIGCONT, SIGKILL, SIGSTOP, SIGTERM
from typing import Self

import pytest

__all__ = ["HANG_GUARD", "Process", "proc_state"]

# How long a wait may last before it is called a hang: processes that start, stall
# and recover on a loaded 2-core machine are slow, never this slow. No wait here is
# a claim about speed; bench/ measures that.
HANG_GUARD = 120.0


class Process:
    """A child process whose output goes to `log`."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.popen = popen
        self.log = log

    @classmethod
    def spawn(cls, name: str, command: Sequence[str], log: Path, *,
              env: Mapping[str, str] | None = None, cwd: Path | None = None,
              echo_command: bool = False, stdout: bool = True) -> Self:
        """Start `command`; its stderr (and its stdout unless `stdout` is False) to `log`,
        after the command line itself when `echo_command`."""
        with log.open("wb") as out:
            if echo_command:
                out.write((" ".join(command) + "\n").encode())
                out.flush()
            popen = subprocess.Popen(
                list(command), env=None if env is None else dict(env), cwd=cwd,
                stdin=subprocess.DEVNULL, stdout=out if stdout else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if stdout else out)
        return cls(name, popen, log)

    # ------------------------------------------------------------ what it is
    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def text(self) -> str:
        """The log so far ('' before the process wrote it)."""
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 400, header: str = "") -> str:
        """The last `lines` of the log under a line naming the process and its state."""
        state = "running" if self.alive else f"exited {self.popen.returncode}"
        return (f"--- {self.name} (pid {self.pid}, {state}{header}) ---\n"
                + "\n".join(self.text().splitlines()[-lines:]))

    def proc_state(self) -> str:
        """The kernel's one-letter state of the process (T: stopped)."""
        return proc_state(self.pid)

    def connected_to(self, port: int) -> bool:
        """Whether the process has an established TCP connection to 127.0.0.1:`port`."""
        found = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
                               capture_output=True, text=True, check=False).stdout
        return f"pid={self.pid}," in found

    # ------------------------------------------------------------ waiting
    def wait_for_line(self, *fragments: str, timeout: float = HANG_GUARD,
                      exited_ok: bool = False) -> str:
        """Until the log holds one of `fragments`; returns the log. Fails if the process
        exits first (unless `exited_ok`: then returns its whole log) or after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if any(fragment in text for fragment in fragments):
                return text
            if not self.alive:
                if exited_ok:
                    return self.text()
                pytest.fail(f"{self.name} exited ({self.popen.returncode}) before it logged"
                            f" {fragments}:\n{self.text()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} did not log {fragments} within {timeout:.0f}s:\n"
                            f"{self.text()}", pytrace=False)
            time.sleep(0.02)

    # ------------------------------------------------------------ signals
    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def freeze(self) -> float:
        """SIGSTOP, and wait until the kernel shows it stopped; returns when it was."""
        os.kill(self.pid, SIGSTOP)
        deadline = time.monotonic() + 10
        while self.proc_state() != "T":
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not stop on SIGSTOP")
            time.sleep(0.001)
        return time.time()

    def thaw(self) -> float:
        """SIGCONT; returns a time before it could run again."""
        at = time.time()
        os.kill(self.pid, SIGCONT)
        return at

    def kill(self) -> float:
        """SIGKILL (which ends a frozen process too) and reap; returns a time by which it
        was certainly dead."""
        if self.alive:
            os.kill(self.pid, SIGKILL)
        self.popen.wait(timeout=30)
        return time.time()

    def stop(self, sig: int = SIGTERM, timeout: float = HANG_GUARD) -> int | None:
        """Ask it to stop (`sig`) and wait for its exit status. After `timeout` (a hang
        guard) it is SIGKILLed, and None says it did not stop."""
        if self.alive:
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of process `pid` (/proc/PID/stat's third field)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def kill_all(processes: Sequence[Process]) -> None:
    """SIGKILL every live one at once, then reap each (teardown, whatever happened)."""
    for process in processes:
        if process.alive:
            os.kill(process.pid, SIGKILL)
    for process in processes:
        process.popen.wait(timeout=30)

"""A process-isolated agent call does not outlive the agent's process (SPEC S5, M5)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from support import APPS
from support.process import Process

APP = APPS / "isolatedagent.py"

pytestmark = pytest.mark.chaos


def running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie nobody reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(done: Callable[[], bool], what: str, guard: float = 60.0) -> None:
    """Poll `done()` until true; the guard only stops a hang."""
    give_up = time.monotonic() + guard
    while not done():
        assert time.monotonic() < give_up, f"still waiting for {what}"
        time.sleep(0.01)


def test_a_sigkilled_agent_takes_its_hung_call_with_it(tmp_path: Path) -> None:
    """SIGKILL of the process that serves the agent: the worker process running its
    hung call dies too, so the call can never apply its effect after the deadline
    that nobody is left to enforce."""
    noted = tmp_path / "hung.pid"
    agent = Process.spawn("agent", [sys.executable, str(APP), str(tmp_path)],
                          tmp_path / "agent.log")
    hung = 0
    try:
        wait_until(noted.exists, "the call to start")
        hung = int(noted.read_text())
        assert running(hung)
        agent.signal(signal.SIGKILL)
        assert agent.popen.wait(timeout=60) == -signal.SIGKILL, agent.tail()
        wait_until(lambda: not running(hung), f"worker process {hung} to die")
        assert not (tmp_path / "shipped").exists()
    finally:
        agent.kill()
        if hung and running(hung):
            with contextlib.suppress(ProcessLookupError):
                os.kill(hung, signal.SIGKILL)

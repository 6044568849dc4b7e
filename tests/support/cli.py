"""Runs the `sasflow` command line as a real subprocess, against a fresh SQLite store.

`cli(...)` runs one command and returns its exit status and output; `cli.worker(...)`
starts `sasflow worker` in the background and stops it with a signal. Waiting for a
task uses the command line too (`tasks show --json`), so these tests see what an
operator sees; only `snapshot()` reads the SQLite file itself, every row of every
table, to prove that a refused command wrote nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support import APPS
from support.process import Process

SHOP = f"{APPS / 'shopapp.py'}:app"  # the path form of APP; tests also use shopapp:app
COMMAND = [sys.executable, "-m", "sasflow.cli"]
WAIT = 120.0  # seconds: a hang guard for a loaded 2-core machine, not a claim about speed


@dataclass(frozen=True)
class Result:
    status: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.status == 0, self.err
        return json.loads(self.out)

    def one_error_line(self) -> str:
        """The error, asserting it is one `sasflow: error:` line with no traceback."""
        lines = self.err.splitlines()
        assert len(lines) == 1, f"expected one line on stderr, got: {self.err!r}"
        assert lines[0].startswith("sasflow: error: "), lines[0]
        return lines[0]


class Worker(Process):
    """`sasflow worker` in the background, its log (stderr) in a file."""

    @classmethod
    def start(cls, cli: Cli, args: tuple[str, ...], cwd: Path, ready: str | None) -> Worker:
        cli.workers += 1
        worker = cls.spawn(f"worker-{cli.workers}", [*COMMAND, "worker", *args],
                           cli.home / f"worker-{cli.workers}.log", env=cli.env, cwd=cwd,
                           stdout=False)
        if ready is not None:
            # until it has logged this, a signal would find the interpreter still starting
            worker.wait_for_log(ready)
        return worker

    def wait_for_log(self, fragment: str) -> None:
        self.wait_for_line(fragment, timeout=WAIT)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT) -> int:
        """Signal the worker and return its exit status."""
        status = super().stop(sig, timeout)
        if status is None:
            pytest.fail(f"the worker did not stop on signal {sig}: {self.text()}")
        return status


class Cli:
    """Runs `python -m sasflow.cli` with SASFLOW_STORE pointing at this test's store."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.db = home / "tasks.db"
        self.store = f"sqlite:///{self.db}"
        # a developer's own SASFLOW_* settings must not change what the tests see
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SASFLOW_")}
        self.env["SASFLOW_STORE"] = self.store
        self.workers = 0
        self._running: list[Worker] = []

    def __call__(self, *args: str, env: dict[str, str] | None = None,
                 cwd: Path | None = None, stdin: str | None = None) -> Result:
        done = subprocess.run([*COMMAND, *args], cwd=cwd or self.home,
                              env={**self.env, **(env or {})}, input=stdin or "",
                              capture_output=True, text=True, timeout=WAIT)
        assert "Traceback" not in done.stderr, done.stderr
        return Result(done.returncode, done.stdout, done.stderr)

    def worker(self, *args: str, cwd: Path | None = None,
               ready: str | None = "starting") -> Worker:
        """Start a worker; wait until it logs `ready` (None: when logging below INFO)."""
        started = Worker.start(self, ("--supervisor-interval", "0.1", *args), cwd or self.home,
                               ready)
        self._running.append(started)
        return started

    def task(self, task_id: str, *, history: bool = False) -> dict[str, Any]:
        flags = ("--history",) if history else ()
        task: dict[str, Any] = self("tasks", "show", task_id, "--json", *flags).json()
        return task

    def tasks(self, *args: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self("tasks", "list", "--json", *args).json()
        return found

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table of the store: to check a refused command wrote nothing."""
        assert self.db.exists(), "seed the store first: there is nothing to compare"
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)) as db:
            tables = [r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
            return {t: sorted(db.execute(f'SELECT * FROM "{t}"'), key=repr) for t in tables}

    def wait_for(self, task_id: str, state: str, worker: Worker | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT
        while True:
            task = self.task(task_id)
            if task["state"] == state:
                return task
            if time.monotonic() > deadline:
                log = worker.text() if worker is not None else ""
                pytest.fail(f"task {task_id} is {task['state']}, not {state}: {task}\n{log}")
            time.sleep(0.05)

    def close(self) -> None:
        for worker in self._running:
            worker.kill()

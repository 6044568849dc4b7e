"""The chaos scenarios' world: real worker processes over one SQLite file.

A Cluster is one scenario's world: a fresh store file, an effects file the
agents append to (see apps/chaosapp.py), an App in the test process to submit
tasks, and the worker processes it spawned. Every wait is bounded and fails
with the store's state and the workers' logs; every process is killed at
teardown, whatever happened.
"""

from __future__ import annotations

import abc
import json
import os
import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import chaosapp

from sasflow import App
from support import APPS, waiting
from support.process import Process, kill_all

T = TypeVar("T")

ALL_ROLES = ("scheduler", "agent", "supervisor")


@dataclass(frozen=True)
class Effect:
    """One line of the effects file."""

    event: str  # start | end | hang
    task: str
    step: str
    phase: str  # do | undo
    key: str
    pid: int
    at: float


@dataclass(frozen=True)
class History:
    """One row of the store's history table."""

    id: int
    task_id: str
    step: str | None
    phase: str | None
    at: float
    actor: str
    epoch: int
    from_state: str | None
    to_state: str
    why: str | None

    @property
    def expiry(self) -> bool:
        """A supervisor's recovery of an expired task (a task row, not a unit row)."""
        return self.step is None and "expired" in (self.why or "")


class Worker(Process):
    """A worker process running an application of apps/ with some roles; its name is
    also its instance id."""


class World(abc.ABC):
    """What every chaos cluster has: worker processes writing to one effects file, an
    App in the test process, and the store's tables read through `query`. How the
    workers are started and the store reached is the subclass's (Cluster: SQLite;
    support.dist.DistCluster: PostgreSQL and a broker)."""

    def __init__(self, root: Path, store_url: str, app: App) -> None:
        self.root = root
        self.store_url = store_url
        self.effects_path = root / "effects.log"
        self.effects_path.touch()
        self.remote_url: str | None = None
        self.workers: list[Worker] = []
        self.app = app

    @abc.abstractmethod
    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of the store's tables; the SQL is SQLite's (``?`` parameters)."""

    def close(self) -> None:
        try:
            kill_all(self.workers)
        finally:
            self.app.close()

    # ------------------------------------------------------------ tasks
    def submit(self, workflow: str, inputs: dict[str, Any]) -> list[str]:
        return [self.app.submit(workflow, payload, task_id=task_id)
                for task_id, payload in inputs.items()]

    # ------------------------------------------------------------ observation
    def effects(self) -> list[Effect]:
        found = []
        for line in self.effects_path.read_text().splitlines():
            event, task, step, phase, key, pid, at = line.split()
            found.append(Effect(event, task, step, phase, key, int(pid), float(at)))
        return found

    def states(self) -> Counter[str]:
        return Counter(dict(self.query("SELECT state, COUNT(*) FROM tasks GROUP BY state")))

    def tasks(self) -> dict[str, tuple[str, str | None, int, int]]:
        """task_id -> (state, locked_by, failure_count, epoch)."""
        rows = self.query("SELECT task_id, state, locked_by, failure_count, epoch FROM tasks")
        return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}

    def history(self) -> list[History]:
        rows = self.query("SELECT id, task_id, step, phase, at, actor, epoch, from_state,"
                          " to_state, why FROM history_entries ORDER BY id, part")
        return [History(*row) for row in rows]

    def results(self, step: str) -> dict[str, Any]:
        """task_id -> the committed result of `step`."""
        rows = self.query("SELECT task_id, result FROM steps WHERE phase = 'do' AND name = ?",
                          (step,))
        return {r[0]: None if r[1] is None else json.loads(r[1]) for r in rows}

    def lease(self) -> tuple[str, int] | None:
        rows = self.query("SELECT holder, epoch FROM leases WHERE name = 'supervisor'")
        return (rows[0][0], rows[0][1]) if rows else None

    def all_in(self, states: Iterable[str], total: int) -> bool:
        counts = self.states()
        return sum(counts[s] for s in states) == total

    def wait_for(self, what: str, condition: Callable[[], T], timeout: float,
                 poll: float = 0.02) -> T:
        """Poll `condition` until it is truthy; fail after `timeout` s saying what is missing."""
        return waiting.wait_for(what, condition, timeout=timeout, poll=poll,
                                explain=self.diagnostics)

    def in_flight(self, pid: int, step: str | None = None, phase: str = "do") -> set[str]:
        """Tasks whose unit `pid` started and has not finished, by the effects file."""
        started, ended = set(), set()
        for e in self.effects():
            if e.pid != pid or e.phase != phase or (step is not None and e.step != step):
                continue
            if e.event == "start":
                started.add((e.task, e.step))
            elif e.event == "end":
                ended.add((e.task, e.step))
        return {task for task, _ in started - ended}

    def completions(self, to_state: str = "completed"
                    ) -> Counter[tuple[str, str | None, str | None]]:
        """How many times each (task, step, phase) unit moved to `to_state`, by the history."""
        return Counter((h.task_id, h.step, h.phase) for h in self.history()
                       if h.step is not None and h.to_state == to_state)

    def diagnostics(self) -> str:
        """The store's state, and each worker's log tail with its threads' stacks."""
        for worker in self.workers:
            if worker.alive:
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGUSR1)
                worker.signal(signal.SIGUSR2)
        time.sleep(0.3)
        lines = [f"task states: {dict(self.states())}", f"lease: {self.lease()}"]
        lines += [worker.tail() for worker in self.workers]
        return "\n".join(lines)


class Cluster(World):
    """Worker processes running an application script of apps/ over one SQLite file."""

    def __init__(self, root: Path) -> None:
        store_url = f"sqlite:///{root / 'store.db'}"
        super().__init__(root, store_url, chaosapp.build_app(store_url))
        self.db = root / "store.db"
        assert self.app._store is not None  # creates and migrates the file before any worker

    def spawn(self, name: str, *, roles: Iterable[str] = ALL_ROLES, concurrency: int = 32,
              slow: float | None = None, hang_at: Iterable[str] = (),
              script: str = "chaosapp.py") -> Worker:
        """A worker process running `script` (an application of apps/) with these roles."""
        env = dict(os.environ)
        env.update({chaosapp.EFFECTS_ENV: str(self.effects_path),
                    chaosapp.PARENT_ENV: str(os.getpid()),
                    chaosapp.HANG_ENV: ",".join(hang_at),
                    "PYTHONUNBUFFERED": "1"})
        if slow is not None:
            env[chaosapp.SLOW_ENV] = str(slow)
        if self.remote_url is not None:
            env[chaosapp.REMOTE_ENV] = self.remote_url
        worker = Worker.spawn(
            name, [sys.executable, str(APPS / script), "--store", self.store_url,
                   "--instance-id", name, "--roles", ",".join(roles),
                   "--concurrency", str(concurrency), "--interval", str(chaosapp.INTERVAL)],
            self.root / f"{name}.log", env=env)
        self.workers.append(worker)
        return worker

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

"""A scenario's world: ``sasflow worker`` processes over a private PostgreSQL and broker.

A Cluster starts worker processes running scenarioapp.py, each logging to a
file under the test's tmp dir, and reads the store directly with psycopg (a
read that fails while PostgreSQL restarts is simply tried again later). Every
wait is bounded; every process is SIGKILLed at teardown, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import scenarioapp

from support import APPS, waiting
from support.process import Process, kill_all
from support.servers import PrivatePostgres, PrivateRabbit, PrivateRedis

APP_FILE = APPS / "scenarioapp.py"
APP_REF = f"{APP_FILE}:app"

T = TypeVar("T")


class Worker(Process):
    """One ``sasflow worker`` process; its name is also its instance id."""

    def __init__(self, name: str, roles: str, agents: str | None,
                 popen: subprocess.Popen[bytes], log: Path) -> None:
        super().__init__(name, popen, log)
        self.roles = roles
        self.agents = agents
        self.killed = False  # by the scenario, on purpose
        self.stopped = False  # SIGTERMed by the scenario, at the end

    def kill(self) -> float:
        """SIGKILL and reap."""
        self.killed = True
        return super().kill()

    def wait_stopped(self, timeout: float) -> None:
        """Wait for the exit that a SIGTERM asked for; SIGKILL after `timeout` (a hang
        guard: the exit status then says it did not stop)."""
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def tail(self, lines: int = 60, header: str = "") -> str:
        if self.killed:
            header += ", SIGKILLed by the scenario"
        elif self.stopped:
            header += ", SIGTERMed by the scenario"
        agents = f"; agents {self.agents}" if self.agents else ""
        return super().tail(lines, f"{header}; roles {self.roles}{agents}; log {self.log}")


@dataclass
class Postgres:
    server: PrivatePostgres
    url: str  # this test's database


@dataclass
class Broker:
    kind: str  # rabbitmq | redis | redis-volatile
    server: PrivateRabbit | PrivateRedis
    transport_url: str

    def restart(self) -> float:
        """Crash the broker (SIGKILL) and start it again on the same data; the downtime."""
        if isinstance(self.server, PrivateRabbit):
            return self.server.restart(crash=True)
        return self.server.restart()

    @property
    def keeps_data(self) -> bool:
        return isinstance(self.server, PrivateRabbit) or self.server.persistent


class StoreReader:
    """Read-only queries on the store's database; None while it cannot be reached.

    The SQL is PostgreSQL's (``%s`` parameters); on a ``sqlite:///PATH`` store the
    same queries run on the file, each in a connection of its own.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[Any] | None = None
        self._sqlite = url[len("sqlite:///"):] if url.startswith("sqlite:///") else None

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]] | None:
        if self._sqlite is not None:
            return self._sqlite_rows(sql.replace("%s", "?"), params)
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
            return self._conn.execute(sql, params).fetchall()
        except psycopg.OperationalError:
            self.close()
            return None

    def _sqlite_rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]] | None:
        assert self._sqlite is not None
        try:
            conn = sqlite3.connect(f"file:{self._sqlite}?mode=ro", uri=True, timeout=5)
        except sqlite3.OperationalError:
            return None
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError:  # locked, or a disk the test filled
            return None
        finally:
            conn.close()

    def writable(self) -> bool:
        """Whether a write could start now. Only SQLite can say no: it has one writer,
        and a process stopped inside its write transaction holds every other
        process's writes until it resumes (PostgreSQL locks rows, not the store)."""
        if self._sqlite is None:
            return True
        try:
            conn = sqlite3.connect(self._sqlite, timeout=1.0, isolation_level=None)
        except sqlite3.OperationalError:
            return False
        try:
            conn.execute("BEGIN IMMEDIATE")  # the write lock, taken and given back at once
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:  # still locked after a second: held by a frozen one
            return False
        finally:
            conn.close()

    def must(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows, retrying for up to 20 s (the store may be restarting)."""
        deadline = time.monotonic() + 20
        while True:
            found = self.rows(sql, params)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"the store at {self.url} stayed unreachable for 20s")
            time.sleep(0.1)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


class Cluster:
    def __init__(self, root: Path, store_url: str, transport_url: str, remote_url: str) -> None:
        self.root = root
        self.store_url = store_url
        self.transport_url = transport_url
        self.remote_url = remote_url
        self.workers: list[Worker] = []
        self.db = StoreReader(store_url)

    # ------------------------------------------------------------ processes
    def spawn(self, name: str, roles: str, agents: Iterable[str] = (), *,
              concurrency: int = 32, interval: float = 0.25, store: str | None = None,
              transport: str | None = None, extra_env: dict[str, str] | None = None) -> Worker:
        """A ``sasflow worker`` process; `store` and `transport` default to the cluster's
        (a test gives its own to route one worker through a fault proxy)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SASFLOW_")}
        env.update({scenarioapp.REMOTE_ENV: self.remote_url,
                    scenarioapp.PARENT_ENV: str(os.getpid()),
                    "PYTHONUNBUFFERED": "1", **(extra_env or {})})
        agent_list = ",".join(agents) or None
        command = [sys.executable, str(APP_FILE), "worker", APP_REF, "--roles", roles,
                   "--store", store or self.store_url,
                   "--transport", transport or self.transport_url,
                   "--instance-id", name, "--concurrency", str(concurrency),
                   "--supervisor-interval", str(interval), "--log-level", "info"]
        if agent_list:
            command += ["--agents", agent_list]
        process = Process.spawn(name, command, self.root / f"{name}.log", env=env, cwd=APPS,
                                echo_command=True)
        worker = Worker(name, roles, agent_list, process.popen, process.log)
        self.workers.append(worker)
        return worker

    def worker(self, name: str) -> Worker:
        return next(w for w in self.workers if w.name == name)

    def died_on_their_own(self) -> list[Worker]:
        return [w for w in self.workers if not w.killed and not w.stopped and not w.alive]

    def stop(self, timeout: float = 60.0) -> list[Worker]:
        """Stop every live worker cleanly, all at once; those that did not exit 0."""
        live = [w for w in self.workers if w.alive]
        for worker in live:
            worker.stopped = True
            os.kill(worker.pid, signal.SIGTERM)
        for worker in live:
            worker.wait_stopped(timeout)
        return [w for w in live if w.popen.returncode != 0]

    def close(self) -> None:
        try:
            kill_all(self.workers)
        finally:
            self.db.close()

    # ------------------------------------------------------------ observation
    def states(self) -> Counter[str] | None:
        rows = self.db.rows("SELECT state, COUNT(*) FROM tasks GROUP BY state")
        return None if rows is None else Counter({r[0]: int(r[1]) for r in rows})

    def locked_by(self) -> Counter[str]:
        rows = self.db.rows("SELECT locked_by, COUNT(*) FROM tasks"
                            " WHERE locked_by IS NOT NULL GROUP BY locked_by") or []
        return Counter({r[0]: int(r[1]) for r in rows})

    def lease(self) -> tuple[str, int, float] | None:
        """The supervisor lease: (holder, epoch, expires_at), None if never taken."""
        rows = self.db.rows("SELECT holder, epoch, expires_at FROM leases"
                            " WHERE name = 'supervisor'")
        return (rows[0][0], int(rows[0][1]), float(rows[0][2])) if rows else None

    def claims(self, actor: str, since: float = 0.0) -> set[str]:
        """Tasks `actor` claimed (or took back to compensate) after `since`."""
        rows = self.db.must("SELECT DISTINCT task_id FROM history_entries WHERE actor = %s"
                            " AND step IS NULL AND at > %s AND why LIKE %s",
                            (actor, since, "claimed%"))
        return {r[0] for r in rows}

    def leader(self) -> str | None:
        """The supervisor holding an unexpired lease (stores and tests share a host clock)."""
        lease = self.lease()
        return lease[0] if lease is not None and lease[2] > time.time() else None

    def wait_for(self, what: str, condition: Callable[[], T | None], timeout: float,
                 poll: float = 0.1) -> T:
        return waiting.wait_for(what, condition, timeout=timeout, poll=poll,
                                explain=self.diagnostics)

    def diagnostics(self, lines: int = 60, *, stacks: bool = True) -> str:
        """The store's counts and every worker's log tail (with live ones' stacks: for a
        run that hangs)."""
        if stacks:
            for worker in self.workers:
                if worker.alive:
                    os.kill(worker.pid, signal.SIGUSR1)  # faulthandler: every thread's stack
            time.sleep(0.3)
        parts = [f"task states: {self.states()}", f"locked by: {dict(self.locked_by())}",
                 f"supervisor lease: {self.leader()}"]
        parts += [w.tail(lines) for w in self.workers]
        return "\n".join(parts)

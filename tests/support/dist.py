"""Distributed chaos scenarios: `sasflow worker` processes over PostgreSQL and a broker.

A private PostgreSQL schema, a private Redis key prefix or private RabbitMQ queue
names per test, and a `DistCluster` that spawns ``sasflow worker
apps/distapp.py:app`` with ``--store``/``--transport``/``--roles``/``--agents`` and
reads the store with psycopg. It shares support.chaos.World's observations
(history, leases, effects, bounded waits with diagnostics) over PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from chaosapp import EFFECTS_ENV, HANG_ENV, INTERVAL, PARENT_ENV, REMOTE_ENV, SLOW_ENV
from distapp import NAMESPACE_ENV, agent_name, build_app

from sasflow.supervisor import LEASE_NAME
from support import APPS
from support.chaos import ALL_ROLES, Worker, World
from support.services import POSTGRES, RABBITMQ, REDIS, require

SCHEMA_PREFIX = "chaosdist_"


# ------------------------------------------------------------------ private backends
@contextlib.contextmanager
def postgres_schema() -> Iterator[str]:
    """A store URL on a new empty schema of the local server's `test` database.

    Dropped afterwards; the name carries this process's id, so schemas left by a
    killed run are dropped by the next one (as tests/contract/conftest.py does).
    """
    require("postgres")
    name = f"{SCHEMA_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        stale = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname ~ %s",
                             (f"^{SCHEMA_PREFIX}[0-9]+_",)).fetchall()
        for (old,) in stale:
            if not os.path.exists(f"/proc/{old[len(SCHEMA_PREFIX):].split('_')[0]}"):
                conn.execute(f"DROP SCHEMA IF EXISTS {old} CASCADE")
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield f"{POSTGRES}?options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@contextlib.contextmanager
def private_transport(kind: str, namespace: str) -> Iterator[str]:
    """A transport URL no other test shares.

    Redis: a key prefix of its own, every key under it deleted afterwards (a short
    visibility timeout, so a dead agent's entries are taken over within the test).
    RabbitMQ: queue names are private already (agents and instance ids carry the
    namespace); the broker deletes the queues once unused for 20 s.
    """
    if kind in ("redis", "rabbitmq"):
        require(kind)
    if kind == "redis":
        import redis

        prefix = f"sasflow-chaos-{namespace}:"
        try:
            yield f"{REDIS}?prefix={prefix}&visibility_timeout=2"
        finally:
            with redis.Redis.from_url(REDIS) as admin:
                keys = list(admin.scan_iter(match=f"{prefix}*"))
                if keys:
                    admin.delete(*keys)
    elif kind == "rabbitmq":
        yield f"{RABBITMQ}?queue_expires=20"
    else:
        raise ValueError(f"unknown transport {kind!r}")


# ------------------------------------------------------------------ the harness
@dataclass(frozen=True)
class LogEvent:
    at: float
    worker: str
    message: str


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")


class DistCluster(World):
    """A Cluster of `sasflow worker` processes on a PostgreSQL store (and a broker)."""

    def __init__(self, root: Path, store_url: str, *, transport_url: str | None = None,
                 namespace: str | None = None) -> None:
        self.transport_url = transport_url
        self.namespace = namespace or uuid.uuid4().hex[:10]
        super().__init__(root, store_url, build_app(self.namespace, store_url))
        self.app.alerts(limit=1)  # opens the store: its tables exist before any worker starts
        self._conn: psycopg.Connection[Any] | None = None

    def agent(self, base: str) -> str:
        return agent_name(base, self.namespace)

    def instance(self, name: str) -> str:
        """The instance id of worker `name` (private reply queue names on a broker)."""
        return f"{name}-{self.namespace}"

    def spawn(self, name: str, *, roles: Iterable[str] = ALL_ROLES, concurrency: int = 32,
              slow: float | None = None, hang_at: Iterable[str] = (),
              agents: Iterable[str] | None = None) -> Worker:
        """``sasflow worker apps/distapp.py:app`` with these roles (and agents, by base name)."""
        env = dict(os.environ)
        env.update({EFFECTS_ENV: str(self.effects_path), PARENT_ENV: str(os.getpid()),
                    HANG_ENV: ",".join(hang_at), NAMESPACE_ENV: self.namespace,
                    "PYTHONPATH": os.pathsep.join([str(APPS), env.get("PYTHONPATH", "")]),
                    "PYTHONUNBUFFERED": "1"})
        if slow is not None:
            env[SLOW_ENV] = str(slow)
        if self.remote_url is not None:
            env[REMOTE_ENV] = self.remote_url
        command = [sys.executable, "-m", "sasflow.cli", "worker", f"{APPS / 'distapp.py'}:app",
                   "--store", self.store_url, "--roles", ",".join(roles),
                   "--instance-id", self.instance(name), "--concurrency", str(concurrency),
                   "--supervisor-interval", str(INTERVAL), "--log-level", "info"]
        if self.transport_url is not None:
            command += ["--transport", self.transport_url]
        if agents is not None:
            command += ["--agents", ",".join(self.agent(a) for a in agents)]
        worker = Worker.spawn(self.instance(name), command, self.root / f"{name}.log", env=env,
                              cwd=self.root)
        self.workers.append(worker)
        return worker

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.store_url, autocommit=True)
        statement = sql.replace("?", "%s")  # Cluster's SQL is SQLite's
        return self._conn.execute(statement, params).fetchall()

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._conn is not None:
                self._conn.close()

    def lease_row(self) -> tuple[str, int, float] | None:
        """(holder, epoch, expires_at) of the supervisor lease."""
        rows = self.query("SELECT holder, epoch, expires_at FROM leases WHERE name = ?",
                          (LEASE_NAME,))
        return (rows[0][0], rows[0][1], rows[0][2]) if rows else None

    def started(self, worker: Worker) -> bool:
        """The worker logged its start line (its app is loaded and its roles start now)."""
        return any(e.message.startswith(f"worker {worker.name} starting")
                   for e in self.log_events(worker))

    def log_events(self, worker: Worker) -> list[LogEvent]:
        """The worker's log lines, with their time (the CLI's format: local time, ms)."""
        events = []
        with contextlib.suppress(FileNotFoundError):
            for line in worker.log.read_text(errors="replace").splitlines():
                match = _LOG_LINE.match(line)
                if match:
                    at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    events.append(LogEvent(at, worker.name, match[2]))
        return events

    def leading(self, worker: Worker) -> list[LogEvent]:
        """When `worker`'s supervisor said it took the lead ('leading') or lost it."""
        return [e for e in self.log_events(worker)
                if e.message.startswith(f"supervisor {worker.name}: ")]

    def diagnostics(self) -> str:
        try:
            return super().diagnostics()
        except Exception as error:  # the store itself may be what failed
            return f"(diagnostics failed: {error!r})\n" + "\n".join(w.tail() for w in self.workers)

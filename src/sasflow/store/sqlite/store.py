"""The embedded state store: one SQLite file in WAL mode (SPEC S10, M1).

Writes go through one writer thread per process that group-commits whatever is
waiting (writer.py); reads use their own connections and never wait for it.
Several processes may share the file: `BEGIN IMMEDIATE` makes each claim and
each fenced transition atomic across them, and they wake each other through a
channel beside the file (wake.py). The file is private to its owner and its
errors are StoreErrors (connections.py); the transaction an error interrupted
leaves nothing behind.

SQLite assumes one machine and one clock: every process sharing the file reads
this host's clock.

Durability is the `synchronous` setting, chosen in the URL:
``sqlite:///tasks.db?synchronous=normal`` (the default; survives a process
crash) or ``?synchronous=full`` (also survives a power loss, one fsync a commit).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from sasflow.errors import ConfigurationError, StoreError
from sasflow.loop_calls import tell
from sasflow.model import Task, claimable, terminal
from sasflow.redact import redact
from sasflow.store.interfaces import ClaimRule
from sasflow.store.records import NewTask
from sasflow.store.rows import (
    Row,
    attach_steps,
    claim_transition,
    claimed_at_submission,
    reports_status,
    task_from_row,
)
from sasflow.store.sql_store import SQLStore, Statement
from sasflow.store.sqlite import migrations, writes
from sasflow.store.sqlite.connections import (
    Checkpointer,
    bind,
    connect,
    create_private,
    store_error,
)
from sasflow.store.sqlite.wake import WakeChannel
from sasflow.store.sqlite.writer import Writer
from sasflow.transition import Transition

__all__ = ["SQLiteStore"]

_T = TypeVar("_T")
_Q = writes.statements()
# How often an idle scheduler looks for work no wake-up told of (E1 submissions)
_LOOK_EVERY = 0.25
_SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL", "off": "OFF", "extra": "EXTRA"}
# reads that are one primary-key lookup: cheaper on the caller's thread than a hop
# to a thread and back (a read of a WAL file never waits for writers)
_QUICK = frozenset({"select_task", "next_expiry", "next_expiry_of"})


class SQLiteStore(SQLStore):
    """Tasks, steps, history, alerts, outbox and leases in one SQLite file."""

    def __init__(self, path: str, *, synchronous: str = "normal",
                 clock: Callable[[], float] | None = None, create: bool = True) -> None:
        if path in ("", ":memory:"):
            raise ConfigurationError("the SQLite store needs a file path (sqlite:///PATH)")
        if not create and not os.path.exists(path):
            raise StoreError(f"no SQLite store at {os.path.abspath(path)}")
        level = _SYNCHRONOUS.get(synchronous.lower())
        if level is None:
            raise ConfigurationError(
                f"unknown SQLite synchronous setting {synchronous!r}: use normal or full")
        self.path = os.path.abspath(path)
        self.synchronous = level
        self.clock = clock or time.time  # every process sharing the file reads this host's
        self.migrations_applied: list[str] = []  # by this process, for `sasflow db upgrade`
        self._readers = threading.local()
        self._deferred = writes.Deferred()
        create_private(self.path)
        self._writer = Writer(self._connect, prepare=self._prepare_writer,
                              translate=self._store_error, before_commit=self._deferred.flush,
                              after_rollback=self._deferred.clear)
        self._checkpointer = Checkpointer(self._connect)
        self._wake = WakeChannel(self.path)

    @classmethod
    def from_url(cls, url: str, *, clock: Callable[[], float] | None = None,
                 create: bool = True) -> SQLiteStore:
        parts = urlsplit(url)
        if parts.scheme != "sqlite" or parts.netloc:
            raise ConfigurationError(f"bad SQLite URL {redact(url)!r}: expected sqlite:///PATH")
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return cls(path, synchronous=options.get("synchronous", "normal"), clock=clock,
                   create=create)

    def now(self) -> float:
        return self.clock()

    # ------------------------------------------------------------ connections
    def _connect(self) -> sqlite3.Connection:
        return connect(self.path, self.synchronous)

    def _prepare_writer(self, conn: sqlite3.Connection) -> None:
        """WAL mode and the schema: each only read when already there, so that a
        process opening a ready store never waits for anyone's write lock."""
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"cannot put {self.path} in WAL mode (got {mode})")
        # the checkpointer thread copies the WAL back beside the writer; the writer's own
        # checkpoint, now rare and with little left to copy, lets the WAL start over
        conn.execute("PRAGMA wal_autocheckpoint = 4000")
        self.migrations_applied += migrations.migrate(conn)

    def _store_error(self, error: BaseException) -> BaseException:
        return store_error(self.path, error)

    def _reading(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        conn: sqlite3.Connection | None = getattr(self._readers, "conn", None)
        try:
            if conn is None:
                self._writer.wait_prepared()  # the schema is there before anyone reads it
                conn = self._readers.conn = self._connect()
            return fn(conn)
        except sqlite3.Error as error:
            raise self._store_error(error) from error

    async def _read(self, name: str, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        if name in _QUICK:
            return self._reading(fn)
        return await asyncio.to_thread(self._reading, fn)

    # ------------------------------------------------------------ statements
    async def _fetch(self, name: str, params: Mapping[str, Any]) -> Sequence[Row]:
        rows: Sequence[Row] = await self._read(
            name, lambda c: c.execute(_Q[name], bind(params)).fetchall())
        return rows

    async def _fetch_tasks(self, name: str, params: Mapping[str, Any]) -> list[Task]:
        return await self._read(
            name, lambda c: _with_steps(c, c.execute(_Q[name], bind(params))))

    async def _write(self, statements: Callable[[float], Sequence[Statement]]
                     ) -> list[Sequence[Row]]:
        def job(conn: sqlite3.Connection) -> list[Sequence[Row]]:
            return [conn.execute(_Q[name], bind(params)).fetchall()
                    for name, params in statements(self.now())]

        return await self._writer.run(job)

    # ------------------------------------------------------------ submission
    async def submit(self, task: NewTask, *, connection: Any = None) -> bool:
        if connection is not None:
            return self.submit_in(connection, task)
        def tell(created: bool) -> None:
            if created:
                self._wake.work(self.now())
                if reports_status(task):
                    self._wake.outbox()

        new = writes.submission(task, self.now())
        return await self._writer.run(lambda conn: writes.insert(conn, new),
                                      then=tell)

    async def submit_claimed(self, task: NewTask, owner: str, rule: ClaimRule
                             ) -> Task | None:
        # planned, and its rows made, before the job is queued (as PostgreSQL plans
        # it): that work then runs while the writer finishes the transaction in
        # progress, not after it in the submission's own
        now = self.now()
        claim, claimed = claimed_at_submission(rule, task, owner, now)
        new = writes.submission(task, now, claim)

        def job(conn: sqlite3.Connection) -> Task | None:
            return claimed if writes.insert(conn, new) else None

        def tell(created: Task | None) -> None:
            if created is not None and reports_status(task):
                self._wake.outbox()

        return await self._writer.run(job, then=tell)

    def submit_in(self, connection: sqlite3.Connection, task: NewTask) -> bool:
        """Write the task with the caller's connection, in the caller's transaction (E1)."""
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError("connection must be a sqlite3.Connection to the store's file")
        files = {row[2] for row in connection.execute("PRAGMA database_list") if row[2]}
        if self.path not in {os.path.abspath(f) for f in files}:
            raise ConfigurationError(
                f"connection is not to the store's database file {self.path}")
        factory = connection.row_factory
        connection.row_factory = sqlite3.Row  # the caller's, given back as it was
        try:
            # The store's first use may be inside this very transaction, which holds the
            # write lock: the schema then comes up through it, committed with the caller's
            # rows or rolled back with them. Under that lock no other process can be
            # migrating, so what is pending here is what is pending.
            scripts = migrations.pending(connection)
            if scripts:
                connection.execute("SAVEPOINT sasflow_migrate")
                migrations.apply_migrations(connection, scripts)
                connection.execute("RELEASE sasflow_migrate")
            return writes.insert(connection, writes.submission(task, self.now()))
        except sqlite3.Error as error:
            raise self._store_error(error) from error
        finally:
            connection.row_factory = factory

    # ------------------------------------------------------------ scheduler
    async def _claim(self, owner: str, limit: int, rules: Mapping[str, ClaimRule]
                     ) -> list[Task]:
        # only the versions declared here (R4): (workflow, version) of each rule
        shapes = [{"workflow": name, "version": rule.version} for name, rule in rules.items()]
        now = self.now()

        def probe(c: sqlite3.Connection) -> bool:
            return any(c.execute(_Q["probe_claimable"], {**shape, "now": now}).fetchone()
                       for shape in shapes)

        if not self._reading(probe):  # nothing to do: no write lock at all
            return []

        wrote_statuses = False

        def job(conn: sqlite3.Connection) -> list[Task]:
            nonlocal wrote_statuses
            self._deferred.flush(conn)  # read what earlier jobs of this batch wrote
            now = self.now()
            rows = [row for shape in shapes for row in conn.execute(
                _Q["select_claimable"], {**shape, "now": now, "limit": limit})]
            if len(shapes) > 1:  # the earliest runnable first, whatever their workflow
                rows = sorted(rows, key=lambda row: row["available_at"])[:limit]
            claimed = []
            for task in _with_steps(conn, rows):
                planned = claim_transition(rules[task.workflow], task, owner, now)
                if planned is not None and writes.apply(conn, planned[0], now,
                                                        self._deferred):
                    claimed.append(planned[1])
                    wrote_statuses |= reports_status(planned[0])
            return claimed

        def tell(_: list[Task]) -> None:
            if wrote_statuses:
                self._wake.outbox()

        return await self._writer.run(job, then=tell)

    async def apply(self, transition: Transition) -> bool:
        def tell(applied: bool) -> None:
            if applied:
                self._tell(transition)

        return await self._writer.run(
            lambda conn: writes.apply(conn, transition, self.now(), self._deferred), then=tell)

    def _tell(self, transition: Transition) -> None:
        """Wake the other processes sharing the file that wait for what it did (from the
        writer's thread, as soon as it is committed)."""
        if terminal(transition.state):
            self._wake.finished(transition.task_id)
        elif claimable(transition.state, transition.locked_by):
            self._wake.work(transition.available_at)
        if reports_status(transition):
            self._wake.outbox()

    # ------------------------------------------------------------ wake-ups
    async def watch(self, wake: Callable[[float], None]) -> None:
        """Call `wake(at)` when another process sharing the file submits or releases
        work (wake.py), and every `_LOOK_EVERY` seconds: a submission made in a
        caller's own transaction (E1) commits where the store cannot see it."""
        loop = asyncio.get_running_loop()

        def heard(at: float) -> None:
            tell(loop, wake, at)

        stop = self._wake.on_work(heard)
        try:
            while True:
                await asyncio.sleep(_LOOK_EVERY)
                wake(self.now())
        finally:
            stop()

    async def watch_outbox(self, written: Callable[[], None]) -> None:
        """Call `written()` when any process sharing the file, this one included, wrote
        status messages (wake.py). A submission in a caller's own transaction (E1)
        commits where the store cannot see it: the reader's own look finds it."""
        loop = asyncio.get_running_loop()
        stop = self._wake.on_outbox(lambda: tell(loop, written))
        written()  # for what came before it listened
        try:
            await loop.create_future()  # until cancelled
        finally:
            stop()

    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Call `finished(task_id)`, from another thread, when another process sharing
        the file ends a task; returns the unsubscribe."""
        return self._wake.on_finished(finished)

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        self._wake.close()
        self._writer.close()
        self._checkpointer.close()


def _with_steps(conn: sqlite3.Connection, rows: Iterable[Row]) -> list[Task]:
    tasks = {task.task_id: task for task in map(task_from_row, rows)}
    ids = list(tasks)
    if len(ids) == 1:
        attach_steps(tasks, conn.execute(_Q["select_steps_of"], {"task_id": ids[0]}))
        return list(tasks.values())
    for chunk in range(0, len(ids), 500):  # bounded lists
        attach_steps(tasks, conn.execute(_Q["select_steps"],
                                         bind({"task_ids": ids[chunk:chunk + 500]})))
    return list(tasks.values())

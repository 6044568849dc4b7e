"""The embedded state store: one SQLite file in WAL mode (SPEC S10, M1).

Writes go through one writer thread per process that group-commits whatever is
waiting (writer.py); reads use their own connections and never wait for it.
Several processes may share the file: `BEGIN IMMEDIATE` makes each claim and
each fenced transition atomic across them.

The file and its -wal and -shm companions are readable by their owner only
(R5): the store creates the file 0600, and SQLite gives the companions the
file's own mode. A full disk or an I/O error is a StoreError naming the file,
never a raw sqlite3 error; the transaction it interrupted leaves nothing behind.

Durability is the `synchronous` setting, chosen in the URL:
``sqlite:///tasks.db?synchronous=normal`` (the default; survives a process
crash) or ``?synchronous=full`` (also survives a power loss, one fsync a commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import msgspec

from sasflow.errors import ConfigurationError, StoreError, TaskConflictError
from sasflow.model import (
    Phase,
    StepState,
    Task,
    TaskState,
    claimable,
    terminal,
)
from sasflow.plan import Plan
from sasflow.redact import redact
from sasflow.store import dead_letters, sql
from sasflow.store.base import Alert, Census, HistoryEntry, Instance, NewTask, OutboxMessage
from sasflow.store.rows import (
    RowKind,
    alert_from_row,
    attach_steps,
    check_legal,
    claim_transition,
    fence_values,
    implied_rows,
    incident_params,
    instance_from_row,
    instance_params,
    set_values,
    status_row,
    task_from_row,
    versions_of,
)
from sasflow.store.sqlite_wake import WakeChannel
from sasflow.store.writer import Writer
from sasflow.transition import Transition
from sasflow.transport.dead_letter import DeadLetter

__all__ = ["SQLiteStore"]

_T = TypeVar("_T")
# How often an idle scheduler looks for work no wake-up told of (E1 submissions)
_LOOK_EVERY = 0.25
_SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL", "off": "OFF", "extra": "EXTRA"}
_decode = msgspec.json.decode


class SQLiteStore:
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
        self.now: Callable[[], float] = clock or time.time
        self.migrations_applied: list[str] = []  # by this process, for `sasflow db upgrade`
        self._readers = threading.local()
        # rows whose writes need no answer, inserted in bulk once per group commit
        self._deferred = _Deferred()
        _create_private(self.path)
        self._writer = Writer(self._connect, prepare=self._prepare_writer,
                              translate=self._store_error, before_commit=self._deferred.flush,
                              after_rollback=self._deferred.clear)
        self._checkpointer = _Checkpointer(self._connect)
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

    # ------------------------------------------------------------ connections
    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as error:
            raise StoreError(f"cannot open SQLite store {self.path}: {error}") from error
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        return conn

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
        self.migrations_applied += _migrate(conn)

    def _store_error(self, error: BaseException) -> BaseException:
        """What SQLite raised, as sasflow's error when the cause is the store's, not ours."""
        if not isinstance(error, sqlite3.Error) or isinstance(error, sqlite3.ProgrammingError):
            return error
        code = getattr(error, "sqlite_errorcode", None)
        why = _WHY.get(code & 0xFF if isinstance(code, int) else -1, "failed")
        translated = StoreError(f"SQLite store {self.path} {why}: {error}")
        translated.__cause__ = error
        return translated

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._readers, "conn", None)
        if conn is None:
            self._writer.wait_prepared()  # the schema is there before anyone reads it
            conn = self._readers.conn = self._connect()
        return conn

    def _reading(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        try:
            return fn(self._reader())
        except sqlite3.Error as error:
            raise self._store_error(error) from error

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return await asyncio.to_thread(self._reading, fn)

    # ------------------------------------------------------------ submission
    async def submit(self, task: NewTask, *, connection: Any = None) -> bool:
        if connection is not None:
            return self.submit_in(connection, task)
        created = await self._writer.run(lambda conn: self._insert(conn, task))
        if created:
            self._wake.work(self.now())
        return created

    def submit_blocking(self, task: NewTask) -> bool:
        created = self._writer.run_sync(lambda conn: self._insert(conn, task))
        if created:
            self._wake.work(self.now())
        return created

    def submit_in(self, connection: sqlite3.Connection, task: NewTask) -> bool:
        """Write the task with the caller's connection, in the caller's transaction (E1)."""
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError("connection must be a sqlite3.Connection to the store's file")
        files = {row[2] for row in connection.execute("PRAGMA database_list") if row[2]}
        if self.path not in {os.path.abspath(f) for f in files}:
            raise ConfigurationError(
                f"connection is not to the store's database file {self.path}")
        try:
            # The store's first use may be inside this very transaction, which holds the
            # write lock: the schema then comes up through it, committed with the caller's
            # rows or rolled back with them. Under that lock no other process can be
            # migrating, so what is pending here is what is pending.
            pending = _pending(connection)
            if pending:
                connection.execute("SAVEPOINT sasflow_migrate")
                _apply_migrations(connection, pending)
                connection.execute("RELEASE sasflow_migrate")
            return self._insert(connection, task)
        except sqlite3.Error as error:
            raise self._store_error(error) from error

    def _insert(self, conn: sqlite3.Connection, task: NewTask) -> bool:
        now = self.now()
        body = task.input_json.decode()
        created = conn.execute(sql.INSERT_TASK, (
            task.task_id, task.workflow, body, TaskState.PENDING.value, now, task.reply_to,
            now, now, task.version)).rowcount
        if not created:
            row = conn.execute(sql.SELECT_TASK_IDENTITY, (task.task_id,)).fetchone()
            if row is not None and (row[0] != task.workflow or _decode(row[1]) != _decode(body)):
                raise TaskConflictError(
                    f"task {task.task_id} exists with another workflow or input",
                    task_id=task.task_id)
            return False
        conn.executemany(sql.INSERT_STEP, [
            (task.task_id, Phase.DO.value, i, name, agent, StepState.PENDING.value, key, now)
            for i, (name, agent, key) in enumerate(task.steps)])
        conn.execute(sql.INSERT_HISTORY, (
            task.task_id, None, None, now, "submit", 0, None, TaskState.PENDING.value,
            "submitted"))
        if task.reply_to:
            conn.execute(sql.INSERT_OUTBOX, status_row(task.reply_to, task.task_id, "received",
                                                    TaskState.PENDING, None, now))
        return True

    # ------------------------------------------------------------ scheduler
    async def claim(self, owner: str, limit: int, plans: Mapping[str, Plan]) -> list[Task]:
        # only the versions declared here (R4): (workflow, version) of each plan
        shapes = [(name, plan.workflow.version) for name, plan in plans.items()]
        if not shapes or limit <= 0:
            return []
        now = self.now()

        def probe(c: sqlite3.Connection) -> bool:
            return any(c.execute(sql.PROBE_CLAIMABLE, (name, version, now)).fetchone()
                       for name, version in shapes)

        if not self._reading(probe):  # nothing to do: no write lock at all
            return []

        def job(conn: sqlite3.Connection) -> list[Task]:
            self._deferred.flush(conn)  # read what earlier jobs of this batch wrote
            now = self.now()
            rows = [row for name, version in shapes
                    for row in conn.execute(sql.SELECT_CLAIMABLE, (name, version, now, limit))]
            if len(shapes) > 1:  # the earliest runnable first, whatever their workflow
                rows = sorted(rows, key=lambda row: row[8])[:limit]
            claimed = []
            for task in _tasks_with_steps(conn, rows):
                planned = claim_transition(plans[task.workflow], task, owner, now)
                if planned is not None and _apply(conn, planned[0], now, self._deferred):
                    claimed.append(planned[1])
            return claimed

        return await self._writer.run(job)

    async def apply(self, transition: Transition) -> bool:
        applied = await self._writer.run(
            lambda conn: _apply(conn, transition, self.now(), self._deferred))
        if applied:
            self._tell(transition)
        return applied

    def _tell(self, transition: Transition) -> None:
        """Wake the other processes sharing the file that wait for what it did."""
        if terminal(transition.state):
            self._wake.finished(transition.task_id)
        elif claimable(transition.state, transition.locked_by):
            self._wake.work(transition.available_at)

    # ------------------------------------------------------------ supervisor
    async def expired(self, limit: int, workflows: Collection[str] | None = None
                      ) -> list[Task]:
        now = self.now()
        names = None if workflows is None else list(workflows)

        def read(conn: sqlite3.Connection) -> list[Task]:
            if names is None:
                rows = conn.execute(sql.SELECT_EXPIRED, (now, limit)).fetchall()
            else:  # the earliest first, whatever their workflow
                rows = sorted((row for name in names for row in conn.execute(
                    sql.SELECT_EXPIRED_OF, (name, now, limit))), key=lambda row: row[7])[:limit]
            return _tasks_with_steps(conn, rows)

        result: list[Task] = await self._read(read)
        return result

    async def next_expiry(self, workflows: Collection[str] | None = None) -> float | None:
        # MIN over the partial index tasks_locked (tasks_expiring per workflow): one
        # index lookup each
        def read(reader: sqlite3.Connection) -> list[Any]:
            if workflows is None:
                return [reader.execute(sql.NEXT_EXPIRY).fetchone()]
            return [reader.execute(sql.NEXT_EXPIRY_OF, (name,)).fetchone() for name in workflows]

        due = [float(row[0]) for row in self._reading(read)
               if row is not None and row[0] is not None]
        return min(due) if due else None

    # ------------------------------------------------------------ incidents (R4)
    async def census(self) -> Census:
        def read(conn: sqlite3.Connection) -> Census:
            versions = {(w, v): n for w, v, n in conn.execute(sql.CENSUS_VERSIONS)}
            agents = {(w, v, a): n for w, v, a, n in conn.execute(sql.CENSUS_AGENTS)}
            return Census(versions=versions, agents=agents)

        result: Census = await self._read(read)
        return result

    async def incidents(self) -> list[Alert]:
        rows = await self._read(lambda c: c.execute(sql.SELECT_OPEN_INCIDENTS).fetchall())
        return sorted((alert_from_row(row) for row in rows), key=lambda a: a.id)

    async def report_incidents(self, raised: Collection[Alert], resolved: Collection[str]
                               ) -> None:
        def job(conn: sqlite3.Connection) -> None:
            now = self.now()
            for incident in [*resolved, *(a.incident for a in raised)]:
                conn.execute(sql.RESOLVE_INCIDENT, {"now": now, "incident": incident})
            for alert in raised:
                conn.execute(sql.INSERT_INCIDENT, incident_params(alert, now))

        if raised or resolved:
            await self._writer.run(job)

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        def job(conn: sqlite3.Connection) -> int | None:
            now = self.now()
            row = conn.execute(sql.ACQUIRE_LEASE, (name, holder, now + ttl, now)).fetchone()
            return int(row[1]) if row is not None and row[0] == holder else None

        return await self._writer.run(job)

    # ------------------------------------------------------------ reading
    async def watch(self, wake: Callable[[float], None]) -> None:
        """Call `wake(at)` when another process sharing the file submits or releases
        work (sqlite_wake.py), and every `_LOOK_EVERY` seconds: a submission made in
        a caller's own transaction (E1) commits where the store cannot see it."""
        loop = asyncio.get_running_loop()

        def heard(at: float) -> None:
            loop.call_soon_threadsafe(wake, at)

        stop = self._wake.on_work(heard)
        try:
            while True:
                await asyncio.sleep(_LOOK_EVERY)
                wake(self.now())
        finally:
            stop()

    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Call `finished(task_id)`, from another thread, when another process sharing
        the file ends a task; returns the unsubscribe."""
        return self._wake.on_finished(finished)

    async def get(self, task_id: str) -> Task | None:
        # a primary-key read of a WAL file never waits for writers: cheaper inline
        # than a hop to a thread and back
        return self._reading(lambda c: _get(c, task_id))

    async def list_tasks(self, *, state: TaskState | None = None, workflow: str | None = None,
                   limit: int = 100) -> list[Task]:
        value = state.value if state is not None else None
        rows = await self._read(lambda c: c.execute(
            sql.LIST_TASKS, (value, value, workflow, workflow, limit)).fetchall())
        return [task_from_row(row) for row in rows]

    async def history(self, task_id: str) -> list[HistoryEntry]:
        rows = await self._read(lambda c: c.execute(sql.SELECT_HISTORY, (task_id,)).fetchall())
        return [HistoryEntry(task_id=task_id, step=r[0], phase=r[1], at=r[2], actor=r[3],
                             epoch=r[4], from_state=r[5], to_state=r[6], why=r[7])
                for r in rows]

    async def alerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]:
        rows = await self._read(lambda c: c.execute(sql.SELECT_ALERTS, (after, limit))
                                .fetchall())
        return [alert_from_row(row) for row in rows]

    # ------------------------------------------------------------ instances (R2)
    async def beat(self, instance: Instance, *, first: bool = False) -> None:
        await self._writer.run(lambda conn: conn.execute(
            sql.BEAT, instance_params(instance, self.now(), first)))

    async def stopped(self, instance_id: str) -> None:
        await self._writer.run(lambda conn: conn.execute(
            sql.MARK_STOPPED, {"instance_id": instance_id, "now": self.now()}))

    async def instances(self, *, instance_id: str | None = None) -> list[Instance]:
        rows = await self._read(lambda c: c.execute(
            sql.SELECT_INSTANCES, {"instance_id": instance_id}).fetchall())
        return [instance_from_row(row) for row in rows]

    async def orphaned(self, limit: int, workflows: Collection[str] | None = None
                       ) -> list[Task]:
        now = self.now()
        names = None if workflows is None else msgspec.json.encode(list(workflows)).decode()

        def read(conn: sqlite3.Connection) -> list[Task]:
            rows = conn.execute(sql.SELECT_ORPHANED, {"now": now, "limit": limit,
                                                      "workflows": names}).fetchall()
            return _tasks_with_steps(conn, rows)

        result: list[Task] = await self._read(read)
        return result

    # ------------------------------------------------------------ dead letters (R3)
    async def add_dead_letter(self, letter: DeadLetter) -> None:
        await self._writer.run(lambda conn: conn.execute(
            dead_letters.INSERT, dead_letters.letter_params(letter)))

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        rows = await self._read(lambda c: c.execute(
            dead_letters.SELECT_OLDEST, {"limit": limit}).fetchall())
        return [dead_letters.letter_from_row(row) for row in rows]

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        rows = await self._read(lambda c: c.execute(
            dead_letters.SELECT_ONE, {"id": letter_id}).fetchall())
        return dead_letters.letter_from_row(rows[0]) if rows else None

    async def purge_dead_letters(self) -> int:
        count: int = await self._writer.run(
            lambda conn: conn.execute(dead_letters.PURGE).rowcount)
        return count

    # ------------------------------------------------------------ outbox (E11)
    async def take_outbox(self, queues: Collection[str] | None, limit: int
                          ) -> list[OutboxMessage]:
        names = list(queues) if queues is not None else None
        if names == []:
            return []

        def job(conn: sqlite3.Connection) -> list[OutboxMessage]:
            now = self.now()
            rows = conn.execute(sql.lease_outbox(None if names is None else len(names)),
                                (now + 30.0, now, *(names or ()), limit)).fetchall()
            return [OutboxMessage(id=r[0], queue=r[1], body=bytes(r[2])) for r in rows]

        return await self._writer.run(job)

    async def ack_outbox(self, ids: Collection[int]) -> None:
        if ids:
            await self._writer.run(lambda conn: conn.executemany(
                sql.DELETE_OUTBOX, [(i,) for i in ids]))

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        self._wake.close()
        self._writer.close()
        self._checkpointer.close()


class _Checkpointer:
    """Copies the WAL back into the database file in a thread of its own.

    SQLite's automatic checkpoint runs inside whichever commit crosses the
    threshold, on the writer's critical path; here it runs beside it (and,
    being C code that releases the GIL, on the other core). PASSIVE never blocks
    a writer or a reader.
    """

    _EVERY_S = 0.1

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sasflow-sqlite-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = self._connect()
        try:
            while not self._stop.wait(self._EVERY_S):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:  # busy or locked: the next round will do
                    continue
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- row mapping
class _Deferred:
    """Unit, history and outbox rows of the current group commit, written in bulk.

    Only the fenced task UPDATE must run at once (its row count says whether the
    transition applies); what follows from it can wait for the end of the batch,
    or for the next job that reads steps (a claim), which flushes first.
    """

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {}

    def add(self, statement: str, row: tuple[Any, ...]) -> None:
        self.rows.setdefault(statement, []).append(row)

    def flush(self, conn: sqlite3.Connection) -> None:
        # dicts keep insertion order: statements run in the order first used
        rows, self.rows = self.rows, {}
        for statement, values in rows.items():
            conn.executemany(statement, values)

    def clear(self) -> None:
        self.rows = {}


_STATEMENTS: dict[RowKind, str] = {
    "step": sql.UPSERT_STEP, "history": sql.INSERT_HISTORY,
    "outbox": sql.INSERT_OUTBOX, "alert": sql.INSERT_ALERT, "drop": sql.DROP_STEPS}


def _apply(conn: sqlite3.Connection, t: Transition, now: float, deferred: _Deferred) -> bool:
    """Apply one fenced transition inside the writer's transaction."""
    check_legal(t)
    (task_id, epoch, state, owner, phase, cursor, version, expired_before, lease, holder,
     lease_epoch) = fence_values(t)
    fence = (task_id, epoch, state, owner, phase, cursor, version, expired_before,
             expired_before, lease, lease, holder, lease_epoch)
    if not conn.execute(sql.APPLY_TRANSITION, set_values(t, now) + fence).rowcount:
        return False
    for kind, row in implied_rows(t, now):
        deferred.add(_STATEMENTS[kind], row)
    return True


def _tasks_with_steps(conn: sqlite3.Connection, rows: Iterable[tuple[Any, ...]]) -> list[Task]:
    tasks = {task.task_id: task for task in map(task_from_row, rows)}
    ids = list(tasks)
    for chunk in range(0, len(ids), 500):  # bounded IN lists
        part = ids[chunk:chunk + 500]
        attach_steps(tasks, conn.execute(sql.select_steps(len(part)), part))
    return list(tasks.values())


def _get(conn: sqlite3.Connection, task_id: str) -> Task | None:
    rows = conn.execute(sql.SELECT_TASK, (task_id,)).fetchall()
    found = _tasks_with_steps(conn, rows)
    return found[0] if found else None


_VERSIONS_MIGRATION = "0003_versions.sql"  # tasks gained a version column

# what a failing SQLite primary result code says about the store (the rest: "failed")
_WHY = {sqlite3.SQLITE_FULL: "is out of disk space", sqlite3.SQLITE_IOERR: "had an I/O error",
        sqlite3.SQLITE_CANTOPEN: "cannot be opened", sqlite3.SQLITE_READONLY: "is read-only",
        sqlite3.SQLITE_CORRUPT: "is corrupt", sqlite3.SQLITE_NOTADB: "is not a database",
        sqlite3.SQLITE_BUSY: "stayed locked", sqlite3.SQLITE_LOCKED: "stayed locked",
        sqlite3.SQLITE_PERM: "is not accessible"}


def _create_private(path: str) -> None:
    """Create the store's file readable by its owner only, unless it exists (R5)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as error:
        raise StoreError(f"cannot create SQLite store {path}: {error.strerror}") from error


def _scripts() -> list[tuple[str, str]]:
    folder = resources.files("sasflow.store.migrations") / "sqlite"
    return sorted((f.name, f.read_text()) for f in folder.iterdir() if f.name.endswith(".sql"))


def _pending(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """The packaged migrations this file has not seen, in order (a read, no lock)."""
    table = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'"
                         " AND name = 'schema_migrations'").fetchone()
    done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")} if (
        table) else set()
    return [(name, script) for name, script in _scripts() if name not in done]


def _apply_migrations(conn: sqlite3.Connection, pending: list[tuple[str, str]]) -> None:
    """Run `pending` migrations in the transaction `conn` has open."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                 "(version TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    for name, script in pending:
        for statement in script.split(";\n"):
            if statement.strip():
                conn.execute(statement)
        if name == _VERSIONS_MIGRATION:  # tasks written before get their version
            conn.executemany(sql.SET_VERSION,
                             versions_of(conn.execute(sql.SELECT_UNVERSIONED).fetchall()))
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", (name, time.time()))


def _migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply the migrations this file has not seen, atomically; returns their names.

    A file that is up to date is only read: no write lock is taken.
    """
    if not _pending(conn):
        return []
    conn.execute("BEGIN IMMEDIATE")
    try:
        pending = _pending(conn)  # again, under the lock: another may have just finished
        _apply_migrations(conn, pending)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return [name for name, _ in pending]

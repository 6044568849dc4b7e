"""The distributed state store: PostgreSQL through psycopg 3 (SPEC S10, M1, M3, E1).

Why psycopg 3 (rather than asyncpg): native asyncio with a maintained pool
(psycopg_pool.AsyncConnectionPool), server-side parameter binding, pipeline mode
(a batch of statements in one round trip, used by `executemany`), COPY and
LISTEN/NOTIFY, and one driver for the sync and async sides, so `submit_in` can
join an application's ordinary psycopg transaction (E1). It is maintained by the
author of psycopg2, the driver most PostgreSQL applications already use.

Every scheduler verb is one short transaction on a pooled connection:

* claim: per workflow `SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`, then the
  planner's claim Transitions applied in the same transaction, so concurrent
  schedulers on any number of hosts take disjoint tasks without waiting (M1).
* apply: the fenced UPDATE of sql.py, then the units, history, outbox and alert
  rows, sent together in pipeline mode.

Times are seconds since the epoch (double precision) so the planner is the same
for every store. `now()` is the injected clock when there is one (tests), else
the database's clock: the offset between `clock_timestamp()` and this host's
clock is measured and refreshed, so deadlines are compared with one clock for
every host (DESIGN invariant 3). Serialization failures and deadlocks are
retried a few times. Migrations run at open under an advisory lock.

The URL is a libpq one: ``postgresql://user@host:5432/db``; to keep the tables
in a schema of their own add ``?options=-csearch_path%3DNAME``.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, TypeVar

import msgspec
import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool

from sasflow.errors import ConfigurationError, StoreError, TaskConflictError
from sasflow.messages import encode
from sasflow.model import (
    Phase,
    StepState,
    Task,
    TaskState,
    can_move,
)
from sasflow.plan import Plan
from sasflow.store import pg_sql as q
from sasflow.store.base import Alert, HistoryEntry, NewTask, OutboxMessage
from sasflow.store.rows import attach_steps, status_row, task_from_row
from sasflow.transition import UNSET, Transition

__all__ = ["PostgresStore"]

_T = TypeVar("_T")
_decode = msgspec.json.decode
_RETRIED = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)  # 40001, 40P01
_ATTEMPTS = 5
_CLOCK_REFRESH_S = 30.0
_OUTBOX_LEASE_S = 30.0

Statements = list[tuple[str, Sequence[Any]]]


class PostgresStore:
    """Tasks, steps, history, alerts, outbox and leases in one PostgreSQL database."""

    def __init__(self, conninfo: str, *, clock: Callable[[], float] | None = None,
                 create: bool = True, pool_size: int = 10) -> None:
        self.conninfo = conninfo
        self._clock = clock
        self._create = create
        self._offset = 0.0  # database clock - this host's clock
        self._offset_at = float("-inf")
        # opened on first use: stores are built outside the event loop (open_store)
        self._pool = AsyncConnectionPool(conninfo, min_size=1, max_size=pool_size, open=False,
                                         kwargs={"autocommit": True})
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._sync: psycopg.Connection[Any] | None = None  # for submit_blocking
        self._sync_lock = threading.Lock()
        self._schema_ready = False

    @classmethod
    def from_url(cls, url: str, *, clock: Callable[[], float] | None = None,
                 create: bool = True) -> PostgresStore:
        if url.startswith("postgres:"):  # libpq knows both schemes; keep one spelling
            url = "postgresql:" + url[len("postgres:"):]
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as error:
            raise ConfigurationError(f"bad PostgreSQL URL {url!r}: {error}") from error
        return cls(url, clock=clock, create=create)

    # ------------------------------------------------------------ clock
    def now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return time.time() + self._offset

    def _measure_clock(self, db_now: float, sent: float, received: float) -> None:
        # the server read its clock about halfway through the round trip
        self._offset = db_now - (sent + received) / 2
        self._offset_at = received

    async def _refresh_clock(self, conn: psycopg.AsyncConnection[Any]) -> None:
        sent = time.time()
        row = await (await conn.execute(q.DB_CLOCK)).fetchone()
        assert row is not None
        self._measure_clock(float(row[0]), sent, time.time())

    # ------------------------------------------------------------ connections
    async def _open(self) -> None:
        async with self._open_lock:
            if self._opened:
                return
            try:
                await self._pool.open(wait=True, timeout=30.0)
            except psycopg.Error as error:  # PoolTimeout is one too
                raise StoreError(f"cannot reach the PostgreSQL store: {error}") from error
            if not self._schema_ready:  # checked before any use (open() again is a no-op)
                async with self._pool.connection() as conn:
                    await _migrate(conn, self._create)
                self._schema_ready = True
            self._opened = True

    async def _run(self, job: Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]], *,
                   read_only: bool = False) -> _T:
        """Run `job` in one transaction, again if PostgreSQL asks for it (40001, 40P01).

        A lost connection is retried on a new one for reads only: whether a write
        was committed before its connection died is unknown, so that is reported.
        """
        if not self._opened:
            await self._open()
        for attempt in range(_ATTEMPTS):
            try:
                async with self._pool.connection() as conn:
                    if self._clock is None and time.time() - self._offset_at > _CLOCK_REFRESH_S:
                        await self._refresh_clock(conn)
                    if read_only:  # autocommit: no BEGIN/COMMIT round trips
                        return await job(conn)
                    # pipeline mode: BEGIN goes with the first statement and COMMIT
                    # with the last, instead of a round trip each
                    async with conn.pipeline(), conn.transaction():
                        return await job(conn)
            except _RETRIED as error:
                if attempt == _ATTEMPTS - 1:
                    raise StoreError(f"the PostgreSQL store kept conflicting: {error}"
                                     ) from error
            except psycopg.OperationalError as error:
                # the pool replaces a broken connection when it is given back
                if not read_only or attempt == _ATTEMPTS - 1:
                    raise StoreError(f"the PostgreSQL store failed: {error}") from error
            await asyncio.sleep(random.uniform(0.001, 0.01) * 2 ** attempt)
        raise AssertionError("unreachable")

    def _sync_connection(self) -> psycopg.Connection[Any]:
        if self._sync is None or self._sync.closed:
            try:
                self._sync = psycopg.connect(self.conninfo)
            except psycopg.Error as error:
                raise StoreError(f"cannot reach the PostgreSQL store: {error}") from error
            if not self._schema_ready:
                _migrate_sync(self._sync, self._create)
                self._schema_ready = True
            if self._clock is None:
                sent = time.time()
                row = self._sync.execute(q.DB_CLOCK).fetchone()
                assert row is not None
                self._measure_clock(float(row[0]), sent, time.time())
                self._sync.commit()
        return self._sync

    # ------------------------------------------------------------ submission
    async def submit(self, task: NewTask, *, connection: Any = None) -> bool:
        if isinstance(connection, psycopg.AsyncConnection):
            return await _insert_async(connection, task, self.now())
        if connection is not None:
            return self.submit_in(connection, task)
        return await self._run(lambda conn: _insert_async(conn, task, self.now()))

    def submit_blocking(self, task: NewTask) -> bool:
        with self._sync_lock:
            conn = self._sync_connection()
            for attempt in range(_ATTEMPTS):
                try:
                    with conn.transaction():
                        return _insert_sync(conn, task, self.now())
                except _RETRIED as error:
                    if attempt == _ATTEMPTS - 1:
                        raise StoreError(f"the PostgreSQL store kept conflicting: {error}"
                                         ) from error
                except psycopg.OperationalError as error:
                    raise StoreError(f"the PostgreSQL store failed: {error}") from error
        raise AssertionError("unreachable")

    def submit_in(self, connection: Any, task: NewTask) -> bool:
        """Write the task with the caller's psycopg connection, in its transaction (E1).

        Nothing is committed here: the task commits, or rolls back, with the
        caller's own rows.
        """
        if not isinstance(connection, psycopg.Connection):
            raise ConfigurationError(
                "connection must be a psycopg.Connection to the store's database")
        return _insert_sync(connection, task, self.now())

    # ------------------------------------------------------------ scheduler
    async def claim(self, owner: str, limit: int, plans: Mapping[str, Plan]) -> list[Task]:
        names = list(plans)
        if not names or limit <= 0:
            return []

        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Task]:
            now = self.now()
            rows: list[tuple[Any, ...]] = []
            async with conn.cursor() as cur:
                for name in names:
                    await cur.execute(q.SELECT_CLAIMABLE, (name, now, limit))
                    rows.extend(await cur.fetchall())
            if not rows:
                return []
            if len(names) > 1:  # the earliest runnable first, whatever their workflow;
                # the rows left over are unlocked again at commit
                rows = sorted(rows, key=lambda row: row[8])[:limit]
            tasks = await _tasks_with_steps(conn, rows)
            transitions = [plans[task.workflow].claim(task, owner, now) for task in tasks]
            applied = await _apply_all(conn, transitions, now)
            return [task for task, ok in zip(tasks, applied, strict=True) if ok]

        return await self._run(job)

    async def apply(self, transition: Transition) -> bool:
        [applied] = await self._run(lambda conn: _apply_all(conn, [transition], self.now()))
        return applied

    # ------------------------------------------------------------ supervisor
    async def expired(self, limit: int) -> list[Task]:
        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Task]:
            cur = await conn.execute(q.SELECT_EXPIRED, (self.now(), limit))
            return await _tasks_with_steps(conn, await cur.fetchall())

        return await self._run(job, read_only=True)

    async def next_expiry(self) -> float | None:
        row = await self._fetchone(q.NEXT_EXPIRY, ())
        return None if row is None or row[0] is None else float(row[0])

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> tuple[Any, ...] | None:
            now = self.now()  # after the first connection has measured the clock
            return await (await conn.execute(q.ACQUIRE_LEASE,
                                             (name, holder, now + ttl, now))).fetchone()

        row = await self._run(job)
        return int(row[1]) if row is not None and row[0] == holder else None

    # ------------------------------------------------------------ reading
    async def get(self, task_id: str) -> Task | None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Task]:
            cur = await conn.execute(q.SELECT_TASK, (task_id,))
            return await _tasks_with_steps(conn, await cur.fetchall())

        found = await self._run(job, read_only=True)
        return found[0] if found else None

    async def list_tasks(self, *, state: TaskState | None = None, workflow: str | None = None,
                         limit: int = 100) -> list[Task]:
        value = state.value if state is not None else None
        rows = await self._fetchall(q.LIST_TASKS, (value, value, workflow, workflow, limit))
        return [task_from_row(row) for row in rows]

    async def history(self, task_id: str) -> list[HistoryEntry]:
        rows = await self._fetchall(q.SELECT_HISTORY, (task_id,))
        return [HistoryEntry(task_id=task_id, step=r[0], phase=r[1], at=r[2], actor=r[3],
                             epoch=r[4], from_state=r[5], to_state=r[6], why=r[7])
                for r in rows]

    async def alerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]:
        rows = await self._fetchall(q.SELECT_ALERTS, (after, limit))
        return [Alert(id=r[0], task_id=r[1], step=r[2], agent=r[3], at=r[4], message=r[5])
                for r in rows]

    async def _fetchall(self, statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        async def job(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            return await (await conn.execute(statement, params)).fetchall()

        return await self._run(job, read_only=True)

    async def _fetchone(self, statement: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        rows = await self._fetchall(statement, params)
        return rows[0] if rows else None

    # ------------------------------------------------------------ outbox (E11)
    async def take_outbox(self, queues: Collection[str] | None, limit: int
                          ) -> list[OutboxMessage]:
        names = list(queues) if queues is not None else None
        if names == []:
            return []

        async def job(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            now = self.now()
            return await (await conn.execute(
                q.LEASE_OUTBOX, (now + _OUTBOX_LEASE_S, now, names, names, limit))).fetchall()

        rows = await self._run(job)
        return sorted((OutboxMessage(id=r[0], queue=r[1], body=bytes(r[2])) for r in rows),
                      key=lambda m: m.id)

    async def ack_outbox(self, ids: Collection[int]) -> None:
        if ids:
            async def job(conn: psycopg.AsyncConnection[Any]) -> None:
                await conn.execute(q.DELETE_OUTBOX, (list(ids),))

            await self._run(job)

    async def close(self) -> None:
        if not self._pool.closed:
            await self._pool.close()
        self._opened = False
        with self._sync_lock:
            if self._sync is not None:
                self._sync.close()
                self._sync = None


# ---------------------------------------------------------------- writing
def _submission(task: NewTask, now: float) -> tuple[Sequence[Any], Statements]:
    """The task row, and the rows written with it only if it is new."""
    row = (task.task_id, task.workflow, task.input_json.decode(), TaskState.PENDING.value, now,
           task.reply_to, now, now)
    rest: Statements = [
        (q.INSERT_STEP, (task.task_id, Phase.DO.value, i, name, agent, StepState.PENDING.value,
                         key, now))
        for i, (name, agent, key) in enumerate(task.steps)]
    rest.append((q.INSERT_HISTORY, (task.task_id, None, None, now, "submit", 0, None,
                                    TaskState.PENDING.value, "submitted")))
    if task.reply_to:
        rest.append((q.INSERT_OUTBOX, status_row(task.reply_to, task.task_id, "received",
                                              TaskState.PENDING, None, now)))
    return row, rest


def _check_identity(task: NewTask, row: tuple[Any, ...] | None) -> None:
    """A task id reused for other work is refused (the original stays as it was)."""
    if row is not None and (row[0] != task.workflow
                            or _decode(row[1]) != _decode(task.input_json)):
        raise TaskConflictError(f"task {task.task_id} exists with another workflow or input",
                                task_id=task.task_id)


def _insert_sync(conn: psycopg.Connection[Any], task: NewTask, now: float) -> bool:
    row, rest = _submission(task, now)
    with conn.cursor() as cur:
        if cur.execute(q.INSERT_TASK, row).fetchone() is None:
            _check_identity(task, cur.execute(q.SELECT_TASK_IDENTITY, (task.task_id,))
                            .fetchone())
            return False
        for statement, params in _grouped(rest):
            cur.executemany(statement, params)
    return True


async def _insert_async(conn: psycopg.AsyncConnection[Any], task: NewTask, now: float) -> bool:
    row, rest = _submission(task, now)
    async with conn.cursor() as cur:
        if await (await cur.execute(q.INSERT_TASK, row)).fetchone() is None:
            await cur.execute(q.SELECT_TASK_IDENTITY, (task.task_id,))
            _check_identity(task, await cur.fetchone())
            return False
        for statement, params in _grouped(rest):
            await cur.executemany(statement, params)
    return True


def _grouped(statements: Statements) -> list[tuple[str, list[Sequence[Any]]]]:
    """Consecutive rows of one statement together, for one `executemany` (pipelined)."""
    groups: list[tuple[str, list[Sequence[Any]]]] = []
    for statement, params in statements:
        if groups and groups[-1][0] == statement:
            groups[-1][1].append(params)
        else:
            groups.append((statement, [params]))
    return groups


async def _apply_all(conn: psycopg.AsyncConnection[Any], transitions: Sequence[Transition],
                     now: float) -> list[bool]:
    """Apply fenced transitions in the caller's transaction; which of them applied."""
    for t in transitions:
        if not can_move(t.from_state, t.state) and t.from_state is not t.state:
            raise StoreError(f"refusing {t.from_state} -> {t.state} for task {t.task_id}",
                             task_id=t.task_id)
    applied: list[bool] = []
    rows: Statements = []
    async with conn.cursor() as cur:
        # every fenced UPDATE in one round trip; each answers with a row if it applied
        await cur.executemany(q.APPLY_TRANSITION, [(
            t.state.value, t.phase.value, t.cursor, t.locked_by, t.complete_by,
            t.available_at, t.failure_count, t.error, int(t.claim), now,
            t.task_id, t.epoch, t.from_state.value, t.owner, t.expired_before,
            t.expired_before) for t in transitions], returning=True)
        for n, t in enumerate(transitions):
            if n:
                cur.nextset()
            applied.append(await cur.fetchone() is not None)
            if applied[-1]:
                rows.extend(_consequences(t, now))
        # only the fenced UPDATE needed its answer at once; the rest goes in one batch
        for statement, params in _grouped(rows):
            await cur.executemany(statement, params)
    return applied


def _consequences(t: Transition, now: float) -> Statements:
    """The unit, history, outbox and alert rows of an applied transition."""
    epoch = t.epoch + t.claim
    rows: Statements = [(q.INSERT_HISTORY, (t.task_id, None, None, now, t.actor, epoch,
                                            t.from_state.value, t.state.value, t.why))]
    units: Statements = []
    for unit in t.units:
        result = None if unit.result is UNSET else encode(unit.result).decode()
        failures = -1 if unit.reset_failures else int(unit.failed)
        units.append((q.UPSERT_STEP, (
            t.task_id, unit.phase.value, unit.index, unit.name, unit.agent, unit.state.value,
            int(unit.started), failures, unit.complete_by, unit.idempotency_key, result,
            unit.error, int(unit.in_doubt), now, failures)))
        if unit.phase is Phase.UNDO:  # the step shows where its undo stands
            shown = StepState.COMPENSATED if unit.state is StepState.COMPENSATED else (
                StepState.COMPENSATING)
            units.append((q.MIRROR_UNDO, (shown.value, now, t.task_id, unit.index)))
        rows.append((q.INSERT_HISTORY, (
            t.task_id, unit.name, unit.phase.value, now, t.actor, epoch,
            unit.from_state.value if unit.from_state else None, unit.state.value, None)))
    rows[:0] = units
    if t.reply_to:
        rows.extend((q.INSERT_OUTBOX, status_row(t.reply_to, t.task_id, event, t.state, step,
                                              now, t.error))
                    for event, step in t.events)
    if t.alert:
        rows.append((q.INSERT_ALERT, (t.task_id, t.alert_step, t.alert_agent, now, t.alert)))
    return rows


# ---------------------------------------------------------------- reading
async def _tasks_with_steps(conn: psycopg.AsyncConnection[Any],
                            rows: Iterable[tuple[Any, ...]]) -> list[Task]:
    tasks = {task.task_id: task for task in map(task_from_row, rows)}
    if tasks:
        cur = await conn.execute(q.SELECT_STEPS, (list(tasks),))
        attach_steps(tasks, await cur.fetchall())
    return list(tasks.values())


# ---------------------------------------------------------------- migrations
def _scripts() -> list[tuple[str, str]]:
    folder = resources.files("sasflow.store.migrations") / "postgres"
    return sorted((f.name, f.read_text()) for f in folder.iterdir() if f.name.endswith(".sql"))


def _missing_schema() -> StoreError:
    return StoreError("the PostgreSQL store has no sasflow schema yet: run `sasflow db upgrade`")


async def _migrate(conn: psycopg.AsyncConnection[Any], create: bool) -> None:
    """Apply the packaged migrations this database has not seen, in order, atomically."""
    async with conn.transaction():
        if not create:
            row = await (await conn.execute(q.MIGRATIONS_TABLE_EXISTS)).fetchone()
            if not (row and row[0]):
                raise _missing_schema()
        # one migrating process at a time; released at commit
        await conn.execute(q.MIGRATION_LOCK)
        await conn.execute(q.CREATE_MIGRATIONS)
        done = {r[0] for r in await (await conn.execute(q.SELECT_MIGRATIONS)).fetchall()}
        for name, script in _scripts():
            if name not in done:
                await conn.execute(script.encode())  # no parameters: several statements
                await conn.execute(q.INSERT_MIGRATION, (name, time.time()))


def _migrate_sync(conn: psycopg.Connection[Any], create: bool) -> None:
    """`_migrate` for the blocking side (a submit before any async use)."""
    with conn.transaction():
        if not create:
            row = conn.execute(q.MIGRATIONS_TABLE_EXISTS).fetchone()
            if not (row and row[0]):
                raise _missing_schema()
        conn.execute(q.MIGRATION_LOCK)
        conn.execute(q.CREATE_MIGRATIONS)
        done = {r[0] for r in conn.execute(q.SELECT_MIGRATIONS).fetchall()}
        for name, script in _scripts():
            if name not in done:
                conn.execute(script.encode())
                conn.execute(q.INSERT_MIGRATION, (name, time.time()))

"""The distributed state store: PostgreSQL through psycopg 3 (SPEC S10, M1, M3, E1).

Why psycopg 3 (rather than asyncpg): native asyncio with a maintained pool
(psycopg_pool.AsyncConnectionPool), server-side parameter binding, pipeline mode
(a batch of statements in one round trip, used by `executemany`), COPY and
LISTEN/NOTIFY, and one driver for the sync and async sides, so `submit_in` can
join an application's ordinary psycopg transaction (E1). It is maintained by the
author of psycopg2, the driver most PostgreSQL applications already use.

* claim: per workflow `SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`, then the
  planner's claim Transitions applied in the same transaction, so concurrent
  schedulers on any number of hosts take disjoint tasks without waiting (M1).
* apply and submit: group-committed (pg_commit.py): the writes waiting when a
  transaction starts share it, fenced UPDATEs and INSERTs first, the rows they
  imply after, in pipeline mode (pg_write.py).
* wake-ups: whatever makes work claimable NOTIFYs in its transaction; `watch`
  LISTENs, so idle schedulers anywhere wake when work appears instead of polling.

Faults. Serialization failures and deadlocks are retried. A lost connection is
waited out (up to `reconnect_for` seconds, with backoff) and the call retried;
the pool itself never gives up (R2): it is opened without waiting for the
database, and reconnects with capped backoff for as long as it takes, whether
the database went away at start-up or later. One line is logged when the
database becomes unreachable, one every half minute while it stays so, and one
when it is back (outage.py), whatever the number of callers and attempts.
for a write whose COMMIT's answer was lost, the store first asks the database
whether that transaction committed (pg_write.py), so no write is lost or
applied twice by a restart.

Times are seconds since the epoch (double precision) so the planner is the same
for every store. `now()` is the injected clock when there is one (tests), else
the database's clock (R1, DESIGN invariant 3): the offset between
`clock_timestamp()` and this process's *monotonic* clock is measured on the
first connection and refreshed every half minute, so every host judges
deadlines on the database's clock and a host's wall clock, however wrong, or
stepped by NTP, changes nothing. Migrations run at open under an advisory lock.

The pool belongs to one event loop (its "home": the first to use the store);
calls from another loop, such as a web application's while the roles run in a
background thread, are handed to it.

The URL is a libpq one: ``postgresql://user@host:5432/db``; to keep the tables
in a schema of their own add ``?options=-csearch_path%3DNAME``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, TypeVar

import msgspec
import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool

from sasflow.errors import ConfigurationError, StoreError
from sasflow.model import Task, TaskState
from sasflow.outage import Outage
from sasflow.plan import Plan
from sasflow.redact import redact, scrub
from sasflow.store import dead_letters
from sasflow.store import pg_sql as q
from sasflow.store.base import Alert, Census, HistoryEntry, Instance, NewTask, OutboxMessage
from sasflow.store.pg_commit import GroupCommit
from sasflow.store.pg_write import (
    Outcome,
    Write,
    insert_sync,
    needs_transaction,
    new_token,
    write_batch,
    written,
)
from sasflow.store.rows import (
    alert_from_row,
    attach_steps,
    check_legal,
    claim_transition,
    incident_params,
    instance_from_row,
    instance_params,
    task_from_row,
    versions_of,
)
from sasflow.transition import Transition
from sasflow.transport.dead_letter import DeadLetter

__all__ = ["PostgresStore"]

log = logging.getLogger("sasflow.store.postgres")

_T = TypeVar("_T")
_decode = msgspec.json.decode
_RETRIED = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)  # 40001, 40P01
_CONFLICT_ATTEMPTS = 5
_CLOCK_REFRESH_S = 30.0
_OUTBOX_LEASE_S = 30.0
_RECONNECT_FOR_S = 60.0  # how long a call waits for a lost database to come back
_BACKOFF_MAX_S = 1.0
# One wait for a pooled connection. Short, so that a caller asks again (and the
# pool tries to connect again) soon after the database is back.
_POOL_WAIT_MAX_S = 5.0
# How long the pool's own reconnection attempts go on before it stops and waits
# for a caller to ask again: psycopg_pool doubles its delay between attempts
# without a cap, which after a long outage would mean minutes before it tried.
_POOL_RECONNECT_S = 2.0
# One connection attempt's limit: a host that accepts and never answers would
# otherwise hold an attempt (and a thread, and a shutdown) forever; the attempt is
# then retried with the others' backoff. libpq counts whole seconds, 2 at the least.
_CONNECT_ATTEMPT_S = 10
# libpq's words for a URL it cannot use at all ("invalid integer value "x" for
# connection option "port"", "invalid sslmode value"), told apart from an outage
_BAD_SETTING = re.compile(r"^connection is bad: invalid ")


class _QuietPools(logging.Filter):
    """Drops psycopg_pool's line per failed connection attempt for this module's pools:
    the store reports the outage itself, rate-limited (Outage)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.levelno <= logging.WARNING and any(
            isinstance(a, str) and a.startswith(_POOL_PREFIX) for a in args))


_POOL_PREFIX = "sasflow-store-"
logging.getLogger("psycopg.pool").addFilter(_QuietPools())


def _has_jit(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> bool:
    return conn.info.server_version >= 110000  # PostgreSQL 10 has no JIT to turn off


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """Every pooled connection's session settings (pg_sql.SESSION_SETUP)."""
    if _has_jit(conn):
        await conn.execute(q.SESSION_SETUP)


class _Lost(Exception):
    """The connection died inside a write: whether it committed is not known yet."""


class PostgresStore:
    """Tasks, steps, history, alerts, outbox and leases in one PostgreSQL database."""

    def __init__(self, conninfo: str, *, clock: Callable[[], float] | None = None,
                 create: bool = True, pool_size: int = 10,
                 reconnect_for: float = _RECONNECT_FOR_S) -> None:
        self.conninfo = conninfo
        self.pool_size = pool_size
        self.reconnect_for = reconnect_for
        self._clock = clock
        self._create = create
        # database clock - this process's monotonic clock; until first measured, this
        # host's wall clock stands in (Worker measures it before any role starts)
        self._offset = time.time() - time.monotonic()
        self._offset_at = float("-inf")  # monotonic time of the last measurement
        # the pool and group commit live in their home event loop, made on first use
        self._home_lock = threading.Lock()
        self._home: asyncio.AbstractEventLoop | None = None
        self._pool: AsyncConnectionPool | None = None
        self._commit: GroupCommit[Write, bool] | None = None
        self._open_lock = asyncio.Lock()
        self._opened = False
        self._schema_ready = False
        self.migrations_applied: list[str] = []  # by this process, for `sasflow db upgrade`
        self._sync: psycopg.Connection[Any] | None = None  # for submit_blocking
        self._sync_lock = threading.Lock()
        self.outage = Outage(log, "the PostgreSQL store")

    @classmethod
    def from_url(cls, url: str, *, clock: Callable[[], float] | None = None,
                 create: bool = True) -> PostgresStore:
        if url.startswith("postgres:"):  # libpq knows both schemes; keep one spelling
            url = "postgresql:" + url[len("postgres:"):]
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as error:
            raise ConfigurationError(f"bad PostgreSQL URL {redact(url)!r}: {scrub(str(error), url)}"
                                     ) from None  # the cause quotes the URL
        return cls(url, clock=clock, create=create)

    # ------------------------------------------------------------ clock
    def now(self) -> float:
        """The database's clock, read locally: monotonic time plus the measured offset."""
        if self._clock is not None:
            return self._clock()
        return time.monotonic() + self._offset

    def _clock_is_stale(self) -> bool:
        return self._clock is None and time.monotonic() - self._offset_at > _CLOCK_REFRESH_S

    def _measure_clock(self, db_now: float, sent: float, received: float) -> None:
        # the server read its clock about halfway through the round trip
        self._offset = db_now - (sent + received) / 2
        self._offset_at = received

    async def _refresh_clock(self, conn: psycopg.AsyncConnection[Any]) -> None:
        sent = time.monotonic()
        row = await (await conn.execute(q.DB_CLOCK)).fetchone()
        assert row is not None
        self._measure_clock(float(row[0]), sent, time.monotonic())

    # ------------------------------------------------------------ home loop
    def _home_for(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        """The loop the pool lives in; `loop` becomes it if there is none alive."""
        with self._home_lock:
            home = self._home
            if home is None or home.is_closed() or (home is not loop
                                                    and not home.is_running()):
                # a new home: the old loop is gone, and its connections with it
                self._home = home = loop
                self._pool = AsyncConnectionPool(
                    self.conninfo, min_size=0, max_size=self.pool_size, open=False,
                    kwargs={"autocommit": True, "connect_timeout": self._connect_timeout()},
                    configure=_configure,
                    name=f"{_POOL_PREFIX}{id(self):x}", reconnect_timeout=_POOL_RECONNECT_S)
                self._commit = GroupCommit(self._write)
                self._open_lock = asyncio.Lock()
                self._opened = False
            return home

    async def _at_home(self, make: Callable[[], Awaitable[_T]]) -> _T:
        """Run `make()` in the pool's home loop, from whichever loop calls."""
        loop = asyncio.get_running_loop()
        home = self._home_for(loop)
        if home is loop:
            return await make()

        async def there() -> _T:
            return await make()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(there(), home))

    # ------------------------------------------------------------ connections
    async def _open(self, backoff: _Backoff) -> AsyncConnectionPool:
        """Open the pool (it connects in the background) and check the schema once.

        The pool is never closed for want of a database: waiting for it here is
        the caller's `backoff`, and the next call waits again (R2).
        """
        pool = self._pool
        assert pool is not None
        async with self._open_lock:
            if self._opened:
                return pool
            await pool.open(wait=False)
            while not self._schema_ready:  # checked before any use
                try:
                    await asyncio.to_thread(self._ensure_schema)
                except StoreError as error:
                    if isinstance(error.__cause__, psycopg.OperationalError):
                        await backoff.wait(error.__cause__)
                        continue
                    await self._discard(pool)  # not an outage: the schema is behind,
                    raise  # or a bad password
                except ConfigurationError:
                    await self._discard(pool)
                    raise
            self.outage.recovered()
            self._opened = True
        return pool

    async def _discard(self, pool: AsyncConnectionPool) -> None:
        """Close a pool whose connecting would never succeed (its workers would retry
        for ever, holding up the loop's end); the next call makes a new one."""
        await pool.close()
        with self._home_lock:
            self._home = None

    async def _run(self, job: Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]], *,
                   transaction: bool = True, lost: str = "retry",
                   backoff: _Backoff | None = None) -> _T:
        """Run `job` (in the home loop), retrying what may be retried.

        With `transaction`, in one transaction; without, each statement is a
        transaction by itself (reads, and writes of one statement: no BEGIN or
        COMMIT round trips). Again after a conflict (40001, 40P01). After a lost
        connection, with `lost="retry"` (reads and writes safe to repeat) again
        once the database is back, for up to `reconnect_for` seconds; with
        `lost="raise"` the caller, who knows how to find out what committed, gets
        `_Lost`. Waiting for a connection counts against the same budget
        (`backoff`, the caller's if it has one).
        """
        backoff = backoff or _Backoff(self.reconnect_for, self.outage)
        pool = await self._open(backoff) if not self._opened else self._pool
        assert pool is not None
        conflicts = 0
        while True:
            try:
                async with pool.connection(timeout=backoff.patience()) as conn:
                    self.outage.recovered()
                    if self._clock_is_stale():
                        await self._refresh_clock(conn)
                    if not transaction:
                        return await job(conn)
                    # pipeline mode: BEGIN goes with the first statement and COMMIT
                    # with the last, instead of a round trip each
                    async with conn.pipeline(), conn.transaction():
                        return await job(conn)
            except _RETRIED as error:
                conflicts += 1
                if conflicts == _CONFLICT_ATTEMPTS:
                    raise StoreError(f"the PostgreSQL store kept conflicting: {error}"
                                     ) from error
                await asyncio.sleep(random.uniform(0.001, 0.01) * 2 ** conflicts)
            except psycopg.OperationalError as error:
                # the pool replaces a broken connection when it is given back
                if lost == "raise":
                    raise _Lost(str(error)) from error
                await backoff.wait(error)

    async def _written(self, task_ids: Sequence[str], token: int, backoff: _Backoff,
                       lost: _Lost) -> set[str]:
        """After a lost answer: which of these tasks the write with `token` wrote."""
        backoff.note(lost)
        found = await self._run(lambda conn: written(conn, task_ids, token),
                                transaction=False, backoff=backoff)
        if found:
            log.warning("a write's answer was lost (%s); it had committed", lost)
        return found

    def _connect_timeout(self) -> int:
        """Seconds one connection attempt may take (within what the caller waits)."""
        return max(2, int(min(self.reconnect_for, _CONNECT_ATTEMPT_S)))

    def _ensure_schema(self) -> None:
        """Check (or bring up to date) the schema, on a connection of its own."""
        try:
            with psycopg.connect(self.conninfo, connect_timeout=self._connect_timeout()) as conn:
                self.migrations_applied += _migrate(conn, self._create)
        except psycopg.OperationalError as error:
            if _BAD_SETTING.search(str(error)):  # no server will ever accept it: say so now
                raise ConfigurationError(f"bad PostgreSQL URL: {error}") from error
            raise StoreError(f"cannot reach the PostgreSQL store: {error}") from error
        except pg_errors.InsufficientPrivilege as error:
            raise StoreError("the PostgreSQL store's sasflow schema is missing or behind and"
                             " this role may not create it: run `sasflow db upgrade` as the"
                             f" schema's owner ({error})") from error
        self._schema_ready = True

    def _sync_connection(self) -> psycopg.Connection[Any]:
        if self._sync is None or self._sync.closed or self._sync.broken:
            try:
                # autocommit: a submission is one statement, a transaction by itself
                self._sync = psycopg.connect(self.conninfo, autocommit=True,
                                             connect_timeout=self._connect_timeout())
                if _has_jit(self._sync):
                    self._sync.execute(q.SESSION_SETUP)
            except psycopg.Error as error:
                raise StoreError(f"cannot reach the PostgreSQL store: {error}") from error
            if not self._schema_ready:
                self._ensure_schema()
            if self._clock_is_stale():
                sent = time.monotonic()
                row = self._sync.execute(q.DB_CLOCK).fetchone()
                assert row is not None
                self._measure_clock(float(row[0]), sent, time.monotonic())
        return self._sync

    # ------------------------------------------------------------ writing
    async def _write(self, batch: Sequence[Write]) -> list[Outcome]:
        """One group-commit batch, written exactly once, whatever the connection does."""
        backoff = _Backoff(self.reconnect_for, self.outage)
        outcomes: dict[str, Outcome] = {}
        pending = list(batch)
        while pending:
            token = new_token()
            try:
                done = await self._write_once(pending, token, backoff)
            except _Lost as lost:
                found = await self._written([w.task_id for w in pending], token, backoff, lost)
                if found:  # it committed: what applied is what carries its token
                    for write in pending:
                        if isinstance(write, Transition) or write.task_id in found:
                            outcomes[write.task_id] = write.task_id in found
                    # a submission without it existed already: ask again to learn why
                    pending = [w for w in pending if w.task_id not in outcomes]
                if pending:
                    await backoff.wait(None)  # (not written: write it again)
                continue
            outcomes.update(zip((w.task_id for w in pending), done, strict=True))
            pending = []
        return [outcomes[write.task_id] for write in batch]

    async def _write_once(self, batch: Sequence[Write], token: int, backoff: _Backoff
                          ) -> list[Outcome]:
        return await self._run(lambda conn: write_batch(conn, batch, token, self.now()),
                               transaction=needs_transaction(batch), lost="raise",
                               backoff=backoff)

    async def _group_commit(self, write: Write) -> bool:
        async def enqueue() -> bool:
            assert self._commit is not None
            if not self._opened:
                await self._open(_Backoff(self.reconnect_for, self.outage))
            return await self._commit(write)

        return await self._at_home(enqueue)

    # ------------------------------------------------------------ submission
    async def submit(self, task: NewTask, *, connection: Any = None) -> bool:
        if isinstance(connection, psycopg.AsyncConnection):
            [outcome] = await write_batch(connection, [task], new_token(), self.now())
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        if connection is not None:
            return self.submit_in(connection, task)
        return await self._group_commit(task)

    def submit_blocking(self, task: NewTask) -> bool:
        """A submission from a thread: on the store's own blocking connection.

        Safe to repeat (a task that is there already is left alone), so it is
        simply written again if the connection dies, once the database is back.
        """
        with self._sync_lock:
            conflicts = 0
            deadline = time.monotonic() + self.reconnect_for
            while True:
                try:
                    # one statement, autocommit: a transaction by itself
                    return insert_sync(self._sync_connection(), task, self.now())
                except _RETRIED as error:
                    conflicts += 1
                    if conflicts == _CONFLICT_ATTEMPTS:
                        raise StoreError(f"the PostgreSQL store kept conflicting: {error}"
                                         ) from error
                except (psycopg.OperationalError, StoreError) as error:
                    if time.monotonic() > deadline:
                        raise StoreError(f"the PostgreSQL store failed: {error}") from error
                    time.sleep(0.2)

    def submit_in(self, connection: Any, task: NewTask) -> bool:
        """Write the task with the caller's psycopg connection, in its transaction (E1).

        Nothing is committed here: the task commits, or rolls back, with the
        caller's own rows (and schedulers are notified only if it commits).
        """
        if not isinstance(connection, psycopg.Connection):
            raise ConfigurationError(
                "connection must be a psycopg.Connection to the store's database")
        if not self._schema_ready:  # the caller's transaction may be the store's first use
            self._ensure_schema()
        return insert_sync(connection, task, self.now())

    # ------------------------------------------------------------ scheduler
    async def claim(self, owner: str, limit: int, plans: Mapping[str, Plan]) -> list[Task]:
        # only the versions declared here (R4): (workflow, version) of each plan
        shapes = [(name, plan.workflow.version) for name, plan in plans.items()]
        if not shapes or limit <= 0:
            return []

        token = new_token()
        locked: list[str] = []

        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Task]:
            now = self.now()
            rows: list[tuple[Any, ...]] = []
            async with conn.cursor() as cur:
                for name, version in shapes:
                    await cur.execute(q.SELECT_CLAIMABLE, (name, version, now, limit))
                    rows.extend(await cur.fetchall())
            if not rows:  # nothing written: no WAL flush at commit
                return []
            if len(shapes) > 1:  # the earliest runnable first, whatever their workflow;
                # the rows left over are unlocked again at commit
                rows = sorted(rows, key=lambda row: row[8])[:limit]
            tasks = await _tasks_with_steps(conn, rows)
            planned = [claimed for task in tasks
                       if (claimed := claim_transition(plans[task.workflow], task, owner, now))]
            tasks = [task for _, task in planned]  # as claimed
            transitions = [transition for transition, _ in planned]
            locked[:] = [task.task_id for task in tasks]
            applied = await write_batch(conn, transitions, token, now) if transitions else []
            return [task for task, ok in zip(tasks, applied, strict=True) if ok is True]

        async def claim_here() -> list[Task]:
            backoff = _Backoff(self.reconnect_for, self.outage)
            try:
                return await self._run(job, lost="raise", backoff=backoff)
            except _Lost as lost:
                # the answer was lost: the claim committed if its token is there
                found = await self._written(locked, token, backoff, lost) if locked else set()
                if not found:
                    return []
                claimed = await self._run(lambda conn: _select_tasks(conn, found),
                                          transaction=False, backoff=backoff)
                return [task for task in claimed if task.locked_by == owner]

        return await self._at_home(claim_here)

    async def apply(self, transition: Transition) -> bool:
        check_legal(transition)  # refused before it can share a batch with others
        return await self._group_commit(transition)

    # ------------------------------------------------------------ supervisor
    async def expired(self, limit: int, workflows: Collection[str] | None = None
                      ) -> list[Task]:
        names = None if workflows is None else list(workflows)

        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Task]:
            now = self.now()
            if names is None:
                cur = await conn.execute(q.SELECT_EXPIRED, (now, limit))
            else:
                cur = await conn.execute(q.SELECT_EXPIRED_OF, (names, now, limit, limit))
            return _tasks_and_their_steps(await cur.fetchall())

        return await self._at_home(lambda: self._run(job, transaction=False))

    async def next_expiry(self, workflows: Collection[str] | None = None) -> float | None:
        if workflows is None:
            row = await self._fetchone(q.NEXT_EXPIRY, ())
        else:
            row = await self._fetchone(q.NEXT_EXPIRY_OF, (list(workflows),))
        return None if row is None or row[0] is None else float(row[0])

    # ------------------------------------------------------------ incidents (R4)
    async def census(self) -> Census:
        versions = await self._fetchall(q.CENSUS_VERSIONS, ())
        agents = await self._fetchall(q.CENSUS_AGENTS, ())
        return Census(versions={(w, v): n for w, v, n in versions},
                      agents={(w, v, a): n for w, v, a, n in agents})

    async def incidents(self) -> list[Alert]:
        rows = await self._fetchall(q.SELECT_OPEN_INCIDENTS, ())
        return sorted((alert_from_row(row) for row in rows), key=lambda a: a.id)

    async def report_incidents(self, raised: Collection[Alert], resolved: Collection[str]
                               ) -> None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> None:
            now = self.now()
            for incident in [*resolved, *(a.incident for a in raised)]:
                await conn.execute(q.RESOLVE_INCIDENT, {"now": now, "incident": incident})
            for alert in raised:
                await conn.execute(q.INSERT_INCIDENT, incident_params(alert, now))

        if raised or resolved:  # repeated after a lost commit: at worst an alert twice
            await self._at_home(lambda: self._run(job))

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> tuple[Any, ...] | None:
            now = self.now()  # after the first connection has measured the clock
            return await (await conn.execute(q.ACQUIRE_LEASE,
                                             (name, holder, now + ttl, now))).fetchone()

        # safe to repeat: taking or renewing a lease we hold is the same write
        row = await self._at_home(lambda: self._run(job))
        return int(row[1]) if row is not None and row[0] == holder else None

    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Not heard across processes yet: a client waiting here polls."""
        return lambda: None

    async def watch(self, wake: Callable[[float], None]) -> None:
        """Call `wake(at)` whenever work becomes claimable at `at`, until cancelled.

        Its own connection LISTENs for the NOTIFY that submissions and releases
        send at commit. After (re)connecting it calls `wake(now)` once, for what
        may have been missed meanwhile.
        """
        backoff = _Backoff(float("inf"), self.outage)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self.conninfo, autocommit=True) as conn:
                    await conn.execute(q.LISTEN_WORK)
                    backoff = _Backoff(float("inf"), self.outage)
                    self.outage.recovered()
                    wake(self.now())
                    async for notice in conn.notifies():
                        try:
                            wake(float(notice.payload))
                        except ValueError:  # not one of ours
                            wake(self.now())
            except psycopg.OperationalError as error:
                await backoff.wait(error)

    # ------------------------------------------------------------ reading
    async def get(self, task_id: str) -> Task | None:
        found = await self._at_home(lambda: self._run(
            lambda conn: _select_tasks(conn, [task_id]), transaction=False))
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
        return [alert_from_row(row) for row in rows]

    async def _fetchall(self, statement: str, params: Sequence[Any] | Mapping[str, Any]
                        ) -> list[tuple[Any, ...]]:
        async def job(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            return await (await conn.execute(statement, params)).fetchall()

        return await self._at_home(lambda: self._run(job, transaction=False))

    async def _fetchone(self, statement: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        rows = await self._fetchall(statement, params)
        return rows[0] if rows else None

    # ------------------------------------------------------------ instances (R2)
    async def beat(self, instance: Instance, *, first: bool = False) -> None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(q.BEAT, instance_params(instance, self.now(), first))

        await self._at_home(lambda: self._run(job))  # the same row again: safe to repeat

    async def stopped(self, instance_id: str) -> None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(q.MARK_STOPPED, {"instance_id": instance_id, "now": self.now()})

        await self._at_home(lambda: self._run(job))

    async def instances(self, *, instance_id: str | None = None) -> list[Instance]:
        rows = await self._fetchall(q.SELECT_INSTANCES, {"instance_id": instance_id})
        return [instance_from_row(row) for row in rows]

    async def orphaned(self, limit: int, workflows: Collection[str] | None = None
                       ) -> list[Task]:
        names = None if workflows is None else list(workflows)

        async def job(conn: psycopg.AsyncConnection[Any]) -> list[Task]:
            cur = await conn.execute(q.SELECT_ORPHANED, {"now": self.now(), "limit": limit,
                                                         "workflows": names})
            return _tasks_and_their_steps(await cur.fetchall())

        return await self._at_home(lambda: self._run(job, transaction=False))

    # ------------------------------------------------------------ dead letters (R3)
    async def add_dead_letter(self, letter: DeadLetter) -> None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(_DEAD_LETTER_SQL["insert"], dead_letters.letter_params(letter))

        await self._at_home(lambda: self._run(job))  # keyed by its id: safe to repeat

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        rows = await self._fetchall(_DEAD_LETTER_SQL["oldest"], {"limit": limit})
        return [dead_letters.letter_from_row(row) for row in rows]

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        rows = await self._fetchall(_DEAD_LETTER_SQL["one"], {"id": letter_id})
        return dead_letters.letter_from_row(rows[0]) if rows else None

    async def purge_dead_letters(self) -> int:
        async def job(conn: psycopg.AsyncConnection[Any]) -> int:
            # counted by the statement itself: a pipelined cursor's rowcount is not known yet
            row = await (await conn.execute(_DEAD_LETTER_SQL["purge"])).fetchone()
            return int(row[0]) if row else 0

        count: int = await self._at_home(lambda: self._run(job))
        return count

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

        # repeating it after a lost commit only leases more: they go out when it ends
        rows = await self._at_home(lambda: self._run(job))
        return sorted((OutboxMessage(id=r[0], queue=r[1], body=bytes(r[2])) for r in rows),
                      key=lambda m: m.id)

    async def ack_outbox(self, ids: Collection[int]) -> None:
        if ids:
            async def job(conn: psycopg.AsyncConnection[Any]) -> None:
                await conn.execute(q.DELETE_OUTBOX, (list(ids),))

            await self._at_home(lambda: self._run(job))

    async def close(self) -> None:
        with self._home_lock:
            home, pool = self._home, self._pool
            self._home = self._pool = self._commit = None
            self._opened = False
        if pool is not None and not pool.closed and home is not None and not home.is_closed():
            if home is asyncio.get_running_loop():
                await pool.close()
            elif home.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(pool.close(), home))
        with self._sync_lock:
            if self._sync is not None:
                self._sync.close()
                self._sync = None


class _Backoff:
    """Waits growing from 50 ms to 1 s, for at most `budget` seconds in all; each
    failed attempt is told to `outage`, which decides whether to log it."""

    def __init__(self, budget: float, outage: Outage) -> None:
        self._outage = outage
        self._deadline = time.monotonic() + budget
        self._delay = 0.05
        self._error: Exception | None = None  # the last cause, for the final error

    def note(self, error: Exception) -> None:
        self._error = error

    def patience(self) -> float:
        """How long one wait for a connection may last: what is left of the budget."""
        return min(max(self._deadline - time.monotonic(), 0.05), _POOL_WAIT_MAX_S)

    async def wait(self, error: Exception | None) -> None:
        self._error = error or self._error
        if time.monotonic() >= self._deadline:
            raise StoreError(f"the PostgreSQL store stayed unreachable: {self._error}"
                             ) from self._error
        if error is not None:
            self._outage.failed(error)
        await asyncio.sleep(random.uniform(0.5, 1.0) * self._delay)
        self._delay = min(self._delay * 2, _BACKOFF_MAX_S)


# ---------------------------------------------------------------- reading
async def _select_tasks(conn: psycopg.AsyncConnection[Any], task_ids: Collection[str]
                        ) -> list[Task]:
    if len(task_ids) == 1:
        [task_id] = task_ids
        cur = await conn.execute(q.SELECT_TASK_WITH_STEPS, (task_id,))
    else:
        cur = await conn.execute(q.SELECT_TASKS_WITH_STEPS, (list(task_ids),))
    return _tasks_and_their_steps(await cur.fetchall())


def _tasks_and_their_steps(rows: Iterable[tuple[Any, ...]]) -> list[Task]:
    """Tasks from rows of TASK_COLUMNS followed by their steps as JSON (STEPS_AS_JSON)."""
    tasks: dict[str, Task] = {}
    steps: list[tuple[Any, ...]] = []
    for row in rows:
        task = task_from_row(row)
        tasks[task.task_id] = task
        if row[-1] is not None:
            steps.extend((task.task_id, *step) for step in _decode(row[-1]))
    attach_steps(tasks, steps)
    return list(tasks.values())


async def _tasks_with_steps(conn: psycopg.AsyncConnection[Any],
                            rows: Iterable[tuple[Any, ...]]) -> list[Task]:
    tasks = {task.task_id: task for task in map(task_from_row, rows)}
    if tasks:
        cur = await conn.execute(q.SELECT_STEPS, (list(tasks),))
        attach_steps(tasks, await cur.fetchall())
    return list(tasks.values())


_DEAD_LETTER_SQL = {name: dead_letters.postgres(statement) for name, statement in (
    ("insert", dead_letters.INSERT), ("oldest", dead_letters.SELECT_OLDEST),
    ("one", dead_letters.SELECT_ONE),
    ("purge", f"WITH gone AS ({dead_letters.PURGE} RETURNING 1) SELECT count(*) FROM gone"))}


# ---------------------------------------------------------------- migrations
def _scripts() -> list[tuple[str, str]]:
    folder = resources.files("sasflow.store.migrations") / "postgres"
    return sorted((f.name, f.read_text()) for f in folder.iterdir() if f.name.endswith(".sql"))


_VERSIONS_MIGRATION = "0004_versions.sql"  # tasks gained a version column


def _migrate(conn: psycopg.Connection[Any], create: bool) -> list[str]:
    """Apply the packaged migrations this database has not seen, in order, atomically.

    With `create=False` a database that is behind is refused instead. A database
    that is up to date is only read, so processes whose role may not CREATE can
    open it. Returns the names of the migrations it applied.
    """
    with conn.transaction():
        pending = _pending(conn)
        if not pending:
            return []
        if not create:
            raise StoreError("the PostgreSQL store's sasflow schema is missing or behind"
                             " this version: run `sasflow db upgrade`")
        conn.execute(q.MIGRATION_LOCK)  # one migrating process at a time; till commit
        conn.execute(q.CREATE_MIGRATIONS)
        pending = _pending(conn)  # again: another may have just finished
        for name, script in pending:
            conn.execute(script.encode())  # no parameters: several statements
            if name == _VERSIONS_MIGRATION:  # tasks written before get their version
                with conn.cursor() as cur:
                    cur.executemany(q.SET_VERSION, versions_of(
                        conn.execute(q.SELECT_UNVERSIONED).fetchall()))
            conn.execute(q.INSERT_MIGRATION, (name, time.time()))
    return [name for name, _ in pending]


def _pending(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    row = conn.execute(q.MIGRATIONS_TABLE_EXISTS).fetchone()
    done = {r[0] for r in conn.execute(q.SELECT_MIGRATIONS).fetchall()} if (
        row and row[0]) else set()
    return [(name, script) for name, script in _scripts() if name not in done]

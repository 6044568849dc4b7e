"""PostgreSQL's connections: the pool, its home event loop, the clock, and running a
job on a connection through every fault that can be waited out.

Faults. Serialization failures and deadlocks are retried. A lost connection is
waited out (up to `reconnect_for` seconds, with backoff) and the job retried;
the pool itself never gives up (R2): it is opened without waiting for the
database, and reconnects with capped backoff for as long as it takes, whether
the database went away at start-up or later. One line is logged when the
database becomes unreachable, one every half minute while it stays so, and one
when it is back (outage.py), whatever the number of callers and attempts.

The clock (R1, DESIGN invariant 3): `now()` is the injected clock when there is
one (tests), else the database's: the offset between `clock_timestamp()` and
this process's *monotonic* clock is measured on the first connection and
refreshed every half minute, so every host judges deadlines on the database's
clock and a host's wall clock, however wrong, or stepped by NTP, changes nothing.

The pool belongs to one event loop (its "home": the first to use the store);
calls from another loop, such as a web application's while the roles run in a
background thread, are handed to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from sasflow import loop_calls
from sasflow.errors import ConfigurationError, StoreError
from sasflow.outage import Outage, Repeats
from sasflow.store import queries
from sasflow.store.postgres import migrations
from sasflow.store.postgres.backoff import Backoff
from sasflow.store.postgres.closing import PoolCloser, close_pool, close_there
from sasflow.store.postgres.plans import FreshPlans
from sasflow.store.postgres.silent import ANSWER_WITHIN_S, Answered
from sasflow.store.postgres.stalled import StalledTransactions, session_name

__all__ = ["CONFLICT_ATTEMPTS", "RETRIED", "Connections", "Lost"]

log = logging.getLogger("sasflow.store.postgres")

_T = TypeVar("_T")
_Q = queries.load("postgres", "pyformat")
RETRIED = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)  # 40001, 40P01
# a lock waited on past lock_timeout (55P03): its holder may be a stalled transaction,
# ended before the job runs again (stalled.py), or another's long lock (a migration's)
LOCK_WAIT_RAN_OUT = pg_errors.LockNotAvailable
CONFLICT_ATTEMPTS = 5
_CLOCK_REFRESH_S = 30.0
_RECONNECT_FOR_S = 60.0  # how long a call waits for a lost database to come back
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
_POOL_PREFIX = "sasflow-store-"

Job = Callable[[psycopg.AsyncConnection[Any]], Awaitable[_T]]


class _QuietPools(logging.Filter):
    """Drops psycopg_pool's line per failed connection attempt for this module's pools:
    the store reports the outage itself, rate-limited (Outage)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.levelno <= logging.WARNING and any(
            isinstance(a, str) and a.startswith(_POOL_PREFIX) for a in args))


logging.getLogger("psycopg.pool").addFilter(_QuietPools())


def has_jit(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> bool:
    return conn.info.server_version >= 110000  # PostgreSQL 10 has no JIT to turn off


class Lost(Exception):
    """The connection died inside a write: whether it committed is not known yet."""


class Connections:
    """The pool of one store, in its home loop, and the database's clock."""

    def __init__(self, conninfo: str, *, clock: Callable[[], float] | None, create: bool,
                 pool_size: int, reconnect_for: float = _RECONNECT_FOR_S) -> None:
        self.conninfo = conninfo
        self.pool_size = pool_size
        self.reconnect_for = reconnect_for
        self.answer_within = ANSWER_WITHIN_S
        self._clock = clock
        self._create = create
        # database clock - this process's monotonic clock; until first measured, this
        # host's wall clock stands in (Worker measures it before any role starts)
        self._offset = time.time() - time.monotonic()
        self._offset_at = float("-inf")  # monotonic time of the last measurement
        self._home_lock = threading.Lock()
        self._home: asyncio.AbstractEventLoop | None = None
        self.pool: AsyncConnectionPool | None = None
        self._closer: PoolCloser | None = None  # the open pool's (closing.py)
        self._on_new_home: Callable[[], None] = lambda: None
        self._open_lock = asyncio.Lock()
        self.opened = False
        self.schema_ready = False
        self.migrations_applied: list[str] = []  # by this process, for `sasflow db upgrade`
        self.outage = Outage(log, "the PostgreSQL store")
        self._lock_waits = Repeats(log, "the PostgreSQL store waited past its lock_timeout"
                                        " on a lock another session holds, and waits again",
                                   level=logging.WARNING)
        # a young store's plans, made again as its tables grow (plans.py)
        self.plans = FreshPlans()
        self.session_name = session_name(conninfo)
        self.stalled = StalledTransactions()

    def backoff(self, budget: float | None = None) -> Backoff:
        return Backoff(self.reconnect_for if budget is None else budget, self.outage)

    # ------------------------------------------------------------ clock
    def now(self) -> float:
        """The database's clock, read locally: monotonic time plus the measured offset."""
        if self._clock is not None:
            return self._clock()
        return time.monotonic() + self._offset

    def clock_is_stale(self) -> bool:
        return self._clock is None and time.monotonic() - self._offset_at > _CLOCK_REFRESH_S

    async def _refresh_clock(self, conn: psycopg.AsyncConnection[Any]) -> None:
        sent = time.monotonic()
        row = await (await conn.execute(_Q["db_clock"])).fetchone()
        assert row is not None
        self._measured(float(row["now"]), sent, time.monotonic())

    def _measured(self, db_now: float, sent: float, received: float) -> None:
        # the server read its clock about halfway through the round trip
        self._offset = db_now - (sent + received) / 2
        self._offset_at = received

    # ------------------------------------------------------------ home loop
    def on_new_home(self, made: Callable[[], None]) -> None:
        """Call `made()` whenever the pool gets a new home loop (its loop-bound parts
        are made again there)."""
        self._on_new_home = made

    def is_home(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether `loop` is the pool's living home (not whether it would become it)."""
        home = self._home
        return home is loop or home is None or home.is_closed() or not home.is_running()

    def lives_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether the pool is open and lives on `loop`, still running."""
        home = self._home
        return home is loop and self.pool is not None and not home.is_closed()

    def open_here(self) -> bool:
        """Whether the pool lives on the running loop and is open: its queues may then be
        used at once, with no hop and no wait."""
        return self._home is asyncio.get_running_loop() and self.opened

    def _home_for(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        """The loop the pool lives in; `loop` becomes it if there is none alive."""
        with self._home_lock:
            home = self._home
            if home is None or home.is_closed() or (home is not loop
                                                    and not home.is_running()):
                # a new home: the old loop is gone, and its connections with it
                self._home = home = loop
                self.pool = AsyncConnectionPool(
                    self.conninfo, min_size=0, max_size=self.pool_size, open=False,
                    kwargs={"autocommit": True, "connect_timeout": self.connect_timeout(),
                            "row_factory": dict_row, "application_name": self.session_name},
                    configure=self._configure,
                    name=f"{_POOL_PREFIX}{id(self):x}", reconnect_timeout=_POOL_RECONNECT_S)
                self._open_lock = asyncio.Lock()
                self.opened = False
                self._on_new_home()
            return home

    def at_home(self, make: Callable[[], Awaitable[_T]]) -> Awaitable[_T]:
        """`make()` in the pool's home loop, from whichever loop calls: on the home loop
        itself, what it gives, with no coroutine around it."""
        loop = asyncio.get_running_loop()
        # a running loop that is the home stays it (another thread makes a new home only
        # of a loop closed or stopped): known without the lock
        home = loop if self._home is loop else self._home_for(loop)
        if home is loop:
            return make()
        return loop_calls.into(home)(make)

    # ------------------------------------------------------------ connections
    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Every pooled connection's session settings: its bounds (stalled.py) and
        queries.sql session_setup. Bounded as a job: a pool worker held here by a server
        gone silent after the handshake would make no connection again."""
        async with self.answered(conn):
            await self.stalled.bound(conn)
            if has_jit(conn):
                await conn.execute(_Q["session_setup"])

    def connect_timeout(self) -> int:
        """Seconds one connection attempt may take (within what the caller waits)."""
        return max(2, int(min(self.reconnect_for, _CONNECT_ATTEMPT_S)))

    async def open(self, backoff: Backoff) -> AsyncConnectionPool:
        """Open the pool (it connects in the background) and check the schema once.

        The pool is never closed for want of a database: waiting for it here is
        the caller's `backoff`, and the next call waits again (R2).
        """
        pool = self.pool
        assert pool is not None
        async with self._open_lock:
            if self.opened:
                return pool
            await pool.open(wait=False)
            if self._closer is None or self._closer.pool is not pool:
                self._closer = PoolCloser(pool)  # (closed with the loop if not before)
            while not self.schema_ready:  # checked before any use
                try:
                    await asyncio.to_thread(self.ensure_schema)
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
            self.opened = True
        return pool

    async def _discard(self, pool: AsyncConnectionPool) -> None:
        """Close a pool whose connecting would never succeed (its workers would retry
        for ever, holding up the loop's end); the next call makes a new one."""
        closer, self._closer = self._closer, None
        await close_pool(pool, closer)
        with self._home_lock:
            self._home = None

    def ensure_schema(self) -> None:
        """Check (or bring up to date) the schema, on a connection of its own."""
        try:
            with psycopg.connect(self.conninfo, connect_timeout=self.connect_timeout()) as conn:
                self.migrations_applied += migrations.migrate(
                    conn, self._create, answer_within=self.answer_within)
        except psycopg.OperationalError as error:
            if _BAD_SETTING.search(str(error)):  # no server will ever accept it: say so now
                raise ConfigurationError(f"bad PostgreSQL URL: {error}") from error
            raise StoreError(f"cannot reach the PostgreSQL store: {error}") from error
        except pg_errors.InsufficientPrivilege as error:
            raise StoreError("the PostgreSQL store's sasflow schema is missing or behind and"
                             " this role may not create it: run `sasflow db upgrade` as the"
                             f" schema's owner ({error})") from error
        self.schema_ready = True

    async def run(self, job: Job[_T], *, transaction: bool = True,
                  lost: Literal["retry", "raise"] = "retry",
                  backoff: Backoff | None = None) -> _T:
        """Run `job` (in the home loop), retrying what may be retried.

        With `transaction`, in one transaction; without, each statement is a
        transaction by itself (reads, and writes of one statement: no BEGIN or
        COMMIT round trips). Again after a conflict (40001, 40P01), a few times;
        again after a lock waited on past lock_timeout (55P03), for as long as a
        lost connection is waited for: a stalled holder is ended meanwhile
        (stalled.py), and another's lock (a migration's ACCESS EXCLUSIVE, an
        operator's session) is waited out as the database's outage would be. After a lost
        connection, with `lost="retry"` (reads and writes safe to repeat) again
        once the database is back, for up to `reconnect_for` seconds; with
        `lost="raise"` the caller, who knows how to find out what committed, gets
        `Lost`. Waiting for a connection counts against the same budget
        (`backoff`, the caller's if it has one).
        """
        backoff = backoff or self.backoff()
        pool = await self.open(backoff) if not self.opened else self.pool
        assert pool is not None
        conflicts = 0
        while True:
            try:
                async with self._connection(pool, backoff.patience()) as conn, \
                        self.answered(conn):
                    self.outage.recovered()
                    if self.clock_is_stale():
                        await self._refresh_clock(conn)
                    if self.stalled.due():
                        await self.stalled.end(conn)
                    if not transaction:
                        return await job(conn)
                    # pipeline mode: BEGIN goes with the first statement and COMMIT
                    # with the last, instead of a round trip each
                    async with conn.pipeline(), conn.transaction():
                        return await job(conn)
            except LOCK_WAIT_RAN_OUT as error:
                self.stalled.look_again()
                self._lock_waits.failed(error)
                await backoff.wait_for_lock(error)
            except RETRIED as error:
                conflicts += 1
                if conflicts == CONFLICT_ATTEMPTS:
                    raise StoreError(f"the PostgreSQL store kept conflicting: {error}"
                                     ) from error
                await asyncio.sleep(random.uniform(0.001, 0.01) * 2 ** conflicts)
            except psycopg.OperationalError as error:
                # the pool replaces a broken connection when it is given back
                if lost == "raise":
                    raise Lost(str(error)) from error
                await backoff.wait(error)

    def answered(self, conn: psycopg.AsyncConnection[Any]) -> Answered:
        """What runs inside gets the server's answers within `answer_within` seconds,
        or `conn` is given up as lost (silent.py)."""
        return Answered(conn, self.answer_within)

    @staticmethod
    @contextlib.asynccontextmanager
    async def _connection(pool: AsyncConnectionPool, patience: float
                          ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """`pool.connection(patience)`, but a caller cancelled while it waits for one
        ends cancelled. psycopg_pool waits through `asyncio.wait_for`, which on
        Python 3.11 returns the connection instead of raising when the caller is
        cancelled just as it is handed over (CPython gh-86296): the cancellation was
        lost, and a role's task went on with its loop while its stop waited for
        ever. The task's count of cancellations asked for tells: if it grew during
        the wait and nothing was raised, the connection goes back and the
        cancellation is raised here (test_postgres_cancellation)."""
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        conn = await pool.getconn(patience)
        if task is not None and task.cancelling() > asked:
            await pool.putconn(conn)
            raise asyncio.CancelledError
        try:
            async with conn:  # as pool.connection(): commit or roll back, not close
                yield conn
        finally:
            await pool.putconn(conn)

    async def replan(self) -> None:
        """Replace the pool's connections, and with them their prepared statements'
        plans (plans.py); in the home loop. Never fails: a batch has just committed,
        and plans left as they were are a lost optimisation, not a fault."""
        pool = self.pool
        if pool is None or pool.closed:
            return
        try:
            await pool.drain()
        except Exception as error:  # (the pool closing meanwhile)
            log.debug("the store's connections were not replaced: %s", error)

    async def close(self) -> None:
        with self._home_lock:
            home, pool, closer = self._home, self.pool, self._closer
            self._home = self.pool = self._closer = None
            self.opened = False
        if pool is None or pool.closed or home is None or home.is_closed():
            return
        if home is asyncio.get_running_loop():
            await close_pool(pool, closer)
        elif home.is_running():
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                close_pool(pool, closer), home))
        elif closer is not None and closer.pool is pool:
            # idle (an async test's loop under a sync fixture, or asyncio.run's before
            # its shutdown): closed there as soon as it runs again, by its closer's
            # cancellation if that comes first (closing.py)
            loop_calls.tell(home, close_there, closer)  # (False: closed meanwhile)

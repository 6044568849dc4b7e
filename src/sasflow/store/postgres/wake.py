"""Wake-ups on PostgreSQL, by LISTEN/NOTIFY: NOTIFY is transactional, delivered at
commit and never on rollback, so a listener hears only what happened.

* ``sasflow_work``: whatever makes work claimable NOTIFYs, in its statement, when
  the work becomes claimable (bulk.py); `listen_for_work` wakes idle schedulers.
* ``sasflow_finished``: once a batch that ends tasks committed, `CommitNotices`
  NOTIFYs their ids, one per line, in payloads under PostgreSQL's 8000-byte limit
  (bulk.py, queries.sql notify_finished: not in the batch's own transaction,
  where the notify lock would be held through its WAL flush), beside the writers
  rather than in their way; `FinishedListener` tells a client's waiters, in
  whatever process they are.
* ``sasflow_outbox``: once a batch that wrote status messages committed,
  `CommitNotices` NOTIFYs it too; `listen_for_statuses` wakes the outbox's
  readers (outbox.py), which took it every 50 ms before, a write each time.

A channel is the database's, not a schema's: stores of other schemas of the same
database may be heard too, and a listener treats what it hears as a hint to read
the store, never as the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg

from sasflow.store import queries
from sasflow.store.postgres.bulk import Notices, tell
from sasflow.store.postgres.connections import Connections
from sasflow.store.postgres.silent import Answered

__all__ = ["CommitNotices", "FinishedListener", "listen_for_statuses", "listen_for_work"]

log = logging.getLogger("sasflow.store.postgres")

_Q = queries.load("postgres", "pyformat")
_JOIN_S = 1.0  # how long a closing listener waits for its thread
_RETRY_MAX_S = 2.0


async def listen_for_work(conninfo: str, db: Connections, wake: Callable[[float], None]
                          ) -> None:
    """Call `wake(at)` whenever work becomes claimable at `at`, until cancelled.

    Its own connection LISTENs for the NOTIFY that submissions and releases send
    at commit. After (re)connecting it calls `wake(now)` once, for what may have
    been missed meanwhile.
    """
    def heard(payload: str | None) -> None:
        try:
            wake(db.now() if payload is None else float(payload))
        except ValueError:  # not one of ours
            wake(db.now())

    await _listen(conninfo, db, "listen_work", heard)


async def listen_for_statuses(conninfo: str, db: Connections, written: Callable[[], None]
                              ) -> None:
    """Call `written()` whenever a commit wrote status messages, until cancelled, and
    once after each (re)connection."""
    await _listen(conninfo, db, "listen_outbox", lambda _: written())


async def _listen(conninfo: str, db: Connections, statement: str,
                  heard: Callable[[str | None], None]) -> None:
    """LISTEN on a connection of its own: `heard(payload)` for each notice, and
    `heard(None)` after each (re)connection, for what may have been missed meanwhile."""
    backoff = db.backoff(float("inf"))
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                    conninfo, autocommit=True, connect_timeout=db.connect_timeout()) as conn:
                async with db.answered(conn):
                    await conn.execute(_Q[statement])
                backoff = db.backoff(float("inf"))
                db.outage.recovered()
                heard(None)
                async for notice in notices(conn, db.answer_within):
                    heard(notice.payload)
        except psycopg.OperationalError as error:
            await backoff.wait(error)


async def notices(conn: psycopg.AsyncConnection[Any], answer_within: float
                  ) -> AsyncIterator[psycopg.Notify]:
    """What `conn` hears, until it breaks or, asked after a quiet spell of
    `answer_within` seconds, its server does not answer within as long (silent.py).
    A listener on a link gone silent would otherwise wait for ever, and whatever it
    wakes would wait for its own polls: an idle scheduler's are 2 s apart."""
    while True:
        quiet = True
        async for notice in conn.notifies(timeout=answer_within):
            quiet = False
            yield notice
        if quiet:
            async with Answered(conn, answer_within):
                await conn.execute(_Q["still_there"])


class FinishedListener:
    """Calls its subscribers with the id of every task that a commit, by any process,
    ended. Its thread, with an event loop of its own, and its connection start with
    the first subscriber (the waiters of a client may live on any event loop, as the
    SQLite store's wake channel serves them) and stop at `close`. While its
    connection is down nothing is heard: the waiters' polling is the safety net."""

    def __init__(self, conninfo: str, connect_timeout: int, answer_within: float) -> None:
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._answer_within = answer_within
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[str], None]] = []
        self._thread: threading.Thread | None = None
        self._hearing: _Hearing | None = None
        self.listening = threading.Event()  # set while LISTEN is in effect

    def subscribe(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Call `finished(task_id)`, from the listener's thread; returns the unsubscribe."""
        with self._lock:
            self._subscribers.append(finished)
            if self._thread is None:
                self._hearing = _Hearing()
                self._thread = threading.Thread(target=asyncio.run,
                                                args=(self._hear(self._hearing),),
                                                daemon=True, name="sasflow-pg-finished")
                self._thread.start()

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._subscribers.remove(finished)

        return unsubscribe

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            hearing, self._hearing = self._hearing, None
        if hearing is not None:
            hearing.stop()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_JOIN_S)

    async def _hear(self, hearing: _Hearing) -> None:
        if not hearing.started():
            return
        delay = 0.05
        try:
            while True:
                try:
                    async with await psycopg.AsyncConnection.connect(
                            self._conninfo, autocommit=True,
                            connect_timeout=self._connect_timeout) as conn:
                        async with Answered(conn, self._answer_within):
                            await conn.execute(_Q["listen_finished"])
                        self.listening.set()
                        delay = 0.05
                        async for notice in notices(conn, self._answer_within):
                            if notice.channel == "sasflow_finished":
                                self._tell(notice.payload.split("\n"))
                except psycopg.Error as error:
                    self.listening.clear()
                    log.debug("listening for finished tasks: %s", error)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX_S)
        except asyncio.CancelledError:
            pass  # closed: the loop, and the thread, end here
        finally:
            self.listening.clear()

    def _tell(self, task_ids: list[str]) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for task_id in task_ids:
            for finished in subscribers:
                finished(task_id)


class _Hearing:
    """One run of a listener's thread, stopped from any thread: before its loop runs
    (it then never starts) or while it runs (its task is cancelled)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._cancel: Callable[[], object] | None = None

    def started(self) -> bool:
        """On the thread's loop, in its task: False if already stopped."""
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        with self._lock:
            if not self._stopped:
                self._cancel = lambda: loop.call_soon_threadsafe(task.cancel)
            return not self._stopped

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            cancel = self._cancel
        if cancel is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                cancel()


class CommitNotices:
    """Tells the waiting clients of other processes which tasks ended, and the
    outbox's readers that status messages were written, once the write committed,
    without holding up the writer: the NOTIFY is a round trip of its own (0.3-0.4
    ms of a single task's latency when the writer waited for it,
    docs/benchmarks.md), and this process's own waiters are told as each write
    returns (signals.py). A notice that fails is lost; waiting clients poll too,
    and the outbox's readers look now and then."""

    def __init__(self, db: Connections) -> None:
        self._db = db
        self._sending: set[asyncio.Task[None]] = set()

    def tell(self, notices: Notices) -> None:
        """Send `notices` on a connection of the pool (on its home loop)."""
        notice = asyncio.get_running_loop().create_task(self._send(notices))
        self._sending.add(notice)
        notice.add_done_callback(self._sending.discard)

    async def sent(self) -> None:
        """Once every notice on its way from this loop has gone, or failed."""
        here = asyncio.get_running_loop()
        await asyncio.gather(*(notice for notice in self._sending if notice.get_loop() is here))

    async def _send(self, notices: Notices) -> None:
        try:
            await self._db.run(lambda conn: tell(conn, notices), transaction=False,
                               lost="raise")
        except Exception as error:
            log.debug("%d ended task(s) (and status messages: %s) not told: %s",
                      len(notices.ended), notices.statuses, error)

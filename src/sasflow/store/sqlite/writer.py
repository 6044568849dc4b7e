"""Group commit for SQLite: one writer thread, many callers, few transactions.

Callers hand the writer a job (a function of the connection); the writer runs
every job that is waiting in one `BEGIN IMMEDIATE ... COMMIT`, so concurrent
tasks share one commit instead of paying one each (DESIGN "Where the speed comes
from"). If a job raises, the batch is rolled back and each job re-run in a
transaction of its own, so one bad job never takes another's writes with it.
Jobs must therefore be safe to re-run: they read what they need inside the
transaction.

The connection is prepared (schema, journal mode) once when the writer starts,
without waiting for any lock: the store may be made inside a caller's open
transaction on the same file (E1), which holds the very write lock preparing
may need, so a first attempt that finds the lock taken gives up at once. Until
preparation succeeds it is tried again, waiting as usual, before each batch
and before a reader's first read.
Errors from SQLite itself reach callers through `translate` (the store maps
them to StoreError).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sasflow.background_loop import take_early_answer
from sasflow.loop_calls import tell

__all__ = ["Writer"]

log = logging.getLogger("sasflow.store")

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], Any]
_MAX_BATCH = 512
# the longest the writer waits for the rest of a batch (see _gather): a commit's time,
# but never more than this
_MOST_PATIENCE_S = 0.001


class Writer:
    """A thread owning the one write connection of this process."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], *,
                 prepare: Callable[[sqlite3.Connection], None] = lambda conn: None,
                 translate: Callable[[BaseException], BaseException] = lambda error: error,
                 before_commit: Callable[[sqlite3.Connection], None] = lambda conn: None,
                 after_rollback: Callable[[], None] = lambda: None,
                 pause: Callable[[threading.Event, float], object] = threading.Event.wait
                 ) -> None:
        self._jobs: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._connect = connect
        self._prepare = prepare
        self._translate = translate
        self._prepared = False
        self._first_prepare = threading.Event()  # set when the first attempt has ended
        self._prepare_error: BaseException | None = None
        self._before_commit = before_commit  # jobs may defer bulk writes until then
        self._after_rollback = after_rollback
        # how the writer waits for the rest of a batch: until `_gathered` is set, for
        # at most the time given; `_awaited` is how many jobs must be queued to set it
        self._pause = pause
        self._gathered = threading.Event()
        self._awaited = 0
        self._ready = concurrent.futures.Future[None]()
        self._thread = threading.Thread(target=self._run, name="sasflow-sqlite-writer",
                                        daemon=True)
        self._thread.start()
        self._ready.result()

    async def run(self, job: Callable[[sqlite3.Connection], T], *,
                  then: Callable[[T], None] | None = None) -> T:
        """Run `job` in the next group transaction and return what it returned.

        `then(result)` runs in this thread right after the commit, before the
        awaiting coroutine resumes (a wake-up for other processes need not wait for
        a turn of a busy loop); it must be quick and must not raise. So is the
        answer the coroutine promised its blocking caller once this write is
        durable (background_loop.answer_early): the caller need not wait for the
        loop to resume the coroutine first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._put((job, future, loop, _and_answer(then, take_early_answer())))
        return await future

    def run_sync(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """`run` for callers outside any event loop."""
        future = concurrent.futures.Future[T]()
        self._put((job, future, None, None))
        return future.result()

    def _put(self, item: _Item) -> None:
        self._jobs.put(item)
        if self._awaited and self._jobs.qsize() >= self._awaited:  # the batch is whole
            self._awaited = 0
            self._gathered.set()

    def wait_prepared(self) -> None:
        """Return once the connection is prepared; raise what preparing raised, if it
        still fails when tried again (the lock it needed may have been let go since)."""
        self._first_prepare.wait()
        if self._prepared:
            return
        if not self._thread.is_alive():
            assert self._prepare_error is not None
            raise self._prepare_error
        self.run_sync(lambda conn: None)  # an empty batch: the writer prepares first

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        try:
            conn = self._connect()
        except BaseException as error:
            self._ready.set_exception(error)
            return
        try:
            self._first_attempt(conn)
        except BaseException as error:
            self._ready.set_exception(error)
            self._first_prepare.set()
            conn.close()
            return
        self._ready.set_result(None)
        siblings, patience = 1, 0.0  # the last batch's size, and how long it took
        try:
            while True:
                first = self._jobs.get()
                if first is None:
                    return
                batch = self._gather(first, siblings, patience)
                if not self._try_prepare(conn):
                    _settle_all([(item, None, self._prepare_error) for item in batch])
                    continue
                began = time.perf_counter()
                outcomes = self._commit(conn, batch)
                siblings = len(batch)
                patience = min(time.perf_counter() - began, _MOST_PATIENCE_S)
                _settle_all(outcomes)
        finally:
            self._first_prepare.set()  # nobody waits for a thread that has ended
            conn.close()

    def _gather(self, first: _Item, siblings: int, patience: float) -> list[_Item]:
        """`first` and the jobs waiting behind it: the next batch.

        If at most half as many are waiting as the last batch held, the writers
        of that batch, each woken by its commit, are most likely on their way
        with their next jobs (a step's next state follows its reply; a
        sequential client's next submission follows its answer). Committing now
        would commit the first of them alone and the rest a transaction later;
        which of them comes first is a matter of microseconds on their event
        loop, and it moved a sequential client's row between 12k and 15k
        transactions for the same 40k writes (docs/benchmarks.md). So the writer
        waits for them, until as many jobs are queued as the last batch held,
        but at most as long as the last transaction took: the early ones then
        wait no longer than the late ones would have waited behind a
        transaction of their own. Past half, it does not wait: a straggler
        left to the next transaction costs less than holding up the rest (a
        batch of hundreds would wait for the few that finish its load). A lone
        writer (the last batch was one job) never waits. This is PostgreSQL's
        commit_delay with commit_siblings, the siblings counted by the last
        batch instead of by open transactions.
        """
        if _expects_more(self._jobs.qsize() + 1, siblings):
            self._gathered.clear()
            self._awaited = siblings - 1
            if self._jobs.qsize() < self._awaited:  # (one may have come meanwhile)
                self._pause(self._gathered, patience)
            self._awaited = 0
        batch = [first]
        while len(batch) < _MAX_BATCH:
            try:
                more = self._jobs.get_nowait()
            except queue.Empty:
                break
            if more is None:
                self._jobs.put(None)  # finish this batch, then stop
                break
            batch.append(more)
        return batch

    def _first_attempt(self, conn: sqlite3.Connection) -> None:
        """Prepare without waiting for a lock another connection holds."""
        patience = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            self._try_prepare(conn)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(patience)}")

    def _try_prepare(self, conn: sqlite3.Connection) -> bool:
        if not self._prepared:
            try:
                self._prepare(conn)
            except Exception as error:
                self._prepare_error = self._translate(error)
            else:
                self._prepared, self._prepare_error = True, None
            self._first_prepare.set()
        return self._prepared

    def _commit(self, conn: sqlite3.Connection, batch: list[_Item]) -> list[_Outcome]:
        try:
            conn.execute("BEGIN IMMEDIATE")
            results = [job(conn) for job, _, _, _ in batch]
            self._before_commit(conn)
            conn.execute("COMMIT")
        except BaseException as error:
            if conn.in_transaction:
                # a full disk or an I/O error may fail the rollback too; SQLite has then
                # rolled back itself, and this thread must live on to answer the others
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            self._after_rollback()
            if len(batch) == 1:
                return [(batch[0], None, self._translate(error))]
            outcomes: list[_Outcome] = []
            for item in batch:  # find the culprit: each job in a transaction of its own
                outcomes.extend(self._commit(conn, [item]))
            return outcomes
        return [(item, result, None) for item, result in zip(batch, results, strict=True)]


def _expects_more(waiting: int, siblings: int) -> bool:
    """Whether a batch of `waiting` jobs, after one of `siblings`, waits for the rest
    of them (see `Writer._gather`): while no more than half have come."""
    return 2 * waiting <= siblings


# a job, its future, the loop awaiting it (None: a thread), what follows its commit
_Item = tuple[Job, "asyncio.Future[Any] | concurrent.futures.Future[Any]",
              asyncio.AbstractEventLoop | None, Callable[[Any], None] | None]
_Outcome = tuple[_Item, Any, BaseException | None]


def _settle_all(outcomes: list[_Outcome]) -> None:
    """Wake every waiter; one hop per event loop, not one per job. What follows a
    commit (`run`'s `then`) runs last, once the loops have been told: whatever a
    blocking caller answered early does next on its loop comes after its coroutine
    has ended."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        (_, future, loop, _) = outcome[0]
        if loop is None:
            assert isinstance(future, concurrent.futures.Future)
            _, result, error = outcome
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
        else:
            by_loop.setdefault(loop, []).append(outcome)
    for loop, group in by_loop.items():
        tell(loop, _settle_in_loop, group)  # (False: a closed loop, nobody waits)
    for (_, _, _, then), result, error in outcomes:
        if then is not None and error is None:
            try:
                then(result)
            except Exception:  # the write is done: its waiter still hears of it
                log.exception("after a commit")


def _and_answer(then: Callable[[T], None] | None, answer: Callable[[], None] | None
                ) -> Callable[[T], None] | None:
    """`then`, followed by giving the early answer, if there is one."""
    if answer is None:
        return then

    def both(result: T) -> None:
        if then is not None:
            then(result)
        answer()

    return both


def _settle_in_loop(outcomes: list[_Outcome]) -> None:
    for (_, future, _, _), result, error in outcomes:
        if future.done():
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

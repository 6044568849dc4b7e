"""Reading single tasks (`get`, what `App.await_` reads): reads that wait together
travel together, and a read from another event loop than the pool's is answered
on that loop.

* Many clients waiting for their tasks share one statement, one round trip: a
  lone read goes at once; while reads are in flight the next ones gather, and each
  batch is one statement (`task_id = ANY(:ids)`; a batch of one, `task_id = :id`).
* Tasks are made of their rows here: a task row with its steps as JSON (the steps
  fragment), or task rows whose steps a statement of their own fetches.
* The pool lives in one loop (connections.py); a call from another loop is
  handed to it and its answer handed back, four thread wake-ups a read, each
  waiting for the busy roles' loop and for a CPU. Measured on the 2-core machine
  under load (bench/pg_reads.py's shape): ~670-1,070 µs a read handed over against
  ~350-400 µs on a connection of the caller's loop. So each other loop that reads
  gets one connection of its own, its reads batched one statement at a time; when
  that connection fails, the read goes the pool's way, which waits out outages.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import msgspec
import psycopg
from psycopg.rows import dict_row

from sasflow.model import Task
from sasflow.store import queries
from sasflow.store.postgres.flushers import Flushers
from sasflow.store.postgres.silent import Answered
from sasflow.store.rows import Row, attach_steps, task_from_row

__all__ = ["GuestReads", "ReadBatch", "read_of", "read_text_of", "tasks_of_rows",
           "tasks_with_steps"]

_Q = queries.load("postgres", "pyformat")
_decode = msgspec.json.decode

Read = Callable[[Sequence[str]], Awaitable[list[Task]]]


class ReadBatch:
    """Batches reads by task id for one event loop; `read` fetches a batch of ids."""

    def __init__(self, read: Read, *, in_flight: int = 4, max_batch: int = 512) -> None:
        self._read = read
        self._max_batch = max_batch
        self._waiting: dict[str, list[asyncio.Future[Task | None]]] = {}
        self._readers = Flushers(self._read_all, in_flight)

    async def __call__(self, task_id: str) -> Task | None:
        future: asyncio.Future[Task | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(task_id, []).append(future)
        self._readers.queued()
        return await future

    async def _read_all(self) -> None:
        while self._waiting:
            ids = list(self._waiting)[:self._max_batch]
            batch = {task_id: self._waiting.pop(task_id) for task_id in ids}
            try:
                found = {task.task_id: task for task in await self._read(ids)}
            except Exception as error:
                for futures in batch.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(error)
                continue
            for task_id, futures in batch.items():
                task = found.get(task_id)
                for n, future in enumerate(futures):
                    if not future.done():  # each its own copy: callers may change theirs
                        future.set_result(task if n == 0 else copy.deepcopy(task))


class _Guest:
    """One other loop's connection and its batch of reads."""

    def __init__(self, reads: GuestReads) -> None:
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.batch = ReadBatch(lambda ids: reads.fetch(self, ids), in_flight=1)

    def drop(self) -> None:
        """Close the connection at once, its loop gone or going (no round trip)."""
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            conn.pgconn.finish()


class GuestReads:
    """Reads from event loops other than the pool's, each on a connection of its loop.

    `statement(ids)` is the statement and parameters that read them; `rows_to_tasks`
    makes tasks of its rows; `fallback` reads the pool's way (after a failure here, or
    before the store has opened).
    """

    def __init__(self, conninfo: str, *,
                 statement: Callable[[Sequence[str]], tuple[str, dict[str, Any]]],
                 setup: str | None,
                 rows_to_tasks: Callable[[list[Any]], list[Task]], fallback: Read,
                 connect_timeout: int, answer_within: float) -> None:
        self._conninfo = conninfo
        self._statement = statement
        self._setup = setup
        self._rows_to_tasks = rows_to_tasks
        self._fallback = fallback
        self._connect_timeout = connect_timeout
        self._answer_within = answer_within  # (silent.py)
        self._lock = threading.Lock()
        self._guests: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Guest] = (
            weakref.WeakKeyDictionary())

    async def get(self, task_id: str) -> Task | None:
        loop = asyncio.get_running_loop()
        with self._lock:
            guest = self._guests.get(loop)
            if guest is None:
                guest = self._guests[loop] = _Guest(self)
                weakref.finalize(loop, guest.drop)  # a loop that ends before the store
        return await guest.batch(task_id)

    async def fetch(self, guest: _Guest, ids: Sequence[str]) -> list[Task]:
        try:
            if guest.conn is None or guest.conn.closed:
                guest.conn = await self._connect()
            async with Answered(guest.conn, self._answer_within):
                cur = await guest.conn.execute(*self._statement(ids))
                return self._rows_to_tasks(await cur.fetchall())
        except psycopg.OperationalError:
            if guest.conn is not None:
                await guest.conn.close()
                guest.conn = None
            return await self._fallback(ids)  # the pool's way waits out an outage

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, row_factory=dict_row,
            connect_timeout=self._connect_timeout)
        if self._setup is not None:
            async with Answered(conn, self._answer_within):
                await conn.execute(self._setup)
        return conn

    async def close(self) -> None:
        """Close every loop's connection: this loop's politely, others' at once (their
        loops may be gone)."""
        with self._lock:
            guests = list(self._guests.items())
            self._guests.clear()
        here = asyncio.get_running_loop()
        for loop, guest in guests:
            if loop is here and guest.conn is not None:
                conn, guest.conn = guest.conn, None
                await conn.close()
            else:
                guest.drop()


def read_of(task_ids: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """The statement that reads these tasks: one alone by `task_id = %s` (a one-element
    array parameter costs ~100 µs more to adapt and parse, benchmarks.md)."""
    if len(task_ids) == 1:
        return "select_task", {"task_id": task_ids[0]}
    return "select_tasks", {"task_ids": list(task_ids)}


def read_text_of(task_ids: Sequence[str]) -> tuple[str, dict[str, Any]]:
    name, params = read_of(task_ids)
    return _Q[name], params


def tasks_of_rows(rows: Iterable[Row]) -> list[Task]:
    """Tasks from task rows with their steps as JSON (the steps fragment)."""
    rows = list(rows)
    tasks = {task.task_id: task for task in map(task_from_row, rows)}
    attach_steps(tasks, _steps_of(rows))
    return list(tasks.values())


def _steps_of(rows: Iterable[Row]) -> list[tuple[Any, ...]]:
    """Unit rows, in columns.STEP's order, from rows with a task id and its steps as
    JSON arrays (the steps fragment: each of those columns but task_id, in order)."""
    return [(row["task_id"], *step)
            for row in rows if row["steps"] is not None for step in _decode(row["steps"])]


async def tasks_with_steps(conn: psycopg.AsyncConnection[Any], rows: Iterable[Row]
                           ) -> list[Task]:
    """Tasks from task rows, their steps read in a statement of their own."""
    tasks = {task.task_id: task for task in map(task_from_row, rows)}
    if tasks:
        cur = await conn.execute(_Q["select_steps"], {"task_ids": list(tasks)})
        attach_steps(tasks, _steps_of(await cur.fetchall()))
    return list(tasks.values())

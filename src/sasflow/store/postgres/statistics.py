"""Plans made again as the store's tables outgrow the ones they were made on.

PostgreSQL plans a statement from how large its tables are, and the store's
statements are prepared (psycopg, at their sixth run on a connection):
PostgreSQL then soon settles on one plan for each (a generic plan), kept for as
long as the connection lives, however the tables grow. On a new store those
plans are made on tables of a few rows, where reading the whole table is the
cheapest way to find a batch's hundred tasks, and nothing makes PostgreSQL plan
them again until autovacuum analyzes the table: a minute or more later
(autovacuum_naptime), once enough rows changed. Until then each write batch
read every task and compared it with each of the batch's ids, and looked tasks
up through `tasks_state` by state, reading every task in that state: a batch
cost more as the table grew, and PostgreSQL spent about twice the CPU a
completed step over a first run of 5,000 tasks (docs/benchmarks.md, "Plans made
on an empty table").

So the store looks at the tasks table as its writes (submissions and
transitions) pass 512, 2,048, 8,192, 32,768 and then 131,072: if it holds more
than twice the tasks it held when it was last analyzed (or it never was), and
at least 256, the store runs ANALYZE on tasks, steps and history, on a sample
of 3,000 rows a table (autovacuum samples fully later on). ANALYZE updates
their statistics, and makes every session of the database plan its statements
again, other processes' included. The tasks it holds are the server's count of
live rows (which can lag its writes by a second or so), or the tasks this store
has submitted since it opened if more. On tables autovacuum keeps current, the
look finds them so and does nothing. The look runs beside the writes (never in
their way); ANALYZE passes over a table autovacuum is analyzing at that moment
(SKIP_LOCKED); a failure leaves the tables to autovacuum, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from sasflow.store import queries
from sasflow.store.postgres.connections import Connections
from sasflow.transition import Transition

__all__ = ["GROWTH", "SMALLEST", "WRITE_MARKS", "TableStatistics"]

log = logging.getLogger("sasflow.store.postgres")

_Q = queries.load("postgres", "pyformat")
# writes through this store since it opened at which it looks at the tables' size
WRITE_MARKS = (512, 2_048, 8_192, 32_768, 131_072)
GROWTH = 2.0  # more than this many times the tasks it held when last analyzed: analyze
SMALLEST = 256  # tasks: fewer, and a whole-table read is as good as any plan


class TableStatistics:
    """Looks at the tasks table as this store's writes pass each of `marks`, and
    analyzes the store's large tables if it has outgrown its statistics."""

    def __init__(self, db: Connections, marks: Sequence[int] = WRITE_MARKS) -> None:
        self._db = db
        self._marks = tuple(marks)
        self._writes = 0
        self._submitted = 0  # tasks submitted through this store since it opened
        self._passed = 0  # how many of the marks the writes have passed
        self._looking: asyncio.Task[None] | None = None
        self._again = False  # a mark passed while a look was under way
        self.analyzed = 0  # times this store ran ANALYZE

    def written(self, batch: Sequence[Any]) -> None:
        """Count a batch just written (on the pool's loop); past a mark, look at the
        tables in the background."""
        if self._passed == len(self._marks):
            return  # grown up: autovacuum's from here
        self._writes += len(batch)
        self._submitted += sum(1 for write in batch if not isinstance(write, Transition))
        if self._writes < self._marks[self._passed]:
            return
        while self._passed < len(self._marks) and self._writes >= self._marks[self._passed]:
            self._passed += 1
        self._again = True
        if self._looking is None or self._looking.done():
            self._looking = asyncio.get_running_loop().create_task(self._looks())

    async def _looks(self) -> None:
        while self._again:
            self._again = False
            await self._look()

    async def _look(self) -> None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int] | None:
            row = await (await conn.execute(_Q["tasks_held"])).fetchone()
            assert row is not None
            analyzed, held = int(row["analyzed"]), max(int(row["live"]), self._submitted)
            if held < SMALLEST or held <= GROWTH * max(analyzed, 0):
                return None
            await conn.execute(_Q["sample_lightly"])
            await conn.execute(_Q["analyze_tables"])
            return analyzed, held

        try:
            grown = await self._db.run(job)  # one transaction: the light sample is its own
        except Exception as error:  # left to autovacuum: a lost optimisation, no fault
            log.debug("could not refresh the planner's statistics: %s", error)
            return
        if grown is not None:
            self.analyzed += 1
            log.debug("analyzed tasks, steps and history: %d tasks, against %d when last"
                      " analyzed (-1: never)", grown[1], grown[0])

    async def looked(self) -> None:
        """Once the look under way, if any, has ended (and its ANALYZE with it)."""
        if self._looking is not None:
            await asyncio.shield(self._looking)

    async def close(self) -> None:
        looking, self._looking = self._looking, None
        if looking is not None and not looking.done():
            looking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await looking

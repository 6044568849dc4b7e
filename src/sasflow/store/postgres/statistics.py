"""Planner statistics kept current while the store's tables grow from empty.

PostgreSQL plans a statement from what its statistics say a table holds, and the
store's statements are prepared: from their sixth run on a connection, the plan
made then is kept for as long as the connection lives (a generic plan). On a new
store those plans are made on tables of a few rows, where reading the whole
table is the cheapest way to find a batch's hundred tasks, and the statistics
say nothing else until autovacuum analyzes the table: a minute or more later
(autovacuum_naptime), and only once enough rows have changed. Until then each
write batch read every task and compared it with each of the batch's ids, and
looked tasks up through `tasks_state` by state, reading every task in that
state: a batch cost more as the table grew, and PostgreSQL spent twice the CPU
a completed step over a first run of 5,000 tasks (docs/benchmarks.md, "Plans
made on an empty table").

So the store analyzes `tasks` and `steps` itself while it is young: when the
tasks it has submitted since it opened pass 128, 1,024, 8,192 and then 65,536,
it reads how many tasks the statistics count, and if that is fewer than it
submitted, runs ANALYZE. ANALYZE updates the statistics and makes every session
of the database plan its statements again, other processes' included. A store
whose tables are large and analyzed already finds the count above its own
submissions and does nothing: autovacuum keeps such tables current. The check
runs beside the writes (never in their way), ANALYZE passes over a table
autovacuum is analyzing at that moment (SKIP_LOCKED), and a failure leaves the
statistics to autovacuum, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from sasflow.store import queries
from sasflow.store.postgres.bulk import Write
from sasflow.store.postgres.connections import Connections
from sasflow.transition import Transition

__all__ = ["SUBMITTED_MARKS", "TableStatistics"]

log = logging.getLogger("sasflow.store.postgres")

_Q = queries.load("postgres", "pyformat")
# submissions by this store since it opened at which it looks at the statistics
SUBMITTED_MARKS = (128, 1_024, 8_192, 65_536)


class TableStatistics:
    """Looks at the statistics of the tasks table as this store's submissions pass
    each of `marks`, and analyzes it (with steps) if they count fewer tasks."""

    def __init__(self, db: Connections, marks: Sequence[int] = SUBMITTED_MARKS) -> None:
        self._db = db
        self._marks = tuple(marks)
        self._submitted = 0
        self._passed = 0  # how many of the marks the submissions have passed
        self._looking: asyncio.Task[None] | None = None
        self.analyzed = 0  # times this store ran ANALYZE (for tests and logs)

    def written(self, batch: Sequence[Write]) -> None:
        """Count the submissions of a batch just written (on the pool's loop); past a
        mark, look at the statistics in the background."""
        if self._passed == len(self._marks):
            return  # grown up: autovacuum's from here
        self._submitted += sum(1 for write in batch if not isinstance(write, Transition))
        if self._submitted < self._marks[self._passed]:
            return
        while self._passed < len(self._marks) and self._submitted >= self._marks[self._passed]:
            self._passed += 1
        if self._looking is None or self._looking.done():
            self._looking = asyncio.get_running_loop().create_task(self._look(self._submitted))

    async def _look(self, submitted: int) -> None:
        async def job(conn: psycopg.AsyncConnection[Any]) -> bool:
            row = await (await conn.execute(_Q["tasks_counted"])).fetchone()
            if row is not None and row["tasks"] >= submitted:
                return False
            await conn.execute(_Q["analyze_tables"])
            return True

        try:
            analyzed = await self._db.run(job, transaction=False)
        except Exception as error:  # left to autovacuum: a lost optimisation, no fault
            log.debug("could not refresh the planner's statistics: %s", error)
            return
        if analyzed:
            self.analyzed += 1
            log.debug("analyzed tasks and steps after %d submissions", submitted)

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

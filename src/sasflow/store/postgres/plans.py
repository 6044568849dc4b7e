"""Plans made again as a young store's tables outgrow the ones they were made on.

The store's statements are prepared (psycopg, at their sixth run on a
connection), and PostgreSQL soon settles on one plan for each (a generic plan),
made from how large the tables are at that moment and kept for as long as the
prepared statement lives, however the tables grow. On a new store those plans
are made on tables of a few rows, where reading the whole table is the cheapest
way to find a batch's hundred tasks: each write batch then read every task and
compared it with each of the batch's ids, and found each task it updates
through `tasks_state`, by state. A batch cost more as the table grew, and
PostgreSQL spent about twice the CPU a completed step over a first run of 5,000
tasks (docs/benchmarks.md, "Plans made on an empty table"). Only an ANALYZE
would make PostgreSQL plan them again, and autovacuum runs one a minute or more
later.

So as the store's writes (submissions and transitions) pass 512, 2,048, 8,192,
32,768 and then 131,072, the store's pool replaces its connections
(psycopg_pool's `drain()`: idle ones at once, busy ones as they come back), and
with them their prepared statements: they are prepared and planned again on
the tables as they are. The planner reads a table's size from its current pages
(scaled by its last statistics, or from the rows' width if it has none), so the
new plans fit the grown tables with no ANALYZE: nothing is locked, no other
session's plans change, and a role that does not own the tables (which may not
analyze them) gets the same plans. A new connection costs the server a few
milliseconds, a few times in a store's life. Past the last mark the tables have
outgrown the plans' worst case, and autovacuum's statistics have long taken
over.

(Dropping the statements on the same connections, `DEALLOCATE ALL`, would need
psycopg to forget its own record of them at the same moment, which it does only
in some of the cases: new connections need nothing of psycopg's insides.)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["WRITE_MARKS", "FreshPlans"]

# writes through this store since it opened at which its plans are made again
WRITE_MARKS = (512, 2_048, 8_192, 32_768, 131_072)


class FreshPlans:
    """Counts the store's writes, and tells when they pass one of `marks`."""

    def __init__(self, marks: Sequence[int] = WRITE_MARKS) -> None:
        self._marks = tuple(marks)
        self._writes = 0
        self._passed = 0  # how many of the marks the writes have passed
        self.replanned = 0  # times the store's plans were made again

    def due(self, count: int) -> bool:
        """Count `count` writes that just committed; whether they passed a mark, so
        that the store's connections are to be replaced now."""
        if self._passed == len(self._marks):
            return False  # grown up
        self._writes += count
        passed = self._passed
        while self._passed < len(self._marks) and self._writes >= self._marks[self._passed]:
            self._passed += 1
        if self._passed == passed:
            return False
        self.replanned += 1
        return True

"""The PostgreSQL store finds rows by index, never by reading a whole table.

A statement that scans the tasks table costs more with every task stored: the
bulk transition once joined its batch to the tasks table with `IN (SELECT ...)`,
which the planner answered with a sequential scan of the whole table for every
batch (3.5 ms for a batch of one with 5,000 tasks stored). The class of fault is
"cost that grows with the store, not with the work", whichever statement has
it; so this test runs every statement a task's life takes through the store
(submission, claims, transitions, reads, the supervisor's looks) for a few
hundred tasks, on a store that already holds many finished ones with its
statistics up to date (as autovacuum keeps them), and then reads the server's
own count of the rows that sequential scans returned per table
(pg_stat_user_tables.seq_tup_read). On a small table a scan may well be the
planner's best choice; beside STORED tasks, none of this work should need one.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from sasflow.model import TaskState
from sasflow.store.postgres import PostgresStore
from support.pg_scans import run_to_the_end, scanned_rows
from support.stores import PLANS, new_task

TASKS = 300
STORED = 20_000  # finished tasks already in the store, with their steps and history
OWNER = "scheduler-1"
BIG_TABLES = ("tasks", "steps", "history")


def fill(url: str) -> None:
    """STORED processed tasks of another workflow, with three steps and a history row
    each, then ANALYZE (the statistics autovacuum would have gathered)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tasks (task_id, workflow, input, state, available_at,"
                     " created_at, updated_at, version)"
                     " SELECT 'old-' || g, 'archived', '{}', 'processed', 0, 0, 0, 'v'"
                     " FROM generate_series(1, %s) g", (STORED,))
        conn.execute("INSERT INTO steps (task_id, phase, idx, name, agent, state,"
                     " idempotency_key, updated_at)"
                     " SELECT 'old-' || g, 'do', i, 's' || i, 'a', 'completed', g || '/' || i, 0"
                     " FROM generate_series(1, %s) g, generate_series(0, 2) i", (STORED,))
        conn.execute("INSERT INTO history (task_id, at, actor, epoch, to_state)"
                     " SELECT 'old-' || g, 0, 'submit', 0, 'pending'"
                     " FROM generate_series(1, %s) g", (STORED,))
        conn.execute("ANALYZE tasks, steps, history")


async def test_no_statement_of_a_tasks_life_reads_a_whole_table(postgres_url: str) -> None:
    """Over the life of TASKS tasks beside STORED finished ones, sequential scans of
    the tasks, steps and history tables return fewer rows in all than one reading
    of the tasks table would."""
    application_name = f"scans-{uuid.uuid4().hex[:10]}"
    url = f"{postgres_url}&application_name={application_name}"
    store = PostgresStore(url)
    assert await store.get("warm-up") is None  # the schema is there
    fill(postgres_url)
    before = scanned_rows(postgres_url, application_name="(none)")
    ids = [f"task-{i:04d}" for i in range(TASKS)]
    for start in range(0, TASKS, 50):  # submissions group-committed, 50 at a time
        created = await asyncio.gather(*(store.submit(new_task(task_id))
                                         for task_id in ids[start:start + 50]))
        assert all(created)
    while claimed := await store.claim(OWNER, 50, PLANS):
        ended = await asyncio.gather(*(run_to_the_end(store, task, OWNER) for task in claimed))
        assert {task.state for task in ended} == {TaskState.PROCESSED}
        assert await store.expired(100) == []  # the supervisor's looks, meanwhile
        assert await store.next_expiry() is None
        assert await store.orphaned(100) == []
    for start in range(0, TASKS, 50):
        # clients waiting for their tasks, 50 at a time (their reads share statements).
        # Not all at once: for a batch of hundreds of ids on a table of STORED the
        # planner rightly prefers one pass over the table to hundreds of lookups
        finished = await asyncio.gather(*(store.get(task_id)
                                          for task_id in ids[start:start + 50]))
        assert all(task is not None and task.state is TaskState.PROCESSED
                   for task in finished)
    await store.close()

    after = scanned_rows(postgres_url, application_name)
    assert set(BIG_TABLES) <= set(after)
    scanned = {name: after[name] - before[name] for name in BIG_TABLES}
    assert {name: rows for name, rows in scanned.items() if rows >= STORED} == {}

"""On PostgreSQL a step's write adds no index entry that no reader needs.

PostgreSQL writes a new version of an updated row; when no indexed column changed
and the page has room, it links the new version from the old one and writes no
index entry (a HOT update). Otherwise every index of the table whose predicate the
row meets gets an entry for the new version. A task's row is written at every
step, so the class of cost is "an index over a column a step changes", whoever
adds it: such an index keeps every step's write from being made in place. One is
needed: the supervisor finds expired steps by their complete-by, in order, so that
its sweep costs what has expired (tasks_expiring). The dashboard's throughput was
another (tasks_ended over updated_at, now over ended_at, set once as a task ends).

The test derives the columns a step changes from a real step's write (the row read
before and after it) and checks them against every index's key columns,
expressions and predicate, as the server's catalogue holds them.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.rows import dict_row

from sasflow.model import TaskState
from sasflow.store.postgres import PostgresStore
from support.stores import PLANS, applies, new_task

OWNER = "scheduler-1"


def task_row(url: str, task_id: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert row is not None
    return row


def indexed_columns(url: str) -> dict[str, set[str]]:
    """Each index of the tasks table, with the columns its key, its expressions and
    its predicate read."""
    with psycopg.connect(url, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'tasks'::regclass"
            " AND attnum > 0 AND NOT attisdropped").fetchall()]
        rows = conn.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'tasks'::regclass"
        ).fetchall()
    # the definition names every column it reads, in its key, expressions or WHERE
    return {index: {name for name in names if re.search(rf"\b{name}\b", definition)}
            for index, definition in rows}


async def test_the_only_index_over_a_column_a_step_changes_is_the_supervisors(
        postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    try:
        assert await store.submit(new_task("t-1"))
        [task] = await store.claim(OWNER, 1, PLANS)
        before = task_row(postgres_url, "t-1")
        plan = PLANS[task.workflow]
        task = await applies(store, task, plan.reply(task, OWNER, True, {"ok": 1}, None,
                                                     store.now() + 1.0))
        assert task.state is TaskState.PROCESSING and task.cursor == 1  # a step, mid-task
        after = task_row(postgres_url, "t-1")
    finally:
        await store.close()
    changed = {name for name in before if before[name] != after[name]}
    assert {"cursor", "complete_by", "updated_at"} <= changed  # the derivation is live
    read_by = {index: columns & changed for index, columns in indexed_columns(postgres_url).items()}
    assert {index: columns for index, columns in read_by.items() if columns} == {
        "tasks_expiring": {"complete_by"}}

"""On PostgreSQL a step's write updates its task row in place.

PostgreSQL writes a new version of an updated row; when no indexed column changed
and the page has room, it links the new version from the old one and writes no
index entry (a HOT update). Otherwise every index of the table gets an entry for
the new version. A task's row is written at every step, so the class of cost is
"an index over a column a step changes", whichever index it is and whoever adds
it: the tasks table had five such entries a step (complete_by in two indexes,
updated_at in one, and the pkey and listing indexes for the row's new place).

The first test derives the columns a step changes from a real step's write (the
row read before and after it) and checks them against every index's key columns,
expressions and predicate, as the server's catalogue holds them. The second runs
task lives and reads the server's own count of in-place updates.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from sasflow.model import TaskState
from sasflow.store.postgres import PostgresStore
from support.pg_scans import run_to_the_end, scanned_rows
from support.stores import PLANS, applies, new_task

OWNER = "scheduler-1"
TASKS = 40


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


async def test_no_index_of_tasks_reads_a_column_that_a_step_changes(postgres_url: str) -> None:
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
    assert {index: columns for index, columns in read_by.items() if columns} == {}


async def test_the_steps_of_a_task_update_its_row_in_place(postgres_url: str) -> None:
    """Of the tasks' mid-task step writes (two a task of three steps), the server made
    at least nine in ten in place; before, none."""
    application_name = f"in-place-{uuid.uuid4().hex[:10]}"
    store = PostgresStore(f"{postgres_url}&application_name={application_name}")
    ids = [f"task-{i:03d}" for i in range(TASKS)]
    for task_id in ids:
        assert await store.submit(new_task(task_id))
    claimed = await store.claim(OWNER, TASKS, PLANS)
    assert len(claimed) == TASKS
    for task in claimed:
        assert (await run_to_the_end(store, task, OWNER)).state is TaskState.PROCESSED
    await store.close()
    scanned_rows(postgres_url, application_name)  # (waits for the backends to hand in counts)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        row = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                           " WHERE relid = 'tasks'::regclass").fetchone()
    assert row is not None
    updates, in_place = row
    assert updates == 4 * TASKS  # the claim, two steps moving on, the end
    assert in_place >= 0.9 * 2 * TASKS

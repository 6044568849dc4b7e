"""On PostgreSQL a step's write updates its task row in place.

PostgreSQL writes a new version of an updated row; when no indexed column changed
and the page has room, it links the new version from the old one and writes no
index entry (a HOT update). Otherwise every index of the table whose predicate the
row meets gets an entry for the new version. A task's row is written at every
step, so the class of cost is "an index over a column a step changes", whoever
adds it. The supervisor's index was one (complete_by, which every step moves), and
the dashboard's throughput another (updated_at). The supervisor's index now holds
a bound that a step leaves as it is (sweep_at, 0011_sweep_at.sql), so its sweep
still costs what has expired.

The first test derives the columns a step changes from a real step's write (the row
read before and after it) and checks them against every index's key columns,
expressions and predicate, as the server's catalogue holds them. The second reads
the server's own count of the updates it made in place over task lives. The last
three show the supervisor's bound at work: moved up once it has passed without its
task expiring, never hiding a task that has, and given to a task an older release
claimed without one.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from sasflow.model import TaskState
from sasflow.store.postgres import PostgresStore
from support.backends import FakeClock
from support.pg_scans import run_to_the_end, scanned_rows
from support.servers import PrivatePostgres
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


@pytest.fixture
def own_server() -> Iterator[str]:
    """A database on a PostgreSQL cluster of the test's own. A page has room for a
    row's new version once its old ones are pruned, and the server prunes only what
    no transaction can still see: another test's transaction open on the shared
    server (one with a transaction id, in any of its databases) decided the count."""
    server = PrivatePostgres().start()
    try:
        yield f"{server.create_database('in_place')}?options=-csearch_path%3Dpublic"
    finally:
        server.close()


async def test_the_steps_of_a_task_update_its_row_in_place(own_server: str) -> None:
    """Of the tasks' mid-task step writes (two a task of three steps), the server made
    at least nine in ten in place; before, none."""
    postgres_url = own_server
    application_name = f"in-place-{uuid.uuid4().hex[:10]}"
    store = PostgresStore(f"{postgres_url}&application_name={application_name}")
    for n in range(TASKS):
        assert await store.submit(new_task(f"task-{n:03d}"))
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


async def test_a_bound_that_passed_is_moved_up_to_the_complete_by(postgres_url: str) -> None:
    """A step that moves the complete-by later leaves the supervisor's bound at the
    first one. Past the bound, the task is not expired; the alarm clock names the
    true complete-by, and the bound is moved up to it."""
    clock = FakeClock()
    store = PostgresStore(postgres_url, clock=clock)
    try:
        assert await store.submit(new_task("t-1"))
        [task] = await store.claim(OWNER, 1, PLANS)
        first = task.complete_by
        assert first is not None and task_row(postgres_url, "t-1")["sweep_at"] == first
        clock.advance(1.0)
        plan = PLANS[task.workflow]
        task = await applies(store, task, plan.reply(task, OWNER, True, {"ok": 1}, None,
                                                     clock.now))
        assert task.complete_by is not None and task.complete_by > first
        assert task_row(postgres_url, "t-1")["sweep_at"] == first  # left as it was
        assert await store.next_expiry(["order"]) == first  # (no later than the truth)

        clock.now = (first + task.complete_by) / 2  # past the bound, not the deadline
        assert await store.expired(10, ["order"]) == []
        assert await store.next_expiry(["order"]) == task.complete_by
        assert task_row(postgres_url, "t-1")["sweep_at"] == task.complete_by  # moved up
    finally:
        await store.close()


async def test_a_task_whose_bound_was_left_behind_is_found_once_it_expires(
        postgres_url: str) -> None:
    clock = FakeClock()
    store = PostgresStore(postgres_url, clock=clock)
    try:
        assert await store.submit(new_task("t-1"))
        [task] = await store.claim(OWNER, 1, PLANS)
        clock.advance(1.0)
        plan = PLANS[task.workflow]
        task = await applies(store, task, plan.reply(task, OWNER, True, {"ok": 1}, None,
                                                     clock.now))
        assert task.complete_by is not None
        assert task_row(postgres_url, "t-1")["sweep_at"] < task.complete_by
        clock.now = task.complete_by + 0.5  # expired, its bound never moved up
        assert [t.task_id for t in await store.expired(10, ["order"])] == ["t-1"]
        assert await store.next_expiry(["order"]) == task.complete_by
    finally:
        await store.close()


async def test_a_task_claimed_by_an_older_release_is_watched_all_the_same(
        postgres_url: str) -> None:
    """While the workers roll after `sasflow db upgrade`, a scheduler of the release
    before 0011 writes no bound: the supervisor reads such a task as one whose bound
    has passed, gives it one at its next look, and finds it once it expires."""
    clock = FakeClock()
    store = PostgresStore(postgres_url, clock=clock)
    try:
        assert await store.submit(new_task("t-1"))
        [task] = await store.claim(OWNER, 1, PLANS)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("UPDATE tasks SET sweep_at = NULL")  # as the older claim left it
        assert task.complete_by is not None
        assert await store.next_expiry(["order"]) == task.complete_by
        assert task_row(postgres_url, "t-1")["sweep_at"] == task.complete_by  # given one

        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("UPDATE tasks SET sweep_at = NULL")
        clock.now = task.complete_by + 0.5
        assert [t.task_id for t in await store.expired(10, ["order"])] == ["t-1"]
    finally:
        await store.close()

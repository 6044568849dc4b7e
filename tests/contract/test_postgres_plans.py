"""A young PostgreSQL store does not keep plans made on its empty tables.

The store's statements are prepared, and PostgreSQL soon settles on one plan
for each (a generic plan), kept until something makes it plan again. On a new
store those plans are made on tables of a few rows: a whole-table read to find
a batch's tasks, an index looked through by state. As the tables grow, each
batch reads the whole of them, until autovacuum analyzes them, a minute or more
later. The class of fault is "a plan that outlives the table it was made for",
whichever statement it is; so the test turns autovacuum off for the schema's
tables (nothing but the store may make it plan again), warms every connection's
plans on an empty store, grows the store past the point where its connections
plan again (plans.py), and then counts, on the server, the rows sequential
scans return over further task lives (pg_stat_user_tables.seq_tup_read), as
test_postgres_scans does for a store whose statistics were current from the
start.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from sasflow.model import TaskState
from sasflow.store.postgres import PostgresStore
from sasflow.store.postgres.plans import WRITE_MARKS
from support.pg_scans import run_to_the_end, scanned_rows
from support.stores import PLANS, new_task

OWNER = "scheduler-1"
WARM = 60  # tasks run one at a time on the empty store: every statement prepared
GROWN = WRITE_MARKS[2] + 200  # tasks: their writes pass the third mark
AFTER = 200  # task lives over which sequential scans are counted
ORDERS = {"order": PLANS["order"]}  # what is claimed: the tasks that grow it stay pending


async def lives(store: PostgresStore, ids: list[str], *, at_once: int) -> None:
    """Submit `ids`, claim them and run each to its end, `at_once` at a time."""
    for start in range(0, len(ids), at_once):
        part = ids[start:start + at_once]
        assert all(await asyncio.gather(*(store.submit(new_task(i)) for i in part)))
        claimed = await store.claim(OWNER, at_once, ORDERS)
        assert {task.task_id for task in claimed} == set(part)
        ended = await asyncio.gather(*(run_to_the_end(store, task, OWNER) for task in claimed))
        assert {task.state for task in ended} == {TaskState.PROCESSED}


def without_autovacuum(url: str) -> None:
    """The schema made, and autovacuum kept off its large tables for the test."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("tasks", "steps", "history"):
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


def analyzed(url: str) -> list[str]:
    """The schema's tables that were ever analyzed, by anyone."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT relname FROM pg_stat_user_tables"
                            " WHERE schemaname = current_schema() AND (last_analyze IS NOT"
                            " NULL OR last_autoanalyze IS NOT NULL)").fetchall()
    return sorted(name for (name,) in rows)


async def test_plans_made_on_the_empty_tables_do_not_outlive_them(postgres_url: str) -> None:
    """After the store's writes passed its third mark, task lives in batches read fewer
    rows by sequential scans than one reading of the tasks table holds, with no table
    analyzed."""
    application_name = f"young-{uuid.uuid4().hex[:10]}"
    store = PostgresStore(f"{postgres_url}&application_name={application_name}")
    assert await store.get("warm-up") is None  # the schema is there
    without_autovacuum(postgres_url)
    await lives(store, [f"warm-{i:03d}" for i in range(WARM)], at_once=1)
    grown = [f"grow-{i:05d}" for i in range(GROWN - WARM)]
    for start in range(0, len(grown), 256):
        assert all(await asyncio.gather(*(store.submit(new_task(i, "slow"))
                                          for i in grown[start:start + 256])))
    # (read at once: what the store's open sessions have not yet handed in is counted
    # as scanned after, which can only make the bound harder to meet)
    before = scanned_rows(postgres_url, application_name="(none)")
    await lives(store, [f"after-{i:03d}" for i in range(AFTER)], at_once=50)
    await store.close()

    after = scanned_rows(postgres_url, application_name)
    scanned = {name: after[name] - before[name] for name in ("tasks", "steps")}
    assert {name: rows for name, rows in scanned.items() if rows >= GROWN} == {}
    assert analyzed(postgres_url) == []  # the plans were made again, on no statistics

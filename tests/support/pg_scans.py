"""What the PostgreSQL server counts of a schema's sequential scans, and task lives to
count them over (test_postgres_scans, test_postgres_plans)."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import psycopg

from sasflow.model import Task, TaskState
from sasflow.store.interfaces import Store
from support.stores import PLANS, applies

HANG_GUARD = 60.0  # seconds: only a hung server makes a test wait this long


async def run_to_the_end(store: Store, task: Task, owner: str) -> Task:
    """Each step's reply, one transition at a time, as a scheduler's driver does."""
    plan = PLANS[task.workflow]
    while task.state is TaskState.PROCESSING:
        task = await applies(store, task, plan.reply(task, owner, True, {"ok": 1}, None,
                                                     store.now()))
    return task


def scanned_rows(url: str, application_name: str) -> dict[str, int]:
    """Rows returned by sequential scans so far, per table of the schema of `url`,
    once no backend of that `application_name` is left (the store's pool names its own
    after it: stalled.py): a backend hands its counts in as it exits."""
    schema = parse_qs(urlsplit(url).query)["options"][0].split("=", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        end = time.monotonic() + HANG_GUARD
        # a backend's exit has no event to wait on: poll for it (the positive signal)
        while conn.execute("SELECT count(*) FROM pg_stat_activity"
                           " WHERE application_name LIKE %s",
                           (f"{application_name}%",)).fetchone() != (0,):
            assert time.monotonic() < end, "the store's connections did not close"
            time.sleep(0.05)
        rows = conn.execute("SELECT relname, seq_tup_read FROM pg_stat_user_tables"
                            " WHERE schemaname = %s", (schema,)).fetchall()
    return {name: count for name, count in rows}

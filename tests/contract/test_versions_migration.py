"""Tasks written before versions existed get theirs from their own steps (R4, M4).

A store of the previous schema is built by applying the packaged migrations
before the one that added versions; a task is written there as the previous
release wrote it. Opening the store with this release brings the schema up to
date, and the task then carries the version its steps make, so the schedulers of
that version claim it.
"""

from __future__ import annotations

import sqlite3
from importlib import resources
from pathlib import Path

import psycopg

from sasflow.model import TaskState
from sasflow.plan import Plan
from sasflow.store import open_store
from sasflow.workflow import Step, Workflow

WORKFLOW = Workflow.declare("order", [Step("reserve", "inventory"), Step("charge", "payments")],
                            agents=["inventory", "payments"])
TASK = ("t-1", "order", "{}", "pending", 1.0, None, 1.0, 1.0)
STEPS = [("t-1", "do", 0, "reserve", "inventory", "pending", "k0", 1.0),
         ("t-1", "do", 1, "charge", "payments", "pending", "k1", 1.0)]


def _scripts(dialect: str, before: str) -> list[str]:
    folder = resources.files(f"sasflow.store.{dialect}") / "migrations"
    return [f.read_text() for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".sql") and f.name < before]


async def _claims_it(url: str) -> None:
    store = open_store(url, clock=lambda: 1_700_000_000.0)
    try:
        task = await store.get("t-1")
        assert task is not None and task.version == WORKFLOW.version
        [claimed] = await store.claim("s1", 10, {"order": Plan(WORKFLOW, frozenset())})
        assert (claimed.task_id, claimed.state) == ("t-1", TaskState.PROCESSING)
    finally:
        await store.close()


async def test_sqlite_tasks_of_the_previous_schema_get_their_version(tmp_path: Path) -> None:
    """SQLite: the task written by the previous release is claimed by its version."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_migrations (version TEXT PRIMARY KEY,"
                 " applied_at REAL NOT NULL)")
    for script in _scripts("sqlite", "0003"):
        conn.executescript(script)
    conn.executemany("INSERT INTO schema_migrations VALUES (?, 0)",
                     [("0001_initial.sql",), ("0002_instances.sql",)])
    conn.execute("INSERT INTO tasks (task_id, workflow, input, state, available_at, reply_to,"
                 " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", TASK)
    conn.executemany("INSERT INTO steps (task_id, phase, idx, name, agent, state,"
                     " idempotency_key, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", STEPS)
    conn.commit()
    conn.close()
    await _claims_it(f"sqlite:///{path}")


async def test_postgres_tasks_of_the_previous_schema_get_their_version(
        postgres_url: str) -> None:
    """PostgreSQL: the same."""
    url = postgres_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_migrations (version text PRIMARY KEY,"
                     " applied_at double precision NOT NULL)")
        for name, script in zip(("0001_initial.sql", "0002_last_write.sql",
                                 "0003_instances.sql"), _scripts("postgres", "0004"),
                                strict=True):
            conn.execute(script.encode())
            conn.execute("INSERT INTO schema_migrations VALUES (%s, 0)", (name,))
        conn.execute("INSERT INTO tasks (task_id, workflow, input, state, available_at, reply_to,"
                     " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", TASK)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO steps (task_id, phase, idx, name, agent, state,"
                            " idempotency_key, updated_at)"
                            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", STEPS)
    await _claims_it(url)

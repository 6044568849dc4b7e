"""PostgreSQL's migrations: the packaged scripts (postgres/migrations/) a database has
not seen, applied in order, one migrating process at a time (an advisory lock)."""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

import psycopg
from psycopg.rows import dict_row

from sasflow.errors import StoreError
from sasflow.store import queries
from sasflow.store.postgres.silent import ANSWER_WITHIN_S, AnsweredSync
from sasflow.store.rows import versions_of

__all__ = ["migrate", "scripts"]

_Q = queries.load("postgres", "pyformat")
_VERSIONS_MIGRATION = "0004_versions.sql"  # tasks gained a version column


def scripts() -> list[tuple[str, str]]:
    folder = resources.files("sasflow.store.postgres") / "migrations"
    return sorted((f.name, f.read_text()) for f in folder.iterdir() if f.name.endswith(".sql"))


def migrate(conn: psycopg.Connection[Any], create: bool, *,
            answer_within: float = ANSWER_WITHIN_S) -> list[str]:
    """Apply the packaged migrations this database has not seen, in order, atomically.

    With `create=False` a database that is behind is refused instead. A database
    that is up to date is only read, so processes whose role may not CREATE can
    open it. Returns the names of the migrations it applied.

    That read gets its answers within `answer_within` seconds (silent.py): every
    process makes it at its start, and one started while the server is silent then
    waits it out as for a server that is down (R2). The migrations are not so
    bounded: one may rightly take long.
    """
    with AnsweredSync(conn, answer_within):
        pending = _pending(conn)
        conn.rollback()  # it only read: the migrations' transaction is a new one
    if not pending:
        return []
    with conn.transaction():
        pending = _pending(conn)
        if not pending:
            return []
        if not create:
            raise StoreError("the PostgreSQL store's sasflow schema is missing or behind"
                             " this version: run `sasflow db upgrade`")
        conn.execute(_Q["migration_lock"])  # one migrating process at a time; till commit
        conn.execute(_Q["create_migrations"])
        pending = _pending(conn)  # again: another may have just finished
        for name, script in pending:
            conn.execute(script.encode())  # no parameters: several statements
            if name == _VERSIONS_MIGRATION:  # tasks written before get their version
                with conn.cursor(row_factory=dict_row) as cur:
                    unversioned = cur.execute(_Q["select_unversioned"]).fetchall()
                    cur.executemany(_Q["set_version"], versions_of(unversioned))
            conn.execute(_Q["insert_migration"], {"version": name, "applied_at": time.time()})
    return [name for name, _ in pending]


def _pending(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    row = conn.execute(_Q["schema_migrations_exists"]).fetchone()
    done = {r[0] for r in conn.execute(_Q["select_migrations"]).fetchall()} if (
        row and row[0]) else set()
    return [(name, script) for name, script in scripts() if name not in done]

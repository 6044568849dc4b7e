"""SQLite's migrations: the packaged scripts (sqlite/migrations/) a file has not seen,
applied in order under SQLite's one write lock."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from importlib import resources

from sasflow.store import queries
from sasflow.store.rows import versions_of

__all__ = ["apply_migrations", "migrate", "pending"]

_Q = queries.load("sqlite", "named")
_VERSIONS_MIGRATION = "0003_versions.sql"  # tasks gained a version column


def _scripts() -> list[tuple[str, str]]:
    folder = resources.files("sasflow.store.sqlite") / "migrations"
    return sorted((f.name, f.read_text()) for f in folder.iterdir() if f.name.endswith(".sql"))


def pending(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """The packaged migrations this file has not seen, in order (a read, no lock)."""
    table = conn.execute(_Q["schema_migrations_exists"]).fetchone()
    done = {r[0] for r in conn.execute(_Q["select_migrations"])} if table else set()
    return [(name, script) for name, script in _scripts() if name not in done]


def apply_migrations(conn: sqlite3.Connection, scripts: list[tuple[str, str]]) -> None:
    """Run `scripts` in the transaction `conn` has open."""
    conn.execute(_Q["create_migrations"])
    for name, script in scripts:
        for statement in script.split(";\n"):
            if statement.strip():
                conn.execute(statement)
        if name == _VERSIONS_MIGRATION:  # tasks written before get their version
            conn.executemany(_Q["set_version"],
                             versions_of(conn.execute(_Q["select_unversioned"]).fetchall()))
        conn.execute(_Q["insert_migration"], {"version": name, "applied_at": time.time()})


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply the migrations this file has not seen, atomically; returns their names.

    A file that is up to date is only read: no write lock is taken.
    """
    if not pending(conn):
        return []
    conn.execute("BEGIN IMMEDIATE")
    try:
        scripts = pending(conn)  # again, under the lock: another may have just finished
        apply_migrations(conn, scripts)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return [name for name, _ in scripts]

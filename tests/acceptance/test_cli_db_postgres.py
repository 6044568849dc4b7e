"""`sasflow db upgrade` against the real PostgreSQL server (and SQLite)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def sasflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sasflow.cli", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def empty_schema(postgres_server: str) -> Iterator[str]:
    name = f"dbup_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield f"{SERVER}?options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


def test_reading_an_unmigrated_postgres_store_says_to_upgrade_then_upgrade_fixes_it(
        empty_schema: str) -> None:
    """Before: one clear line naming the command; after `db upgrade` (twice): it reads."""
    before = sasflow("tasks", "list", "--store", empty_schema)
    assert before.returncode == 1
    assert "run `sasflow db upgrade`" in before.stderr
    assert len(before.stderr.strip().splitlines()) == 1
    upgraded = sasflow("db", "upgrade", "--store", empty_schema)
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.startswith("applied ") and "0001_initial.sql" in upgraded.stdout
    again = sasflow("db", "upgrade", "--store", empty_schema)  # repeating it is harmless
    assert (again.returncode, again.stdout) == (
        0, f"schema already up to date: {empty_schema}\n")
    after = sasflow("tasks", "list", "--json", "--store", empty_schema)
    assert (after.returncode, after.stdout.strip()) == (0, "[]")


def test_db_upgrade_creates_a_sqlite_store(tmp_path: Path) -> None:
    """On SQLite, `db upgrade` creates the file with the schema; reading it then works."""
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    assert sasflow("db", "upgrade", "--store", url).returncode == 0
    assert (tmp_path / "tasks.db").exists()
    listed = sasflow("tasks", "list", "--json", "--store", url)
    assert (listed.returncode, listed.stdout.strip()) == (0, "[]")

"""The SQLite writer (store/sqlite/writer.py): what follows a commit runs in the
writer's thread as soon as the commit is done, and only if it was."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sasflow.store.sqlite.writer import Writer

HANG_GUARD = 60.0  # a wait that long is a hang, never a claim about speed


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "w.db"


@pytest.fixture
def writer(path: Path) -> Iterator[Writer]:
    def connect() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def prepare(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")

    w = Writer(connect, prepare=prepare)
    yield w
    w.close()


async def test_what_follows_a_commit_runs_in_the_writer_once_it_is_committed(
        writer: Writer, path: Path) -> None:
    seen: list[tuple[object, str, int]] = []
    ran = threading.Event()

    def then(result: int) -> None:
        with contextlib.closing(sqlite3.connect(path)) as other:  # sees committed rows only
            rows = other.execute("SELECT count(*) FROM t").fetchone()[0]
        seen.append((result, threading.current_thread().name, rows))
        ran.set()

    def job(conn: sqlite3.Connection) -> int:
        return conn.execute("INSERT INTO t VALUES (1)").rowcount

    assert await writer.run(job, then=then) == 1
    assert await asyncio.to_thread(ran.wait, HANG_GUARD)
    assert seen == [(1, "sasflow-sqlite-writer", 1)]


async def test_nothing_follows_a_write_that_failed(writer: Writer) -> None:
    seen: list[object] = []
    ran = threading.Event()

    def job(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO nowhere VALUES (1)")

    def then(result: object) -> None:
        seen.append(result)
        ran.set()

    with pytest.raises(sqlite3.OperationalError):
        await writer.run(job, then=then)
    assert await writer.run(lambda conn: 7, then=then) == 7
    assert await asyncio.to_thread(ran.wait, HANG_GUARD)
    assert seen == [7]  # a later job's: the failed one had none

"""The SQLite writer (store/sqlite/writer.py): what follows a commit runs in the
writer's thread as soon as the commit is done, and only if it was."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sasflow.store.sqlite.writer import Writer, _expects_more

HANG_GUARD = 60.0  # a wait that long is a hang, never a claim about speed


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "w.db"


def _connect_to(path: Path) -> Callable[[], sqlite3.Connection]:
    return lambda: sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def _make_table(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")


@pytest.fixture
def writer(path: Path) -> Iterator[Writer]:
    w = Writer(_connect_to(path), prepare=_make_table)
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


class Batches:
    """Each transaction's jobs, by name: a job notes itself, the commit closes the batch."""

    def __init__(self) -> None:
        self.committed: list[list[str]] = []
        self.holding = threading.Event()  # a held job has begun its transaction
        self._open: list[str] = []

    def job(self, name: str, hold: threading.Event | None = None
            ) -> Callable[[sqlite3.Connection], str]:
        def run(conn: sqlite3.Connection) -> str:
            self._open.append(name)
            if hold is not None:
                self.holding.set()
                hold.wait(HANG_GUARD)
            conn.execute("INSERT INTO t VALUES (1)")
            return name
        return run

    def close(self, conn: sqlite3.Connection) -> None:
        self.committed.append(self._open)
        self._open = []


async def test_the_rest_of_the_last_batchs_writers_are_waited_for_and_share_a_transaction(
        path: Path) -> None:
    loop = asyncio.get_running_loop()
    batches = Batches()
    pauses: list[float] = []
    late: list[asyncio.Future[str]] = []

    def pause(gathered: threading.Event, seconds: float) -> None:
        # the writer's wait, made long enough for the late ones to come whatever the
        # machine's speed: it ends when their arrival makes the batch whole
        pauses.append(seconds)
        loop.call_soon_threadsafe(send_late)
        assert gathered.wait(HANG_GUARD)

    def send_late() -> None:
        late.extend(asyncio.ensure_future(writer.run(batches.job(name))) for name in "ef")

    writer = Writer(_connect_to(path), prepare=_make_table, before_commit=batches.close,
                    pause=pause)
    try:
        held = threading.Event()
        first = asyncio.ensure_future(writer.run(batches.job("held", held)))
        # the held job runs alone (nothing else was queued) ...
        assert await asyncio.to_thread(batches.holding.wait, HANG_GUARD)
        three = [asyncio.ensure_future(writer.run(batches.job(name))) for name in "abc"]
        await asyncio.sleep(0)  # ... and these three are queued behind it
        held.set()
        async with asyncio.timeout(HANG_GUARD):
            await asyncio.gather(first, *three)
            assert pauses == []  # three waited for a batch of one: more than expected
            # one write where the last batch held three: its writers are waited for
            assert await writer.run(batches.job("d")) == "d"
            assert await asyncio.gather(*late) == ["e", "f"]
    finally:
        writer.close()
    assert batches.committed == [["held"], ["a", "b", "c"], ["d", "e", "f"]]
    assert len(pauses) == 1 and 0 < pauses[0] <= 0.001  # the last commit's time, bounded


async def test_a_lone_writer_never_waits(path: Path) -> None:
    batches = Batches()
    pauses: list[float] = []
    writer = Writer(_connect_to(path), prepare=_make_table, before_commit=batches.close,
                    pause=lambda gathered, seconds: pauses.append(seconds))
    try:
        async with asyncio.timeout(HANG_GUARD):
            for n in range(20):
                assert await writer.run(batches.job(f"w{n}")) == f"w{n}"
    finally:
        writer.close()
    assert batches.committed == [[f"w{n}"] for n in range(20)]
    assert pauses == []


def test_a_batch_waits_for_the_rest_only_while_at_most_half_have_come() -> None:
    assert [_expects_more(waiting, 4) for waiting in (1, 2, 3, 4, 5)] == [
        True, True, False, False, False]
    assert not _expects_more(1, 1)  # a lone writer never waits
    assert _expects_more(1, 2) and _expects_more(1, 3) and not _expects_more(2, 3)
    assert not _expects_more(437, 512)  # hundreds queued: the few late ones go next

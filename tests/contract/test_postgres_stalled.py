"""A process stopped inside one of the PostgreSQL store's transactions holds no one up.

A real process (support/apps/stalledwriter.py) runs a store verb and stops
itself (SIGSTOP) once the verb's transaction has locked its rows: a supervisor
leader renewing its lease, a scheduler claiming tasks. Its session then waits on
its client in pipeline mode, where PostgreSQL's idle_in_transaction timeout does
not run (stalled.py). Another store of the same database takes the lease, or
claims the tasks, once the stalled transaction is older than its bound; the
stalled session is gone, and the process, continued, gets nothing of what it
was doing. The other store's bound is one second here, so as not to wait ten.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar
from unittest import mock

import psycopg
import pytest

from sasflow.store.postgres import PostgresStore
from sasflow.store.postgres.connections import CONFLICT_ATTEMPTS
from sasflow.store.postgres.stalled import session_name
from support.process import HANG_GUARD, Process
from support.stores import PLANS, submitted

TESTS = Path(__file__).resolve().parents[1]
WRITER = TESTS / "support" / "apps" / "stalledwriter.py"
T = TypeVar("T")
BOUND = 1.0  # seconds inside one transaction that make it stalled, for the store that waits


@pytest.fixture
def url(postgres_url: str) -> str:
    """The test's schema, its sessions named apart from every other test's."""
    return f"{postgres_url}&application_name=stalled-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def stalled() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.kill()


def stop_inside(verb: str, url: str, tmp_path: Path, started: list[Process]) -> tuple[Process, int]:
    """A writer process stopped inside `verb`'s transaction, and its session's backend."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")])}
    writer = Process.spawn(verb, [sys.executable, str(WRITER), url, verb],
                           tmp_path / f"{verb}.log", env=env)
    started.append(writer)
    line = writer.wait_for_line("stalled: backend ")
    backend = int(line.split("stalled: backend ")[1].split()[0])
    deadline = time.monotonic() + HANG_GUARD
    while writer.proc_state() != "T":  # (it stops itself just after it said so)
        assert writer.alive and time.monotonic() < deadline, writer.tail()
        time.sleep(0.005)
    return writer, backend


def session_of(url: str, backend: int) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT state FROM pg_stat_activity WHERE pid = %s",
                            (backend,)).fetchall()


async def until_given(attempt: Callable[[], Awaitable[T]], what: str) -> T:
    """`attempt()` again until it gives something (a positive signal), within the hang
    guard: a store that waits on the stalled rows for ever fails here."""
    got: T | None = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(HANG_GUARD):
            while not (got := await attempt()):
                await asyncio.sleep(0.05)
    if not got:
        pytest.fail(f"{what} not within {HANG_GUARD:.0f}s: held by the stalled transaction",
                    pytrace=False)
    return got


async def test_a_standby_takes_the_lease_its_leader_stopped_inside_a_renewal(
        url: str, tmp_path: Path, stalled: list[Process]) -> None:
    standby = PostgresStore(url, stalled_after=BOUND)
    try:
        assert await standby.acquire_lease("supervisor", "frozen", 0.5) == 1
        writer, backend = stop_inside("lease", url, tmp_path, stalled)
        assert session_of(url, backend), "the stopped leader's session is not open"

        epoch = await until_given(lambda: standby.acquire_lease("supervisor", "standby", 600),
                                  "the lease taken")
        assert epoch == 2
        assert not session_of(url, backend), "the stalled session was not ended"

        writer.thaw()  # its renewal was rolled back; tried again, the lease is not free
        writer.wait_for_line("lease: ")
        assert "lease: None" in writer.text(), writer.text()
        assert await standby.acquire_lease("supervisor", "standby", 600) == 2
    finally:
        await standby.close()


async def test_tasks_a_scheduler_stopped_inside_its_claim_are_claimed_by_another(
        url: str, tmp_path: Path, stalled: list[Process]) -> None:
    other = PostgresStore(url, stalled_after=BOUND)
    try:
        await submitted(other, "t1")
        writer, backend = stop_inside("claim", url, tmp_path, stalled)

        # the stopped claim's rows are skipped (SKIP LOCKED) until its session is ended
        claimed = await until_given(lambda: other.claim("other", 10, PLANS), "the task claimed")
        assert [task.task_id for task in claimed] == ["t1"]
        assert not session_of(url, backend), "the stalled session was not ended"

        writer.thaw()
        writer.wait_for_line("claimed: ")
        assert "claimed: []" in writer.text(), writer.text()
        task = await other.get("t1")
        assert task is not None and task.locked_by == "other"
    finally:
        await other.close()


def test_the_store_names_its_own_sessions_apart_from_the_applications() -> None:
    base = "postgresql://u@127.0.0.1/db"
    assert session_name(base) == "sasflow-store"
    assert session_name(f"{base}?application_name=billing") == "billing:sasflow-store"
    assert len(session_name(f"{base}?application_name={'x' * 80}").encode()) == 63


async def test_a_long_read_is_left_to_run_where_a_stalled_writer_is_ended(url: str) -> None:
    """Both in a transaction past the bound, in sessions named as the store's: the one
    that wrote (it holds a transaction id, and row locks) is ended; the read, which
    holds neither, is left to run. The look that ends the one judges the other."""
    store = PostgresStore(url, stalled_after=BOUND)
    name = session_name(url)
    reader = await psycopg.AsyncConnection.connect(url, autocommit=True, application_name=name)
    writer = await psycopg.AsyncConnection.connect(url, autocommit=True, application_name=name)
    try:
        await submitted(store, "t1")
        reading = asyncio.create_task(reader.execute("SELECT pg_sleep(600)"))
        await until_given(lambda: asyncio.to_thread(session_of, url, reader.info.backend_pid),
                          "the read under way")
        await writer.execute("BEGIN")
        await writer.execute("UPDATE tasks SET version = version WHERE task_id = 't1'")

        async def writer_ended() -> bool:
            await store.get("t1")  # a job of the store's, before which it looks
            return not session_of(url, writer.info.backend_pid)

        await until_given(writer_ended, "the stalled writer ended")
        [(state,)] = session_of(url, reader.info.backend_pid)
        assert state == "active", "the read was ended with the writer"
        reader.cancel()
        with pytest.raises(psycopg.errors.QueryCanceled):
            await reading
    finally:
        for conn in (reader, writer):
            with contextlib.suppress(psycopg.Error):
                await conn.close()
        await store.close()


async def test_a_write_waits_out_another_sessions_long_lock_past_the_conflicts_count(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A lock held long by a session that is not the store's (a migration's ACCESS
    EXCLUSIVE, an operator's): the store's write waits past its lock_timeout again and
    again, as it would wait for the database itself, more times than a conflict is
    retried, and is written once the lock is let go; one warning says so. Nothing
    ends the holder: it is not one of the store's sessions."""
    store = PostgresStore(url, stalled_after=0.2)  # lock waits of 0.1 s
    stalled = store._db.stalled
    holder = await psycopg.AsyncConnection.connect(url, application_name="migration")
    # the store looks for stalled sessions again each time a lock wait ran out: counted
    with mock.patch.object(stalled, "look_again", wraps=stalled.look_again) as ran_out:
        try:
            await submitted(store, "t1")  # the store's schema, and one task
            await holder.execute("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE")
            writing = asyncio.create_task(submitted(store, "t2"))
            deadline = time.monotonic() + HANG_GUARD
            while ran_out.call_count <= 2 * CONFLICT_ATTEMPTS:  # past a conflict's retries
                assert not writing.done(), writing.exception()
                assert time.monotonic() < deadline, f"{ran_out.call_count} lock waits"
                await asyncio.sleep(0.01)  # (polling for the count: a positive signal)
            await holder.rollback()  # the migration done
            async with asyncio.timeout(HANG_GUARD):
                await writing
            task = await store.get("t2")
            assert task is not None and task.state.value == "pending"
            # said once, as a warning, however many times it waited (counted every 30 s)
            said = [r for r in caplog.records if "waits again" in r.getMessage()]
            assert [r.levelname for r in said] == ["WARNING"], said
        finally:
            await holder.close()
            await store.close()

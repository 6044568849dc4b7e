"""A call to the PostgreSQL store that is cancelled ends cancelled, whenever it is.

psycopg_pool waits for a free connection through `asyncio.wait_for`, which on
Python 3.11 returns what it waited for, instead of raising, when the waiting task
is cancelled just as the connection is handed to it (the cancellation is lost:
CPython gh-86296, fixed in 3.12). A role's task that loses its cancellation so
goes on with its loop, and whoever stops it waits for ever. The class is "a
cancellation that arrives while a call waits for a connection", at any moment of
the hand-over; so the test cancels a waiting call at each of the event loop's
steps after the connection is given back, and asks each time that the call end
cancelled (or, if it had already ended, with its answer), and that no connection
is lost.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any
from unittest import mock

import psycopg
import pytest

from sasflow.store.postgres.connections import Connections

HANDOVER_STEPS = 12  # the loop's steps over which the connection changes hands
HANG_GUARD = 30.0


async def hold(held: asyncio.Event, release: asyncio.Event,
               conn: psycopg.AsyncConnection[Any]) -> None:
    held.set()
    await release.wait()


async def read(conn: psycopg.AsyncConnection[Any]) -> int:
    row = await (await conn.execute("SELECT 1 AS one")).fetchone()
    assert row is not None
    return int(row["one"])


async def test_a_call_cancelled_while_it_waits_for_a_connection_ends_cancelled(
        postgres_url: str) -> None:
    db = Connections(postgres_url, clock=None, create=True, pool_size=1)

    def call(job: Any) -> asyncio.Future[Any]:  # as the store calls: in the pool's home loop
        return asyncio.ensure_future(db.at_home(lambda: db.run(job, transaction=False)))

    outcomes: list[str] = []
    async with asyncio.timeout(HANG_GUARD):
        for steps in range(HANDOVER_STEPS):
            held, release = asyncio.Event(), asyncio.Event()
            holder = call(functools.partial(hold, held, release))
            await held.wait()  # the only connection is held
            waiter = call(read)
            for _ in range(5):
                await asyncio.sleep(0)  # the waiter is queued for the connection
            release.set()
            for _ in range(steps):
                await asyncio.sleep(0)
            if waiter.cancel():
                with pytest.raises(asyncio.CancelledError):
                    await waiter
                outcomes.append("cancelled")
            else:  # it had its answer before the cancellation came
                assert await waiter == 1
                outcomes.append("answered")
            await holder
        # the connection was not lost: a call still gets it
        assert await call(read) == 1
    await db.close()
    assert "cancelled" in outcomes  # the race was run, not passed over


def test_a_pool_left_on_an_idle_loop_is_closed_when_the_loop_runs_again(
        postgres_url: str) -> None:
    """A store closed from another loop while its pool's loop is idle (a sync fixture
    after an async test; `App.close()` after `asyncio.run`) has that pool closed as
    soon as the loop runs again. Else the loop's shutdown, which cancels what is left
    on it, waited for ever on a pool worker cancelled in the middle of a maintenance
    task: psycopg_pool's workers go on after a failed task, cancellations included,
    and only the pool's close ends them."""
    home = asyncio.new_event_loop()
    db = Connections(postgres_url, clock=None, create=True, pool_size=2)

    async def used_then_left_busy() -> None:
        assert await db.at_home(lambda: db.run(read, transaction=False)) == 1
        assert db.pool is not None
        await db.pool.drain()  # the pool's workers connect again, in the background
        for _ in range(3):
            await asyncio.sleep(0)  # a worker is in the middle of its connect

    try:
        home.run_until_complete(used_then_left_busy())
        pool = db.pool
        assert pool is not None and not pool.closed
        asyncio.run(db.close())  # from another loop, while the pool's is idle
        # the home loop's shutdown, as asyncio.run and pytest-asyncio do it
        left = asyncio.all_tasks(home)
        for task in left:
            task.cancel()
        _, pending = home.run_until_complete(asyncio.wait(left, timeout=HANG_GUARD))
        assert pending == set()
        closing = asyncio.all_tasks(home)  # the pool's close, begun as the loop ran again
        if closing:
            _, pending = home.run_until_complete(asyncio.wait(closing, timeout=HANG_GUARD))
            assert pending == set()
        assert pool.closed
    finally:
        home.close()


def test_a_pool_never_closed_is_closed_by_its_loops_end(postgres_url: str) -> None:
    """`asyncio.run` returns (or a test's loop is torn down) with the pool open and one
    of its workers in the middle of a maintenance task, a new connection's set-up:
    the loop's end cancels every task left, the pool's closer among them, which
    closes the pool and so ends the worker (closing.py). Without the closer the end
    waited for ever on that worker (seen in CI: an async test's teardown)."""
    db = Connections(postgres_url, clock=None, create=True, pool_size=2)
    configure = db._configure
    configured: list[psycopg.AsyncConnection[Any]] = []
    setting_up = threading.Event()

    async def then_stuck(conn: psycopg.AsyncConnection[Any]) -> None:
        if configured:  # the second connection's set-up never ends
            setting_up.set()
            await asyncio.get_running_loop().create_future()
        configured.append(conn)
        await configure(conn)

    async def left_busy() -> None:
        assert await db.at_home(lambda: db.run(read, transaction=False)) == 1
        held, release = asyncio.Event(), asyncio.Event()
        holding = asyncio.ensure_future(db.run(functools.partial(hold, held, release)))
        await held.wait()  # the one connection is busy: the next call needs a new one
        reading = asyncio.ensure_future(db.run(read, transaction=False))
        while not setting_up.is_set():
            await asyncio.sleep(0.01)  # (until the worker is inside the set-up)
        del holding, reading  # left running, as by a program that forgot to close

    ended = threading.Event()

    def program() -> None:
        asyncio.run(left_busy())
        ended.set()

    # (patched before the pool exists: it takes the set-up as it is made)
    with mock.patch.object(db, "_configure", then_stuck):
        threading.Thread(target=program, daemon=True).start()
        assert ended.wait(HANG_GUARD), "the loop's end waited on the pool's worker"
    assert db.pool is not None and db.pool.closed

"""A PostgreSQL that stops answering, seen by the store's connections outside its pool.

The pool's jobs get their answers within `answer_within` or give their connection up
(silent.py, test_postgres_faults.py). These are the store's other connections: the
listeners that wake idle schedulers and waiting clients, the reads a client makes
from an event loop of its own, and the blocking submit's own connection. Each must
notice a silent server too: a listener that waited on for ever left what it wakes
to its polls, and a read or a submission held its caller for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from sasflow.errors import StoreError
from sasflow.own_connection import OwnConnection
from sasflow.store.postgres import PostgresStore, migrations
from sasflow.store.postgres.silent import AnsweredSync
from support.faultproxy import FaultProxy, fault_proxy
from support.stores import Clock, StoreFactory, new_task

on_postgres = pytest.mark.parametrize("make_store", ["postgres"], indirect=True)
HANG_GUARD = 60.0  # only a hang fails on it: a loaded machine is slow, never this slow
ANSWER_WITHIN = 0.5


def postgres(make_store: StoreFactory, clock: Clock | None = None) -> PostgresStore:
    store = make_store(clock=clock)
    assert isinstance(store, PostgresStore)
    return store


@pytest.fixture
def proxy(postgres_server: str) -> Iterator[FaultProxy]:
    with fault_proxy(5432) as started:
        yield started


async def until(predicate: Callable[[], object]) -> None:
    async with asyncio.timeout(HANG_GUARD):
        while not predicate():
            await asyncio.sleep(0.005)


async def notify(conninfo: str, channel: str, payload: str) -> None:
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


@contextlib.contextmanager
def another_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, as a client's may."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@on_postgres
async def test_the_work_listener_gives_a_silent_server_up_and_listens_again(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy) -> None:
    """An idle scheduler's listener asks, after a quiet spell, whether the server is
    still there: unanswered, it connects again and, once the server answers, wakes
    its scheduler for what it may have missed and hears the next notice."""
    direct = postgres(make_store, clock)
    store = PostgresStore(proxy.url(direct.conninfo), clock=clock,
                          answer_within=ANSWER_WITHIN)
    woken: list[float] = []
    watching = asyncio.create_task(store.watch(woken.append))
    try:
        await until(lambda: len(woken) == 1)  # listening: woken once, on connecting
        proxy.set_mode("black-hole")
        connections = proxy.connections
        await until(lambda: proxy.connections > connections)  # it gave the link up
        proxy.set_mode("pass")
        await until(lambda: len(woken) >= 2)  # listening again: woken again
        await notify(direct.conninfo, "sasflow_work", "12345.5")
        await until(lambda: 12345.5 in woken)
    finally:
        proxy.set_mode("pass")
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await store.close()


@on_postgres
async def test_the_finished_listener_gives_a_silent_server_up_and_listens_again(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy) -> None:
    """The listener that tells waiting clients of ended tasks does the same, on its
    own thread: after the silence, an ended task is heard again."""
    direct = postgres(make_store, clock)
    store = PostgresStore(proxy.url(direct.conninfo), clock=clock,
                          answer_within=ANSWER_WITHIN)
    heard: list[str] = []
    store.on_finished(heard.append)
    try:
        await heard_once_listening(direct, heard, "before")
        proxy.set_mode("black-hole")
        connections = proxy.connections
        await until(lambda: proxy.connections > connections)  # it gave the link up
        proxy.set_mode("pass")
        await heard_once_listening(direct, heard, "after")
    finally:
        proxy.set_mode("pass")
        await store.close()


async def heard_once_listening(direct: PostgresStore, heard: list[str], name: str) -> None:
    """A notice of an ended task is heard: sent again until the listener, which may be
    connecting still, hears one."""
    async with asyncio.timeout(HANG_GUARD):
        for attempt in itertools.count():
            marker = f"{name}-{attempt}"
            await notify(direct.conninfo, "sasflow_finished", marker)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await until(functools.partial(operator.contains, heard, marker))
                    return


@on_postgres
async def test_a_read_from_another_loop_gives_a_silent_server_up(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy) -> None:
    """A client's read from an event loop other than the store's, on that loop's own
    connection, gets its answer within `answer_within` too, then goes the pool's way,
    which waits the outage out within `reconnect_for`: the caller gets an error
    instead of waiting for as long as the server is silent."""
    direct = postgres(make_store, clock)
    store = PostgresStore(proxy.url(direct.conninfo), clock=clock, reconnect_for=0.5,
                          answer_within=ANSWER_WITHIN)
    try:
        assert await store.get("t1") is None  # the pool opened on this loop
        with another_loop() as elsewhere:
            async def read_elsewhere() -> object:
                return await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(store.get("t1"), elsewhere))

            assert await read_elsewhere() is None  # on the other loop's own connection
            proxy.set_mode("hold-answers")
            with pytest.raises(StoreError, match=r"no answer from the database within 0\.5s"):
                async with asyncio.timeout(HANG_GUARD):  # a TimeoutError: it waited on
                    await read_elsewhere()
            proxy.set_mode("pass")
            assert await read_elsewhere() is None
    finally:
        proxy.set_mode("pass")
        await store.close()


@on_postgres
def test_a_blocking_call_on_a_silent_server_gives_its_connection_up(
        make_store: StoreFactory, proxy: FaultProxy) -> None:
    """A synchronous connection's call waits `seconds` for its answer: the watchdog
    shuts its socket down, and the call fails as a lost connection, saying why."""
    url = proxy.url(postgres(make_store).conninfo)
    with psycopg.connect(url, autocommit=True) as conn:
        with AnsweredSync(conn, ANSWER_WITHIN):
            assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.set_mode("hold-answers")
        with (pytest.raises(psycopg.OperationalError,
                            match=r"no answer from the database within 0\.5s"),
              AnsweredSync(conn, ANSWER_WITHIN)):
            conn.execute("SELECT 2")
        assert proxy.held > 0, "no answer was held: the server was never silent"


@on_postgres
async def test_a_blocking_submit_on_a_silent_server_goes_through_the_loop(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy) -> None:
    """The blocking submit's own connection gives a silent server up within
    `answer_within`: the submission is handed to the loop's way (None), which waits
    the outage out, instead of holding its caller for as long as the silence."""
    direct = postgres(make_store, clock)
    store = PostgresStore(proxy.url(direct.conninfo), clock=clock,
                          answer_within=ANSWER_WITHIN)
    own = OwnConnection(store)
    try:
        assert await store.get("t0") is None  # the store's first use: its schema checked
        assert await asyncio.to_thread(own.submit, new_task("t1")) is True
        proxy.set_mode("hold-answers")
        async with asyncio.timeout(HANG_GUARD):  # a TimeoutError: it waited on
            assert await asyncio.to_thread(own.submit, new_task("t2")) is None
        proxy.set_mode("pass")
        assert await direct.get("t2") is not None  # written; only its answer was lost
        assert await asyncio.to_thread(own.submit, new_task("t3")) is True  # a new one
    finally:
        proxy.set_mode("pass")
        await asyncio.to_thread(own.close)
        await store.close()


@on_postgres
async def test_the_schema_check_on_a_silent_server_gives_its_connection_up(
        make_store: StoreFactory, proxy: FaultProxy) -> None:
    """Every process checks the schema at its start, on a synchronous connection of
    its own: the check waits `answer_within` for its answers, so a process started
    while the server is silent waits it out as for one that is down (R2), instead of
    hanging at its start."""
    direct = postgres(make_store)
    assert await direct.get("t1") is None  # its first use: the schema made
    url = proxy.url(direct.conninfo)

    def check(conn: psycopg.Connection[Any]) -> list[str]:
        return migrations.migrate(conn, False, answer_within=ANSWER_WITHIN)

    with psycopg.connect(url) as conn:
        assert await asyncio.to_thread(check, conn) == []  # up to date: only read
        proxy.set_mode("hold-answers")
        with pytest.raises(psycopg.OperationalError,
                           match=r"no answer from the database within 0\.5s"):
            async with asyncio.timeout(HANG_GUARD):  # a TimeoutError: it waited on
                await asyncio.to_thread(check, conn)
        assert proxy.held > 0, "no answer was held: the server was never silent"

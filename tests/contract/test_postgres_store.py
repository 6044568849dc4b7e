"""What the PostgreSQL store adds to the store contract: the caller's transaction
(E1), SKIP LOCKED claims (M1), the database clock, migrations, retried conflicts.

Each test runs on a private schema of the local server (conftest STORES).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sasflow import AgentRequest, App, Step
from sasflow.errors import MissingExtraError, StoreError
from sasflow.model import UNFINISHED_TASK_STATES, Task, TaskState, claimable
from sasflow.own_connection import APPLICATION_NAME
from sasflow.store import open_store
from sasflow.store import queries as sql
from sasflow.store.listing import TaskQuery
from sasflow.store.postgres import PostgresStore, bulk
from sasflow.store.postgres.bulk import new_token, tell_finished, write_batch
from sasflow.store.postgres.migrations import scripts as pg_migrations
from sasflow.store.postgres.stalled import session_name
from sasflow.transition import Transition
from support.process import Process
from support.stores import PLANS, Clock, StoreFactory, new_task, submitted

on_postgres = pytest.mark.parametrize("make_store", ["postgres"], indirect=True)
HANG_GUARD = 30.0  # seconds: only a hung test waits this long


def postgres(make_store: StoreFactory, clock: Clock | None = None) -> PostgresStore:
    store = make_store(clock=clock)
    assert isinstance(store, PostgresStore)
    return store


def business_table(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")


@on_postgres
async def test_submit_in_commits_with_the_callers_transaction(make_store: StoreFactory,
                                                              clock: Clock) -> None:
    """E1: the task and the caller's own row commit together, in the caller's transaction."""
    store = postgres(make_store, clock)
    await store.get("warm-up")  # the schema exists once the store has opened
    business_table(store.conninfo)
    with psycopg.connect(store.conninfo) as conn:
        conn.execute("INSERT INTO orders VALUES ('o-1')")
        assert store.submit_in(conn, new_task("o-1"))
        # not committed yet: another connection (the store's pool) does not see it
        assert await store.get("o-1") is None
        conn.commit()
    task = await store.get("o-1")
    assert task is not None and task.state is TaskState.PENDING


@on_postgres
async def test_submit_in_rolls_back_with_the_callers_transaction(make_store: StoreFactory,
                                                                 clock: Clock) -> None:
    """E1: when the caller's transaction rolls back, neither its row nor the task exist."""
    store = postgres(make_store, clock)
    await store.get("warm-up")
    business_table(store.conninfo)
    with psycopg.connect(store.conninfo) as conn:
        conn.execute("INSERT INTO orders VALUES ('o-1')")
        assert store.submit_in(conn, new_task("o-1", reply_to="status"))
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    assert await store.get("o-1") is None
    assert await store.history("o-1") == []
    assert await store.take_outbox(None, 10) == []


@on_postgres
async def test_submit_joins_an_async_connections_transaction(make_store: StoreFactory,
                                                             clock: Clock) -> None:
    """E1 from async code: submit(connection=AsyncConnection) commits with the caller."""
    store = postgres(make_store, clock)
    await store.get("warm-up")
    business_table(store.conninfo)
    async with await psycopg.AsyncConnection.connect(store.conninfo) as conn:
        await conn.execute("INSERT INTO orders VALUES ('o-1')")
        assert await store.submit(new_task("o-1"), connection=conn)
        assert await store.get("o-1") is None
        await conn.rollback()
        assert await store.submit(new_task("o-2"), connection=conn)
        await conn.commit()
    assert await store.get("o-1") is None
    assert await store.get("o-2") is not None


@on_postgres
async def test_a_submission_from_another_event_loop_is_written_by_the_pools_own(
        make_store: StoreFactory, clock: Clock) -> None:
    """A submission from another thread's event loop (the sync facade's) is handed to
    the loop the pool lives in, and is idempotent too."""
    store = postgres(make_store, clock)
    await store.get("opens-the-pool")  # this loop becomes the pool's home

    def elsewhere() -> bool:
        return asyncio.run(store.submit(new_task("o-1")))

    assert await asyncio.to_thread(elsewhere)
    assert not await asyncio.to_thread(elsewhere)
    task = await store.get("o-1")
    assert task is not None and len(task.steps) == 3


@on_postgres
async def test_a_claim_skips_tasks_locked_elsewhere_instead_of_waiting(
        make_store: StoreFactory, clock: Clock) -> None:
    """M1: a row another transaction holds is passed over at once (SKIP LOCKED), not waited for."""
    store = postgres(make_store, clock)
    await submitted(store, "t1", "t2", "t3")
    async with await psycopg.AsyncConnection.connect(store.conninfo) as other:
        await other.execute("SELECT 1 FROM tasks WHERE task_id = 't1' FOR UPDATE")
        # a claim that waited for t1's lock would wait for the rollback below, which
        # comes only after it returns: it would hang, and the guard fail it
        got = await asyncio.wait_for(store.claim("s1", 10, PLANS), timeout=60)
        assert sorted(t.task_id for t in got) == ["t2", "t3"]
        await other.rollback()
    assert [t.task_id for t in await store.claim("s2", 10, PLANS)] == ["t1"]


@on_postgres
async def test_claims_by_many_stores_never_overlap(make_store: StoreFactory,
                                                   clock: Clock) -> None:
    """M1 across four hosts racing for 200 tasks: every task claimed exactly once."""
    stores = [postgres(make_store, clock) for _ in range(4)]
    ids = [f"t{n:03}" for n in range(200)]
    for chunk in range(0, 200, 50):
        await asyncio.gather(*(stores[0].submit(new_task(i)) for i in ids[chunk:chunk + 50]))
    owners: dict[str, list[str]] = {}

    async def keep_claiming(n: int, store: PostgresStore) -> None:
        while got := await store.claim(f"host-{n}", 9, PLANS):
            for task in got:
                owners.setdefault(task.task_id, []).append(f"host-{n}")

    await asyncio.gather(*(keep_claiming(n, s) for n, s in enumerate(stores)))
    assert sorted(owners) == ids
    assert all(len(hosts) == 1 for hosts in owners.values())
    for task in await stores[1].list_tasks(TaskQuery(limit=500)):
        assert (task.locked_by, task.epoch) == (owners[task.task_id][0], 1)


@on_postgres
async def test_without_an_injected_clock_now_is_the_databases_clock(
        make_store: StoreFactory) -> None:
    """DESIGN invariant 3: deadlines are set from the database's clock, not the host's."""
    store = postgres(make_store)
    await submitted(store, "t1")
    assert len(await store.claim("s1", 1, PLANS)) == 1
    async with await psycopg.AsyncConnection.connect(store.conninfo) as conn:
        row = await (await conn.execute(
            "SELECT extract(epoch FROM clock_timestamp())::float8, complete_by,"
            " extract(epoch FROM clock_timestamp())::float8 - created_at FROM tasks")).fetchone()
    assert row is not None
    db_now, complete_by, age = row
    assert abs(store.now() - db_now) < 0.5
    assert 0 <= age < 5
    assert db_now + 4.0 < complete_by <= db_now + 5.0  # reserve's timeout is 5 s


@on_postgres
@pytest.mark.parametrize("skew", [300.0, -300.0], ids=["ahead", "behind"])
async def test_the_databases_clock_ignores_this_hosts_wall_clock(
        make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, skew: float) -> None:
    """R1: once measured, `now()` stays the database's clock when this host's wall clock
    is set 5 minutes off (read from the monotonic clock, not from time.time)."""
    store = postgres(make_store)
    await store.next_expiry()  # the first connection measures the clock
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + skew)
    async with await psycopg.AsyncConnection.connect(store.conninfo) as conn:
        row = await (await conn.execute(
            "SELECT extract(epoch FROM clock_timestamp())::float8")).fetchone()
    assert row is not None
    assert abs(store.now() - row[0]) < 0.5  # before the store has talked to the database again
    await submitted(store, "t1")
    [task] = await store.claim("s1", 1, PLANS)
    assert task.complete_by is not None and abs(task.complete_by - 5.0 - row[0]) < 0.5


@on_postgres
async def test_a_serialization_failure_is_retried(make_store: StoreFactory,
                                                  clock: Clock) -> None:
    """A transaction the server aborts with SQLSTATE 40001 is run again, not reported."""
    store = postgres(make_store, clock)
    assert await store.acquire_lease("leader", "a", 10) == 1
    attempts = 0

    async def job(conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal attempts
        attempts += 1
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        await conn.execute("SELECT holder FROM leases")  # the snapshot is taken here
        if attempts == 1:  # someone else changes the row after our snapshot
            async with await psycopg.AsyncConnection.connect(store.conninfo,
                                                             autocommit=True) as other:
                await other.execute("UPDATE leases SET expires_at = expires_at + 1")
        await conn.execute("UPDATE leases SET holder = 'b'")

    await store._run(job)
    assert attempts == 2
    assert await store.acquire_lease("leader", "b", 10) == 1


@on_postgres
async def test_the_stores_sessions_never_jit_compile(make_store: StoreFactory,
                                                     clock: Clock) -> None:
    """JIT is off on every connection of the store: a cached plan estimated costly
    must not be compiled (~150 ms) for a statement that runs in microseconds."""
    store = postgres(make_store, clock)

    async def jit(conn: psycopg.AsyncConnection[Any]) -> str:
        row = await (await conn.execute("SHOW jit")).fetchone()
        assert row is not None
        return str(row["jit"])

    await store.get("opens-the-pool")
    settings = await asyncio.gather(*(store._run(jit, transaction=False) for _ in range(4)))
    assert settings == ["off"] * 4


@on_postgres
async def test_migrations_run_once_when_stores_open_together(make_store: StoreFactory,
                                                             clock: Clock) -> None:
    """Stores opening an empty schema at the same moment apply each migration once."""
    stores = [postgres(make_store, clock) for _ in range(4)]
    await asyncio.gather(*(s.get("x") for s in stores))
    async with await psycopg.AsyncConnection.connect(stores[0].conninfo) as conn:
        rows = await (await conn.execute("SELECT version FROM schema_migrations"
                                         " ORDER BY version")).fetchall()
    packaged = [(name,) for name, _ in pg_migrations()]
    assert rows == packaged and len(packaged) >= 3  # each once, in order


@on_postgres
async def test_a_store_opened_without_create_refuses_an_empty_database(
        make_store: StoreFactory, clock: Clock) -> None:
    """create=False (read-only commands) is an error on a schema never migrated."""
    url = postgres(make_store, clock).conninfo
    store = open_store(url, clock=clock, create=False)
    try:
        with pytest.raises(StoreError, match="db upgrade"):
            await store.get("x")
    finally:
        await store.close()


def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The postgres URL without the driver installed says which extra to install."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    for name in [m for m in sys.modules if m.startswith("sasflow.store.postgres")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingExtraError, match=r"sasflow\[postgres\]"):
        open_store("postgresql://postgres@127.0.0.1:5432/test")


@on_postgres
async def test_reads_survive_the_servers_end_of_a_pooled_connection(
        make_store: StoreFactory, clock: Clock) -> None:
    """A connection the server ended (restart, idle kill) is replaced; a read still answers."""
    name = f"sasflow-{uuid.uuid4().hex[:12]}"  # this store's connections only
    url = postgres(make_store, clock).conninfo
    store = PostgresStore.from_url(f"{url}&application_name={name}", clock=clock)
    try:
        await submitted(store, "t1")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            cur = await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                      " WHERE application_name = %s",
                                      (session_name(f"{url}&application_name={name}"),))
            assert (await cur.fetchall()) == [(True,)]
        task = await store.get("t1")
        assert task is not None and task.task_id == "t1"
        assert await store.submit(new_task("t2"))
    finally:
        await store.close()


@on_postgres
async def test_an_app_runs_orders_to_the_end_on_postgres(make_store: StoreFactory) -> None:
    """The actors, unchanged, drive tasks to processed on this store; E1 through the App."""
    url = postgres(make_store).conninfo
    app = App(store=url)

    @app.agent("inventory")
    def reserve(req: AgentRequest) -> dict[str, Any]:
        return {"reserved": req.input["order_id"]}

    @app.agent("payments")
    async def charge(req: AgentRequest) -> dict[str, Any]:
        return {"charged": req.input["order_id"], "after": req.results["reserve"]}

    app.workflow("process-order", steps=[Step("reserve", agent="inventory", timeout=60.0),
                                         Step("charge", agent="payments", timeout=60.0)])

    def run() -> list[Task]:
        app.start()
        try:
            ids = [app.submit("process-order", {"order_id": n}, task_id=f"order-{n}")
                   for n in range(20)]
            with psycopg.connect(url) as conn:  # E1: with the caller's transaction
                ids.append(app.submit("process-order", {"order_id": 99}, task_id="order-99",
                                      connection=conn))
            return [app.wait(task_id, timeout=60) for task_id in ids]
        finally:
            app.stop()

    done = await asyncio.to_thread(run)
    assert [t.state for t in done] == [TaskState.PROCESSED] * 21
    assert done[-1].steps[1].result == {"charged": 99, "after": {"reserved": 99}}


@on_postgres
async def test_the_order_example_runs_on_postgres(make_store: StoreFactory,
                                                  tmp_path: Path) -> None:
    """The example app served by a `sasflow worker` on PostgreSQL: each order row
    commits with its task (E1), the payments agent reads the order from the same
    database (E4), a declined card is compensated, the others are processed."""
    from sasflow.examples.orders.app import build_app
    from sasflow.examples.orders.orders import place_orders, sample_orders
    from sasflow.examples.orders.remote import RemoteService

    url = postgres(make_store).conninfo
    orders = sample_orders(6, prefix="order-pg-", declined={3})

    def run() -> list[Task]:
        with RemoteService() as service:  # no faults: the outcome is exact
            worker = Process.spawn(
                "worker", [sys.executable, "-m", "sasflow.cli", "worker",
                           "sasflow.examples.orders.app:app", "--log-level", "warning"],
                tmp_path / "worker.log",
                env={**os.environ, "SASFLOW_STORE": url, "SASFLOW_TRANSPORT": "memory",
                     "SASFLOW_DEMO_REMOTE": service.url})
            app = build_app(url)
            try:
                place_orders(app, orders)
                return [app.wait(order.order_ref, timeout=60) for order in orders]
            finally:
                app.close()
                if worker.stop(timeout=30) is None:
                    pytest.fail(f"the worker did not stop on SIGTERM:\n{worker.tail()}")

    done = await asyncio.to_thread(run)
    assert [t.state for t in done] == [TaskState.PROCESSED] * 2 + [TaskState.COMPENSATED] + [
        TaskState.PROCESSED] * 3
    # without its row, charging any order fails at once and every order is undone
    charged = done[0].steps[1].result
    assert charged is not None
    assert (charged["operation"], charged["order_id"]) == ("charge", 1)
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT order_ref, card FROM orders ORDER BY order_id").fetchall()
    assert rows == [(o.order_ref, o.card) for o in orders]


@on_postgres
async def test_placing_example_orders_from_the_command_line(make_store: StoreFactory) -> None:
    """`python -m sasflow.examples.orders.orders --orders 3` writes 3 order rows and their
    3 pending tasks; `--orders 0` is refused in one line and writes nothing."""
    url = postgres(make_store).conninfo
    command = [sys.executable, "-m", "sasflow.examples.orders.orders"]
    env = {**os.environ, "SASFLOW_STORE": url}
    refused = await asyncio.to_thread(subprocess.run, [*command, "--orders", "0"], env=env,
                                      capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "--orders must be >= 1 and --decline-every >= 0")
    placed = await asyncio.to_thread(subprocess.run, [*command, "--orders", "3"], env=env,
                                     capture_output=True, text=True)
    assert placed.returncode == 0, placed.stderr
    with psycopg.connect(url) as conn:
        orders = conn.execute("SELECT order_ref FROM orders ORDER BY order_id").fetchall()
        tasks = conn.execute("SELECT task_id, state FROM tasks ORDER BY task_id").fetchall()
    assert len(orders) == 3
    assert sorted((ref, "pending") for (ref,) in orders) == tasks


@on_postgres
async def test_postgres_reads_the_claimable_and_unfinished_predicates_as_the_model(
        make_store: StoreFactory) -> None:
    """sql.CLAIMABLE_SQL and sql.UNFINISHED_SQL, as PostgreSQL reads them, agree with
    model.claimable and model.UNFINISHED_TASK_STATES on every state, held or not."""
    store = postgres(make_store)
    rows = [(state.value, holder) for state in TaskState for holder in (None, "s1")]
    checks: list[tuple[str, Callable[[str, str | None], bool]]] = [
        (sql.CLAIMABLE_SQL, lambda s, h: claimable(TaskState(s), h)),
        (sql.UNFINISHED_SQL, lambda s, h: TaskState(s) in UNFINISHED_TASK_STATES)]
    with psycopg.connect(store.conninfo) as conn:
        for predicate, python in checks:
            for state, holder in rows:
                found = conn.execute(
                    f"SELECT count(*) FROM (SELECT %s::text AS state, %s::text AS locked_by)"
                    f" AS tasks WHERE {predicate}", (state, holder)).fetchone()
                assert found is not None
                assert bool(found[0]) is python(state, holder), (predicate, state, holder)


@on_postgres
async def test_a_blocking_submit_whose_own_connection_died_goes_through_the_loop(
        make_store: StoreFactory) -> None:
    """The blocking submit writes on a connection of its own (own_connection.py), once
    the store has been opened (its first use, through the client's loop); when the
    server has closed that connection, that submission is written through the loop,
    once, and the next one on a new connection."""
    url = postgres(make_store).conninfo
    app = App(store=url)

    @app.agent("inventory")
    def reserve(req: AgentRequest) -> dict[str, Any]:
        return {"reserved": req.input["n"]}

    app.workflow("reserve", steps=[Step("reserve", agent="inventory", timeout=60.0)])

    def own_backends(conn: psycopg.Connection[Any]) -> list[int]:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                            " AND application_name = %s", (APPLICATION_NAME,)).fetchall()
        return [row[0] for row in rows]

    def run() -> list[Task]:
        try:
            with psycopg.connect(url, autocommit=True) as admin:
                opening = app.submit("reserve", {"n": 0}, task_id="r-0")
                assert not own_backends(admin), "the store's first use goes through the loop"
                first = app.submit("reserve", {"n": 1}, task_id="r-1")
                killed = own_backends(admin)
                assert killed, "the first submission used a connection of its own"
                for pid in killed:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                second = app.submit("reserve", {"n": 2}, task_id="r-2")  # through the loop
                third = app.submit("reserve", {"n": 3}, task_id="r-3")  # a new connection
                assert own_backends(admin) and not set(own_backends(admin)) & set(killed)
            app.start()
            return [app.wait(task_id, timeout=60)
                    for task_id in (opening, first, second, third)]
        finally:
            app.stop()

    done = await asyncio.to_thread(run)
    assert [t.state for t in done] == [TaskState.PROCESSED] * 4
    assert [t.steps[0].result for t in done] == [{"reserved": n} for n in (0, 1, 2, 3)]


async def ended(store: PostgresStore, task_id: str) -> Transition:
    """`task_id` submitted and cancelled (a terminal state) on `store`; the cancel."""
    assert await store.submit(new_task(task_id))
    task = await store.get(task_id)
    assert task is not None
    cancel = PLANS["order"].cancel(task, store.now())
    assert await store.apply(cancel)
    return cancel


async def heard_by(store: PostgresStore, ender: PostgresStore) -> list[str]:
    """What `store.on_finished` hears, once its listener is known to be LISTENing: a
    marker task that `ender` ends has been heard (those ended before it were not)."""
    heard: list[str] = []
    store.on_finished(heard.append)
    async with asyncio.timeout(HANG_GUARD):
        for attempt in itertools.count():
            marker = f"marker-{attempt}"
            await ended(ender, marker)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    while marker not in heard:
                        await asyncio.sleep(0.005)
                    return heard
    raise AssertionError("unreachable")


async def until_heard(heard: list[str], task_id: str) -> None:
    async with asyncio.timeout(HANG_GUARD):
        while task_id not in heard:
            await asyncio.sleep(0.005)


@on_postgres
async def test_a_task_ended_by_another_process_wakes_an_on_finished_subscriber(
        make_store: StoreFactory, clock: Clock) -> None:
    """A terminal state committed by another store (another process) reaches this
    store's on_finished subscribers by NOTIFY: the store is never polled for it."""
    waiting, worker = postgres(make_store, clock), postgres(make_store, clock)
    heard = await heard_by(waiting, worker)
    await ended(worker, "t-1")
    await until_heard(heard, "t-1")
    await submitted(worker, "t-2")  # not ended: never told
    await ended(worker, "t-3")
    await until_heard(heard, "t-3")
    assert "t-2" not in heard


@on_postgres
async def test_an_end_is_written_without_waiting_for_its_notice(
        make_store: StoreFactory, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NOTIFY that tells other processes of an ended task is sent beside the
    writer, after the commit: a write that ends a task returns while its notice is
    held, the notice is heard once it goes, and closing the store waits for it."""
    waiting, worker = postgres(make_store, clock), postgres(make_store, clock)
    heard = await heard_by(waiting, worker)
    held, holding = asyncio.Event(), asyncio.Event()

    async def held_notice(conn: psycopg.AsyncConnection[Any], task_ids: list[str]) -> None:
        holding.set()
        await held.wait()
        await sent_notice(conn, task_ids)

    sent_notice = tell_finished
    monkeypatch.setattr(bulk, "tell_finished", held_notice)
    async with asyncio.timeout(HANG_GUARD):
        await ended(worker, "held")  # the write returned: its notice is not sent yet
        await holding.wait()
    assert "held" not in heard
    closing = asyncio.ensure_future(worker.close())
    held.set()
    async with asyncio.timeout(HANG_GUARD):
        await closing
    await until_heard(heard, "held")


@on_postgres
async def test_a_notice_that_fails_loses_nothing_but_itself(
        make_store: StoreFactory, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NOTIFY that fails (its connection gone) leaves the ended task written and
    the writer unharmed: waiting clients find it by reading."""
    worker = postgres(make_store, clock)
    failed = asyncio.Event()

    async def failing_notice(conn: psycopg.AsyncConnection[Any], task_ids: list[str]) -> None:
        failed.set()
        raise psycopg.OperationalError("the notice's connection is gone")

    monkeypatch.setattr(bulk, "tell_finished", failing_notice)
    await ended(worker, "unheard")
    async with asyncio.timeout(HANG_GUARD):
        await failed.wait()
    task = await worker.get("unheard")
    assert task is not None and task.state is TaskState.CANCELLED
    await ended(worker, "next")  # the writer goes on
    await worker.close()


@on_postgres
async def test_a_rolled_back_end_notifies_no_one(make_store: StoreFactory,
                                                 clock: Clock) -> None:
    """The NOTIFY of an ended task commits with its write, or not at all."""
    waiting, worker = postgres(make_store, clock), postgres(make_store, clock)
    heard = await heard_by(waiting, worker)
    await submitted(worker, "gone")
    task = await worker.get("gone")
    assert task is not None
    cancel = PLANS["order"].cancel(task, worker.now())
    async with await psycopg.AsyncConnection.connect(worker.conninfo) as conn, (
            conn.transaction(force_rollback=True)):
        assert await write_batch(conn, [cancel], new_token(), worker.now()) == [True]
    # NOTIFYs reach a listener in commit order: once a task ended after the rollback
    # is heard, the rolled-back one would have been
    await ended(worker, "after")
    await until_heard(heard, "after")
    assert "gone" not in heard
    gone = await worker.get("gone")
    assert gone is not None and gone.state is TaskState.PENDING


@on_postgres
async def test_the_ids_of_a_large_batch_are_told_in_notifies_under_the_limit(
        make_store: StoreFactory, clock: Clock) -> None:
    """A batch that ends more ids than one NOTIFY payload holds (8,000 bytes) tells
    every one of them, in several payloads."""
    waiting, worker = postgres(make_store, clock), postgres(make_store, clock)
    heard = await heard_by(waiting, worker)
    ids = [f"{n:03d}-" + "x" * 190 for n in range(60)]  # ~11,500 bytes of ids
    await submitted(worker, *ids)
    cancels = []
    for task_id in ids:
        task = await worker.get(task_id)
        assert task is not None
        cancels.append(PLANS["order"].cancel(task, worker.now()))
    async with await psycopg.AsyncConnection.connect(worker.conninfo,
                                                     autocommit=True) as conn:
        assert await write_batch(conn, cancels, new_token(), worker.now()) == [True] * 60
    for task_id in ids:
        await until_heard(heard, task_id)

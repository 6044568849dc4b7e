"""The PostgreSQL store under faults: lost commits, killed connections, an unreachable
server, NOTIFY wake-ups, and calls from an event loop other than the pool's.

Faults are made by a loopback TCP proxy in front of the local server (it can cut
a connection right after a given statement went through, or turn every new
connection away for a while) and by `pg_terminate_backend`. Each test runs on a
private schema of the local server (conftest STORES).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from sasflow import AgentRequest, App, Step, transition
from sasflow.errors import StoreError, UnknownTaskError
from sasflow.model import Task, TaskState
from sasflow.scheduler import Scheduler
from sasflow.store.postgres import PostgresStore
from sasflow.store.postgres.connections import Connections
from support.faultproxy import FaultProxy, fault_proxy
from support.stores import (
    PLANS,
    Clock,
    StoreFactory,
    assert_stored_as_planned,
    claim_one,
    new_task,
    submitted,
)

on_postgres = pytest.mark.parametrize("make_store", ["postgres"], indirect=True)
SERVER = ("127.0.0.1", 5432)
IDLE_CLAIMS = 10  # empty claims before a submit: an idle scheduler's poll is 2 s apart


def postgres(make_store: StoreFactory, clock: Clock | None = None) -> PostgresStore:
    store = make_store(clock=clock)
    assert isinstance(store, PostgresStore)
    return store


HANG_GUARD = 60.0  # only a hang fails on it: a loaded machine is slow, never this slow


async def until(predicate: Callable[[], object], seconds: float = HANG_GUARD) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.005)


@pytest.fixture
def proxy(postgres_server: str) -> Iterator[FaultProxy]:
    """A FaultProxy to the machine's PostgreSQL: it can lose a statement's answer
    (`cut_after`), lose the statement (`cut_before`), or refuse (`reset`)."""
    with fault_proxy(SERVER[1]) as started:
        yield started


def history_rows(entries: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.step, e.phase, e.actor, e.epoch, e.from_state, e.to_state, e.why)
            for e in entries]


# ---------------------------------------------------------------- a lost answer

# In the statement that applies a batch of transitions (pg_sql.APPLY_TRANSITIONS):
# a write is one statement, and its answer is its commit's.
BATCH_STATEMENT = b"last_write = v.token"


@on_postgres
async def test_postgres_apply_whose_answer_is_lost_is_applied_once(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy,
        caplog: pytest.LogCaptureFixture) -> None:
    """The write reached the server and committed, its answer never came back: the
    store finds its token in the rows, answers True and does not write again."""
    direct = postgres(make_store, clock)
    await submitted(direct, "control", "order-1")
    plan = PLANS["order"]
    control = await claim_one(direct, "s1")
    task = await claim_one(direct, "s1")
    assert (control.task_id, task.task_id) == ("control", "order-1")
    clock.advance(1)
    assert await direct.apply(plan.reply(control, "s1", True, {"sku": 7}, None, clock.now))

    store = PostgresStore(proxy.url(direct.conninfo), clock=clock, reconnect_for=10.0)
    try:
        assert await store.get("order-1") is not None  # opened, through the proxy
        before = proxy.forwarded
        proxy.cut_after(BATCH_STATEMENT)
        with caplog.at_level(logging.WARNING, logger="sasflow.store.postgres"):
            async with asyncio.timeout(15):
                reply = plan.reply(task, "s1", True, {"sku": 7}, None, clock.now)
                applied = await store.apply(reply)
        assert applied is True
        assert proxy.fired.is_set()
        assert any("answer was lost" in r.getMessage() for r in caplog.records
                   if r.name == "sasflow.store.postgres")
        assert proxy.forwarded > before  # it came back on a new connection to ask
    finally:
        await store.close()
    stored = await direct.get("order-1")
    assert stored is not None
    assert_stored_as_planned(stored, transition.applied(task, reply))
    assert (stored.cursor, stored.steps[0].result) == (1, {"sku": 7})
    rows = history_rows(await direct.history("order-1"))
    assert rows == history_rows(await direct.history("control"))  # the same, once
    assert [r[:2] + r[4:6] for r in rows].count(("reserve", "do", "running", "completed")) == 1


@on_postgres
async def test_postgres_apply_cut_before_the_server_got_it_is_written_again_once(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy,
        caplog: pytest.LogCaptureFixture) -> None:
    """The connection dies as the write goes out, before the server got it: its token
    is nowhere, so the batch is written again on a new connection, and only once."""
    direct = postgres(make_store, clock)
    await submitted(direct, "control", "order-1")
    plan = PLANS["order"]
    control = await claim_one(direct, "s1")
    task = await claim_one(direct, "s1")
    clock.advance(1)
    assert await direct.apply(plan.reply(control, "s1", True, {"sku": 7}, None, clock.now))

    store = PostgresStore(proxy.url(direct.conninfo), clock=clock, reconnect_for=10.0)
    try:
        assert await store.get("order-1") is not None
        before = proxy.forwarded
        proxy.cut_before(BATCH_STATEMENT)
        with caplog.at_level(logging.WARNING, logger="sasflow.store.postgres"):
            async with asyncio.timeout(15):
                reply = plan.reply(task, "s1", True, {"sku": 7}, None, clock.now)
                applied = await store.apply(reply)
        assert applied is True
        assert proxy.fired.is_set()
        assert proxy.forwarded > before  # written on a new connection
        # nothing had committed: written again, not taken for an answer lost
        assert not any("answer was lost" in r.getMessage() for r in caplog.records)
    finally:
        await store.close()
    stored = await direct.get("order-1")
    assert stored is not None
    assert_stored_as_planned(stored, transition.applied(task, reply))
    rows = history_rows(await direct.history("order-1"))
    assert rows == history_rows(await direct.history("control"))
    assert [r[:2] + r[4:6] for r in rows].count(("reserve", "do", "running", "completed")) == 1


@on_postgres
async def test_postgres_claim_whose_commit_answer_is_lost_returns_the_claimed_tasks(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy) -> None:
    """A claim that committed though its answer was lost returns its tasks (not [])."""
    direct = postgres(make_store, clock)
    await submitted(direct, "t1", "t2")
    store = PostgresStore(proxy.url(direct.conninfo), clock=clock, reconnect_for=10.0)
    try:
        assert await store.get("t1") is not None
        proxy.cut_after(b"COMMIT")
        async with asyncio.timeout(15):
            claimed = await store.claim("s1", 10, PLANS)
        assert proxy.fired.is_set()
    finally:
        await store.close()
    assert sorted(t.task_id for t in claimed) == ["t1", "t2"]
    for task_id in ("t1", "t2"):
        stored = await direct.get(task_id)
        assert stored is not None and (stored.locked_by, stored.epoch) == ("s1", 1)
        assert [e.to_state for e in await direct.history(task_id)].count("processing") == 1


# ---------------------------------------------------------------- an unreachable server


@on_postgres
async def test_postgres_write_waits_for_the_server_to_come_back(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy) -> None:
    """Every connection cut and new ones refused: a submit keeps reconnecting, without
    failing, until the server is back, then succeeds."""
    direct = postgres(make_store, clock)
    store = PostgresStore(proxy.url(direct.conninfo), clock=clock)
    try:
        assert await store.get("t1") is None
        proxy.set_mode("reset")  # every connection dropped, as a server restart does,
        # and new ones closed as soon as accepted (the server is unreachable)
        write = asyncio.create_task(store.submit(new_task("t1")))
        # the store was turned away three times: it had its chances to give up
        await until(lambda: proxy.refused >= 3 or write.done())
        assert not write.done(), write  # waiting, not failed
        proxy.set_mode("pass")
        async with asyncio.timeout(HANG_GUARD):
            assert await write is True
    finally:
        await store.close()
    task = await direct.get("t1")
    assert task is not None and task.state is TaskState.PENDING
    assert len(await direct.history("t1")) == 1


@on_postgres
async def test_postgres_write_gives_up_after_reconnect_for(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy) -> None:
    """With reconnect_for=0.5 and the server gone for good, a StoreError, not before
    0.5 s of reconnecting (it does not wait the default 60 s)."""
    direct = postgres(make_store, clock)
    store = PostgresStore(proxy.url(direct.conninfo), clock=clock, reconnect_for=0.5)
    try:
        assert await store.get("t1") is None
        proxy.set_mode("reset")  # every connection dropped, as a server restart does,
        # and new ones closed as soon as accepted (the server is unreachable)
        started = time.monotonic()
        with pytest.raises(StoreError):
            # a TimeoutError here means it went on past its budget, as without one
            async with asyncio.timeout(30):
                await store.submit(new_task("t1"))
        took = time.monotonic() - started
    finally:
        proxy.set_mode("pass")
        await store.close()
    assert took >= 0.4
    assert proxy.refused >= 1, "it gave up without trying to reconnect"
    assert await direct.get("t1") is None


@on_postgres
async def test_postgres_a_call_the_server_never_answers_gives_its_connection_up(
        make_store: StoreFactory, clock: Clock, proxy: FaultProxy) -> None:
    """The server stops answering while the connections stay up (a hung host, a link
    that drops every packet): a call waits `answer_within` for its answer, gives the
    connection up as lost and tries again, and fails once `reconnect_for` is spent,
    as for a server that is down. Without the bound it waited for as long as the
    answers were held. Once they flow again, the store works."""
    direct = postgres(make_store, clock)
    store = PostgresStore(proxy.url(direct.conninfo), clock=clock, reconnect_for=0.5,
                          answer_within=0.5)
    try:
        assert await store.get("t1") is None
        proxy.set_mode("hold-answers")
        with pytest.raises(StoreError, match=r"no answer from the database within 0\.5s"):
            # a TimeoutError here means it waited on, as without the bound
            async with asyncio.timeout(HANG_GUARD):
                await store.get("t1")
        assert proxy.held > 0, "no answer was held: the server was never silent"
        proxy.set_mode("pass")
        await submitted(store, "t1")
        assert await store.get("t1") is not None
    finally:
        proxy.set_mode("pass")
        await store.close()


# ---------------------------------------------------------------- connections killed under load


@on_postgres
async def test_postgres_app_finishes_every_task_once_while_its_connections_are_killed(
        make_store: StoreFactory) -> None:
    """200 three-step tasks while the server ends the store's connections again and
    again: all processed, each step completed exactly once, no error to the caller.
    Every task's second step waits until three rounds of killing have happened, so
    the tasks are in flight through them however fast the machine is."""
    name = f"sasflow-faults-{uuid.uuid4().hex[:10]}"
    three_rounds = threading.Event()
    url = postgres(make_store).conninfo
    app = App(store=f"{url}&application_name={name}")

    for agent in ("a", "b", "c"):
        @app.agent(agent)
        async def step(req: AgentRequest) -> dict[str, Any]:
            await asyncio.sleep(0.002)
            while req.step == "two" and not three_rounds.is_set():
                await asyncio.sleep(0.01)  # (a positive signal, set by the killer)
            return {"n": req.input["n"], "step": req.step}

    app.workflow("three", steps=[Step("one", agent="a", timeout=10.0),
                                 Step("two", agent="b", timeout=10.0),
                                 Step("three", agent="c", timeout=10.0)])
    ids = [f"job-{n:03}" for n in range(200)]
    finished = threading.Event()

    def run() -> list[Task]:
        app.start()
        try:
            for n, task_id in enumerate(ids):
                app.submit("three", {"n": n}, task_id=task_id)
            return [app.wait(task_id, timeout=HANG_GUARD) for task_id in ids]
        finally:
            finished.set()
            app.stop()

    killed: list[int] = []

    async def kill() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await asyncio.sleep(0.2)
            for _ in range(6):
                if finished.is_set():
                    break
                cur = await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name LIKE %s", (f"{name}%",))  # (its pool's too)
                killed.append(len(await cur.fetchall()))
                if len(killed) == 3:
                    three_rounds.set()
                await asyncio.sleep(0.25)
            three_rounds.set()

    done, _ = await asyncio.gather(asyncio.to_thread(run), kill())
    assert len(killed) >= 3 and sum(killed) >= 3  # the connections really were ended
    assert [t.state for t in done] == [TaskState.PROCESSED] * 200
    check = postgres(make_store)
    for task_id in ids:
        completed = [(e.step, e.phase) for e in await check.history(task_id)
                     if e.step is not None and e.to_state == "completed"]
        assert sorted(completed) == [("one", "do"), ("three", "do"), ("two", "do")], task_id


# ---------------------------------------------------------------- NOTIFY wake-ups


def own_time(clock: Clock) -> None:
    """Move `clock` to a time no other store sends: the channel is the whole
    database's, so other schemas' (other tests') wake-ups may be heard too."""
    clock.now = 1_500_000_000.0 + uuid.uuid4().int % 10**9 / 1000


@on_postgres
def test_a_blocking_submit_waits_out_the_store_first_use_losing_its_connection(
        make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's first use (its schema check, on a connection of its own) loses that
    connection twice, as when the server ends it: a blocking submission made then
    waits it out, as the store's opening does, and is written once; no error reaches
    the caller. (The blocking submit's own connection once made that check itself,
    and its lost connection reached the caller as a StoreError.)"""
    url = postgres(make_store).conninfo
    check = Connections.ensure_schema
    lost: list[str] = []

    def losing_twice(db: Connections) -> None:
        if len(lost) < 2:
            lost.append(threading.current_thread().name)
            cause = psycopg.OperationalError("terminating connection due to administrator"
                                             " command")
            raise StoreError(f"cannot reach the PostgreSQL store: {cause}") from cause
        check(db)

    monkeypatch.setattr(Connections, "ensure_schema", losing_twice)
    app = App(store=url)

    @app.agent("a")
    def one(req: AgentRequest) -> dict[str, Any]:
        return {"n": req.input["n"]}

    app.workflow("one", steps=[Step("one", agent="a", timeout=10.0)])
    try:
        task_id = app.submit("one", {"n": 1}, task_id="first-use")
        assert len(lost) == 2, lost
        stored = app.get(task_id)
        assert (stored.task_id, stored.state) == ("first-use", TaskState.PENDING)
        assert app.submit("one", {"n": 1}, task_id="first-use") == "first-use"  # once
    finally:
        app.close()


@on_postgres
async def test_postgres_watch_hears_a_submit_by_another_store(make_store: StoreFactory,
                                                              clock: Clock) -> None:
    """A submit on store B wakes store A's watcher with the work's time: only a
    NOTIFY carries it there (the watcher does not poll)."""
    own_time(clock)
    a, b = postgres(make_store, clock), postgres(make_store, clock)
    await a.get("warm-up")
    heard: list[float] = []
    watcher = asyncio.create_task(a.watch(heard.append))
    try:
        await until(lambda: clock.now in heard)  # wake(now) once, on connecting
        clock.advance(3)
        assert await b.submit(new_task("t1"))
        await until(lambda: clock.now in heard)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


@on_postgres
async def test_postgres_a_rolled_back_submit_in_wakes_no_one_and_a_committed_one_does(
        make_store: StoreFactory, clock: Clock) -> None:
    """E1: the wake-up commits with the caller's transaction, or not at all."""
    own_time(clock)
    store = postgres(make_store, clock)
    await store.get("warm-up")
    heard: list[float] = []
    watcher = asyncio.create_task(store.watch(heard.append))
    try:
        await until(lambda: clock.now in heard)
        # NOTIFYs reach a listener in commit order: once a marker committed after the
        # rollback is heard, a wake-up the rolled-back submit had sent would have been
        clock.advance(1)
        gone_at = clock.now
        with psycopg.connect(store.conninfo) as conn:
            assert store.submit_in(conn, new_task("gone"))
            conn.rollback()
        clock.advance(1)
        assert await store.submit(new_task("marker-1"))
        await until(lambda: clock.now in heard)
        assert gone_at not in heard
        clock.advance(1)
        kept_at = clock.now
        with psycopg.connect(store.conninfo) as conn:
            assert store.submit_in(conn, new_task("kept"))
            clock.advance(1)
            assert await store.submit(new_task("marker-2"))  # committed while kept's is open
            await until(lambda: clock.now in heard)
            assert kept_at not in heard  # not before the caller commits
            conn.commit()
        await until(lambda: kept_at in heard)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    assert await store.get("gone") is None
    assert await store.get("kept") is not None


@on_postgres
async def test_postgres_an_idle_scheduler_takes_work_from_another_host_at_once(
        make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle scheduler, its next poll up to 2 s away, takes a task another store
    instance submitted as soon as the store tells it: woken, not by its poll."""
    url = postgres(make_store).conninfo

    def declare(app: App) -> None:
        @app.agent("echo")
        def echo(req: AgentRequest) -> dict[str, Any]:
            return {"echo": req.input}

        app.workflow("one", steps=[Step("only", agent="echo", timeout=60.0)])

    # on the runner's loop clock: each claim (started, ended, task ids), each wake-up
    claims: list[tuple[float, float, list[str]]] = []
    wakes: list[float] = []
    claim, wake_at = Scheduler._claim, Scheduler.wake_at

    async def recorded_claim(self: Scheduler, limit: int) -> list[Task]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        tasks = await claim(self, limit)
        claims.append((started, loop.time(), [t.task_id for t in tasks]))
        return tasks

    def recorded_wake_at(self: Scheduler, at: float) -> None:
        wakes.append(asyncio.get_running_loop().time())
        wake_at(self, at)

    monkeypatch.setattr(Scheduler, "_claim", recorded_claim)
    monkeypatch.setattr(Scheduler, "wake_at", recorded_wake_at)
    name = f"sasflow-runner-{uuid.uuid4().hex[:10]}"
    runner, submitter = App(store=f"{url}&application_name={name}"), App(store=url)
    declare(runner)
    declare(submitter)
    runner.start()
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            async def listening() -> bool:
                cur = await admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                    " AND query = 'LISTEN sasflow_work'", (name,))
                return await cur.fetchone() == (1,)

            async with asyncio.timeout(HANG_GUARD):
                while not await listening():  # the runner's scheduler is listening
                    await asyncio.sleep(0.01)
        # idle waits double up to 2 s: after 10 empty claims the scheduler polls seldom
        await until(lambda: len(claims) >= IDLE_CLAIMS)
        assert all(ids == [] for *_, ids in claims)
        await submitter.asubmit("one", {"x": 1}, task_id="t1")  # its own store: no
        # in-process wake-up reaches the runner
        async with asyncio.timeout(HANG_GUARD):
            while (await submitter.aget("t1")).state is not TaskState.PROCESSED:
                await asyncio.sleep(0.005)
    finally:
        await asyncio.to_thread(runner.stop)
        await asyncio.to_thread(submitter.close)
    [taken] = [n for n, (*_, ids) in enumerate(claims) if ids == ["t1"]]
    assert taken >= IDLE_CLAIMS, "the task was taken by a claim made before it was submitted"
    last_empty, taking = claims[taken - 1], claims[taken]
    # told by the store before the claim that took the task returned (on a loaded
    # machine that claim may be a poll that overlaps the wake-up, which is fine)
    assert [w for w in wakes if last_empty[1] <= w <= taking[1]], (
        "the task was found by the scheduler's poll, never told of", claims, wakes)


# ---------------------------------------------------------------- calls from another loop


@on_postgres
async def test_postgres_calls_from_another_event_loop_than_the_roles(
        make_store: StoreFactory) -> None:
    """Roles in app.start()'s background loop; 200 asubmit/await_ from asyncio.run()."""
    url = postgres(make_store).conninfo
    app = App(store=url)

    @app.agent("echo")
    async def echo(req: AgentRequest) -> dict[str, Any]:
        return {"echo": req.input}

    app.workflow("two", steps=[Step("first", agent="echo", timeout=600.0),
                               Step("second", agent="echo", timeout=600.0)])

    async def client() -> list[Task]:
        async def one(n: int) -> Task:
            task_id = await app.asubmit("two", {"n": n}, task_id=f"web-{n:03}")
            return await app.await_(task_id, timeout=HANG_GUARD)

        async with asyncio.timeout(HANG_GUARD):
            return await asyncio.gather(*(one(n) for n in range(200)))

    def run() -> list[Task]:
        app.start()
        try:
            with pytest.raises(UnknownTaskError):
                app.get("nothing")  # the store's pool now lives in the roles' loop
            return asyncio.run(client())
        finally:
            app.stop()

    done = await asyncio.to_thread(run)
    assert [t.state for t in done] == [TaskState.PROCESSED] * 200
    assert done[17].steps[1].result == {"echo": {"n": 17}}

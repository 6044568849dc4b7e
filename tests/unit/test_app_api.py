"""The App facade on a real SQLite file: submit, wait, status messages, alerts, E1."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sasflow import (
    AgentRequest,
    App,
    ConfigurationError,
    InvalidTransitionError,
    PayloadError,
    PermanentError,
    Step,
    TaskConflictError,
    TaskState,
    UnknownTaskError,
    UnknownWorkflowError,
    WaitTimeout,
)
from sasflow.messages import Status
from sasflow.store.records import Alert

MakeApp = Callable[..., App]
# No test here is about a step running out of time, or about speed: a complete-by and
# waits that a loaded machine cannot miss
STEP_TIMEOUT = 600.0
HANG_GUARD = 60.0


@pytest.fixture
def make_app(db_url: str) -> Iterator[MakeApp]:
    """Apps on this test's store file; each is stopped (and its store closed) afterwards."""
    apps: list[App] = []

    def make(**options: Any) -> App:
        app = App(store=db_url, **options)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.stop()


def store_path(db_url: str) -> str:
    return db_url.removeprefix("sqlite:///")


def orders_app(make_app: MakeApp, *, declined: Callable[[AgentRequest], bool] = lambda r: False,
               on_reserve: Callable[[AgentRequest], None] = lambda r: None,
               on_failure: str = "compensate", **options: Any) -> App:
    """reserve (undoable) then charge; charge refuses when `declined(req)` says so."""
    app = make_app(**options)

    @app.agent("inventory")
    def reserve(req: AgentRequest) -> dict[str, Any]:
        on_reserve(req)
        return {"reserved": req.input["order_id"]}

    @reserve.compensator
    def release(req: AgentRequest) -> dict[str, Any]:
        return {"released": req.result["reserved"]}

    @app.agent("payments")
    async def charge(req: AgentRequest) -> dict[str, Any]:
        if declined(req):
            raise PermanentError("card declined")
        return {"charged": req.input["order_id"], "after": req.results["reserve"]}

    app.workflow("process-order", steps=[Step("reserve", agent="inventory", timeout=STEP_TIMEOUT),
                                         Step("charge", agent="payments", timeout=STEP_TIMEOUT)],
                 max_failures=3, on_failure=on_failure)
    return app


def rows_everywhere(db_url: str) -> dict[str, int]:
    """How many rows each of the store's tables holds (what a refused submit must not touch)."""
    with contextlib.closing(sqlite3.connect(store_path(db_url))) as conn:
        return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("tasks", "steps", "history", "outbox", "alerts")}


# ---------------------------------------------------------------- submit / wait


def test_submit_then_wait_until_processed(make_app: MakeApp) -> None:
    """A submitted task runs its steps in order and ends processed with each result."""
    app = orders_app(make_app).start()
    task_id = app.submit("process-order", {"order_id": 42}, task_id="order-42")
    assert task_id == "order-42"
    task = app.wait("order-42", timeout=HANG_GUARD)
    assert (task.task_id, task.workflow, task.state, task.locked_by) == (
        "order-42", "process-order", TaskState.PROCESSED, None)
    assert [(s.name, s.state.value, s.result) for s in task.steps] == [
        ("reserve", "completed", {"reserved": 42}),
        ("charge", "completed", {"charged": 42, "after": {"reserved": 42}})]
    assert app.get("order-42").state is TaskState.PROCESSED


def test_submit_without_task_id_makes_one(make_app: MakeApp) -> None:
    """No task id given: a fresh unique one is returned and the task is pending."""
    app = orders_app(make_app)
    first, second = app.submit("process-order", {"order_id": 1}), app.submit(
        "process-order", {"order_id": 1})
    assert first != second
    task = app.get(first)
    assert (task.state, task.locked_by, task.complete_by, task.failure_count) == (
        TaskState.PENDING, None, None, 0)


def test_submit_is_idempotent_on_task_id(make_app: MakeApp, db_url: str) -> None:
    """The same submission twice is one task; the second call just returns its id."""
    app = orders_app(make_app)
    assert app.submit("process-order", {"order_id": 7}, task_id="order-7") == "order-7"
    before = rows_everywhere(db_url)
    assert app.submit("process-order", {"order_id": 7}, task_id="order-7") == "order-7"
    assert rows_everywhere(db_url) == before


def test_resubmitting_a_task_id_with_other_input_conflicts(make_app: MakeApp,
                                                           db_url: str) -> None:
    """Same task id, different input: TaskConflictError, and the first task is untouched."""
    app = orders_app(make_app)
    app.submit("process-order", {"order_id": 7}, task_id="order-7")
    before = rows_everywhere(db_url)
    with pytest.raises(TaskConflictError, match="order-7") as caught:
        app.submit("process-order", {"order_id": 8}, task_id="order-7")
    assert caught.value.task_id == "order-7"
    assert rows_everywhere(db_url) == before
    assert app.get("order-7").input == {"order_id": 7}


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda app: app.submit("no-such-flow", {"order_id": 1}, task_id="t"),
     UnknownWorkflowError, "unknown workflow 'no-such-flow' (declared: process-order)"),
    (lambda app: app.submit("process-order", {"when": object()}, task_id="t"),
     PayloadError, "input is not JSON-serialisable"),
    (lambda app: app.submit("process-order", {"amount": float("nan")}, task_id="t"),
     PayloadError, "input"),
    (lambda app: app.submit("process-order", float("inf"), task_id="t"),
     PayloadError, "input"),
    (lambda app: app.submit("process-order", {"blob": "x" * 2000}, task_id="t"),
     PayloadError, "over the limit of 1000 bytes"),
    (lambda app: app.submit("process-order", {"order_id": 1}, task_id=""),
     PayloadError, "task id must be 1-200 printable characters"),
    (lambda app: app.submit("process-order", {"order_id": 1}, task_id="x" * 201),
     PayloadError, "task id must be"),
    (lambda app: app.submit("process-order", {"order_id": 1}, task_id="bad\nid"),
     PayloadError, "task id must be"),
    (lambda app: app.submit("process-order", {"order_id": 1}, task_id=42),
     PayloadError, "task id must be"),
    (lambda app: app.submit("process-order", {"order_id": 1}, task_id="t", reply_to=""),
     PayloadError, "reply_to must be a queue name"),
], ids=["unknown-workflow", "not-json", "not-a-json-number", "a-bare-infinity", "oversized",
        "empty-id", "long-id", "control-char-id", "non-string-id", "empty-reply-to"])
def test_bad_input_is_refused_clearly_and_writes_nothing(
        make_app: MakeApp, db_url: str, call: Callable[[App], Any], error: type[Exception],
        words: str) -> None:
    """U7: a clear error naming the problem, and not one row written anywhere."""
    app = orders_app(make_app, max_payload_bytes=1000)
    app.submit("process-order", {"order_id": 0}, task_id="existing")
    before = rows_everywhere(db_url)
    with pytest.raises(error) as caught:
        call(app)
    assert words in str(caught.value)
    assert rows_everywhere(db_url) == before


def test_unknown_task_ids_are_refused(make_app: MakeApp) -> None:
    """get, wait and the operator actions name the unknown task."""
    app = orders_app(make_app)
    for action in (app.get, app.wait, app.retry, app.compensate, app.cancel):
        with pytest.raises(UnknownTaskError, match="unknown task 'order-404'") as caught:
            action("order-404")
        assert caught.value.task_id == "order-404"


def test_wait_gives_up_at_its_timeout(make_app: MakeApp) -> None:
    """No worker running: wait raises WaitTimeout (also a TimeoutError) when time is up."""
    app = orders_app(make_app)
    app.submit("process-order", {"order_id": 1}, task_id="order-1")
    with pytest.raises(WaitTimeout, match="order-1") as caught:
        app.wait("order-1", timeout=0.2)
    assert isinstance(caught.value, TimeoutError)


# ---------------------------------------------------------------- status messages (E11)


async def collect(app: App, queue: str, until: str) -> list[Status]:
    """Status messages of `queue` up to and including the first `until` event."""
    seen: list[Status] = []
    listening = app.alisten(queue)
    async with asyncio.timeout(HANG_GUARD), contextlib.aclosing(listening) as statuses:
        async for status in statuses:
            seen.append(status)
            if status.event == until:
                return seen
    raise AssertionError("listen() ended")


async def test_listen_reports_progress_in_order(make_app: MakeApp) -> None:
    """E11: received, each step completed, processed - each carrying the task id."""
    app = orders_app(make_app).start()
    await app.asubmit("process-order", {"order_id": 5}, task_id="order-5", reply_to="shop-1")
    seen = await collect(app, "shop-1", until="processed")
    assert [(s.event, s.step) for s in seen] == [
        ("received", None), ("step_completed", "reserve"), ("step_completed", "charge"),
        ("processed", None)]
    assert {s.task_id for s in seen} == {"order-5"}
    assert seen[-1].state == "processed"


async def test_listen_reports_a_compensated_task(make_app: MakeApp) -> None:
    """E11 failure path: received, step completed, compensating, compensated."""
    app = orders_app(make_app, declined=lambda req: True).start()
    await app.asubmit("process-order", {"order_id": 6}, task_id="order-6", reply_to="shop-1")
    seen = await collect(app, "shop-1", until="compensated")
    assert [(s.event, s.step) for s in seen] == [
        ("received", None), ("step_completed", "reserve"), ("compensating", "charge"),
        ("compensated", None)]
    assert seen[2].error is not None and "card declined" in seen[2].error
    task = await app.await_("order-6", timeout=HANG_GUARD)
    assert task.state is TaskState.COMPENSATED
    assert [s.state.value for s in task.steps] == ["compensated", "failed"]


def test_a_refused_first_step_ends_compensated(make_app: MakeApp) -> None:
    """compensate policy, first step refused: nothing to undo, so the task is compensated."""
    app = make_app()

    @app.agent("payments")
    def charge(req: AgentRequest) -> None:
        raise PermanentError("card declined")

    app.workflow("charge-only", steps=[Step("charge", agent="payments", timeout=STEP_TIMEOUT)],
                 on_failure="compensate")
    app.start()
    app.submit("charge-only", {"order_id": 1}, task_id="order-1")
    task = app.wait("order-1", timeout=HANG_GUARD)
    assert (task.state, task.locked_by) == (TaskState.COMPENSATED, None)
    assert task.steps[0].state.value == "failed"


async def test_listen_only_sees_its_own_queue(make_app: MakeApp) -> None:
    """Status messages go to the queue the submitter named, not to others."""
    app = orders_app(make_app).start()
    await app.asubmit("process-order", {"order_id": 1}, task_id="a", reply_to="shop-a")
    await app.asubmit("process-order", {"order_id": 2}, task_id="b", reply_to="shop-b")
    seen = await collect(app, "shop-b", until="processed")
    assert {s.task_id for s in seen} == {"b"}


# ---------------------------------------------------------------- alerts and operators (E8)


def test_on_alert_receives_the_operator_alert(make_app: MakeApp) -> None:
    """error policy: the task ends in error and the on_alert callback gets the alert."""
    app = orders_app(make_app, declined=lambda req: True, on_failure="error")
    received: list[Alert] = []
    arrived = threading.Event()

    @app.on_alert
    def page_operator(alert: Alert) -> None:
        received.append(alert)
        arrived.set()

    app.start()
    app.submit("process-order", {"order_id": 9}, task_id="order-9")
    task = app.wait("order-9", timeout=HANG_GUARD)
    assert task.state is TaskState.ERROR
    assert task.error is not None and "card declined" in task.error
    assert arrived.wait(5)
    [alert] = received
    assert (alert.task_id, alert.step, alert.agent) == ("order-9", "charge", "payments")
    assert "card declined" in alert.message
    [stored] = app.alerts()
    assert (stored.task_id, stored.message) == ("order-9", alert.message)


def test_operator_retry_after_the_cause_is_fixed(make_app: MakeApp) -> None:
    """E8: the operator fixes the cause and resubmits the failed step; the task completes."""
    card_ok = threading.Event()
    app = orders_app(make_app, declined=lambda req: not card_ok.is_set(), on_failure="error")
    app.start()
    app.submit("process-order", {"order_id": 3}, task_id="order-3")
    assert app.wait("order-3", timeout=HANG_GUARD).state is TaskState.ERROR
    card_ok.set()
    retried = app.retry("order-3", step="charge")
    assert retried.state is not TaskState.ERROR
    assert retried.failure_count == 0
    task = app.wait("order-3", timeout=HANG_GUARD)
    assert task.state is TaskState.PROCESSED
    assert task.steps[0].attempts == 1  # reserve was not run again


def test_operator_actions_refused_for_a_finished_task(make_app: MakeApp) -> None:
    """A processed task cannot be retried, compensated or cancelled."""
    app = orders_app(make_app).start()
    app.submit("process-order", {"order_id": 4}, task_id="order-4")
    app.wait("order-4", timeout=HANG_GUARD)
    for action in (app.retry, app.compensate, app.cancel):
        with pytest.raises(InvalidTransitionError, match="it is processed"):
            action("order-4")
    assert app.get("order-4").state is TaskState.PROCESSED


def test_cancel_a_pending_task(make_app: MakeApp) -> None:
    """An operator cancels a task no scheduler has taken yet."""
    app = orders_app(make_app)
    app.submit("process-order", {"order_id": 1}, task_id="order-1")
    assert app.cancel("order-1").state is TaskState.CANCELLED


# ---------------------------------------------------------------- atomic submission (E1)


def _orders_table(db_url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(store_path(db_url), timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
    return conn


def _orders(db_url: str) -> list[tuple[int, str]]:
    with contextlib.closing(sqlite3.connect(store_path(db_url))) as conn:
        return conn.execute("SELECT id, item FROM orders").fetchall()


def test_submission_rolled_back_with_the_business_row(make_app: MakeApp, db_url: str) -> None:
    """E1: order row and task in one transaction; rollback leaves neither."""
    app = orders_app(make_app).start()
    with contextlib.closing(_orders_table(db_url)) as conn:
        conn.execute("INSERT INTO orders VALUES (42, 'book')")
        assert app.submit("process-order", {"order_id": 42}, task_id="order-42",
                          connection=conn) == "order-42"
        conn.rollback()
    assert _orders(db_url) == []
    with pytest.raises(UnknownTaskError):
        app.get("order-42")
    assert rows_everywhere(db_url)["tasks"] == 0


def test_submission_committed_with_the_business_row_is_processed(make_app: MakeApp,
                                                                 db_url: str) -> None:
    """E1: commit makes both exist, and the task then runs to the end."""
    app = orders_app(make_app).start()
    with contextlib.closing(_orders_table(db_url)) as conn:
        conn.execute("INSERT INTO orders VALUES (42, 'book')")
        app.submit("process-order", {"order_id": 42}, task_id="order-42", connection=conn)
        conn.commit()
    assert _orders(db_url) == [(42, "book")]
    assert app.wait("order-42", timeout=HANG_GUARD).state is TaskState.PROCESSED


def test_submission_in_a_transaction_is_invisible_until_commit(make_app: MakeApp,
                                                               db_url: str) -> None:
    """Until the caller commits, no scheduler can see (let alone run) the task."""
    ran = threading.Event()
    app = orders_app(make_app, on_reserve=lambda req: ran.set()).start()
    with contextlib.closing(_orders_table(db_url)) as conn:
        conn.execute("INSERT INTO orders VALUES (1, 'pen')")
        app.submit("process-order", {"order_id": 1}, task_id="order-1", connection=conn)
        assert not ran.wait(0.5)
        conn.commit()
    assert app.wait("order-1", timeout=HANG_GUARD).state is TaskState.PROCESSED
    assert ran.is_set()


def test_submission_with_a_connection_to_another_database_is_refused(
        make_app: MakeApp, db_url: str, tmp_path: Path) -> None:
    """A connection that is not to the store's file cannot share its transaction."""
    app = orders_app(make_app)
    with contextlib.closing(sqlite3.connect(tmp_path / "elsewhere.db")) as other, \
            pytest.raises(ConfigurationError, match="not to the store's database file"):
        app.submit("process-order", {"order_id": 1}, task_id="order-1", connection=other)
    assert rows_everywhere(db_url)["tasks"] == 0


# ---------------------------------------------------------------- binding


def test_every_value_the_sqlite_store_binds_is_bound_without_a_search(
        make_app: MakeApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each parameter the store hands SQLite over a task's whole life (a step done, one
    refused, the other undone) is an int, float or str, or has an adapter registered:
    never the sqlite3 module's failed adaptation search, which costs ~1.2 µs a value on
    Python 3.11 (store/sqlite/connections.py). Values bind as the search's miss would."""
    bound: list[Any] = []

    class Recording(sqlite3.Connection):
        def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
            bound.extend(parameters.values() if isinstance(parameters, dict) else parameters)
            return super().execute(sql, parameters)

        def executemany(self, sql: str, seq: Any, /) -> sqlite3.Cursor:
            rows = list(seq)
            for parameters in rows:
                bound.extend(parameters.values() if isinstance(parameters, dict)
                             else parameters)
            return super().executemany(sql, rows)

    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect",
                        lambda *args, **kwargs: connect(*args, factory=Recording, **kwargs))
    app = orders_app(make_app, declined=lambda r: True).start()
    app.submit("process-order", {"order_id": 7}, task_id="undone")
    assert app.wait("undone", timeout=HANG_GUARD).state is TaskState.COMPENSATED
    kinds = {type(value) for value in bound}
    assert {type(None), TaskState} <= kinds  # what the registry must answer for
    searched = {kind for kind in kinds if kind not in (int, float, str, bytearray)
                and (kind, sqlite3.PrepareProtocol) not in sqlite3.adapters}
    assert not searched, searched
    with contextlib.closing(connect(":memory:")) as conn:
        assert conn.execute("SELECT ?, typeof(?), ?, typeof(?)", (
            TaskState.PENDING, TaskState.PENDING, None, b"x")).fetchone() == (
                "pending", "text", None, "blob")

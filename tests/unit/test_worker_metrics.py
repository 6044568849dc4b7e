"""A worker's metrics as its roles count them (U5): an App running workflows in this
process on SQLite, and a supervisor recovering expiries on a moved clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sasflow import AgentRequest, App, PermanentError, Step, TaskState
from sasflow.metrics import Metrics
from sasflow.model import idempotency_key
from sasflow.store.records import NewTask
from sasflow.store.sqlite import SQLiteStore
from sasflow.transport.base import agent_queue
from sasflow.transport.memory import MemoryTransport
from sasflow.worker import Worker, WorkerSettings
from sasflow.workflow import Workflow
from support.waiting import wait_for

HANG_GUARD = 120.0  # only a hang fails on it, never a slow machine


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def make_app(store: str) -> App:
    """order: reserve (fails once, then works) -> charge (refused for good);
    probe: one call to a service that is down, whose breaker opens on the first try."""
    app = App(store=store)
    failed_once: set[str] = set()

    @app.agent("inventory", initial_wait=0.001, max_wait=0.001)
    def reserve(req: AgentRequest) -> dict[str, Any]:
        if req.task_id not in failed_once:
            failed_once.add(req.task_id)
            raise ConnectionError("reset by peer")
        return {"reservation": f"r-{req.task_id}"}

    @app.agent("payments")
    def charge(req: AgentRequest) -> None:
        raise PermanentError("card declined")

    # two tries a request, and two failures open the breaker for an hour
    @app.agent("ledger", attempts=2, initial_wait=0.001, max_wait=0.001,
               failure_threshold=2, reset_timeout=3600.0)
    def post(req: AgentRequest) -> None:
        raise ConnectionError("connection refused")

    app.workflow("order", [Step("reserve", "inventory", timeout=600.0),
                           Step("charge", "payments", timeout=600.0)], on_failure="error")
    app.workflow("probe", [Step("post", "ledger", timeout=600.0)], on_failure="error",
                 max_failures=2, retry_backoff=0.01)
    return app


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    made = make_app(db_url)
    yield made
    made.stop()


def test_an_apps_roles_count_durations_retries_the_breaker_alerts_and_dead_letters(
        app: App) -> None:
    app.start(metrics=True, concurrency=8)
    metrics = app.metrics
    order, probe = app.submit("order", None), app.submit("probe", None)
    assert app.wait(order, timeout=HANG_GUARD).state is TaskState.ERROR
    assert app.wait(probe, timeout=HANG_GUARD).state is TaskState.ERROR
    # counted just after the store applied it: a waiter may be woken first
    wait_for("both alerts counted",
             lambda: value(metrics, "sasflow_alerts_total", kind="task") == 2,
             timeout=HANG_GUARD)

    def requests(agent: str, outcome: str) -> float | None:
        return value(metrics, "sasflow_step_duration_seconds_count", agent=agent,
                     outcome=outcome)

    # reserve failed once and was retried within its request: one request, ok
    assert requests("inventory", "ok") == 1 and requests("inventory", "transient") == 0
    assert value(metrics, "sasflow_agent_retries_total", agent="inventory") == 1
    assert requests("payments", "permanent") == 1 and requests("payments", "ok") == 0
    # the ledger gave up twice: once after two failed calls (which opened its breaker),
    # once refused by the open breaker; the first was released to run again
    assert requests("ledger", "transient") == 2
    assert value(metrics, "sasflow_agent_retries_total", agent="ledger") == 2
    assert value(metrics, "sasflow_step_retries_total", workflow="probe") == 1
    assert value(metrics, "sasflow_step_retries_total", workflow="order") == 0
    assert value(metrics, "sasflow_breaker_state", agent="ledger") == 2  # open
    assert value(metrics, "sasflow_breaker_trips_total", agent="ledger") == 1
    assert value(metrics, "sasflow_breaker_state", agent="inventory") == 0  # closed again
    assert value(metrics, "sasflow_alerts_total", kind="incident") == 0
    took = value(metrics, "sasflow_step_duration_seconds_sum", agent="inventory",
                 outcome="ok")
    assert took is not None and took > 0

    # a body no agent can read is a dead letter of its queue
    queue = agent_queue("inventory")
    app._loop.run(app._backends.transport.publish(queue, b"not a request"))
    wait_for("the dead letter counted",
             lambda: value(metrics, "sasflow_dead_letters_total", queue=queue) == 1,
             timeout=HANG_GUARD)

    app.stop()
    # the breakers are the running roles': gone with them; the counts stay
    assert value(metrics, "sasflow_breaker_state", agent="ledger") is None
    assert value(metrics, "sasflow_alerts_total", kind="task") == 2


def test_a_schedulers_metrics_see_only_the_transitions_that_let_a_task_go(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's usual transition locks the next unit and costs the metrics no call: the
    scheduler counts (`on_released`) only a transition that unlocks its task, here
    each task's last, and the first attempt of a probe released to run again."""
    seen: list[tuple[str | None, tuple[str, ...]]] = []
    released = Metrics.released

    def spying(self: Metrics, *, supervisor: bool = False) -> Any:
        count = released(self, supervisor=supervisor)

        def spy(t: Any) -> None:
            seen.append((t.locked_by, tuple(str(e) for e in t.events)))
            count(t)
        return spy if not supervisor else count

    monkeypatch.setattr(Metrics, "released", spying)
    app = make_app(db_url)
    app.workflow("chain", [Step(name, "inventory", timeout=600.0)
                           for name in ("one", "two", "three")])
    app.start(metrics=True, concurrency=8)
    try:
        chain = app.submit("chain", None)
        assert app.wait(chain, timeout=HANG_GUARD).state is TaskState.PROCESSED
        # three steps, one retried inside its agent (not a step retry): one transition
        # lets the task go, its end
        assert [locked for locked, _ in seen] == [None]
        probe = app.submit("probe", None)
        assert app.wait(probe, timeout=HANG_GUARD).state is TaskState.ERROR
        assert len(seen) == 3 and all(locked is None for locked, _ in seen)
        assert value(app.metrics, "sasflow_step_retries_total", workflow="probe") == 1
    finally:
        app.stop()


def test_metrics_are_off_unless_asked_for(app: App) -> None:
    app.start(concurrency=8)
    assert app.wait(app.submit("order", None), timeout=HANG_GUARD).state is TaskState.ERROR
    # the agent counts before it replies: had it counted, it would show by now
    assert value(app.metrics, "sasflow_step_duration_seconds_count", agent="payments",
                 outcome="permanent") is None
    families = {m.name: m for m in app.metrics.registry.collect()}
    assert families["sasflow_step_duration_seconds"].samples == []
    assert families["sasflow_breaker_state"].samples == []


# ---------------------------------------------------------------- the supervisor
class Clock:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


ORDER = Workflow.declare("order", [Step("reserve", "inventory", 5.0)], agents=["inventory"],
                         max_failures=2, on_failure="error", retry_backoff=0.5)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(str(tmp_path / "store.db"), clock=Clock())
    yield opened
    await opened.close()


async def test_a_supervisors_recoveries_and_escalations_after_expiries(
        store: SQLiteStore) -> None:
    """Three steps held by a worker that went silent expire: each is released (a
    recovery, a retry); claimed again and expired again, the workflow's two failures
    are spent and each task moves to error (an escalation and its alert)."""
    for n in range(3):
        await store.submit(NewTask(task_id=f"t{n}", workflow="order", input_json=b"{}",
                                   steps=[("reserve", "inventory",
                                           idempotency_key(f"t{n}", "reserve"))]))
    metrics = Metrics()
    worker = Worker(store=store, transport=MemoryTransport(), workflows={"order": ORDER},
                    agents={}, settings=WorkerSettings(roles=["supervisor"], metrics=True),
                    metrics=metrics)
    assert worker.supervisor is not None and worker.metrics is metrics
    clock = store.clock
    assert isinstance(clock, Clock)
    plans = worker.supervisor.plans

    def counted(name: str) -> float | None:
        return value(metrics, name, workflow="order")

    assert len(await store.claim("gone", 10, plans)) == 3
    clock.now += 6  # past the complete-by
    assert await worker.supervisor.tick() == 3
    assert counted("sasflow_supervisor_recoveries_total") == 3
    assert counted("sasflow_step_retries_total") == 3
    assert counted("sasflow_supervisor_escalations_total") == 0

    clock.now += 1  # past the release's backoff
    assert len(await store.claim("gone", 10, plans)) == 3
    clock.now += 6
    assert await worker.supervisor.tick() == 3
    assert counted("sasflow_supervisor_escalations_total") == 3
    assert counted("sasflow_supervisor_recoveries_total") == 3
    assert value(metrics, "sasflow_alerts_total", kind="task") == 3
    ended = [await store.get(f"t{n}") for n in range(3)]
    assert {t.state if t else None for t in ended} == {TaskState.ERROR}

"""The metrics module (U5): its series, their names and labels, and what moves each.

Every hook is driven here as its actor drives it (the agent's handling of a
request, the planner's own transitions, a breaker, a transport's consumer), on
a registry of the test's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from prometheus_client import Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from sasflow.agent import AgentFunction, AgentRequest, AgentRuntime
from sasflow.breaker import CircuitBreaker
from sasflow.errors import ConfigurationError, PermanentError
from sasflow.messages import Request
from sasflow.metrics import OUTCOMES, STEP_BUCKETS, Metrics, store_exposition
from sasflow.model import Phase, StepRecord, StepState, Task, TaskState, idempotency_key
from sasflow.plan import Plan
from sasflow.resilience import RetryPolicy
from sasflow.store.records import Alert, Instance
from sasflow.transition import Transition, applied
from sasflow.transport.dead_letter import MalformedMessage
from sasflow.transport.memory import MemoryTransport
from sasflow.worker import WorkerSettings
from sasflow.workflow import Step, Workflow

NOW = 1_700_000_000.0
HANG_GUARD = 60.0  # only a hang fails on it
ORDER = Workflow.declare("order", [Step("reserve", "inventory", 5.0),
                                   Step("charge", "payments", 5.0)],
                         agents=["inventory", "payments"], max_failures=2, on_failure="error")
PLAN = Plan(ORDER, frozenset())

# name -> (type, labels) of every family the module defines
WORKER_FAMILIES = {
    "sasflow_step_duration_seconds": ("histogram", ("agent", "outcome")),
    "sasflow_agent_retries": ("counter", ("agent",)),
    "sasflow_step_retries": ("counter", ("workflow",)),
    "sasflow_supervisor_recoveries": ("counter", ("workflow",)),
    "sasflow_supervisor_escalations": ("counter", ("workflow",)),
    "sasflow_breaker_state": ("gauge", ("agent",)),
    "sasflow_breaker_trips": ("counter", ("agent",)),
    "sasflow_alerts": ("counter", ("kind",)),
    "sasflow_dead_letters": ("counter", ("queue",)),
}
STORE_FAMILIES = {
    "sasflow_tasks": ("gauge", ("state",)),
    "sasflow_worker_heartbeat_age_seconds": ("gauge", ("instance",)),
    "sasflow_worker_heartbeat_lease_seconds": ("gauge", ("instance",)),
    "sasflow_worker_live": ("gauge", ("instance",)),
}


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    """A sample's value now (None: no such series)."""
    return metrics.registry.get_sample_value(name, labels)


def new_task(task_id: str = "order-1") -> Task:
    return Task(task_id=task_id, workflow="order", input=None, state=TaskState.PENDING,
                steps=[StepRecord(name=s.name, agent=s.agent, state=StepState.PENDING,
                                  idempotency_key=idempotency_key(task_id, s.name))
                       for s in ORDER.steps])


# ---------------------------------------------------------------- the series
async def test_each_family_is_named_under_sasflow_with_its_help_and_labels() -> None:
    """Every family the module defines, each with a sample (so its labels show)."""
    metrics = Metrics()
    metrics.declare(workflows=["order"], queues=["sasflow.agent.payments"])
    metrics.agent("payments")
    async with metrics.running({"payments": CircuitBreaker("payments")}):
        worker = {m.name: m for m in metrics.registry.collect()}
    store = {m.name: m for m in text_string_to_metric_families(
        store_exposition({}, [Instance(instance_id="w1", host="h", pid=1, roles=[], agents=[],
                                       workflows={}, beat_at=NOW, lease=10.0)], NOW).decode())}
    for found, expected in ((worker, WORKER_FAMILIES), (store, STORE_FAMILIES)):
        assert set(found) == set(expected)
        for name, family in found.items():
            kind, labels = expected[name]
            assert family.type == kind, name
            assert len(family.documentation) > 20, name
            assert family.samples, name
            for sample in family.samples:
                assert set(sample.labels) - {"le"} == set(labels), (name, sample)


def test_two_metrics_count_apart_and_a_given_registry_is_used() -> None:
    """Each Metrics has a registry of its own: two apps in one process never mix."""
    one, two = Metrics(), Metrics()
    one.agent("payments").retried()
    assert value(one, "sasflow_agent_retries_total", agent="payments") == 1
    assert value(two, "sasflow_agent_retries_total", agent="payments") is None
    registry = CollectorRegistry()
    assert Metrics(registry).registry is registry


def test_declared_workflows_and_queues_and_both_alert_kinds_show_at_zero() -> None:
    """A series is there before its first event, so that increase() sees that event."""
    metrics = Metrics()
    metrics.declare(workflows=["order"], queues=["sasflow.agent.payments"])
    for name in ("sasflow_step_retries_total", "sasflow_supervisor_recoveries_total",
                 "sasflow_supervisor_escalations_total"):
        assert value(metrics, name, workflow="order") == 0, name
    assert value(metrics, "sasflow_dead_letters_total", queue="sasflow.agent.payments") == 0
    for kind in ("task", "incident"):
        assert value(metrics, "sasflow_alerts_total", kind=kind) == 0


# ---------------------------------------------------------------- the agent
def test_step_durations_are_exposed_as_the_librarys_own_histogram_would_be() -> None:
    """The durations are kept by hand (durations.py): fed the same observations,
    including ones on each bound, the text a scrape gives is the library Histogram's,
    bucket by bucket, sum and count (its `_created` series aside)."""
    observed = [0.0, 0.0004, 0.001, 0.0010001, 0.0025, 0.3, 1.0, 7.5, 600.0, 601.0, 1e6]
    metrics = Metrics()
    metrics.step_duration.series("payments", "deadline")  # bound, never observed: all 0
    payments = metrics.step_duration.series("payments", "ok")
    library = CollectorRegistry()
    histogram = Histogram("sasflow_step_duration_seconds",
                          metrics.step_duration.describe()[0].documentation,
                          ["agent", "outcome"], buckets=STEP_BUCKETS, registry=library)
    histogram.labels("payments", "deadline")
    for amount in observed:
        payments.observe(amount)
        histogram.labels("payments", "ok").observe(amount)

    def scraped(registry: CollectorRegistry) -> list[str]:
        return [line for line in generate_latest(registry).decode().splitlines()
                if line.startswith("sasflow_step_duration_seconds")
                and "_created" not in line]

    ours = scraped(metrics.registry)
    assert ours == scraped(library)
    assert 'sasflow_step_duration_seconds_bucket{agent="payments",le="0.001",outcome="ok"} 3.0' \
        in ours
    assert value(metrics, "sasflow_step_duration_seconds_count", agent="payments",
                 outcome="ok") == len(observed)


def test_an_agents_timing_lands_where_the_series_own_observation_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """AgentMetrics.took writes Series.observe out (a call less a step): fed the same
    durations, on and beside every bound, both give the same buckets and sum."""
    observed = [0.0, 0.0004, 0.001, 0.0010001, 0.0025, 0.3, 1.0, 7.5, 600.0, 601.0, 1e6,
                *STEP_BUCKETS]
    timed, reference = Metrics(), Metrics()
    agent = timed.agent("payments")
    series = reference.step_duration.series("payments", "ok")
    for amount in observed:
        # the clock reads `amount` when the request ends, having started at 0
        monkeypatch.setattr(time, "perf_counter", lambda amount=amount: amount)
        agent.took("ok", 0.0)
        series.observe(amount)
    monkeypatch.undo()

    def buckets(metrics: Metrics) -> list[tuple[str, float]]:
        return [(sample.labels.get("le", sample.name), sample.value)
                for family in text_string_to_metric_families(
                    generate_latest(metrics.registry).decode())
                if family.name == "sasflow_step_duration_seconds"
                for sample in family.samples
                if sample.labels.get("outcome") == "ok" and "_created" not in sample.name]

    assert buckets(timed) == buckets(reference)
    assert ("+Inf", float(len(observed))) in buckets(timed)


def runtime_request(*, within: float) -> Request:
    return Request(task_id="order-1", step="charge", phase=Phase.DO, agent="payments",
                   epoch=1, input=None, results={},
                   idempotency_key=idempotency_key("order-1", "charge"),
                   complete_by=time.time() + within, reply_to="sasflow.reply.test")


@pytest.fixture
async def transport() -> AsyncIterator[MemoryTransport]:
    transport = MemoryTransport()
    yield transport
    await transport.close()


async def test_the_agent_runtime_times_each_request_and_counts_its_retries(
        transport: MemoryTransport) -> None:
    """Through AgentRuntime.handle: a call that fails once is one retry and one `ok`
    request; a call that outlives the complete-by is a `deadline`."""
    metrics = Metrics()
    calls: list[int] = []
    stuck = asyncio.Event()

    async def charge(req: AgentRequest) -> dict[str, Any]:
        calls.append(req.attempt)
        if req.input == "hang":
            await stuck.wait()
        if req.attempt == 1:
            raise ConnectionError("reset by peer")
        return {"charged": True}

    declared = AgentFunction(name="payments", handler=charge,
                             retry=RetryPolicy(attempts=3, initial_wait=0.001, jitter=0.0))
    runtime = AgentRuntime(transport, [declared], metrics=metrics)
    await runtime.handle(declared, runtime_request(within=HANG_GUARD))
    assert calls == [1, 2]
    assert value(metrics, "sasflow_agent_retries_total", agent="payments") == 1
    assert value(metrics, "sasflow_step_duration_seconds_count", agent="payments",
                 outcome="ok") == 1
    hanging = runtime_request(within=0.2)
    hanging.input = "hang"
    await runtime.handle(declared, hanging)  # silent at its complete-by
    assert value(metrics, "sasflow_step_duration_seconds_count", agent="payments",
                 outcome="deadline") == 1
    assert value(metrics, "sasflow_step_duration_seconds_count", agent="payments",
                 outcome="transient") == 0


async def test_a_request_is_timed_by_how_it_ended(transport: MemoryTransport) -> None:
    """Each request's calls are timed once, by how they ended: a result (ok); a
    permanent refusal; a transient error once the tries ran out, a timeout the
    remote raised among them (transient); the complete-by passing, or the worker
    stopping, while a call runs (deadline)."""
    metrics = Metrics()
    running = asyncio.Event()

    async def charge(req: AgentRequest) -> str:
        match req.input:
            case "refused":
                raise PermanentError("card declined")
            case "down":
                raise ConnectionError("down")
            case "slow":
                raise TimeoutError("read timed out")
            case "hang":
                running.set()
                await asyncio.Event().wait()
        return "charged"

    declared = AgentFunction(name="payments", handler=charge,
                             retry=RetryPolicy(attempts=2, initial_wait=0.001, jitter=0.0))
    runtime = AgentRuntime(transport, [declared], metrics=metrics)

    async def handled(what: str, within: float = HANG_GUARD) -> None:
        sent = runtime_request(within=within)
        sent.input = what
        await runtime.handle(declared, sent)

    for what in ("ok", "refused", "down", "slow"):
        await handled(what)
    await handled("hang", within=0.2)  # silent at its complete-by
    running.clear()
    stopped = asyncio.create_task(handled("hang"))
    await running.wait()
    stopped.cancel()  # as a worker's stop does
    with pytest.raises(asyncio.CancelledError):
        await stopped
    counts = {outcome: value(metrics, "sasflow_step_duration_seconds_count",
                             agent="payments", outcome=outcome) for outcome in OUTCOMES}
    assert counts == {"ok": 1, "permanent": 1, "transient": 2, "deadline": 2}
    for outcome in OUTCOMES:
        took = value(metrics, "sasflow_step_duration_seconds_sum", agent="payments",
                     outcome=outcome)
        assert took is not None and took >= 0


# ---------------------------------------------------------------- transitions
def decide(task: Task, transition: Transition, hook: Callable[[Transition], None]) -> Task:
    """Hand `transition` to `hook` as an actor does once applied; the task after it."""
    hook(transition)
    return applied(task, transition)


def test_a_schedulers_transitions_count_its_released_attempts_and_alerts() -> None:
    """A step completed counts nothing; an agent that gave up, below the threshold, is a
    retry of the workflow; a permanent refusal, an alert."""
    metrics = Metrics()
    seen: list[Transition] = []
    hook = metrics.counting(seen.append)
    task = decide(new_task(), PLAN.claim(new_task(), "s1", NOW), hook)
    task = decide(task, PLAN.reply(task, "s1", True, {"r": 1}, None, NOW), hook)
    assert value(metrics, "sasflow_step_retries_total", workflow="order") is None
    task = decide(task, PLAN.reply(task, "s1", False, None, "gave up", NOW, permanent=False),
                  hook)
    assert (task.state, task.locked_by) == (TaskState.PENDING, None)
    assert value(metrics, "sasflow_step_retries_total", workflow="order") == 1
    task = decide(task, PLAN.claim(task, "s1", NOW + 1), hook)
    task = decide(task, PLAN.reply(task, "s1", False, None, "card declined", NOW + 1), hook)
    assert task.state is TaskState.ERROR
    assert value(metrics, "sasflow_alerts_total", kind="task") == 1
    assert value(metrics, "sasflow_step_retries_total", workflow="order") == 1
    # a scheduler escalates nothing: the supervisor's counters stay untouched
    assert value(metrics, "sasflow_supervisor_escalations_total", workflow="order") is None
    assert len(seen) == 5  # each transition handed on


def test_a_supervisors_transitions_count_recoveries_then_the_escalation() -> None:
    """An expiry below the threshold is released (a recovery and a retry); at the
    threshold the task moves to error (an escalation, with its alert)."""
    metrics = Metrics()
    seen: list[Transition] = []
    hook = metrics.counting(seen.append, supervisor=True)
    task = applied(new_task(), PLAN.claim(new_task(), "s1", NOW))
    task = decide(task, PLAN.expire(task, "sup", NOW + 6), hook)
    assert task.state is TaskState.PENDING
    assert value(metrics, "sasflow_supervisor_recoveries_total", workflow="order") == 1
    assert value(metrics, "sasflow_step_retries_total", workflow="order") == 1
    task = applied(task, PLAN.claim(task, "s1", NOW + 7))
    task = decide(task, PLAN.orphan(task, "sup", NOW + 8), hook)
    assert task.state is TaskState.ERROR
    assert value(metrics, "sasflow_supervisor_escalations_total", workflow="order") == 1
    assert value(metrics, "sasflow_supervisor_recoveries_total", workflow="order") == 1
    assert value(metrics, "sasflow_alerts_total", kind="task") == 1
    assert [t.task_id for t in seen] == ["order-1", "order-1"]


def test_a_supervisors_move_to_compensation_is_an_escalation() -> None:
    compensating = Workflow.declare("order", ORDER.steps, agents=["inventory", "payments"],
                                    max_failures=1, on_failure="compensate")
    plan = Plan(compensating, frozenset({"inventory"}))
    metrics = Metrics()
    hook = metrics.counting(lambda t: None, supervisor=True)
    task = applied(new_task(), plan.claim(new_task(), "s1", NOW))
    task = applied(task, plan.reply(task, "s1", True, {"r": 1}, None, NOW))
    task = decide(task, plan.expire(task, "sup", NOW + 6), hook)
    assert task.state is TaskState.COMPENSATING
    assert value(metrics, "sasflow_supervisor_escalations_total", workflow="order") == 1
    assert value(metrics, "sasflow_alerts_total", kind="task") == 0


def test_an_incidents_alert_is_counted_as_such_and_handed_on() -> None:
    metrics = Metrics()
    heard: list[Alert] = []
    hook = metrics.alerting(heard.append)
    hook(Alert(id=0, task_id=None, at=NOW, message="no worker", incident="agent:payments"))
    assert value(metrics, "sasflow_alerts_total", kind="incident") == 1
    assert value(metrics, "sasflow_alerts_total", kind="task") == 0
    assert len(heard) == 1


# ---------------------------------------------------------------- breakers, dead letters
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_breakers_are_read_when_scraped_while_their_roles_run() -> None:
    """0 closed, 2 open, 1 half-open once its reset timeout passed; each opening a trip;
    gone once the roles stopped."""
    metrics, clock = Metrics(), Clock()
    breaker = CircuitBreaker("payments", failure_threshold=2, reset_timeout=5.0, clock=clock)

    def state() -> tuple[float | None, float | None]:
        return (value(metrics, "sasflow_breaker_state", agent="payments"),
                value(metrics, "sasflow_breaker_trips_total", agent="payments"))

    async with metrics.running({"payments": breaker}):
        assert state() == (0, 0)
        for _ in range(2):
            breaker.before_call()
            breaker.failed()
        assert state() == (2, 1)
        clock.now += 5.0
        assert state() == (1, 1)
        breaker.before_call()  # the probe
        breaker.failed()
        assert state() == (2, 2)
        clock.now += 5.0
        breaker.before_call()
        breaker.succeeded()
        assert state() == (0, 2)
    assert state() == (None, None)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(HANG_GUARD):
        while not condition():
            await asyncio.sleep(0.001)


async def test_dead_letters_of_consumers_started_while_running_are_counted_by_queue(
        transport: MemoryTransport) -> None:
    metrics = Metrics()

    async def refuse(body: bytes) -> None:
        raise MalformedMessage(f"not a request: {body!r}")

    async with metrics.running({}):
        counted = asyncio.create_task(transport.consume("sasflow.agent.a", refuse, prefetch=1))
    elsewhere = asyncio.create_task(transport.consume("sasflow.agent.b", refuse, prefetch=1))
    try:
        await transport.publish("sasflow.agent.a", b"garbage")
        await until(lambda: value(metrics, "sasflow_dead_letters_total",
                                  queue="sasflow.agent.a") == 1)
        # a consumer started outside counts nothing: its letter is kept, not counted
        await transport.publish("sasflow.agent.b", b"garbage")
        async with asyncio.timeout(HANG_GUARD):
            while len(await transport.dead_letters()) < 2:
                await asyncio.sleep(0.001)
        assert value(metrics, "sasflow_dead_letters_total", queue="sasflow.agent.b") is None
    finally:
        for consumer in (counted, elsewhere):
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer


# ---------------------------------------------------------------- serving
async def test_running_with_a_port_serves_the_registry_over_http() -> None:
    metrics = Metrics()
    metrics.agent("payments").retried()
    async with metrics.running({}, port=0) as url:
        assert url is not None and url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient() as client:
            page = await client.get(url)
    assert page.status_code == 200
    assert 'sasflow_agent_retries_total{agent="payments"} 1.0' in page.text
    async with metrics.running({}) as url:
        assert url is None  # no port: counted, not served


async def test_a_port_taken_is_one_configuration_error_before_anything_runs() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            async with Metrics().running({}, port=port):
                pytest.fail("ran without its metrics")


def test_a_metrics_port_turns_metrics_on_and_is_checked() -> None:
    assert not WorkerSettings().metered
    assert WorkerSettings(metrics=True).metered
    assert WorkerSettings(metrics_port=0).metered
    with pytest.raises(ConfigurationError, match="metrics port must be 0-65535"):
        WorkerSettings(metrics_port=70000).check()


# ---------------------------------------------------------------- the store's state
def test_the_stores_state_names_every_state_and_each_running_instances_heartbeat() -> None:
    def instance(name: str, beat_at: float, stopped_at: float | None = None) -> Instance:
        return Instance(instance_id=name, host="h", pid=1, roles=["scheduler"], agents=[],
                        workflows={}, beat_at=beat_at, lease=10.0, stopped_at=stopped_at)

    text = store_exposition({"processed": 5, "error": 1},
                            [instance("w-live", NOW - 3), instance("w-gone", NOW - 30),
                             instance("w-stopped", NOW - 1, stopped_at=NOW - 1)], NOW).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    tasks = {dict(labels)["state"]: v for (name, labels), v in samples.items()
             if name == "sasflow_tasks"}
    assert tasks == {s.value: {"processed": 5, "error": 1}.get(s.value, 0) for s in TaskState}
    by_instance = {(name, dict(labels)["instance"]): v for (name, labels), v in samples.items()
                   if name.startswith("sasflow_worker_")}
    assert by_instance == {
        ("sasflow_worker_heartbeat_age_seconds", "w-live"): 3.0,
        ("sasflow_worker_heartbeat_lease_seconds", "w-live"): 10.0,
        ("sasflow_worker_live", "w-live"): 1.0,
        ("sasflow_worker_heartbeat_age_seconds", "w-gone"): 30.0,
        ("sasflow_worker_heartbeat_lease_seconds", "w-gone"): 10.0,
        ("sasflow_worker_live", "w-gone"): 0.0}

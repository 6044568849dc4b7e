"""Prometheus metrics (U5): what a worker's roles count, and the store's state.

Two sources, served from two places.

**A worker process** counts what its own roles do, on the registry of a
`Metrics` (an App has its own, `app.metrics`: two apps, or two tests, in one
process never add to each other's series). It counts only while its roles run
with metrics on (`metrics=True`, or a `metrics_port`, which also serves them:
`sasflow worker --metrics-port`)::

    sasflow_step_duration_seconds{agent,outcome}  histogram: an agent's handling of one
        request, its retries included; outcome ok, transient (it gave up), permanent
        (refused), deadline (the complete-by passed, or the worker stopped)
    sasflow_agent_retries_total{agent}            calls made again within one request
    sasflow_step_retries_total{workflow}          failed attempts released to run again,
        by a scheduler (the agent gave up) or the supervisor
    sasflow_supervisor_recoveries_total{workflow}   units the supervisor released: past
        their complete-by, or held by a gone instance
    sasflow_supervisor_escalations_total{workflow}  tasks it moved to error or to
        compensation, their failures exhausted
    sasflow_breaker_state{agent}                  0 closed, 1 half-open, 2 open
    sasflow_breaker_trips_total{agent}            times the breaker opened
    sasflow_alerts_total{kind}                    task (a task moved to error), incident
    sasflow_dead_letters_total{queue}             messages dead-lettered by its consumers

What a step costs: one observation in the agent (durations.py: a bisect and two
additions). A transition that lets its task go (a retry, an end, an escalation)
is counted (`_Released`); the scheduler calls that only for those, so a step's
usual transition, which locks the next unit, costs the metrics nothing. The
durations and the breakers are made into samples only when scraped.

**The store's state** is no worker's to report (each would report the same
counts): `sasflow serve` reads it when scraped (`store_exposition`, at
/api/v1/metrics), kept for a couple of seconds as its counts are::

    sasflow_tasks{state}                          tasks in each state, every state named
    sasflow_worker_heartbeat_age_seconds{instance}    since a running worker instance's
        last heartbeat, on the store's clock
    sasflow_worker_heartbeat_lease_seconds{instance}  its lease: older, it counts as gone
    sasflow_worker_live{instance}                 1 while its heartbeat is within its lease

A stopped instance is not reported: it said it stopped, and holds nothing.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sasflow.breaker import BreakerState, CircuitBreaker
from sasflow.durations import Durations
from sasflow.errors import ConfigurationError
from sasflow.model import TaskState
from sasflow.store.records import Alert, Instance
from sasflow.transition import Transition
from sasflow.transport.dead_letter import DeadLetter, on_dead_letter

__all__ = ["CONTENT_TYPE", "OUTCOMES", "AgentMetrics", "Metrics", "store_exposition"]

log = logging.getLogger("sasflow.metrics")


CONTENT_TYPE = CONTENT_TYPE_LATEST  # the text format, what /metrics answers with
OUTCOMES = ("ok", "transient", "permanent", "deadline")
# from a no-op call to the longest step timeouts seen in practice (seconds)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_BREAKER_LEVELS = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


class Metrics:
    """The series a worker's roles count, on `registry` (default: a new one of their own).

    The actors are handed what they need of it: the agent runtime `agent(name)`,
    the scheduler and supervisor a `counting` callback, the supervisor's incidents
    an `alerting` one; `running` is entered around the roles.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.step_duration = Durations(
            "sasflow_step_duration_seconds",
            "How long an agent took over one request, its retries included, by outcome: ok,"
            " transient (it gave up), permanent (refused), deadline (the complete-by passed).",
            ("agent", "outcome"), STEP_BUCKETS)
        r.register(self.step_duration)
        self.agent_retries = Counter(
            "sasflow_agent_retries", "Calls an agent made again within one request.",
            ["agent"], registry=r)
        self.step_retries = Counter(
            "sasflow_step_retries",
            "Failed attempts at a step released to run again (the agent gave up, the"
            " complete-by passed, or its holder was gone).", ["workflow"], registry=r)
        self.recoveries = Counter(
            "sasflow_supervisor_recoveries",
            "Units the supervisor released: past their complete-by, or held by a gone"
            " instance.", ["workflow"], registry=r)
        self.escalations = Counter(
            "sasflow_supervisor_escalations",
            "Tasks the supervisor moved to error or to compensation, their failures"
            " exhausted.", ["workflow"], registry=r)
        self.alerts = Counter(
            "sasflow_alerts", "Operator alerts raised: task (a task moved to error) or"
            " incident (work no live worker declares).", ["kind"], registry=r)
        self.dead_letters = Counter(
            "sasflow_dead_letters", "Messages taken off their queue because no consumer"
            " could handle them.", ["queue"], registry=r)
        self._breakers = _Breakers()
        r.register(self._breakers)
        # both kinds at 0 from the start: an increase is seen from the first alert on
        self._task_alerts = self.alerts.labels("task")
        self._incident_alerts = self.alerts.labels("incident")

    def declare(self, *, workflows: Iterable[str] = (), queues: Iterable[str] = ()) -> None:
        """Show the series of these workflows and queues at 0 before anything happens:
        Prometheus' increase() and rate() miss the first event of a series that
        appears with it."""
        for workflow in workflows:
            for family in (self.step_retries, self.recoveries, self.escalations):
                family.labels(workflow)
        for queue in queues:
            self.dead_letters.labels(queue)

    def agent(self, name: str) -> AgentMetrics:
        """The agent's series, bound once."""
        return AgentMetrics(self, name)

    def counting(self, then: Callable[[Transition], None], *,
                 supervisor: bool = False) -> Callable[[Transition], None]:
        """`then`, after counting what a transition a scheduler (or, `supervisor`, the
        supervisor) applied tells: a retry, a recovery, an escalation, an alert."""
        released = self.released(supervisor=supervisor)

        def count(t: Transition) -> None:
            if t.locked_by is None:
                released(t)
            then(t)
        return count

    def released(self, *, supervisor: bool = False) -> Callable[[Transition], None]:
        """What a transition that let its task go (its locked_by is None) tells, counted:
        the scheduler's `on_released`."""
        return _Released(self, supervisor=supervisor)

    def alerting(self, then: Callable[[Alert], None]) -> Callable[[Alert], None]:
        """`then`, after counting the alert (the supervisor's incidents come this way)."""
        def count(alert: Alert) -> None:
            (self._task_alerts if alert.incident is None else self._incident_alerts).inc()
            then(alert)
        return count

    @contextlib.asynccontextmanager
    async def running(self, breakers: Mapping[str, CircuitBreaker], *,
                      host: str = "127.0.0.1", port: int | None = None
                      ) -> AsyncIterator[str | None]:
        """While inside: `breakers` are read at each scrape, each dead letter made in this
        context (by the consumers its roles start) is counted, and, given a `port`, the
        registry is served over HTTP on it (0: a free one). Gives the metrics' URL (None
        without a port), and logs it."""
        server = self._serve(host, port) if port is not None else None
        token = on_dead_letter.set(self._dead_lettered)
        self._breakers.watch(breakers)
        try:
            yield None if server is None else _url(host, server)
        finally:
            self._breakers.unwatch(breakers)
            on_dead_letter.reset(token)
            if server is not None:
                # shutdown() waits for the server's loop to notice (up to half a second)
                await asyncio.to_thread(_shut, server)

    def _serve(self, host: str, port: int) -> WSGIServer:
        try:
            server, _thread = start_http_server(port, host, self.registry)
        except OSError as error:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {error.strerror or error}") from None
        log.info("serving metrics on %s", _url(host, server))
        return server

    def _dead_lettered(self, letter: DeadLetter) -> None:
        self.dead_letters.labels(letter.queue).inc()


def _url(host: str, server: WSGIServer) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{server.server_address[1]}/metrics"


def _shut(server: WSGIServer) -> None:
    server.shutdown()
    server.server_close()


class AgentMetrics:
    """One agent's series, bound once: a request then costs one observation, no label
    lookup. Observed from the loop its roles run on."""

    __slots__ = ("_series", "retried")

    def __init__(self, metrics: Metrics, agent: str) -> None:
        self._series = {outcome: metrics.step_duration.series(agent, outcome)
                        for outcome in OUTCOMES}
        self.retried: Callable[[], None] = metrics.agent_retries.labels(agent).inc

    def took(self, outcome: str, started: float) -> None:
        """A request's calls (retries included), begun at `started` (time.perf_counter),
        ended by `outcome`: ok, transient, permanent or deadline (the complete-by
        passed, or the worker stopped)."""
        amount, series = time.perf_counter() - started, self._series[outcome]
        # Series.observe, written out: it runs at every step, and this saves a call
        series.counts[bisect.bisect_left(series.bounds, amount)] += 1
        series.total += amount


class _Released:
    """What a transition that let its task go tells, counted.

    The planner (plan/forward.py) leaves the sign of each decision on the
    transition: a failed attempt below the workflow's threshold (or parked) is
    released, unlocked and without events; reaching the threshold records
    `error` or `compensating` (and, nothing to undo, `compensated`) in its
    events. A scheduler's own transitions are otherwise locked (the next unit) or
    carry events (processed, compensated).
    """

    __slots__ = ("_escalations", "_recoveries", "_retries", "_supervisor", "_task_alerts")

    def __init__(self, metrics: Metrics, *, supervisor: bool) -> None:
        self._supervisor = supervisor
        self._retries, self._recoveries = metrics.step_retries, metrics.recoveries
        self._escalations, self._task_alerts = metrics.escalations, metrics._task_alerts

    def __call__(self, t: Transition) -> None:
        if not t.events:  # released to run again
            self._retries.labels(t.workflow).inc()
            if self._supervisor:
                self._recoveries.labels(t.workflow).inc()
        elif self._supervisor:
            self._escalations.labels(t.workflow).inc()
        if t.alert is not None:
            self._task_alerts.inc()


class _Breakers:
    """The circuit breakers of the agents served here, read when scraped (a breaker's
    half-open state is a matter of the time it is read at)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # scrapes come from the HTTP server's thread
        self._watched: list[Mapping[str, CircuitBreaker]] = []

    def watch(self, breakers: Mapping[str, CircuitBreaker]) -> None:
        with self._lock:
            self._watched.append(breakers)

    def unwatch(self, breakers: Mapping[str, CircuitBreaker]) -> None:
        with self._lock:  # this very mapping: another worker's may be equal to it
            self._watched = [b for b in self._watched if b is not breakers]

    def describe(self) -> list[Metric]:
        return list(self._families({}))

    def collect(self) -> list[Metric]:
        with self._lock:
            watched = list(self._watched)
        # two workers of one app serving the same agent: one series, the worst state
        merged: dict[str, tuple[int, int]] = {}
        for breakers in watched:
            for name, breaker in breakers.items():
                level, trips = merged.get(name, (0, 0))
                merged[name] = (max(level, _BREAKER_LEVELS[breaker.state]), trips + breaker.trips)
        return list(self._families(merged))

    @staticmethod
    def _families(merged: Mapping[str, tuple[int, int]]) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "sasflow_breaker_state", "An agent's circuit breaker: 0 closed, 1 half-open,"
            " 2 open (its calls fail fast).", labels=["agent"])
        trips = CounterMetricFamily(
            "sasflow_breaker_trips", "Times an agent's circuit breaker opened.",
            labels=["agent"])
        for name, (level, count) in sorted(merged.items()):
            state.add_metric([name], level)
            trips.add_metric([name], count)
        yield state
        yield trips


def store_exposition(counts: Mapping[str, int], instances: Iterable[Instance],
                     now: float) -> bytes:
    """The store's state in Prometheus' text format: `counts` of tasks by state (by
    state name), and the heartbeats of the `instances` that have not stopped, as of
    `now` on the store's clock."""
    return generate_latest(_StoreState(counts, list(instances), now))


class _StoreState:
    """A collector of one read of the store (generate_latest takes any collector)."""

    def __init__(self, counts: Mapping[str, int], instances: list[Instance],
                 now: float) -> None:
        self.counts, self.instances, self.now = counts, instances, now

    def collect(self) -> Iterator[Metric]:
        tasks = GaugeMetricFamily("sasflow_tasks", "Tasks in each state, in the whole store.",
                                  labels=["state"])
        for state in TaskState:
            tasks.add_metric([state.value], self.counts.get(state.value, 0))
        yield tasks
        age = GaugeMetricFamily(
            "sasflow_worker_heartbeat_age_seconds", "Seconds since a running worker"
            " instance's last heartbeat, on the store's clock.", labels=["instance"])
        lease = GaugeMetricFamily(
            "sasflow_worker_heartbeat_lease_seconds", "A worker instance's lease: without a"
            " heartbeat for longer, it counts as gone and its tasks are released.",
            labels=["instance"])
        live = GaugeMetricFamily(
            "sasflow_worker_live", "1 while a worker instance's last heartbeat is within its"
            " lease, else 0.", labels=["instance"])
        for instance in self.instances:
            if instance.stopped_at is not None:
                continue
            since = max(0.0, self.now - instance.beat_at)
            age.add_metric([instance.instance_id], since)
            lease.add_metric([instance.instance_id], instance.lease)
            live.add_metric([instance.instance_id], float(since <= instance.lease))
        yield age
        yield lease
        yield live

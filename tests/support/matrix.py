"""The fault matrix's common run: orders through real workers, a fault, then the invariants.

Each row (test_matrix_*.py, listed in docs/reliability.md) starts a Cluster of
``sasflow worker`` processes on a store and a transport, submits orders
(scenarioapp.py) that call the flaky remote service, does its fault to the
workers or the servers, lets the cluster recover, and ends with `conclude`:
every invariant of invariants.py, plus no hot loop once the run is over.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from scenarioapp import STEP_TIMEOUT, WORKFLOW, build_app, order_input

from sasflow.examples.orders.remote import RemoteService
from support.invariants import (
    TERMINAL,
    Outcome,
    ProcessMeter,
    check,
    check_alerts,
    post_mortem,
    stale_writes,
)
from support.scenario import Broker, Cluster, Postgres, Worker

__all__ = ["BACKENDS", "LINGER_S", "LONG", "POSTGRES_BACKENDS", "RECOVERY", "Backend", "Run",
           "backends", "lingering", "open_run", "started", "wait_started"]

# a task's step expires STEP_TIMEOUT after it started, and the supervisor acts on it at
# once; the rest is room for a loaded 2-core machine (a hang guard, not a bound)
RECOVERY = STEP_TIMEOUT + 60.0
# A row whose fault must find the workers holding orders submits orders whose every
# operation holds its task this long after the remote applied it (scenarioapp.py):
# on a fast machine plain orders ended between two looks at what was held, and the
# fault found nothing to hit. Well under a step's complete-by.
LINGER_S = 0.25
# an idle cluster: no process may take more of a core than this, nor log more lines
IDLE_CORE = 0.25
IDLE_LINES = 40


@dataclass
class Backend:
    """One column of the fault matrix: a store and a transport."""

    name: str  # sqlite | postgres-memory | postgres-rabbitmq | postgres-redis
    store_url: str
    postgres: Postgres | None  # the private PostgreSQL, when the store is on it
    broker: Broker | None  # None: the in-process transport (a scheduler runs its agents)


BACKENDS = ["sqlite", "postgres-memory", "postgres-rabbitmq", "postgres-redis"]
POSTGRES_BACKENDS = BACKENDS[1:]
# the variants CI leaves out (each row runs in CI on a sample of its backends); all run with
# SASFLOW_LONG=1 (tests/scenario/conftest.py)
LONG = pytest.mark.long


def lingering(n: int) -> dict[str, Any]:
    """Order n (scenarioapp.order_input), its steps lingering: there are tasks to hold."""
    return {**order_input(n), "linger_s": LINGER_S}


def backends(*in_ci: str, among: Iterable[str] = BACKENDS) -> list[Any]:
    """Parameters for the `backend` fixture: `among`, those not `in_ci` marked long."""
    return [name if name in in_ci else pytest.param(name, marks=LONG) for name in among]


class Run:
    """One row's world: a submitter App and the cluster of workers."""

    def __init__(self, root: Path, store_url: str, transport: Broker | None,
                 remote: RemoteService) -> None:
        self.store_url = store_url
        self.transport = transport
        self.remote = remote
        self.submitter = build_app()
        self.submitter.configure(store=store_url)
        self.cluster = Cluster(root, store_url, transport.transport_url if transport else
                               "memory", remote.url)
        self.submitted = 0

    def submit(self, count: int,
               inputs: Callable[[int], dict[str, Any]] = order_input) -> None:
        """Submit the next `count` orders: order-N with input ``inputs(N)``."""
        for _ in range(count):
            self.submitted += 1
            self.submitter.submit(WORKFLOW, inputs(self.submitted),
                                  task_id=f"order-{self.submitted}")

    def held_by(self, worker: Worker) -> set[str]:
        rows = self.cluster.db.must("SELECT task_id FROM tasks WHERE locked_by = %s",
                                    (worker.name,))
        return {r[0] for r in rows}

    def expired_since(self, tasks: Iterable[str], since: float) -> bool:
        """Whether each of `tasks` was recovered by a supervisor after `since`, or ended."""
        wanted = set(tasks)
        rows = self.cluster.db.must(
            "SELECT DISTINCT task_id FROM history_entries WHERE step IS NULL AND at > %s"
            " AND (why LIKE %s OR to_state IN ('processed', 'compensated', 'error'))",
            (since, "%expired%"))
        return wanted <= {r[0] for r in rows}

    def all_terminal(self) -> bool:
        counts = self.cluster.states()
        return counts is not None and sum(counts[s] for s in TERMINAL) == self.submitted

    def wait_all_terminal(self, timeout: float = RECOVERY + 60) -> None:
        self.cluster.wait_for(f"all {self.submitted} orders terminal", self.all_terminal,
                              timeout=timeout, poll=0.2)

    def stop(self, worker: Worker) -> None:
        """SIGTERM and wait for a clean exit: whatever it still had to write is written."""
        worker.popen.send_signal(signal.SIGTERM)
        code = worker.popen.wait(timeout=60)
        worker.killed = True  # on purpose
        assert code == 0, worker.tail()

    def conclude(self, *, fenced: dict[str, float] | None = None,
                 quiet: Iterable[Worker] = (),
                 inputs: Callable[[int], dict[str, Any]] = order_input,
                 alerts: Iterable[str] | None = None) -> Outcome:
        """Every invariant; `fenced` maps a worker that came back from a fault to when the
        fault began (it may write only what it claimed again since); `quiet` are the
        workers whose idle CPU and log volume are measured once every order is terminal."""
        cluster = self.cluster
        meter = ProcessMeter(quiet)
        meter.begin()
        # the span: the supervisor leader renewing its lease twice over (a positive signal
        # that time passed for the whole cluster, whatever the machine's load)
        lease = cluster.wait_for("a supervisor lease", cluster.lease, timeout=120)
        cluster.wait_for("the lease renewed past two seconds from now",
                         lambda: (found := cluster.lease()) is not None
                         and found[2] > lease[2] + 2.0, timeout=60)
        outcome = check(cluster, self.remote, self.submitted, inputs=inputs)
        problems = outcome.problems
        problems += meter.problems(max_core=IDLE_CORE, max_lines=IDLE_LINES)
        errors = {t for t, s in outcome.states.items() if s == "error"}
        problems += check_alerts(cluster, errors if alerts is None else alerts)
        for name, since in (fenced or {}).items():
            problems += stale_writes(cluster, name, since)
        for worker in cluster.died_on_their_own():
            problems.append(f"{worker.name} exited on its own: {worker.popen.returncode}")
        states: dict[str, int] = {}
        for state in outcome.states.values():
            states[state] = states.get(state, 0) + 1
        print(f"{self.submitted} orders: {states}; remote {self.remote.stats()['effects']}"
              f" effects, {self.remote.stats()['deduplicated']} deduplicated;"
              f" {len(outcome.expiries)} expiries recovered")
        assert not problems, "\n".join(["the invariants do not hold:", *problems[:60],
                                        post_mortem(cluster, outcome),
                                        cluster.diagnostics(40, stacks=False)])
        return outcome

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            self.submitter.close()


@contextmanager
def open_run(root: Path, store_url: str, transport: Broker | None,
             remote: RemoteService) -> Iterator[Run]:
    """A Run on this store and transport (None: in-process), closed afterwards."""
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    run = Run(logs, store_url, transport, remote)
    try:
        yield run
    finally:
        run.close()


def started(worker: Worker) -> bool:
    """The worker logged its start line (its roles start now)."""
    try:
        return f"worker {worker.name} starting" in worker.log.read_text(errors="replace")
    except FileNotFoundError:
        return False


def wait_started(cluster: Cluster, workers: Iterable[Worker]) -> None:
    for worker in workers:
        cluster.wait_for(f"{worker.name} to start", partial(started, worker), timeout=60)


"""Scenario: every kind of process SIGKILLed and both servers restarted mid-run (SPEC M1-M4).

Real ``sasflow worker`` processes over a private PostgreSQL store and a private
broker, calling the flaky remote service over HTTP: three schedulers, two
processes per agent, two supervisors. Orders keep arriving (BACKLOG of them
unfinished at any time) while, three seconds apart at the least, one scheduler
(the busiest), one agent process and one supervisor (the leader) are
SIGKILLed, the broker is crashed (SIGKILL) and started again, then PostgreSQL is
stopped and started again: crashed (``pg_ctl stop -m immediate``) with RabbitMQ
and volatile Redis, shut down cleanly (``-m fast``) with Redis. Once every task
is terminal, every worker is stopped (SIGTERM, each must exit 0) and the remote
has answered every request it received, so nothing can change any more; then:

* no task is lost, none is left unfinished;
* no unit of work was committed twice (by two owners, or twice by one);
* the remote applied each effect once: no effect twice for one order, and
  every effect it applied is the recorded result of exactly one unit of the
  store, under that unit's idempotency key;
* every compensated task had each completed step undone exactly once, in
  reverse order; a declined order was undone, a processed one never was.

A loaded machine misses step deadlines, and every expiry counts against the
task's one retry budget (MAX_FAILURES, SPEC S8/E9). A task that used it up ends
as the policy says: its step given up in doubt and compensated, and its
compensation, out of budget too, in error at its first expiry. Such a task
must end compensated or in error, never processed, with the same
effect checks as every task; only the exact effects of a declined or refused
order are not required of it.

The broker is RabbitMQ, Redis with an fsynced append-only file (a restart loses
nothing acknowledged), or Redis without persistence (a restart loses every
queued request and reply: only the supervisors' step expiry recovers them).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from scenarioapp import WORKFLOW, build_app, order_input

from sasflow import App
from sasflow.errors import StoreError
from sasflow.examples.orders.remote import RemoteService
from support.invariants import TERMINAL, Outcome, check, post_mortem
from support.scenario import Broker, Cluster, Postgres

pytestmark = pytest.mark.chaos

BACKLOG = 150  # tasks kept submitted and unfinished while the cluster is hit
MAX_TASKS = 2000  # submissions stop here whatever happens
GAP = 3.0  # seconds between two events at the least: each hits a cluster still recovering
DRAIN_AFTER = 4.0  # seconds of submissions after the last event
DEADLINE = 150.0  # for every task to be terminal, from the first submission
STOP_WITHIN = 60.0  # hang guard: a worker stopping cleanly, the remote's last reply
# how PostgreSQL goes down: a crash (no shutdown checkpoint, in-flight commits in
# doubt, WAL replayed at start) or a clean fast shutdown (sessions terminated)
PG_CRASH = {"rabbitmq": True, "redis": False, "redis-volatile": True}
AGENTS = ("inventory", "payments", "shipping")


@dataclass
class Event:
    """Something done to the cluster `at` s after the first task finished, GAP s after the
    event before it at the least."""

    at: float
    what: str
    action: Callable[[], str]
    done_at: float | None = None  # seconds into the run, once done
    wall: float = 0.0  # time.time() when it began
    terminal: int = 0  # tasks terminal then
    open: int = 0  # tasks submitted and not terminal then
    locked: int = 0  # tasks held by a scheduler then
    note: str = ""


@pytest.mark.timeout(280)
def test_scenario_postgres_survives_kills_and_server_restarts(
        postgres: Postgres, broker: Broker, remote: RemoteService, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    submitter = build_app()
    submitter.configure(store=postgres.url)
    cluster = Cluster(logs, postgres.url, broker.transport_url, remote.url)
    try:
        run(cluster, submitter, postgres, broker, remote)
    finally:
        cluster.close()
        submitter.close()


def submit(app: App, n: int) -> None:
    """Submit order n; on a store error (PostgreSQL restarting), again: same id, no-op."""
    deadline = time.monotonic() + 30
    while True:
        try:
            app.submit(WORKFLOW, order_input(n), task_id=f"order-{n}")
            return
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run(cluster: Cluster, submitter: App, postgres: Postgres, broker: Broker,
        remote: RemoteService) -> None:
    started = time.monotonic()
    submitted = 0
    while submitted < BACKLOG:  # the first also creates the schema, before any worker
        submitted += 1
        submit(submitter, submitted)
    for n in (1, 2, 3):
        cluster.spawn(f"scheduler-{n}", "scheduler")
    for agent in AGENTS:
        for n in (1, 2):
            cluster.spawn(f"{agent}-{n}", "agent", [agent])
    for n in (1, 2):
        cluster.spawn(f"supervisor-{n}", "supervisor")

    def kill_busiest_scheduler() -> str:
        live = [w for w in cluster.workers if w.roles == "scheduler" and w.alive]
        held = cluster.locked_by()
        victim = max(live, key=lambda w: held[w.name])
        victim.kill()
        return f"{victim.name} (pid {victim.pid}) held {held[victim.name]} tasks"

    def kill_agent() -> str:
        victim = cluster.worker("payments-1")
        victim.kill()
        return f"{victim.name} (pid {victim.pid})"

    def kill_leader() -> str:
        leader = cluster.wait_for("a supervisor to hold the lease", cluster.leader, timeout=120)
        victim = cluster.worker(leader)
        victim.kill()
        return f"the leader, {victim.name} (pid {victim.pid})"

    def restart_broker() -> str:
        data = "its queues kept" if broker.keeps_data else "its queues lost"
        return f"down for {broker.restart():.1f}s (SIGKILL, then started again, {data})"

    crash = PG_CRASH[broker.kind]

    def restart_postgres() -> str:
        how = "pg_ctl stop -m immediate: a crash" if crash else "pg_ctl stop -m fast"
        return f"down for {postgres.server.restart(crash=crash):.1f}s ({how}, then started again)"

    # seconds after the first task finished (every role is up by then); apart, so that
    # each hits a run still recovering from the one before
    events = [Event(2.0, "SIGKILL a scheduler", kill_busiest_scheduler),
              Event(5.0, "SIGKILL an agent process", kill_agent),
              Event(8.0, "SIGKILL a supervisor", kill_leader),
              Event(11.0, f"restart {broker.kind}", restart_broker),
              Event(16.0, "restart postgres", restart_postgres)]

    first_done: float | None = None
    last: Counter[str] = Counter()
    while True:
        counts = cluster.states()
        if counts is not None:
            last = counts
        terminal = sum(last[s] for s in TERMINAL)
        now = time.monotonic()
        if first_done is None and terminal:
            first_done = now
        # keep BACKLOG tasks unfinished until DRAIN_AFTER s after the last event
        drained = events[-1].done_at is not None and \
            now - started > events[-1].done_at + DRAIN_AFTER
        while not drained and submitted < MAX_TASKS and submitted - terminal < BACKLOG:
            submitted += 1
            submit(submitter, submitted)
        previous = 0.0
        for event in events:
            if event.done_at is None:
                if first_done is not None and now - first_done >= event.at \
                        and now - started >= previous + GAP:
                    fire(cluster, event, started)
                break
            previous = event.done_at
        if drained and terminal >= submitted:
            break
        if time.monotonic() - started > DEADLINE:
            stuck = [r[0] for r in cluster.db.must(
                "SELECT task_id FROM tasks WHERE state <> ALL(%s) ORDER BY task_id LIMIT 4",
                (sorted(TERMINAL),))]
            raise AssertionError(
                f"after {DEADLINE:.0f}s only {terminal} of {submitted} tasks are terminal:"
                f" {dict(last)}; events: {[(e.what, e.done_at) for e in events]}\n"
                f"{post_mortem(cluster, Outcome(problems=stuck))}\n{cluster.diagnostics()}")
        time.sleep(0.05)
    finished = time.monotonic() - started
    died = cluster.died_on_their_own()
    # a late duplicate (a redelivered request, a call still on its way) is seen only
    # once nothing can act any more: every worker gone, the remote done with them
    not_clean = cluster.stop(STOP_WITHIN)
    cluster.wait_for("the remote to answer its last caller",
                     lambda: remote.open_connections() == 0, timeout=STOP_WITHIN, poll=0.02)

    outcome = check(cluster, remote, submitted)
    for event in events:  # each event hit a run in progress
        if event.open == 0 or event.locked == 0:
            outcome.problems.append(f"{event.what} came when no task was in flight")
    for worker in died:
        outcome.problems.append(f"{worker.name} exited on its own with status"
                                f" {worker.popen.returncode}")
    for worker in not_clean:
        outcome.problems.append(f"{worker.name} did not stop cleanly on SIGTERM: status"
                                f" {worker.popen.returncode}")
    summary(broker, outcome, remote, finished, events)
    if outcome.problems:
        raise AssertionError("\n".join(["the scenario's invariants do not hold:",
                                         *outcome.problems[:60], post_mortem(cluster, outcome),
                                         cluster.diagnostics(40, stacks=False)]))


def fire(cluster: Cluster, event: Event, started: float) -> None:
    """Do it, noting how many tasks were in flight just before."""
    counts = cluster.states() or Counter()
    event.terminal = sum(counts[s] for s in TERMINAL)
    event.open = sum(counts.values()) - event.terminal
    event.locked = sum(cluster.locked_by().values())
    event.wall = time.time()
    event.note = event.action()
    event.done_at = time.monotonic() - started
    print(f"{event.done_at:6.1f}s  {event.what}: {event.note}; before it {event.terminal}"
          f" tasks terminal, {event.open} open, {event.locked} held by schedulers")


def summary(broker: Broker, outcome: Outcome, remote: RemoteService, finished: float,
            events: list[Event]) -> None:
    stats = remote.stats()
    states = Counter(outcome.states.values())
    print(f"{broker.kind}: {len(outcome.states)} tasks, all terminal {finished:.1f}s after the"
          f" first submission: {dict(states)}; {outcome.redispatched} units dispatched more"
          f" than once")
    # when the supervisors recovered expired units: 0 s is the first event
    first = events[0].wall
    buckets = Counter(int((at - first) // 3) * 3 for at in outcome.expiries)
    timeline = ", ".join(f"{b:+d}s: {buckets[b]}" for b in sorted(buckets))
    marks = ", ".join(f"{e.what} {e.wall - first:+.1f}s" for e in events)
    print(f"  expiries recovered: {len(outcome.expiries)} ({timeline}); events: {marks}")
    print(f"  remote: {stats['requests']} requests, {stats['effects']} effects"
          f" {stats['effects_by_operation']}, {stats['deduplicated']} deduplicated,"
          f" {stats['duplicate_effects']} duplicate effects, faults {stats['faults']}")
    print(f"  problems: {len(outcome.problems)}")

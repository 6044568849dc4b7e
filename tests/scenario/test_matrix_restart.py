"""Fault matrix rows 4 and 7 where tests/scenario/test_scenario.py (brokers) does not
reach: PostgreSQL with the in-process transport (SPEC R6, M4, M5, S10).

With the in-process transport a scheduler runs its agents in its own process, so
"each role" is a scheduler-and-agent worker and a supervisor. Two workers and two
supervisors run orders against the flaky remote while the store's server crashes
and comes back (``pg_ctl stop -m immediate``, then start), or while the busiest
worker and the supervisor leader are SIGKILLed; every invariant holds after.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from sasflow.examples.orders.remote import RemoteService
from support.matrix import RECOVERY, Run, lingering, open_run, wait_started
from support.scenario import Postgres, Worker

pytestmark = pytest.mark.chaos

ORDERS = 60
IN_FLIGHT = 5  # the fault waits for this many orders to be held by the workers


@pytest.fixture
def run(postgres: Postgres, remote: RemoteService, tmp_path: Path) -> Iterator[Run]:
    with open_run(tmp_path, postgres.url, None, remote) as found:
        found.submit(1)  # creates the schema before any worker starts
        yield found


def start(run: Run) -> list[Worker]:
    """Two scheduler-and-agent workers and two supervisors, with orders in flight."""
    cluster = run.cluster
    workers = [cluster.spawn(f"worker-{n}", "scheduler,agent") for n in (1, 2)]
    supervisors = [cluster.spawn(f"sup-{n}", "supervisor") for n in (1, 2)]
    wait_started(cluster, [*workers, *supervisors])
    run.submit(ORDERS, lingering)
    cluster.wait_for(f"{IN_FLIGHT}+ orders held by the workers",
                     lambda: sum(cluster.locked_by().values()) >= IN_FLIGHT, timeout=RECOVERY)
    return [*workers, *supervisors]


@pytest.mark.timeout(240)
def test_postgres_crash_mid_run_with_the_in_process_transport(run: Run,
                                                               postgres: Postgres) -> None:
    """PostgreSQL crashes with orders in flight and starts again: the workers reconnect
    and every order ends once, nothing lost, no effect twice."""
    workers = start(run)
    # mid-run: every process is connected (a process still starting when the server goes
    # down is the start-up row of docs/reliability.md)
    for worker in workers:
        run.cluster.wait_for(f"{worker.name} connected to the store",
                             partial(worker.connected_to, postgres.server.port), timeout=60)
    downtime = postgres.server.restart(crash=True)
    print(f"\nPostgreSQL down {downtime:.1f}s with {sum(run.cluster.locked_by().values())}"
          " orders held")
    run.submit(10)  # after the restart too
    run.wait_all_terminal()
    run.conclude(quiet=workers)


@pytest.mark.timeout(240)
def test_sigkill_of_a_worker_and_the_leader_with_the_in_process_transport(run: Run) -> None:
    """SIGKILL the worker holding the most orders and the supervisor leader: the other
    supervisor takes the lease, the dead worker's orders expire and the other worker
    finishes them, each once."""
    cluster = run.cluster
    workers = start(run)
    held = cluster.locked_by()
    victim = max(workers[:2], key=lambda w: held[w.name])
    leader = cluster.worker(cluster.wait_for("a supervisor leader", cluster.leader, timeout=120))
    victim.kill()
    leader.kill()
    print(f"\nkilled {victim.name} holding {held[victim.name]} orders and the leader"
          f" {leader.name}")
    run.wait_all_terminal()
    run.conclude(quiet=[w for w in workers if w not in (victim, leader)])

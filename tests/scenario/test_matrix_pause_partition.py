"""Fault matrix rows 1 and 2: a worker paused, or cut off from the store or the broker,
past its steps' complete-by and past the supervisor lease (SPEC R6, S5, S8, M1, M3, M5).

Every backend of the matrix: SQLite, and a private PostgreSQL with the in-process
transport, a private RabbitMQ or a private Redis (the partition from the store:
PostgreSQL only, an SQLite file has no link to cut). Two workers run schedulers and agents, two run
supervisors; the orders call the flaky remote service. The fault hits one
worker holding tasks (and, for the pause, the supervisor leader too) until every
task it held has expired and been recovered by the others; then it heals, more
orders arrive, and the run ends with every invariant (matrix.Run.conclude),
including that the worker that came back wrote nothing it held before the fault
(fencing) and that each effect was applied once per idempotency key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypedDict

import pytest

from sasflow.examples.orders.remote import RemoteService
from support.faultproxy import FaultProxy
from support.matrix import (
    POSTGRES_BACKENDS,
    RECOVERY,
    Backend,
    Run,
    backends,
    lingering,
    open_run,
    wait_started,
)
from support.scenario import Cluster, Worker

pytestmark = pytest.mark.chaos

FIRST_WAVE = 40  # orders in flight when the fault comes
SECOND_WAVE = 20  # orders after it heals: the worker that came back works again
HELD = 3  # the fault waits for the victim to hold at least this many tasks


@pytest.fixture
def run(backend: Backend, remote: RemoteService, tmp_path: Path) -> Iterator[Run]:
    with open_run(tmp_path, backend.store_url, backend.broker, remote) as found:
        found.submit(1)  # creates the schema before any worker starts
        yield found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", backends("sqlite", "postgres-memory", "postgres-redis"),
                         indirect=True)
def test_paused_worker_and_leader_resume_fenced_effects_once(run: Run) -> None:
    """SIGSTOP a worker holding tasks and the supervisor leader until the tasks expired,
    the lease passed to the standby and the other worker finished them; after SIGCONT
    neither writes anything stale, the old leader stands by, and every order ends once."""
    cluster = run.cluster
    victim = cluster.spawn("victim", "scheduler,agent")
    peer = cluster.spawn("peer", "scheduler,agent")
    supervisors = [cluster.spawn(f"sup-{n}", "supervisor") for n in (1, 2)]
    wait_started(cluster, [victim, peer, *supervisors])
    run.submit(FIRST_WAVE, inputs=lingering)
    cluster.wait_for(f"the victim to hold {HELD}+ tasks",
                     lambda: len(run.held_by(victim)) >= HELD, timeout=60)
    frozen_at = freeze_between_writes(cluster, victim)
    held = run.held_by(victim)
    assert held, "the victim was frozen holding no task"
    leader, at = freeze_leader(cluster)
    frozen_at = min(frozen_at, at)
    cluster.wait_for("the standby to take the lease from the frozen leader",
                     lambda: (cluster.lease() or ("",))[0] not in ("", leader.name),
                     timeout=120)
    cluster.wait_for(f"the {len(held)} tasks the victim held expired and recovered",
                     lambda: run.expired_since(held, frozen_at), timeout=RECOVERY)
    thawed_at = min(victim.thaw(), leader.thaw())
    print(f"\nfrozen {thawed_at - frozen_at:.1f}s holding {len(held)} tasks")

    run.submit(SECOND_WAVE)
    cluster.wait_for("the old leader to stand by after it resumed",
                     lambda: said_after(leader.log, f"supervisor {leader.name}: standing by"),
                     timeout=120)
    run.wait_all_terminal()
    run.stop(victim)  # whatever it had left to write is written, or fenced off, by now
    assert not cluster.db.must("SELECT id FROM history_entries WHERE actor = %s AND at > %s",
                               (leader.name, frozen_at)), "the deposed leader wrote after"
    run.conclude(fenced={victim.name: frozen_at}, quiet=[peer, *supervisors])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", backends("postgres-memory", among=POSTGRES_BACKENDS),
                         indirect=True)
def test_worker_cut_off_from_the_store_heals_without_stale_writes(
        run: Run, backend: Backend) -> None:
    """A worker's connections to PostgreSQL go through a proxy that black-holes them while
    it holds tasks: the others recover its tasks; when the partition heals, the writes it
    had sent meanwhile arrive late and change nothing; nothing is lost or applied twice."""
    assert backend.postgres is not None
    partition(run, backend.postgres.server.port,
              lambda proxy: {"store": proxy.url(backend.store_url)})


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", backends("postgres-redis", among=POSTGRES_BACKENDS[1:]),
                         indirect=True)
def test_worker_cut_off_from_the_broker_heals_without_stale_writes(
        run: Run, backend: Backend) -> None:
    """The same with the worker's connections to the broker black-holed: its requests and
    replies wait in the partition, its tasks expire and are done by the others, and what
    it sent arrives late, changing nothing."""
    broker = backend.broker
    assert broker is not None
    partition(run, broker.server.port, lambda proxy: {"transport": proxy.url(broker.transport_url)})


class Route(TypedDict, total=False):
    """Where the victim reaches its store or its broker: through the proxy."""

    store: str
    transport: str


def partition(run: Run, port: int, routed: Callable[[FaultProxy], Route]) -> None:
    """Route the victim through a FaultProxy to `port`; black-hole it while it holds tasks
    until they were recovered, heal, finish, and check every invariant."""
    cluster = run.cluster
    with FaultProxy(port) as proxy:
        victim = cluster.spawn("victim", "scheduler,agent", **routed(proxy))
        peer = cluster.spawn("peer", "scheduler,agent")
        supervisor = cluster.spawn("sup-1", "supervisor")
        wait_started(cluster, [victim, peer, supervisor])
        run.submit(FIRST_WAVE, inputs=lingering)
        cluster.wait_for(f"the victim to hold {HELD}+ tasks",
                         lambda: len(run.held_by(victim)) >= HELD, timeout=60)

        cut_at = time.time()
        proxy.set_mode("black-hole")
        held = run.held_by(victim)
        assert held, "the victim was cut off holding no task"
        cluster.wait_for(f"the {len(held)} tasks the victim held expired and recovered",
                         lambda: run.expired_since(held, cut_at), timeout=RECOVERY)
        proxy.set_mode("pass")
        print(f"\npartitioned {time.time() - cut_at:.1f}s holding {len(held)} tasks;"
              f" {proxy.connections} connections through the proxy")

        run.submit(SECOND_WAVE)
        run.wait_all_terminal()
        run.stop(victim)
    run.conclude(fenced={victim.name: cut_at}, quiet=[peer, supervisor])


def freeze_between_writes(cluster: Cluster, worker: Worker) -> float:
    """SIGSTOP `worker` at a moment it holds no store-wide lock. On SQLite a process
    stopped inside its write transaction stops every other process's writes: an
    outage of the whole store, not the paused worker this test is about. Such a
    stop is undone and made again."""
    for _ in range(50):
        at = worker.freeze()
        if cluster.db.writable():
            return at
        worker.thaw()
    raise AssertionError(f"{worker.name} held the store's write lock at every stop\n"
                         f"{cluster.diagnostics()}")


def freeze_leader(cluster: Cluster) -> tuple[Worker, float]:
    """SIGSTOP the supervisor that holds the lease, as the lease row shows it after the
    stop (a leader may lose the lease between the read and the signal: then again),
    between its writes (freeze_between_writes)."""
    for _ in range(20):
        name = cluster.wait_for("a supervisor leader", cluster.leader, timeout=120)
        leader = cluster.worker(name)
        at = freeze_between_writes(cluster, leader)
        lease = cluster.lease()
        if lease is not None and lease[0] == name:
            return leader, at
        leader.thaw()
    raise AssertionError(f"no supervisor kept the lease long enough to be frozen holding it\n"
                         f"{cluster.diagnostics()}")


def said_after(log: Path, line: str) -> bool:
    return line in log.read_text(errors="replace")

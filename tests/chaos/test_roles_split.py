"""Roles as services over a broker: schedulers, one process per agent, and a supervisor,
each a `sasflow worker --roles ...` process of its own, sharing only a PostgreSQL store
and a RabbitMQ or Redis transport (S4, S10, M4, M5).

Every step is driven by the scheduler processes and run by the processes serving its
agent, and by no other. One of two processes serving the payments agent is SIGKILLed
with charges applied but unanswered: every order still completes, and the remote
service applies each effect once, deduplicating the repeats by idempotency key.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from distapp import ORDER, STEP_AGENT

from sasflow.examples.orders.remote import RemoteService
from support.chaos import Worker
from support.dist import DistCluster, postgres_schema, private_transport
from support.process import HANG_GUARD

pytestmark = pytest.mark.chaos

ORDERS = 50
WAVE = ORDERS // 2
STEPS = ("reserve", "charge", "ship")
SCHEDULER_CONCURRENCY = 16


@pytest.fixture
def remote() -> Iterator[RemoteService]:
    """The real flaky-service implementation on loopback (no faults: dedup is what is tested)."""
    with RemoteService() as service:
        yield service


@pytest.fixture(params=["rabbitmq", "redis"], ids=["postgres-rabbitmq", "postgres-redis"])
def dist(request: pytest.FixtureRequest, tmp_path: Path,
         remote: RemoteService) -> Iterator[DistCluster]:
    namespace = f"{request.param[:5]}{uuid.uuid4().hex[:10]}"
    with postgres_schema() as store, private_transport(request.param, namespace) as transport:
        world = DistCluster(tmp_path, store, transport_url=transport, namespace=namespace)
        world.remote_url = remote.url
        try:
            yield world
        finally:
            world.close()


def test_postgres_roles_split_over_broker_with_an_agent_sigkilled(
        dist: DistCluster, remote: RemoteService) -> None:
    """Two schedulers, a supervisor and four agent processes (payments twice): each
    step ran only where its agent is served, results and claims come from the two
    schedulers, and the SIGKILL of a payments process loses and duplicates nothing."""
    began = time.time()
    schedulers = [dist.spawn(f"sched-{i}", roles=("scheduler",),
                             concurrency=SCHEDULER_CONCURRENCY) for i in (1, 2)]
    supervisor = dist.spawn("supervisor", roles=("supervisor",))
    # the victim charges, then stalls before replying, until it is killed
    victim = dist.spawn("payments-victim", roles=("agent",), agents=["payments"],
                        hang_at=["do:charge"])
    serving: dict[str, list[Worker]] = {
        "inventory": [dist.spawn("inventory-1", roles=("agent",), agents=["inventory"])],
        "payments": [victim],
        "shipping": [dist.spawn("shipping-1", roles=("agent",), agents=["shipping"])]}
    wait_started(dist)
    up_at = time.time()

    # 1. the first wave: the victim takes charges and stalls on them
    orders = {f"o{n:03d}": {"order_id": n} for n in range(1, ORDERS + 1)}
    first, second = dict(list(orders.items())[:WAVE]), dict(list(orders.items())[WAVE:])
    dist.submit(ORDER, first)
    dist.wait_for("the victim to charge 3+ orders and stall before replying",
                  lambda: len(hangs(dist, victim)) >= 3, timeout=HANG_GUARD)

    # 2. a second payments process joins; the second wave runs on both
    survivor = dist.spawn("payments-2", roles=("agent",), agents=["payments"])
    serving["payments"].append(survivor)
    wait_started(dist)
    dist.submit(ORDER, second)
    dist.wait_for("the second payments process to charge an order",
                  lambda: any(e.pid == survivor.pid and e.step == "charge" and e.event == "end"
                              for e in dist.effects()), timeout=HANG_GUARD)

    # 3. SIGKILL the victim mid-run: its charges are applied and unanswered
    killed_at = victim.kill()
    print(f"\nsix processes up: {up_at - began:.2f}s; first order -> kill:"
          f" {killed_at - up_at:.2f}s")
    stalled = hangs(dist, victim)
    unfinished = {t for t, (state, *_) in dist.tasks().items() if state != "processed"}
    assert stalled & unfinished, "the kill must land while the victim holds unanswered charges"
    dist.wait_for(f"all {ORDERS} orders processed without the victim",
                  lambda: dist.all_in(["processed"], ORDERS), timeout=HANG_GUARD)
    print(f"victim SIGKILL -> all {ORDERS} processed:"
          f" {max_at(dist) - killed_at:.2f}s; stalled charges: {len(stalled)}")

    # each remote effect once; the stalled charges were repeated and deduplicated
    stats = remote.stats()
    assert stats["duplicate_effects"] == 0, stats
    assert {op: n for op, n in stats["effects_by_operation"].items() if n} == {
        "reserve": ORDERS, "charge": ORDERS, "ship": ORDERS}, stats
    assert stats["deduplicated"] >= len(stalled), stats
    with httpx.Client(base_url=remote.url) as client:
        for task, payload in orders.items():
            applied = client.get("/effects", params={"order_id": payload["order_id"]}).json()
            assert applied == list(STEPS), (task, applied)

    # every agent call ran in a process serving that agent, and in no other
    pids = {agent: {w.pid for w in workers} for agent, workers in serving.items()}
    effects = dist.effects()
    misplaced = [e for e in effects if e.pid not in pids[STEP_AGENT[e.step]]]
    assert misplaced == [], misplaced
    for worker in (w for workers in serving.values() for w in workers):
        assert any(e.pid == worker.pid for e in effects), f"{worker.name} ran nothing"
    assert not {e.pid for e in effects} & {w.pid for w in [*schedulers, supervisor]}
    # the victim never answered: every committed charge is the survivor's
    assert {r["pid"] for r in dist.results("charge").values()} == {survivor.pid}
    assert {r["pid"] for r in dist.results("reserve").values()} == {serving["inventory"][0].pid}
    assert {r["pid"] for r in dist.results("ship").values()} == {serving["shipping"][0].pid}
    assert len({r["effect_id"] for r in dist.results("charge").values()}) == ORDERS
    assert all(e.at < killed_at for e in effects if e.pid == victim.pid)

    # the store: claims and step results by the two schedulers, recoveries by the supervisor
    history = dist.history()
    names = {w.name for w in schedulers}
    claims = {h.actor for h in history if h.step is None and h.to_state == "processing"}
    assert claims == names, claims
    done = dist.completions()
    assert set(done) == {(t, s, "do") for t in orders for s in STEPS}
    assert set(done.values()) == {1}, "a step completed twice"
    assert {h.actor for h in history if h.step is not None and h.to_state == "completed"
            } == names
    # the supervisor only recovers expired units, each along with its task's expiry
    expiries = {(h.task_id, h.epoch) for h in history if h.expiry}
    assert {h.actor for h in history if h.expiry} <= {supervisor.name}
    assert all((h.task_id, h.epoch) in expiries for h in history
               if h.step is not None and h.actor == supervisor.name)
    assert {h.actor for h in history} <= names | {supervisor.name, "submit"}


def wait_started(dist: DistCluster) -> None:
    dist.wait_for("every worker to start",
                  lambda: all(dist.started(w) for w in dist.workers), timeout=HANG_GUARD)


def hangs(dist: DistCluster, worker: Worker) -> set[str]:
    """Orders `worker` charged and stalled on without replying."""
    return {e.task for e in dist.effects()
            if e.event == "hang" and e.pid == worker.pid and e.step == "charge"}


def max_at(dist: DistCluster) -> float:
    return max(h.at for h in dist.history())

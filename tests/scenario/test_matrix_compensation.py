"""Fault matrix row 6: a compensator that fails, hangs, or whose process is SIGKILLed
mid-compensation (SPEC R6, S8, S9).

Every backend of the matrix (SQLite; PostgreSQL with the in-process transport,
RabbitMQ or Redis). Orders whose
shipment is refused are undone: their charge refunded, then their reservation
released. When the refund fails for good the task ends in error with one alert
naming the step; when it hangs past its complete-by it is retried (expired,
released) up to the workflow's max_failures, applied once whatever the number
of attempts, then ends in error with one alert; when the process running it is
SIGKILLed another finishes it, still once per completed step, in reverse order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from scenarioapp import MAX_FAILURES, STALL_ENV, STEP_TIMEOUT

from sasflow.examples.orders.remote import Faults, RemoteService
from support.matrix import RECOVERY, Backend, Run, backends, open_run, wait_started

pytestmark = pytest.mark.chaos

EACH = 3  # orders of each kind
FAULT = {1: "permanent", 2: "hang", 3: None}  # by (n - 1) // EACH + 1


@pytest.fixture
def run(backend: Backend, remote: RemoteService, tmp_path: Path) -> Iterator[Run]:
    with open_run(tmp_path, backend.store_url, backend.broker, remote) as found:
        yield found


@pytest.fixture
def steady(backend: Backend, tmp_path: Path) -> Iterator[Run]:
    """A run whose remote never fails: every failure counted is the compensator's own."""
    with RemoteService(faults=Faults()) as remote, \
            open_run(tmp_path, backend.store_url, backend.broker, remote) as found:
        yield found


def refused(n: int) -> dict[str, Any]:
    """Order n: shipping refuses it; its refund fails for good, hangs, or works."""
    fault = FAULT[(n - 1) // EACH + 1]
    return {"order_id": n, "card": "ok", "refuse_ship": True,
            **({"refund_fault": fault} if fault else {})}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", backends("postgres-memory"), indirect=True)
def test_failing_and_hanging_compensators_escalate_once(steady: Run) -> None:
    """A refund that fails for good: error at once, one alert, nothing released. A refund
    that hangs: expired and retried max_failures times, applied once, then error with one
    alert. A working refund beside them: refunded, then released, in that order."""
    run = steady
    cluster = run.cluster
    workers = [cluster.spawn(f"worker-{n}", "scheduler,agent") for n in (1, 2)]
    supervisor = cluster.spawn("sup-1", "supervisor")
    run.submit(len(FAULT) * EACH, refused)
    wait_started(cluster, [*workers, supervisor])
    run.wait_all_terminal(timeout=MAX_FAILURES * (STEP_TIMEOUT + 1) + RECOVERY)

    permanent = {f"order-{n}" for n in range(1, EACH + 1)}
    hanging = {f"order-{n}" for n in range(EACH + 1, 2 * EACH + 1)}
    outcome = run.conclude(quiet=[*workers, supervisor], inputs=refused,
                           alerts=permanent | hanging)
    states = outcome.states
    assert {t: states[t] for t in permanent | hanging} == dict.fromkeys(permanent | hanging,
                                                                          "error")
    assert {s for t, s in states.items() if t not in permanent | hanging} == {"compensated"}
    with httpx.Client(base_url=run.remote.url) as client:
        for n in range(1, run.submitted + 1):
            applied = client.get("/effects", params={"order_id": n}).json()
            expected = {"permanent": ["reserve", "charge"],
                        "hang": ["reserve", "charge", "refund"],
                        None: ["reserve", "charge", "refund", "release"]}[refused(n).get(
                            "refund_fault")]
            assert applied == expected, (n, applied)
    alerts = {r[0]: (r[1], r[2]) for r in cluster.db.must(
        "SELECT task_id, step, message FROM alerts")}
    for task in permanent:
        assert alerts[task][0] == "charge" and "refused" in alerts[task][1], alerts[task]
    for task in hanging:
        assert alerts[task][0] == "charge" and "exhausted" in alerts[task][1], alerts[task]
    # the hanging refund: retried exactly up to the policy, then given up
    counts = dict(cluster.db.must("SELECT task_id, failure_count FROM tasks"))
    assert {counts[t] for t in hanging} == {MAX_FAILURES}, counts
    refunds = dict(cluster.db.must("SELECT task_id, attempts FROM steps WHERE phase = 'undo'"
                                   " AND name = 'charge'"))
    assert {refunds[t] for t in hanging} == {MAX_FAILURES}, refunds
    assert {refunds[t] for t in permanent} == {1}, refunds


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", backends("sqlite", "postgres-redis"), indirect=True)
def test_compensator_sigkilled_mid_compensation_applies_once(run: Run) -> None:
    """The only worker applies each refund and hangs before replying; SIGKILLed there, a
    new worker repeats the refund (deduplicated by its key) and releases: every order
    compensated, each completed step undone once, in reverse order."""
    cluster = run.cluster
    orders = 4
    run.submit(orders, lambda n: {"order_id": n, "card": "ok", "refuse_ship": True})
    victim = cluster.spawn("victim", "scheduler,agent", extra_env={STALL_ENV: "refund"})
    supervisor = cluster.spawn("sup-1", "supervisor")
    cluster.wait_for(f"the victim to apply {orders} refunds and hang",
                     lambda: run.remote.stats()["effects_by_operation"].get("refund") == orders,
                     timeout=RECOVERY)
    victim.kill()
    survivor = cluster.spawn("survivor", "scheduler,agent")
    run.wait_all_terminal()
    outcome = run.conclude(quiet=[survivor, supervisor],
                           inputs=lambda n: {"order_id": n, "card": "ok", "refuse_ship": True})
    assert set(outcome.states.values()) == {"compensated"}
    assert run.remote.stats()["deduplicated"] >= orders, run.remote.stats()

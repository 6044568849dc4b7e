"""A task whose last step fails for good is undone: each completed step's compensation
applied exactly once, in reverse order, even when a worker is SIGKILLed mid-compensation
(S9, DESIGN invariant 8)."""

from __future__ import annotations

import httpx
import pytest
from chaosapp import ORDER

from sasflow.examples.orders.remote import RemoteService
from support.chaos import Cluster, Worker
from support.process import HANG_GUARD

pytestmark = pytest.mark.chaos



def test_compensations_run_once_per_completed_step_in_reverse_order(
        cluster: Cluster, remote: RemoteService) -> None:
    """ship refuses: charge is refunded, then reserve released, each once; ship is not
    undone; every task ends compensated."""
    tasks = orders(cluster, "c", 4)
    cluster.spawn("worker")
    cluster.wait_for("every task compensated",
                     lambda: cluster.all_in(["compensated"], len(tasks)), timeout=HANG_GUARD)

    assert_undone_once_in_reverse(cluster, remote, tasks)
    assert remote.stats()["deduplicated"] == 0, "nothing was interrupted: nothing repeated"
    # literally once: one run of each compensator, the later step's first
    undo = [e for e in cluster.effects() if e.phase == "undo" and e.event == "start"]
    for task in tasks:
        assert [e.step for e in undo if e.task == task] == ["charge", "reserve"], task


def test_compensation_interrupted_by_sigkill_is_applied_once(
        cluster: Cluster, remote: RemoteService) -> None:
    """The victim refunds each order and is SIGKILLed before replying; the survivor
    repeats the refund (deduplicated by its undo key), then releases: still once each,
    in reverse order, and every task ends compensated."""
    tasks = orders(cluster, "k", 3)
    victim = cluster.spawn("victim", hang_at=["undo:charge"])
    cluster.wait_for("the victim to refund every order and stall before replying",
                     lambda: len(hangs(cluster, victim)) == len(tasks), timeout=HANG_GUARD)
    victim.kill()
    survivor = cluster.spawn("survivor")
    cluster.wait_for("every task compensated by the survivor",
                     lambda: cluster.all_in(["compensated"], len(tasks)), timeout=HANG_GUARD)

    assert_undone_once_in_reverse(cluster, remote, tasks)
    assert remote.stats()["deduplicated"] >= len(tasks), "each refund repeated, deduplicated"
    undo = [e for e in cluster.effects() if e.phase == "undo" and e.event == "start"]
    for task in tasks:
        # the refund ran twice (once per process) but was applied once; release ran once
        assert [(e.step, e.pid) for e in undo if e.task == task] == [
            ("charge", victim.pid), ("charge", survivor.pid), ("reserve", survivor.pid)], task


def orders(cluster: Cluster, prefix: str, n: int) -> dict[str, int]:
    """Submit n orders whose ship step refuses; task id -> order id."""
    tasks = {f"{prefix}{i}": i for i in range(1, n + 1)}
    cluster.submit(ORDER, {t: {"order_id": i, "refuse_ship": True} for t, i in tasks.items()})
    return tasks


def hangs(cluster: Cluster, worker: Worker) -> set[str]:
    return {e.task for e in cluster.effects() if e.event == "hang" and e.pid == worker.pid}


def assert_undone_once_in_reverse(cluster: Cluster, remote: RemoteService,
                                  tasks: dict[str, int]) -> None:
    n = len(tasks)
    stats = remote.stats()
    assert stats["duplicate_effects"] == 0, stats
    assert stats["effects_by_operation"] == {
        "reserve": n, "charge": n, "refund": n, "release": n, "ship": 0}, stats
    with httpx.Client(base_url=remote.url) as client:
        for task, order in tasks.items():
            applied = client.get("/effects", params={"order_id": order}).json()
            assert applied == ["reserve", "charge", "refund", "release"], (task, applied)

    history = cluster.history()
    undone = cluster.completions("compensated")
    assert undone == {(t, s, "undo"): 1 for t in tasks for s in ("reserve", "charge")}
    for task in tasks:
        undo_order = [h.step for h in history if h.task_id == task and h.phase == "undo"
                      and h.to_state == "compensated"]
        assert undo_order == ["charge", "reserve"], (task, undo_order)
        failed = [h for h in history if (h.task_id, h.step, h.to_state) == (task, "ship", "failed")]
        assert len(failed) == 1, (task, failed)
    assert cluster.states() == {"compensated": n}

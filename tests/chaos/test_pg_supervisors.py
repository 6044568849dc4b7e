"""Supervisor leader election on PostgreSQL: several supervisors, one leader, fenced;
the leader SIGKILLed (or frozen) -> another takes over once its lease ran out (M3, E9, S8).

"Several hosts" is, on one machine, several `sasflow worker --roles supervisor`
processes with different instance ids, each with its own connections to one
PostgreSQL store (a private schema per test): nothing is shared between them
but the store, as between hosts.

Expired steps are made by scheduler+agent processes that claim HOLD tasks (a
slow agent that outlives the complete-by) and are then SIGKILLed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaosapp import HOLD, INTERVAL, LEASE_TTL

from support.chaos import Worker
from support.dist import DistCluster, postgres_schema

pytestmark = pytest.mark.chaos

BATCH = 10
STALL = 60.0  # the stalled workers' agents outlive any complete-by
# Hang guards only: nothing here is timed. How long a takeover and a recovery take is
# measured by bench/recovery.py --kill-leader (the lease run out, then a sweep).
TAKEOVER = 60.0
RECOVERY = 120.0


@pytest.fixture
def dist(tmp_path: Path) -> Iterator[DistCluster]:
    with postgres_schema() as url:
        world = DistCluster(tmp_path, url)
        try:
            yield world
        finally:
            world.close()


def test_postgres_supervisors_one_leader_and_takeover_after_leader_sigkill(
        dist: DistCluster) -> None:
    """Three supervisor processes: only the lease holder recovers; SIGKILLed, it is
    replaced, once its lease ran out on the store's clock, by exactly one other,
    which recovers what expires next, each expiry once (one recovery transition per
    task and epoch)."""
    supervisors = [dist.spawn(f"sup-{i}", roles=("supervisor",)) for i in (1, 2, 3)]
    by_name = {w.name: w for w in supervisors}
    dist.wait_for("a supervisor to take the lease", dist.lease_row, timeout=RECOVERY)
    leader = by_name[holder(dist)[0]]
    first = [f"a{i:02d}" for i in range(BATCH)]
    second = [f"b{i:02d}" for i in range(BATCH)]

    # 1. the leader recovers a dead scheduler's tasks
    dist.submit(HOLD, {task: {} for task in first})
    stall(dist, "stalled-1", BATCH)
    dist.wait_for("the first batch released once", lambda: released(dist, {t: 1 for t in first}),
                  timeout=RECOVERY)

    # 2. a second scheduler takes both batches; the leader dies while they run
    dist.submit(HOLD, {task: {} for task in second})
    stalled = stall(dist, "stalled-2", 2 * BATCH, kill=False)
    assert holder(dist) == (leader.name, 1)
    killed_at = leader.kill()
    lease_ran_out = lease_expiry(dist, leader)  # the dead leader renews it no more
    stalled.kill()
    new = dist.wait_for("another supervisor to take the lease",
                        lambda: taken_from(dist, leader), timeout=TAKEOVER)
    assert new is not None
    takeover = time.time() - killed_at
    successor = by_name[new[0]]
    [bystander] = [w for w in supervisors if w not in (leader, successor)]
    assert new[1] == 2, "a new holder bumps the lease epoch"
    dist.wait_for("the successor to release both batches",
                  lambda: released(dist, {**{t: 2 for t in first}, **{t: 1 for t in second}}),
                  timeout=RECOVERY)

    # 3. a healthy worker finishes everything
    dist.spawn("finisher", roles=("scheduler", "agent"), slow=0.01)
    dist.wait_for("every task processed", lambda: dist.all_in(["processed"], 2 * BATCH),
                  timeout=RECOVERY)
    print(f"\nleader SIGKILL -> lease taken over: {takeover:.2f}s"
          f" (lease TTL {LEASE_TTL:.2f}s, interval {INTERVAL:.2f}s)")

    history = dist.history()
    expiries = [h for h in history if h.expiry]
    per_epoch = Counter((h.task_id, h.epoch) for h in expiries)
    assert [k for k, n in per_epoch.items() if n != 1] == [], "an expiry was counted twice"
    tasks = dist.tasks()
    for task in first + second:
        epochs = sorted(epoch for (t, epoch) in per_epoch if t == task)
        assert epochs == ([1, 2] if task in first else [1]), (task, epochs)
        assert tasks[task][2] == len(epochs), f"{task}: failure_count is not the expiries"
    # one leader at a time: the first before its death, the successor only after it
    assert {(h.task_id, h.epoch) for h in expiries if h.actor == leader.name} == {
        (t, 1) for t in first}
    assert {(h.task_id, h.epoch) for h in expiries if h.actor == successor.name} == {
        *((t, 2) for t in first), *((t, 1) for t in second)}
    assert all(h.at < killed_at for h in history if h.actor == leader.name)
    assert all(h.at > killed_at for h in history if h.actor == successor.name)
    assert [h for h in history if h.actor == bystander.name] == []
    assert holder(dist) == (successor.name, 2), "the lease changed hands twice"
    # and each supervisor says so: one 'leading' before the kill, one after, none else
    said = {w.name: [(e.at, e.message.rsplit(": ", 1)[1]) for e in dist.leading(w)]
            for w in supervisors}
    assert [m for _, m in said[leader.name]] == ["leading"], said
    assert [m for _, m in said[successor.name]] == ["leading"], said
    assert said[successor.name][0][0] >= killed_at - 0.01, said  # log times are to the ms
    # ... and only once the dead leader's lease had run out
    assert said[successor.name][0][0] >= lease_ran_out - 0.01, (said, lease_ran_out)
    assert said[bystander.name] == [], said
    assert set(dist.completions().values()) == {1}
    assert len(dist.completions()) == 2 * BATCH


def test_postgres_frozen_leader_resumed_after_losing_the_lease_does_not_sweep(
        dist: DistCluster) -> None:
    """The leader is SIGSTOPped; a standby takes the lease (epoch 2) once it ran out and
    recovers what expires. The old leader is resumed just as more tasks expire: it
    finds its lease (epoch 1) gone, stands by, and writes no recovery at all; every
    expiry is recovered once, by the lease holder."""
    supervisors = [dist.spawn(f"sup-{i}", roles=("supervisor",)) for i in (1, 2)]
    dist.wait_for("a supervisor to take the lease", dist.lease_row, timeout=RECOVERY)
    [old] = [w for w in supervisors if w.name == holder(dist)[0]]
    [standby] = [w for w in supervisors if w is not old]
    first = [f"a{i:02d}" for i in range(BATCH)]
    second = [f"b{i:02d}" for i in range(BATCH)]

    dist.submit(HOLD, {task: {} for task in first})
    stall(dist, "stalled-1", BATCH)
    dist.wait_for("the old leader to release the first batch",
                  lambda: released(dist, {t: 1 for t in first}), timeout=RECOVERY)

    # 1. freeze the leader: the standby takes over once the lease runs out
    stopped_at = old.freeze()
    lease_ran_out = lease_expiry(dist, old)  # the frozen leader renews it no more
    new = dist.wait_for("the standby to take the lease",
                        lambda: taken_from(dist, old), timeout=TAKEOVER)
    assert new is not None
    assert new[0] == standby.name
    takeover = time.time() - stopped_at
    print(f"\nleader SIGSTOP -> lease taken over: {takeover:.2f}s"
          f" (lease TTL {LEASE_TTL:.2f}s, interval {INTERVAL:.2f}s)")
    assert new[1] == 2, new
    took_lead = dist.wait_for("the standby to say it leads", lambda: [
        e.at for e in dist.leading(standby) if e.message.endswith(": leading")], timeout=TAKEOVER)
    assert took_lead[0] >= lease_ran_out - 0.01, (took_lead, lease_ran_out)  # ms in logs

    # 2. the new leader recovers a dead scheduler's tasks while the old one is frozen
    dist.submit(HOLD, {task: {} for task in second})
    stall(dist, "stalled-2", 2 * BATCH)
    dist.wait_for("the new leader to release both batches",
                  lambda: released(dist, {**{t: 2 for t in first}, **{t: 1 for t in second}}),
                  timeout=RECOVERY)

    # 3. resume the old leader before a third round of tasks expires: as soon as they
    # run, a whole step timeout ahead of their complete-by
    stall(dist, "stalled-3", 2 * BATCH)
    due = min(r[0] for r in dist.query("SELECT complete_by FROM tasks"))
    resumed_at = old.thaw()
    assert resumed_at < due, "the old leader must wake before the third round expires"
    dist.wait_for("the third round released",
                  lambda: released(dist, {**{t: 3 for t in first}, **{t: 2 for t in second}}),
                  timeout=RECOVERY)
    dist.wait_for("the resumed leader to notice it lost the lease",
                  lambda: [e.message for e in dist.leading(old)][-1:] == [
                      f"supervisor {old.name}: standing by"], timeout=TAKEOVER)
    dist.spawn("finisher", roles=("scheduler", "agent"), slow=0.01)
    dist.wait_for("every task processed", lambda: dist.all_in(["processed"], 2 * BATCH),
                  timeout=RECOVERY)
    assert old.alive, old.tail()

    history = dist.history()
    expiries = [h for h in history if h.expiry]
    per_epoch = Counter((h.task_id, h.epoch) for h in expiries)
    assert [k for k, n in per_epoch.items() if n != 1] == [], "an expiry was counted twice"
    for task in first + second:
        epochs = sorted(epoch for (t, epoch) in per_epoch if t == task)
        assert epochs == ([1, 2, 3] if task in first else [1, 2]), (task, epochs)
    # the old leader recovered only the first round, before it froze; nothing after
    assert {(h.task_id, h.epoch) for h in expiries if h.actor == old.name} == {
        (t, 1) for t in first}
    assert all(h.at < stopped_at for h in history if h.actor == old.name)
    # everything from the freeze on was recovered by the lease holder of epoch 2
    late = [h for h in expiries if h.at > stopped_at]
    assert len(late) == 4 * BATCH and {h.actor for h in late} == {standby.name}
    assert any(h.at > resumed_at for h in late), "the old leader had expiries to race for"
    assert holder(dist) == (standby.name, 2)
    said = [(e.at, e.message.rsplit(": ", 1)[1]) for e in dist.leading(old)]
    assert [m for _, m in said] == ["leading", "standing by"], said
    assert said[1][0] >= resumed_at - 0.01, said
    assert set(dist.completions().values()) == {1}


def stall(dist: DistCluster, name: str, tasks: int, *, kill: bool = True) -> Worker:
    """A scheduler+agent process that claims every pending task and starts it, then (by
    default) is SIGKILLed with all of them in flight: they expire at their complete-by."""
    worker = dist.spawn(name, roles=("scheduler", "agent"), slow=STALL)
    dist.wait_for(f"{name} to start {tasks} tasks",
                  lambda: len(dist.in_flight(worker.pid)) == tasks, timeout=RECOVERY)
    if kill:
        worker.kill()
    return worker


def released(dist: DistCluster, failures: dict[str, int]) -> bool:
    """Every listed task is pending and unlocked with exactly that failure_count."""
    tasks = dist.tasks()
    return all(tasks[t][:3] == ("pending", None, n) for t, n in failures.items())


def lease_expiry(dist: DistCluster, worker: Worker) -> float:
    """When `worker`'s supervisor lease runs out unless renewed (the store's clock)."""
    row = dist.lease_row()
    assert row is not None and row[0] == worker.name, (row, worker.name)
    return float(row[2])


def taken_from(dist: DistCluster, worker: Worker) -> tuple[str, int] | None:
    """The lease's holder and epoch, once someone other than `worker` holds it."""
    row = dist.lease_row()
    return (row[0], row[1]) if row is not None and row[0] != worker.name else None


def holder(dist: DistCluster) -> tuple[str, int]:
    """The supervisor lease's holder and epoch."""
    row = dist.lease_row()
    assert row is not None, "no supervisor lease"
    return row[0], row[1]

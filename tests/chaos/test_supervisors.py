"""Two supervisor processes: one leads at a time, each expiry is counted once, and when
the leader is SIGKILLed the other takes over the recoveries (M3, E9, S8)."""

from __future__ import annotations

from collections import Counter

import pytest
from chaosapp import HOLD

from support.chaos import Cluster
from support.process import HANG_GUARD

pytestmark = pytest.mark.chaos

BATCH = 15
STALL = 60.0  # the stalled workers' agents outlive any complete-by


def test_two_supervisors_count_each_expiry_once_across_a_leader_sigkill(
        cluster: Cluster) -> None:
    """Tasks left locked by SIGKILLed schedulers are released exactly once per expiry
    (failure_count == supervisor expiries, one per task per epoch); only the lease holder
    recovers, and after the leader's SIGKILL the standby finishes the recoveries."""
    supervisors = {w.name: w for w in (cluster.spawn("sup-1", roles=("supervisor",)),
                                       cluster.spawn("sup-2", roles=("supervisor",)))}
    first = [f"a{i:02d}" for i in range(BATCH)]
    second = [f"b{i:02d}" for i in range(BATCH)]

    # 1. a scheduler claims the first batch, then dies with it
    cluster.submit(HOLD, {task: {} for task in first})
    stalled = cluster.spawn("stalled-1", roles=("scheduler", "agent"), slow=STALL)
    cluster.wait_for("stalled-1 to start the first batch",
                     lambda: len(cluster.in_flight(stalled.pid)) == BATCH, timeout=HANG_GUARD)
    stalled.kill()
    cluster.wait_for("the first batch released once, failure_count 1",
                     lambda: released(cluster, {t: 1 for t in first}), timeout=HANG_GUARD)
    lease = cluster.lease()
    assert lease is not None and lease[0] in supervisors, lease
    leader = supervisors.pop(lease[0])
    [standby] = supervisors.values()

    # 2. the leader dies; the first batch is claimed again with a second, and lost again
    killed_at = leader.kill()
    cluster.submit(HOLD, {task: {} for task in second})
    stalled = cluster.spawn("stalled-2", roles=("scheduler", "agent"), slow=STALL)
    cluster.wait_for("stalled-2 to start both batches",
                     lambda: len(cluster.in_flight(stalled.pid)) == 2 * BATCH, timeout=HANG_GUARD)
    stalled.kill()
    cluster.wait_for("the standby to release both batches",
                     lambda: released(cluster, {**{t: 2 for t in first},
                                                **{t: 1 for t in second}}),
                     timeout=HANG_GUARD)

    # 3. a healthy worker finishes everything the supervisors handed back
    cluster.spawn("finisher", roles=("scheduler", "agent"), slow=0.01)
    cluster.wait_for("every task processed",
                     lambda: cluster.all_in(["processed"], 2 * BATCH), timeout=HANG_GUARD)

    history = cluster.history()
    expiries = [h for h in history if h.expiry]
    per_epoch = Counter((h.task_id, h.epoch) for h in expiries)
    assert [k for k, n in per_epoch.items() if n != 1] == [], "an expiry was counted twice"
    tasks = cluster.tasks()
    for task in first + second:
        epochs = sorted(epoch for (t, epoch) in per_epoch if t == task)
        assert epochs == ([1, 2] if task in first else [1]), (task, epochs)
        assert tasks[task][2] == len(epochs), f"{task}: failure_count is not the expiries"
    # one supervisor at a time: the leader before its death, the standby only after it
    by_leader = [h for h in history if h.actor == leader.name]
    by_standby = [h for h in history if h.actor == standby.name]
    assert {(h.task_id, h.epoch) for h in expiries if h.actor == leader.name} == {
        (t, 1) for t in first}
    assert {(h.task_id, h.epoch) for h in expiries if h.actor == standby.name} == {
        *((t, 2) for t in first), *((t, 1) for t in second)}
    assert all(h.at < killed_at for h in by_leader)
    assert by_standby and all(h.at > killed_at for h in by_standby)
    assert cluster.lease() == (standby.name, 2), "the lease changed hands more than once"
    assert set(cluster.completions().values()) == {1}
    assert len(cluster.completions()) == 2 * BATCH


def released(cluster: Cluster, failures: dict[str, int]) -> bool:
    """Every listed task is pending and unlocked with exactly that failure_count."""
    tasks = cluster.tasks()
    return all(tasks[t][:3] == ("pending", None, n) for t, n in failures.items())

"""SIGKILL a worker mid-step: the survivor finishes every task, none twice, none lost (M4, M5)."""

from __future__ import annotations

from collections import Counter

import pytest
from chaosapp import PIPELINE, STEP_TIMEOUT

from support.chaos import Cluster, History
from support.process import HANG_GUARD

pytestmark = pytest.mark.chaos

TASKS = 100
CONCURRENCY = 10  # per worker: 100 tasks of a 0.5 s step keep both busy for ~2.5 s
SLOW = 0.5
STEPS = ("a", "b", "c")
# No wait here is timed: how long recovery takes is measured by bench/recovery.py
# (kill -> released, kill -> all done, against step timeout + interval + 1 s).


def test_sigkilled_worker_is_recovered_by_the_survivor_once_at_its_complete_by(
        cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """Without a restart of the killed worker, every task ends processed; each task
    it held is released by the survivor's supervisor as expired, once, after its
    complete-by on the store's clock; each step completes exactly once, and every
    step's effect happened."""
    cluster.submit(PIPELINE, {f"t{i:03d}": {"n": i} for i in range(TASKS)})
    victim = cluster.spawn("victim", concurrency=CONCURRENCY, slow=SLOW)
    survivor = cluster.spawn("survivor", concurrency=CONCURRENCY, slow=SLOW)

    cluster.wait_for(
        "the victim to have 3+ slow steps in flight while the survivor is working",
        lambda: len(cluster.in_flight(victim.pid, "b")) >= 3
        and any(e.pid == survivor.pid for e in cluster.effects()),
        timeout=HANG_GUARD)
    killed_at = victim.kill()
    interrupted = cluster.in_flight(victim.pid)  # final: the victim writes nothing more
    assert interrupted, "the kill must land while the victim has steps in flight"

    # the victim may have held the supervisor lease: the survivor waits it out, then sweeps
    cluster.wait_for(f"all {TASKS} tasks processed without restarting the victim",
                     lambda: cluster.all_in(["processed"], TASKS), timeout=HANG_GUARD)

    history = cluster.history()
    expiries = [h for h in history if h.expiry]
    recovered = {task: recovery_of(history, task, victim.name) for task in interrupted}
    finished_at = max(h.at for h in history if h.step is None and h.to_state == "processed")
    recovery = finished_at - killed_at
    detection = max(r.at for _, r in recovered.values()) - killed_at
    request.node.user_properties.append(("recovery_seconds", round(recovery, 3)))
    print(f"\nkill -> all {TASKS} terminal: {recovery:.2f}s;"
          f" kill -> last interrupted task expired: {detection:.2f}s;"
          f" interrupted: {len(interrupted)}")

    # no step committed by two owners: one 'completed' transition per unit, and only those
    done = cluster.completions()
    expected = {(f"t{i:03d}", step, "do") for i in range(TASKS) for step in STEPS}
    assert set(done) == expected
    assert [u for u, n in done.items() if n != 1] == []

    # the dead worker wrote nothing after its death
    assert [h for h in history if h.actor == victim.name and h.at >= killed_at] == []

    # every interrupted task was recovered by the survivor's supervisor, as expired, not
    # before the complete-by its start set (store clock), each expiry once
    effects = cluster.effects()
    for task, (started, expiry) in recovered.items():
        step = started.why.rsplit("; ", 1)[-1].removesuffix(" started") if started.why else ""
        assert expiry.actor == survivor.name, (task, expiry)
        why = expiry.why or ""
        assert why.startswith(f"{step}: expired (") and why.endswith(": released"), (
            task, expiry)
        # The start committed at started.at, but its complete-by was set from the
        # scheduler's clock a moment earlier, when it handled the previous step's reply:
        # after that step's agent had ended, and after the previous history row.
        set_no_earlier_than = max(
            [e.at for e in effects if e.task == task and e.event == "end" and e.at <= started.at]
            + [h.at for h in history if h.task_id == task and h.id < started.id])
        assert expiry.at >= set_no_earlier_than + STEP_TIMEOUT, (task, started, expiry)
    per_epoch = Counter((h.task_id, h.epoch) for h in expiries)
    assert [k for k, n in per_epoch.items() if n != 1] == [], "an expiry was counted twice"

    # no effect lost: each committed result comes from an agent run that did finish
    ended = {(e.task, e.step, e.pid) for e in effects if e.event == "end"}
    for step in STEPS:
        for task, result in cluster.results(step).items():
            assert (task, step, result["pid"]) in ended, (task, step, result)
    # and the interrupted steps ran again, on the survivor
    for task in interrupted:
        step = next(e.step for e in reversed(effects)
                    if e.task == task and e.pid == victim.pid and e.event == "start")
        assert cluster.results(step)[task]["pid"] == survivor.pid, (task, step)


def recovery_of(history: list[History], task: str, victim: str) -> tuple[History, History]:
    """The victim's last start of a step of `task` and the first expiry after it."""
    starts = [h for h in history if h.task_id == task and h.step is None
              and h.actor == victim and (h.why or "").endswith(" started")]
    assert starts, f"{task}: the victim never started a step of it"
    started = starts[-1]
    after = [h for h in history if h.task_id == task and h.id > started.id and h.expiry]
    assert after, f"{task}: finished without an expiry after the victim's start"
    return started, after[0]

"""SIGSTOP a scheduler past its tasks' complete-by: once they are released and done
elsewhere, the resumed process can change nothing (M1 fencing, S5)."""

from __future__ import annotations

import signal

import pytest
from chaosapp import HOLD, STEP_TIMEOUT

from support.chaos import Cluster
from support.process import HANG_GUARD

pytestmark = pytest.mark.chaos

TASKS = 5
FROZEN_SLOW = 1.0  # under STEP_TIMEOUT: were it not frozen, the worker would finish in time


def test_resumed_scheduler_writes_nothing_after_its_tasks_were_released(
        cluster: Cluster) -> None:
    """The frozen worker's agents finish only after it resumes; by then the supervisor
    released its tasks and a live worker completed them at a later epoch, so every
    late reply or write of the resumed worker is fenced off and it exits cleanly."""
    tasks = [f"f{i}" for i in range(TASKS)]
    cluster.submit(HOLD, {task: {} for task in tasks})
    # agents run in the frozen process too: their replies can only come after the resume
    frozen = cluster.spawn("frozen", roles=("scheduler", "agent"), slow=FROZEN_SLOW)
    cluster.wait_for("the frozen worker to start every task",
                     lambda: len(cluster.in_flight(frozen.pid)) == TASKS, timeout=HANG_GUARD)
    stopped_at = frozen.freeze()

    # started only now, so nothing could be claimed before the freeze
    cluster.spawn("supervisor", roles=("supervisor",))
    live = cluster.spawn("live", roles=("scheduler", "agent"), slow=0.05)
    cluster.wait_for("the live worker to finish the released tasks",
                     lambda: cluster.all_in(["processed"], TASKS),
                     timeout=HANG_GUARD)

    resumed_at = frozen.thaw()
    cluster.wait_for("the frozen worker's agents to finish their work after the resume",
                     lambda: not cluster.in_flight(frozen.pid), timeout=HANG_GUARD)
    frozen.signal(signal.SIGTERM)  # whatever it still holds, it tries to hand back now
    assert frozen.popen.wait(timeout=HANG_GUARD) == 0, frozen.tail()
    # the frozen process is gone: anything it could have written is in the store by now

    history = cluster.history()
    late = [e for e in cluster.effects() if e.pid == frozen.pid and e.event == "end"]
    assert sorted(e.task for e in late) == tasks
    assert all(e.at > resumed_at for e in late), "the frozen agents must finish after resuming"

    results = cluster.results("hold")
    for task in tasks:
        rows = [h for h in history if h.task_id == task]
        claim = next(h for h in rows if h.actor == frozen.name and h.step is None)
        assert claim.epoch == 1 and resumed_at > claim.at + STEP_TIMEOUT, (
            "the freeze must outlast the complete-by")
        [release] = [h for h in rows if h.expiry]
        assert (release.actor, release.epoch) == ("supervisor", 1)
        # the frozen worker wrote only before it froze, and nothing at all after the release
        frozen_rows = [h for h in rows if h.actor == frozen.name]
        assert all(h.epoch == 1 and h.at <= stopped_at for h in frozen_rows), frozen_rows
        assert all(h.id < release.id for h in frozen_rows), frozen_rows
        # completed once, by the live worker, at the later epoch
        done = [h for h in rows if h.step is not None and h.to_state == "completed"]
        assert [(h.actor, h.epoch) for h in done] == [(live.name, 2)], done
        assert results[task] == {"pid": live.pid}
        last = [h for h in rows if h.step is None][-1]
        assert (last.to_state, last.actor) == ("processed", live.name)
    assert cluster.states() == {"processed": TASKS}

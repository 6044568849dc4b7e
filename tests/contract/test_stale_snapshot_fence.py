"""A transition applies only to the task exactly as it was read, its step included
(DESIGN invariants 2 and 4, SPEC M1, S8): run against every store.

A supervisor reads a task whose step has passed its complete-by. Before it writes,
the owning scheduler applies that step's late reply, which starts the next step
with a complete-by computed when the reply came, also past by the time it is
written (the store was away meanwhile, or the scheduler paused). Epoch, state and
owner are unchanged and complete-by is past: the supervisor's expiry of the step it
read must still not apply, or the completed step is released and run a second time.
"""

from __future__ import annotations

from sasflow.model import TaskState
from support.stores import PLANS, Clock, StoreFactory, claim_one, fresh, submitted


async def test_expiry_read_before_the_next_step_started_does_not_apply(
        make_store: StoreFactory, clock: Clock) -> None:
    """The supervisor's expiry of step 1, read before the scheduler moved the task to step 2
    (whose complete-by is past too), writes nothing; the step-2 expiry read anew does."""
    store = make_store(clock=clock)
    plan = PLANS["order"]
    await submitted(store, "o1")
    running = await claim_one(store, "sched")  # reserve, complete-by now + 5
    planned_at = clock.now + 1  # the reply came then: charge's complete-by is planned_at + 10
    done = plan.reply(running, "sched", True, {"ok": 1}, None, planned_at)

    clock.advance(30)  # the write is late: reserve's and charge's complete-by have both passed
    [seen] = await store.expired(10)  # the supervisor's snapshot: reserve running, expired
    assert seen.cursor == 0
    assert await store.apply(done)  # the scheduler's late write: charge started, same epoch
    stale = plan.expire(seen, "sup", store.now())
    assert not await store.apply(stale), "an expiry of a step the task has left applied"

    task = await fresh(store, "o1")
    assert (task.state, task.cursor, task.epoch) == (TaskState.PROCESSING, 1, 1)
    assert [s.state.value for s in task.steps] == ["completed", "running", "pending"]
    [now_seen] = await store.expired(10)  # read again: charge expired, and that applies
    assert await store.apply(plan.expire(now_seen, "sup", store.now()))
    task = await fresh(store, "o1")
    assert (task.state, task.cursor, task.steps[0].state.value) == (
        TaskState.PENDING, 1, "completed")

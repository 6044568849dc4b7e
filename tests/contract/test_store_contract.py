"""The state store contract (SPEC S10, E2, E3, M1, M3): run against every store.

Written against the `Store` protocol only. Time is the store's injected clock,
moved by the test, so expiry and leases are exact and nothing sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sasflow.errors import StoreError, TaskConflictError
from sasflow.messages import decode_status
from sasflow.model import Phase, StepState, TaskState, idempotency_key
from sasflow.plan import Plan
from sasflow.store import Store
from sasflow.store.listing import TaskQuery
from sasflow.store.records import Alert, Instance, NewTask
from sasflow.transition import LeaseFence, Transition
from sasflow.transport import DeadLetter
from sasflow.workflow import Step, Workflow
from support.stores import (
    AGENTS,
    COMPENSABLE,
    ORDER,
    PLANS,
    SLOW,
    Clock,
    StoreFactory,
    applies,
    assert_stored_as_planned,
    claim_one,
    fresh,
    new_task,
    submitted,
)

T, S = TaskState, StepState


# ---------------------------------------------------------------- submit (E2)


async def test_submit_creates_a_pending_unlocked_task(store: Store, clock: Clock) -> None:
    """E2: pending, LockedBy and CompleteBy null, FailureCount 0; every step pending."""
    assert await store.submit(new_task("order-1", input={"order_id": 1, "items": ["a"]}))
    task = await fresh(store, "order-1")
    assert (task.state, task.locked_by, task.complete_by, task.failure_count, task.epoch) == (
        T.PENDING, None, None, 0, 0)
    assert task.input == {"order_id": 1, "items": ["a"]}
    assert task.created_at == clock.now
    assert [(s.name, s.agent, s.state, s.attempts, s.idempotency_key) for s in task.steps] == [
        (name, agent, S.PENDING, 0, idempotency_key("order-1", name))
        for name, agent in (("reserve", "inventory"), ("charge", "payments"),
                            ("ship", "shipping"))]


async def test_submit_is_idempotent_on_the_task_id(store: Store) -> None:
    """The same submission again is a no-op that reports the task existed."""
    assert await store.submit(new_task("order-1"))
    assert not await store.submit(new_task("order-1"))
    assert [t.task_id for t in await store.list_tasks(TaskQuery())] == ["order-1"]
    assert len(await store.history("order-1")) == 1


async def test_submit_with_other_input_or_workflow_conflicts(store: Store) -> None:
    """A task id reused for different work is refused; the original stays as it was."""
    await store.submit(new_task("order-1", input={"n": 1}))
    with pytest.raises(TaskConflictError) as caught:
        await store.submit(new_task("order-1", input={"n": 2}))
    assert caught.value.task_id == "order-1"
    with pytest.raises(TaskConflictError):
        await store.submit(new_task("order-1", workflow="slow", input={"n": 1}))
    task = await fresh(store, "order-1")
    assert (task.workflow, task.input, len(task.steps)) == ("order", {"n": 1}, 3)


async def test_get_of_an_unknown_task_is_none(store: Store) -> None:
    assert await store.get("nope") is None
    assert await store.history("nope") == []


async def test_list_filters_by_state_and_workflow(store: Store, clock: Clock) -> None:
    """list: oldest first, filtered by state and workflow, bounded by limit."""
    for n, workflow in enumerate(["order", "slow", "order"]):
        await submitted(store, f"t{n}", workflow=workflow)
        clock.advance(1)
    await store.claim("s1", 1, {"slow": PLANS["slow"]})
    assert [t.task_id for t in await store.list_tasks(TaskQuery())] == ["t0", "t1", "t2"]
    assert [t.task_id for t in await store.list_tasks(TaskQuery(state=T.PENDING))] == ["t0", "t2"]
    assert [t.task_id for t in await store.list_tasks(TaskQuery(state=T.PROCESSING))] == ["t1"]
    first_order = await store.list_tasks(TaskQuery(workflow="order", limit=1))
    assert [t.task_id for t in first_order] == ["t0"]


# ---------------------------------------------------------------- claim (E3, M1)


async def test_claim_locks_starts_the_step_and_bumps_the_epoch(store: Store,
                                                               clock: Clock) -> None:
    """E3: LockedBy = me, CompleteBy = now + timeout, processing, epoch + 1, step running."""
    await submitted(store, "order-1")
    claimed = await claim_one(store, "s1")
    stored = await fresh(store, "order-1")
    assert (stored.state, stored.locked_by, stored.complete_by, stored.epoch) == (
        T.PROCESSING, "s1", clock.now + 5.0, 1)
    assert (stored.steps[0].state, stored.steps[0].attempts) == (S.RUNNING, 1)
    assert_stored_as_planned(stored, claimed)
    assert await store.claim("s2", 10, PLANS) == []  # locked: nobody else gets it


async def test_a_task_claimed_with_its_submission_is_stored_as_a_claim_leaves_it(
        store: Store, clock: Clock) -> None:
    """submit_claimed: the task is written and claimed in one transaction, exactly as a
    submission then a claim leave it (history included), and no other claim finds it."""
    claimed = await store.submit_claimed(new_task("order-1"), "s1", PLANS["order"])
    assert claimed is not None
    stored = await fresh(store, "order-1")
    assert (stored.state, stored.locked_by, stored.complete_by, stored.epoch) == (
        T.PROCESSING, "s1", clock.now + 5.0, 1)
    assert (stored.steps[0].state, stored.steps[0].attempts) == (S.RUNNING, 1)
    assert_stored_as_planned(stored, claimed)
    await submitted(store, "order-2")  # the same, the usual way, for comparison
    await claim_one(store, "s1")
    both = [[(h.actor, h.epoch, h.step, h.from_state, h.to_state, h.why)
             for h in await store.history(task_id)] for task_id in ("order-1", "order-2")]
    assert both[0] == both[1] and len(both[0]) >= 2
    assert await store.claim("s2", 10, PLANS) == []  # locked: nobody else gets it


async def test_a_task_that_exists_is_neither_written_nor_claimed_again(
        store: Store) -> None:
    """submit_claimed of an existing id writes nothing, claims nothing and says None; one
    that differs is refused as submit refuses it."""
    await submitted(store, "order-1")
    assert await store.submit_claimed(new_task("order-1"), "s1", PLANS["order"]) is None
    task = await fresh(store, "order-1")
    assert (task.state, task.locked_by, task.epoch) == (T.PENDING, None, 0)
    assert len(await store.history("order-1")) == 1
    with pytest.raises(TaskConflictError):
        await store.submit_claimed(new_task("order-1", input={"n": 2}), "s1", PLANS["order"])
    assert (await fresh(store, "order-1")).epoch == 0


async def test_claim_respects_limit_and_known_workflows(store: Store) -> None:
    """A scheduler takes at most `limit` tasks, and only of the workflows it knows."""
    await submitted(store, "a1", "a2", "a3")
    await submitted(store, "s1", workflow="slow")
    got = await store.claim("s1", 2, {"order": PLANS["order"]})
    assert sorted(t.task_id for t in got) == ["a1", "a2"]
    got = await store.claim("s1", 10, {"order": PLANS["order"]})
    assert [t.task_id for t in got] == ["a3"]
    assert (await fresh(store, "s1")).state is T.PENDING
    assert await store.claim("s1", 0, PLANS) == []
    assert await store.claim("s1", 5, {}) == []


async def test_concurrent_claims_never_share_a_task(store: Store) -> None:
    """M1: two owners claiming at the same moment get disjoint tasks, each locked to them."""
    ids = [f"t{n:02}" for n in range(20)]
    await submitted(store, *ids)
    first, second = await asyncio.gather(store.claim("s1", 12, PLANS),
                                         store.claim("s2", 12, PLANS))
    mine = {t.task_id for t in first}
    theirs = {t.task_id for t in second}
    assert not mine & theirs
    assert mine | theirs == set(ids)
    for task in await store.list_tasks(TaskQuery(limit=100)):
        assert task.locked_by == ("s1" if task.task_id in mine else "s2")
        assert task.epoch == 1


async def test_claims_from_two_store_instances_never_share_a_task(
        make_store: StoreFactory, clock: Clock) -> None:
    """M1 across hosts: instances on the same database claim disjoint tasks."""
    one, two = make_store(clock=clock), make_store(clock=clock)
    ids = [f"t{n:02}" for n in range(40)]
    await submitted(one, *ids)
    taken: list[set[str]] = [set(), set()]
    for _ in range(4):  # several rounds of racing claims
        results = await asyncio.gather(one.claim("host-1", 7, PLANS),
                                       two.claim("host-2", 7, PLANS))
        for got, tasks in zip(taken, results, strict=True):
            got.update(t.task_id for t in tasks)
    assert not taken[0] & taken[1]
    assert len(taken[0]) + len(taken[1]) == 40
    for task in await two.list_tasks(TaskQuery(limit=100)):
        assert task.locked_by == ("host-1" if task.task_id in taken[0] else "host-2")


async def test_a_released_task_waits_out_its_backoff(store: Store, clock: Clock) -> None:
    """A released task is claimable only from its available-at time on."""
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    clock.advance(6)
    assert await store.apply(PLANS["order"].expire(task, "sup", clock.now))
    assert await store.claim("s2", 1, PLANS) == []
    clock.advance(0.49)  # retry_backoff 0.5 after the first failure
    assert await store.claim("s2", 1, PLANS) == []
    clock.advance(0.02)
    task = await claim_one(store, "s2")
    assert (task.locked_by, task.epoch, task.failure_count) == ("s2", 2, 1)


# ---------------------------------------------------------------- apply and fencing (M1)


async def test_apply_writes_the_whole_transition(store: Store, clock: Clock) -> None:
    """Steps, results and the task move together, exactly as planned."""
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    plan = PLANS["order"]
    clock.advance(1)
    task = await applies(store, task, plan.reply(task, "s1", True, {"sku": 7}, None, clock.now))
    stored = await fresh(store, "order-1")
    assert_stored_as_planned(stored, task)
    assert (stored.cursor, stored.steps[0].result, stored.steps[1].state) == (
        1, {"sku": 7}, S.RUNNING)
    assert stored.complete_by == clock.now + 10.0


async def test_a_reply_from_a_fenced_out_owner_changes_nothing(store: Store,
                                                               clock: Clock) -> None:
    """M1: after a takeover, the old owner's write (stale epoch) is refused whole."""
    plan = PLANS["order"]
    await submitted(store, "order-1")
    old = await claim_one(store, "s1")
    clock.advance(6)
    assert await store.apply(plan.expire(await fresh(store, "order-1"), "sup", clock.now))
    clock.advance(1)
    await claim_one(store, "s2")
    before = await fresh(store, "order-1")
    history = await store.history("order-1")
    late = plan.reply(old, "s1", True, {"sku": 1}, None, clock.now)
    assert late.epoch == 1
    assert not await store.apply(late)
    assert await fresh(store, "order-1") == before
    assert await store.history("order-1") == history


async def test_an_old_epoch_of_the_same_owner_changes_nothing(store: Store,
                                                              clock: Clock) -> None:
    """M1: the same scheduler re-claimed the task; a late reply of its old claim is refused."""
    plan = PLANS["order"]
    await submitted(store, "order-1")
    old = await claim_one(store, "s1")
    clock.advance(6)
    assert await store.apply(plan.expire(await fresh(store, "order-1"), "sup", clock.now))
    clock.advance(1)
    current = await claim_one(store, "s1")
    assert (old.epoch, current.epoch) == (1, 2)
    before = await fresh(store, "order-1")
    assert not await store.apply(plan.reply(old, "s1", True, {"sku": 1}, None, clock.now))
    assert await fresh(store, "order-1") == before
    assert await store.apply(plan.reply(current, "s1", True, {"sku": 2}, None, clock.now))
    assert (await fresh(store, "order-1")).steps[0].result == {"sku": 2}


async def test_a_write_by_a_scheduler_that_does_not_hold_the_task_changes_nothing(
        store: Store, clock: Clock) -> None:
    """M1: right epoch, wrong owner: refused, nothing written."""
    await submitted(store, "order-1")
    await claim_one(store, "s1")
    before = await fresh(store, "order-1")
    forged = PLANS["order"].reply(await fresh(store, "order-1"), "intruder", True, 1, None,
                                  clock.now)
    assert not await store.apply(forged)
    assert await fresh(store, "order-1") == before


async def test_a_transition_computed_from_another_state_changes_nothing(
        store: Store, clock: Clock) -> None:
    """A write based on a state the task has left (here: cancelled meanwhile) is refused."""
    plan = PLANS["order"]
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    assert await store.apply(plan.cancel(await fresh(store, "order-1"), clock.now))
    assert not await store.apply(plan.reply(task, "s1", True, 1, None, clock.now))
    stored = await fresh(store, "order-1")
    assert (stored.state, stored.steps[0].state) == (T.CANCELLED, S.FAILED)
    assert stored.steps[0].result is None  # the late reply's result was not written


async def test_the_store_refuses_a_move_the_lifecycle_forbids(store: Store,
                                                              clock: Clock) -> None:
    """Stores check model.can_move: processed -> pending is refused with StoreError."""
    await submitted(store, "order-1")
    forbidden = Transition(task_id="order-1", actor="x", why="bad", epoch=0,
                           from_state=T.PROCESSED, owner=None, from_phase=Phase.DO,
                           from_cursor=0, from_version=ORDER.version, state=T.PENDING,
                           phase=Phase.DO, cursor=0, locked_by=None, failure_count=0,
                           available_at=clock.now, new_epoch=0, version=ORDER.version)
    with pytest.raises(StoreError):
        await store.apply(forbidden)
    assert (await fresh(store, "order-1")).state is T.PENDING


async def test_the_same_transition_written_twice_changes_nothing_more(store: Store,
                                                                    clock: Clock) -> None:
    """Values under a fence: the same transition written again (a write retried) applies
    to nothing; the task, its steps and its history stay as the first write left them."""
    plan = PLANS["order"]
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    reply = plan.reply(task, "s1", True, {"sku": 7}, None, clock.now)
    task = await applies(store, task, reply)
    history = await store.history("order-1")
    clock.advance(1)
    assert not await store.apply(reply)
    assert_stored_as_planned(await fresh(store, "order-1"), task)
    assert await store.history("order-1") == history


async def test_a_saga_is_stored_as_planned_at_every_step(store: Store, clock: Clock) -> None:
    """S9 round trip: every transition of a compensated task lands exactly as planned."""
    plan = PLANS["order"]
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    replies = [(True, {"sku": 7}, None), (True, {"charge": 9}, None),
               (False, None, "address refused")]
    for ok, result, error in replies:
        clock.advance(1)
        task = await applies(store, task, plan.reply(task, "s1", ok, result, error, clock.now))
        assert_stored_as_planned(await fresh(store, "order-1"), task)
    # ship refused -> charge has no compensator -> reserve's undo is running
    stored = await fresh(store, "order-1")
    assert (stored.state, stored.phase, stored.cursor) == (T.COMPENSATING, Phase.UNDO, 0)
    undo = stored.steps[0].compensation
    assert undo is not None
    assert (undo.state, undo.attempts, undo.complete_by) == (S.RUNNING, 1, clock.now + 5.0)
    assert undo.idempotency_key == idempotency_key("order-1", "reserve", Phase.UNDO)
    clock.advance(1)
    task = await applies(store, task, plan.reply(task, "s1", True, None, None, clock.now))
    stored = await fresh(store, "order-1")
    assert_stored_as_planned(stored, task)
    assert (stored.state, stored.locked_by) == (T.COMPENSATED, None)
    assert [s.state for s in stored.steps] == [S.COMPENSATED, S.COMPLETED, S.FAILED]
    assert stored.steps[0].result == {"sku": 7}  # kept for the record


async def test_operator_actions_apply_to_an_unlocked_task(store: Store, clock: Clock) -> None:
    """E8: error + alert, then an operator retry makes it claimable again at the failed step."""
    plan = PLANS["alerting"]
    await submitted(store, "order-1", workflow="alerting")
    task = await claim_one(store, "s1")
    task = await applies(store, task, plan.reply(task, "s1", False, None, "declined", clock.now))
    assert (await fresh(store, "order-1")).state is T.ERROR
    task = await fresh(store, "order-1")
    task = await applies(store, task, plan.retry(task, clock.now))
    assert_stored_as_planned(await fresh(store, "order-1"), task)
    again = await claim_one(store, "s2")
    assert (again.steps[0].state, again.steps[0].attempts, again.steps[0].failure_count) == (
        S.RUNNING, 2, 0)


# ---------------------------------------------------------------- supervisor (S7, E9, M3)


async def test_expired_returns_only_locked_tasks_past_complete_by(store: Store,
                                                                  clock: Clock) -> None:
    """S7: the sweep sees running units whose complete-by passed, nothing else."""
    await submitted(store, "fast")
    await submitted(store, "slow", workflow="slow")
    await store.claim("s1", 10, PLANS)
    await submitted(store, "idle")  # pending, never claimed
    assert await store.expired(10) == []
    clock.advance(5.0)
    assert await store.expired(10) == []  # complete-by itself is not past it yet
    clock.advance(0.01)
    [expired] = await store.expired(10)
    assert (expired.task_id, expired.state, expired.locked_by) == ("fast", T.PROCESSING, "s1")
    assert expired.steps[0].state is S.RUNNING  # with its steps, ready for the planner
    clock.advance(50)
    assert sorted(t.task_id for t in await store.expired(10)) == ["fast", "slow"]
    assert len(await store.expired(1)) == 1


async def test_a_released_task_is_no_longer_expired(store: Store, clock: Clock) -> None:
    """After the supervisor's release the task leaves the sweep."""
    await submitted(store, "order-1")
    await claim_one(store, "s1")
    clock.advance(6)
    [task] = await store.expired(10)
    assert await store.apply(PLANS["order"].expire(task, "sup", clock.now))
    assert await store.expired(10) == []
    stored = await fresh(store, "order-1")
    assert (stored.state, stored.locked_by, stored.complete_by, stored.failure_count) == (
        T.PENDING, None, None, 1)


async def test_an_expiry_decided_before_the_deadline_is_not_applied(store: Store,
                                                                    clock: Clock) -> None:
    """The supervisor's write is conditional on complete_by < now (DESIGN invariant 4)."""
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    early = PLANS["order"].expire(task, "sup", clock.now + 1)
    assert not await store.apply(early)
    assert (await fresh(store, "order-1")).state is T.PROCESSING


async def test_an_expiry_read_before_the_reply_landed_does_not_undo_the_step(
        store: Store, clock: Clock) -> None:
    """A reply whose write landed after the next step's complete-by (the database was
    down meanwhile) leaves the task in the same epoch, state and owner; the expiry the
    supervisor read before it must not roll the completed step back to be run again."""
    plan = PLANS["order"]
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    clock.advance(4.9)  # the reply comes just before reserve's complete-by...
    reply = plan.reply(task, "s1", True, {"sku": 7}, None, clock.now)
    clock.advance(10.2)  # ...but its write lands past charge's: already expired
    [seen] = await store.expired(10)  # the supervisor reads reserve running, expired
    assert (seen.cursor, seen.steps[0].state) == (0, S.RUNNING)
    assert await store.apply(reply)
    assert not await store.apply(plan.expire(seen, "sup", clock.now))
    stored = await fresh(store, "order-1")
    assert (stored.cursor, stored.steps[0].state, stored.steps[0].result) == (
        1, S.COMPLETED, {"sku": 7})
    [expired] = await store.expired(10)  # charge's own expiry, read now, applies
    assert await store.apply(plan.expire(expired, "sup", clock.now))
    stored = await fresh(store, "order-1")
    assert (stored.cursor, stored.steps[0].state, stored.steps[1].state) == (
        1, S.COMPLETED, S.PENDING)


async def test_an_operator_action_read_before_a_reply_landed_is_refused(
        store: Store, clock: Clock) -> None:
    """An operator's compensation planned from the task before the scheduler's reply
    advanced it (same epoch, state and owner) is refused: applied, it would undo from
    the step it read and leave the running one's effect never undone."""
    plan = PLANS["order"]
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    read = await fresh(store, "order-1")
    task = await applies(store, task, plan.reply(task, "s1", True, {"sku": 7}, None, clock.now))
    assert not await store.apply(plan.compensate(read, clock.now))
    stored = await fresh(store, "order-1")
    assert (stored.state, stored.cursor, stored.locked_by) == (T.PROCESSING, 1, "s1")
    assert await store.apply(plan.compensate(stored, clock.now))  # read again: it applies


async def test_an_expiry_decided_on_a_unit_its_owner_has_left_is_not_applied(
        store: Store, clock: Clock) -> None:
    """M1: the owner's reply, held up past the complete-by (a database restart), records
    the step and starts the next with a complete-by already past; the supervisor's
    expiry, read before, must not rewind the task to the completed step."""
    await submitted(store, "order-1")
    task = await claim_one(store, "s1")
    planned_at = clock.now
    clock.advance(6)  # reserve (5 s) expired; the owner's write is still on its way
    [stale] = await store.expired(10)
    late = PLANS["order"].reply(task, "s1", True, {"sku": 1}, None, planned_at + 0.5)
    assert await store.apply(late)  # charge started, its complete-by (10 s) not yet passed
    clock.advance(5)  # now charge's has passed too
    assert not await store.apply(PLANS["order"].expire(stale, "sup", clock.now))
    stored = await fresh(store, "order-1")
    assert (stored.cursor, stored.locked_by, stored.steps[0].state) == (1, "s1", S.COMPLETED)


async def test_concurrent_supervisors_count_an_expiry_once(store: Store, clock: Clock) -> None:
    """M3: two supervisors recovering the same expiry at once: one applies, FailureCount 1."""
    await submitted(store, "order-1")
    await claim_one(store, "s1")
    clock.advance(6)
    [a] = await store.expired(10)
    [b] = await store.expired(10)
    plan = PLANS["order"]
    results = await asyncio.gather(store.apply(plan.expire(a, "sup-1", clock.now)),
                                   store.apply(plan.expire(b, "sup-2", clock.now)))
    assert sorted(results) == [False, True]
    assert (await fresh(store, "order-1")).failure_count == 1


async def test_supervisors_on_two_instances_count_an_expiry_once(
        make_store: StoreFactory, clock: Clock) -> None:
    """M3 across hosts: the same race through two store instances."""
    one, two = make_store(clock=clock), make_store(clock=clock)
    plan = PLANS["order"]
    await submitted(one, *[f"t{n}" for n in range(10)])
    await one.claim("s1", 10, PLANS)
    clock.advance(6)
    first, second = await one.expired(100), await two.expired(100)
    results = await asyncio.gather(
        *(one.apply(plan.expire(t, "sup-1", clock.now)) for t in first),
        *(two.apply(plan.expire(t, "sup-2", clock.now)) for t in second))
    assert sum(results) == 10
    assert {t.failure_count for t in await one.list_tasks(TaskQuery(limit=100))} == {1}


# ---------------------------------------------------------------- instances (R2)


def instance(instance_id: str, **declared: Any) -> Instance:
    return Instance(instance_id=instance_id, host="host-a", pid=4321,
                    roles=declared.get("roles", ["scheduler", "agent"]),
                    agents=declared.get("agents", ["inventory"]),
                    workflows=declared.get("workflows", {"order": ORDER.version}))


async def test_an_instance_beats_on_the_stores_clock(store: Store, clock: Clock) -> None:
    """R2: a heartbeat records what the instance declares and when, on the store's clock;
    a later beat renews it and keeps when it started."""
    assert await store.instances() == []
    await store.beat(instance("w-1"))
    clock.advance(2.5)
    await store.beat(instance("w-1", agents=["inventory", "payments"]))
    await store.beat(instance("w-2", roles=["supervisor"], agents=[], workflows={}))
    first, second = await store.instances()
    assert (first.instance_id, first.started_at, first.beat_at) == ("w-1", clock.now - 2.5,
                                                                   clock.now)
    assert first.agents == ["inventory", "payments"]
    assert first.workflows == {"order": ORDER.version} and first.stopped_at is None
    assert (second.instance_id, second.roles, second.workflows) == ("w-2", ["supervisor"], {})
    assert await store.instances(instance_id="w-2") == [second]
    assert await store.instances(instance_id="nobody") == []


async def test_a_stopped_instance_says_so_until_it_beats_again(store: Store,
                                                               clock: Clock) -> None:
    """A clean shutdown is recorded; the same instance id starting again clears it."""
    await store.beat(instance("w-1"))
    clock.advance(1)
    await store.stopped("w-1")
    [stopped] = await store.instances(instance_id="w-1")
    assert stopped.stopped_at == clock.now
    clock.advance(1)
    await store.beat(instance("w-1"))
    [running] = await store.instances(instance_id="w-1")
    assert running.stopped_at is None and running.beat_at == clock.now


async def test_an_instance_keeps_the_lease_it_declares(store: Store) -> None:
    """R2: the heartbeat lease an instance declares is stored with its beat."""
    await store.beat(Instance(instance_id="w-1", host="h", pid=1, roles=["agent"], agents=[],
                              workflows={}, lease=7.5))
    [found] = await store.instances(instance_id="w-1")
    assert found.lease == 7.5


async def test_orphaned_lists_the_tasks_of_gone_instances_only(store: Store,
                                                               clock: Clock) -> None:
    """R2: tasks locked by an instance silent past its lease, or stopped, are orphaned;
    not those of an instance that beats, nor those whose owner never beat (left to
    their complete-by), nor unlocked ones."""
    await submitted(store, "t-alive", "t-silent", "t-stopped", "t-unknown", "t-free")
    for owner, task_id in (("alive", "t-alive"), ("silent", "t-silent"),
                           ("stopped", "t-stopped"), ("unknown", "t-unknown")):
        if owner != "unknown":  # as a worker of a release without heartbeats
            await store.beat(Instance(instance_id=owner, host="h", pid=1,
                                      roles=["scheduler"], agents=[], workflows={}, lease=3.0))
        [task] = await store.claim(owner, 1, PLANS)
        assert task.task_id == task_id
    await store.stopped("stopped")
    assert [t.task_id for t in await store.orphaned(10)] == ["t-stopped"]
    clock.advance(2.0)
    await store.beat(Instance(instance_id="alive", host="h", pid=1, roles=["scheduler"],
                              agents=[], workflows={}, lease=3.0))
    clock.advance(1.5)  # "silent" beat 3.5 s ago, past its 3 s lease; "alive" 1.5 s ago
    orphans = await store.orphaned(10)
    assert sorted(t.task_id for t in orphans) == ["t-silent", "t-stopped"]
    assert all(len(t.steps) == 3 and t.steps[0].state is S.RUNNING for t in orphans)
    assert [t.task_id for t in await store.orphaned(1)] == ["t-silent"]  # (a tie: by id)


async def test_instances_gone_for_long_are_forgotten_unless_they_hold_a_task(
        store: Store, clock: Clock) -> None:
    """Rows of instances silent since before the cut-off are deleted, stopped or not;
    one that still holds a task stays, so that its orphans are still found."""
    await submitted(store, "t-held")
    for name in ("stopped-long-ago", "crashed-long-ago", "holder"):
        await store.beat(instance(name))
    [held] = await store.claim("holder", 1, PLANS)
    await store.stopped("stopped-long-ago")
    clock.advance(100.0)
    await store.beat(instance("recent"))
    clock.advance(1.0)
    assert await store.forget_instances(clock.now - 50.0) == 2
    assert [i.instance_id for i in await store.instances()] == ["holder", "recent"]
    assert [t.task_id for t in await store.orphaned(10)] == [held.task_id]
    assert await store.forget_instances(clock.now - 50.0) == 0  # nothing more to forget


async def test_tasks_an_earlier_process_left_under_the_same_id_are_orphaned(
        store: Store, clock: Clock) -> None:
    """R2: a restarted container keeps its name, so its worker beats under the same id
    at once; what the dead process held is orphaned all the same, and what the new
    one claims is not, through its later beats too."""
    declared = Instance(instance_id="pod-1", host="h", pid=1, roles=["scheduler"], agents=[],
                        workflows={}, lease=10.0)
    await submitted(store, "t-old", "t-new")
    await store.beat(declared, first=True)
    [old] = await store.claim("pod-1", 1, PLANS)
    clock.advance(5.0)  # killed; its successor starts well within the lease
    await store.beat(declared, first=True)
    [new] = await store.claim("pod-1", 1, PLANS)
    assert (old.task_id, new.task_id) == ("t-old", "t-new")
    clock.advance(3.0)
    await store.beat(declared)
    assert [t.task_id for t in await store.orphaned(10)] == ["t-old"]
    [found] = await store.instances(instance_id="pod-1")
    assert found.started_at == clock.now - 3.0


async def test_an_orphan_is_released_at_once_and_counted(store: Store, clock: Clock) -> None:
    """Part 4: the gone holder's unit is released before its complete-by, fenced by the
    supervisors' lease, counted as a failure; the history names the heartbeat."""
    await submitted(store, "order-1")
    await store.beat(Instance(instance_id="dead", host="h", pid=1, roles=["scheduler"],
                              agents=[], workflows={}, lease=1.0))
    claimed = await claim_one(store, "dead")
    clock.advance(2.0)  # past the lease, well before the step's complete-by
    assert claimed.complete_by is not None and clock.now < claimed.complete_by
    epoch = await store.acquire_lease("supervisor", "sup", 3.0)
    assert epoch is not None
    [orphan] = await store.orphaned(10)
    release = PLANS["order"].orphan(orphan, "sup", clock.now)
    release.lease = LeaseFence("supervisor", "sup", epoch)
    assert await store.apply(release)
    stored = await fresh(store, "order-1")
    assert (stored.state, stored.locked_by, stored.failure_count, stored.epoch) == (
        T.PENDING, None, 1, claimed.epoch)
    *_, released = [h for h in await store.history("order-1") if h.step is None]
    assert "holder dead lost its heartbeat lease" in (released.why or "")
    assert await store.orphaned(10) == []
    clock.advance(1.0)  # the workflow's retry backoff
    again = await claim_one(store, "alive")
    assert again.epoch == claimed.epoch + 1


async def test_an_orphan_release_is_not_applied_once_its_holder_went_on(
        store: Store, clock: Clock) -> None:
    """Part 4: a holder that was only paused, and completed its step before the release
    landed, keeps its task: the release is fenced on the unit's complete-by."""
    await submitted(store, "order-1")
    await store.beat(Instance(instance_id="paused", host="h", pid=1, roles=["scheduler"],
                              agents=[], workflows={}, lease=1.0))
    task = await claim_one(store, "paused")
    clock.advance(2.0)
    [orphan] = await store.orphaned(10)
    plan = PLANS["order"]
    task = await applies(store, task, plan.reply(task, "paused", True, {"ok": 1}, None, clock.now))
    late = plan.orphan(orphan, "sup", clock.now)
    assert not await store.apply(late)
    stored = await fresh(store, "order-1")
    assert (stored.locked_by, stored.cursor, stored.failure_count) == ("paused", 1, 0)
    assert stored.steps[0].state is S.COMPLETED


async def test_an_orphan_release_by_a_deposed_supervisor_is_not_applied(
        store: Store, clock: Clock) -> None:
    """M3: the release carries the supervisors' lease fence like every recovery."""
    await submitted(store, "order-1")
    await store.beat(Instance(instance_id="dead", host="h", pid=1, roles=["scheduler"],
                              agents=[], workflows={}, lease=1.0))
    await claim_one(store, "dead")
    old = await store.acquire_lease("supervisor", "sup-1", 1.0)
    assert old is not None
    clock.advance(2.0)
    assert await store.acquire_lease("supervisor", "sup-2", 3.0) is not None
    [orphan] = await store.orphaned(10)
    release = PLANS["order"].orphan(orphan, "sup-1", clock.now)
    release.lease = LeaseFence("supervisor", "sup-1", old)
    assert not await store.apply(release)
    assert (await fresh(store, "order-1")).locked_by == "dead"


# ---------------------------------------------------------------- leases (M3)


async def test_a_lease_has_one_holder_at_a_time(store: Store, clock: Clock) -> None:
    """M3: the first taker holds the lease and renews it; others are refused meanwhile."""
    epoch = await store.acquire_lease("supervisor", "sup-1", 3.0)
    assert epoch is not None
    assert await store.acquire_lease("supervisor", "sup-2", 3.0) is None
    clock.advance(2)
    assert await store.acquire_lease("supervisor", "sup-1", 3.0) == epoch  # renewed
    clock.advance(2)  # 4 s after taking it, but only 2 s after the renewal
    assert await store.acquire_lease("supervisor", "sup-2", 3.0) is None
    assert await store.acquire_lease("other-lease", "sup-2", 3.0) is not None


async def test_an_expired_lease_is_taken_over_with_a_higher_epoch(store: Store,
                                                                  clock: Clock) -> None:
    """When the holder stops renewing, another takes over with a higher fencing epoch."""
    first = await store.acquire_lease("supervisor", "sup-1", 3.0)
    assert first is not None
    clock.advance(3.5)
    second = await store.acquire_lease("supervisor", "sup-2", 3.0)
    assert second is not None and second > first
    assert await store.acquire_lease("supervisor", "sup-1", 3.0) is None  # it lost it
    clock.advance(3.5)
    third = await store.acquire_lease("supervisor", "sup-1", 3.0)
    assert third is not None and third > second


async def test_a_deposed_supervisors_recovery_is_refused(store: Store, clock: Clock) -> None:
    """M3: a recovery fenced with a lease epoch that is no longer current writes nothing;
    the new holder's, with its own epoch, applies."""
    await submitted(store, "order-1")
    await claim_one(store, "s1")
    old = await store.acquire_lease("supervisor", "sup-1", 3.0)
    assert old is not None
    clock.advance(6)  # the step expired, and sup-1's lease too
    new = await store.acquire_lease("supervisor", "sup-2", 3.0)
    assert new is not None and new > old
    [expired] = await store.expired(10)
    stale = PLANS["order"].expire(expired, "sup-1", clock.now)
    stale.lease = LeaseFence("supervisor", "sup-1", old)
    assert not await store.apply(stale)
    assert (await fresh(store, "order-1")).state is T.PROCESSING  # untouched
    [expired] = await store.expired(10)  # read again: the planner moved the snapshot on
    current = PLANS["order"].expire(expired, "sup-2", clock.now)
    current.lease = LeaseFence("supervisor", "sup-2", new)
    assert await store.apply(current)
    assert (await fresh(store, "order-1")).failure_count == 1


async def test_racing_for_a_lease_elects_one(make_store: StoreFactory, clock: Clock) -> None:
    """Two instances asking at once: exactly one holds it."""
    one, two = make_store(clock=clock), make_store(clock=clock)
    results = await asyncio.gather(one.acquire_lease("supervisor", "sup-1", 3.0),
                                   two.acquire_lease("supervisor", "sup-2", 3.0))
    assert sum(r is not None for r in results) == 1


# ---------------------------------------------------------------- outbox (E11)


async def test_status_messages_are_written_with_the_state_change(store: Store,
                                                                 clock: Clock) -> None:
    """E11: each event a transition reports is in the outbox, in order, with the task id."""
    plan = PLANS["order"]
    await submitted(store, "order-1", reply_to="app-1")
    task = await claim_one(store, "s1")
    for result in ({"sku": 1}, {"charge": 2}, {"parcel": 3}):
        task = await applies(store, task, plan.reply(task, "s1", True, result, None, clock.now))
    messages = await store.take_outbox(["app-1"], 100)
    statuses = [decode_status(m.body) for m in messages]
    assert [(s.event, s.step) for s in statuses] == [
        ("received", None), ("step_completed", "reserve"), ("step_completed", "charge"),
        ("step_completed", "ship"), ("processed", None)]
    assert {s.task_id for s in statuses} == {"order-1"}
    assert statuses[-1].state == "processed"
    assert {m.queue for m in messages} == {"app-1"}


async def test_outbox_take_leases_and_ack_removes(store: Store, clock: Clock) -> None:
    """A taken message is not handed out again while leased; acked, it is gone for good."""
    await submitted(store, "a", reply_to="app-1")
    await submitted(store, "b", reply_to="app-1")
    taken = await store.take_outbox(["app-1"], 100)
    assert len(taken) == 2
    assert await store.take_outbox(["app-1"], 100) == []
    await store.ack_outbox([taken[0].id])
    clock.advance(60)  # the relay died: its lease runs out
    again = await store.take_outbox(["app-1"], 100)
    assert [m.id for m in again] == [taken[1].id]  # unacked ones come back, acked do not
    assert again[0].body == taken[1].body
    await store.ack_outbox([taken[1].id])
    clock.advance(60)
    assert await store.take_outbox(None, 100) == []


async def test_outbox_take_filters_by_queue_and_limit(store: Store) -> None:
    """take_outbox(queues) only hands out those queues' messages; None means all."""
    await submitted(store, "a", reply_to="app-1")
    await submitted(store, "b", reply_to="app-2")
    await submitted(store, "c", reply_to="app-2")
    await submitted(store, "d")  # no reply_to: no status messages
    assert await store.take_outbox([], 10) == []
    [one] = await store.take_outbox(["app-1"], 10)
    assert decode_status(one.body).task_id == "a"
    first = await store.take_outbox(None, 1)
    assert [m.queue for m in first] == ["app-2"]
    rest = await store.take_outbox(None, 10)
    assert [decode_status(m.body).task_id for m in first + rest] == ["b", "c"]


# ---------------------------------------------------------------- history and alerts


async def test_history_records_every_transition(store: Store, clock: Clock) -> None:
    """Who, when, from, to and why: for the task and for each unit it touched."""
    plan = PLANS["order"]
    await submitted(store, "order-1")
    clock.advance(1)
    task = await claim_one(store, "s1")
    clock.advance(6)
    [expired] = await store.expired(10)
    assert await store.apply(plan.expire(expired, "sup-1", clock.now))
    entries = await store.history("order-1")
    rows = [(e.step, e.phase, e.actor, e.epoch, e.from_state, e.to_state) for e in entries]
    assert rows == [
        (None, None, "submit", 0, None, "pending"),
        (None, None, "s1", 1, "pending", "processing"),
        ("reserve", "do", "s1", 1, "pending", "running"),
        (None, None, "sup-1", 1, "processing", "pending"),
        ("reserve", "do", "sup-1", 1, "running", "pending"),
    ]
    assert [e.at for e in entries] == [clock.now - 7, clock.now - 6, clock.now - 6,
                                       clock.now, clock.now]
    assert entries[0].why == "submitted"
    assert entries[1].why is not None and "claimed" in entries[1].why
    assert entries[3].why is not None and "expired" in entries[3].why
    assert {e.task_id for e in entries} == {"order-1"}
    assert task.task_id == "order-1"


async def test_alerts_are_listed_with_their_task_step_and_agent(store: Store,
                                                                clock: Clock) -> None:
    """E8: an error transition's alert is stored and listed, newest after older ones."""
    plan = PLANS["alerting"]
    await submitted(store, "a", "b", workflow="alerting")
    for owner in ("s1", "s2"):
        task = await claim_one(store, owner, {"alerting": plan})
        assert await store.apply(plan.reply(task, owner, False, None, "declined", clock.now))
    alerts = await store.alerts()
    assert [(a.task_id, a.step, a.agent) for a in alerts] == [
        ("a", "reserve", "inventory"), ("b", "reserve", "inventory")]
    assert alerts[0].message == "step reserve failed: declined"
    assert alerts[0].at == clock.now
    assert alerts[0].id < alerts[1].id
    assert [a.task_id for a in await store.alerts(after=alerts[0].id)] == ["b"]
    assert [a.task_id for a in await store.alerts(limit=1)] == ["a"]


async def test_now_is_the_stores_clock(store: Store, clock: Clock) -> None:
    """Deadlines are compared with the store's clock (DESIGN invariant 3)."""
    assert store.now() == clock.now
    clock.advance(10)
    assert store.now() == clock.now


async def test_an_operator_retry_resets_the_steps_failure_count(store: Store,
                                                                clock: Clock) -> None:
    """E8: after a retry the failed step starts again from 0 failures, as planned."""
    plan = PLANS["alerting"]
    await submitted(store, "o-1", workflow="alerting")
    while (task := await store.get("o-1")) is not None and task.state is TaskState.PENDING:
        await store.claim("s1", 1, PLANS)
        clock.advance(10)
        expired = await store.get("o-1")
        assert expired is not None
        assert await store.apply(plan.expire(expired, "sup", clock.now))
        clock.advance(10)
    assert task is not None and task.state is TaskState.ERROR
    assert task.steps[0].failure_count > 0
    task = await applies(store, task, plan.retry(task, clock.now))
    stored = await store.get("o-1")
    assert stored is not None
    assert (stored.state, stored.steps[0].failure_count) == (TaskState.PENDING, 0)


# ---------------------------------------------------------------- versions (R4, M4)

# The next release of "order": its last step dropped (the list shrank under tasks in flight)
ORDER_V2 = Workflow.declare("order", [Step("reserve", "inventory", 5.0),
                                      Step("charge", "payments", 10.0)],
                            agents=AGENTS, max_failures=2, retry_backoff=0.5)
# ... and one that grows it: the same first two steps, then two others
ORDER_V3 = Workflow.declare("order", [Step("reserve", "inventory", 5.0),
                                      Step("charge", "payments", 10.0),
                                      Step("pack", "shipping", 3.0),
                                      Step("post", "shipping", 4.0)],
                            agents=AGENTS, max_failures=2, retry_backoff=0.5)


async def test_a_task_carries_the_version_it_was_submitted_under(store: Store) -> None:
    """The version is stored with the task and derived from its steps, names and agents."""
    await submitted(store, "order-1")
    await submitted(store, "slow-1", workflow="slow")
    assert (await fresh(store, "order-1")).version == ORDER.version
    assert [t.version for t in await store.list_tasks(TaskQuery())] == [ORDER.version, SLOW.version]
    assert ORDER.version != ORDER_V2.version


async def test_a_scheduler_claims_only_the_versions_it_declares(store: Store,
                                                                clock: Clock) -> None:
    """R4: a task of another version of the same workflow is never claimed, whatever
    the limit; it stays pending and unlocked for a scheduler of its own version."""
    await submitted(store, "old-1", "old-2")
    clock.advance(1)
    assert await store.submit(NewTask(
        task_id="new-1", workflow="order", input_json=b"{}",
        steps=[(s.name, s.agent, idempotency_key("new-1", s.name)) for s in ORDER_V2.steps]))
    newer = {"order": Plan(ORDER_V2, COMPENSABLE)}
    claimed = await store.claim("s-new", 10, newer)
    assert [(t.task_id, t.version) for t in claimed] == [("new-1", ORDER_V2.version)]
    assert await store.claim("s-new", 10, newer) == []
    old = await fresh(store, "old-1")
    assert (old.state, old.locked_by, old.epoch) == (T.PENDING, None, 0)
    assert sorted(t.task_id for t in await store.claim("s-old", 10, PLANS)) == [
        "old-1", "old-2"]


async def test_the_sweep_reads_only_the_workflows_it_is_given(store: Store,
                                                              clock: Clock) -> None:
    """R4: expired tasks of workflows a supervisor does not know never fill its batch,
    however many there are, and do not set its alarm clock."""
    await submitted(store, *[f"slow-{n:04}" for n in range(1100)], workflow="slow")
    await store.claim("gone", 2000, {"slow": PLANS["slow"]})
    clock.advance(60)  # every slow task has expired
    for task_id in ("order-1", "order-2"):  # claimed a second apart: order-1 expires first
        await submitted(store, task_id)
        await store.claim("gone", 10, {"order": PLANS["order"]})
        clock.advance(1)
    assert await store.next_expiry(["order"]) == clock.now - 2 + 5.0
    clock.advance(6)
    assert len(await store.expired(10)) == 10  # unfiltered: the unknown ones come first
    known = await store.expired(10, ["order", "renamed-away"])
    assert sorted(t.task_id for t in known) == ["order-1", "order-2"]
    assert [t.task_id for t in await store.expired(1, ["order"])] == ["order-1"]
    assert len(await store.expired(2000, ["slow", "order"])) == 1102
    assert await store.expired(10, []) == []
    assert await store.next_expiry([]) is None
    assert await store.next_expiry(["slow"]) == clock.now - 6 - 2 - 60 + 50.0


async def test_tasks_that_expire_together_are_swept_in_task_id_order(store: Store,
                                                                     clock: Clock) -> None:
    """Tasks claimed in one batch share their complete-by; every store breaks that tie
    by task id, as the in-memory one always did, so which of them a bounded sweep takes
    first is the stores' rule, not a query plan's."""
    ids = [f"tie-{n}" for n in (3, 1, 4, 0, 2)]
    await submitted(store, *ids)
    assert len(await store.claim("gone", 10, {"order": PLANS["order"]})) == len(ids)
    clock.advance(60)
    assert [t.task_id for t in await store.expired(10)] == sorted(ids)
    assert [t.task_id for t in await store.expired(10, ["order"])] == sorted(ids)
    assert [t.task_id for t in await store.expired(2, ["order"])] == sorted(ids)[:2]


async def test_a_transition_planned_before_a_migration_does_not_apply(store: Store,
                                                                     clock: Clock) -> None:
    """A migration changes a task's version and steps and nothing else the fence holds:
    an operator's action planned from a read before it applies to nothing, rather than
    write back the version (and step rows) it read."""
    plan = PLANS["order"]
    await submitted(store, "o1")
    task = await claim_one(store, "s1")
    task = await applies(store, task, plan.release(task, "s1", clock.now))
    stale = plan.cancel(task, clock.now)
    await applies(store, task, Plan(ORDER_V3, COMPENSABLE).migrate(task, clock.now))
    assert not await store.apply(stale)
    stored = await fresh(store, "o1")
    assert (stored.state, stored.version, len(stored.steps)) == (
        T.PENDING, ORDER_V3.version, len(ORDER_V3.steps))


async def test_a_migration_is_stored_as_planned(store: Store, clock: Clock) -> None:
    """A task re-planned onto a longer shape keeps its completed steps and takes the new
    ones; onto a shorter shape its unstarted tail is dropped; either way it is then
    claimed only by schedulers of its new version."""
    plan = PLANS["order"]
    await submitted(store, "grow", "shrink")
    for _ in range(2):  # each one's first step completes; then they wait, pending, at charge
        task = await claim_one(store, "s1")
        task = await applies(store, task, plan.reply(task, "s1", True, {"sku": 1}, None, clock.now))
        clock.advance(1)  # released after the other was submitted: claimed after it
        task = await applies(store, task, plan.release(task, "s1", clock.now))
    grow = await fresh(store, "grow")
    grow = await applies(store, grow, Plan(ORDER_V3, COMPENSABLE).migrate(grow, clock.now))
    stored = await fresh(store, "grow")
    assert_stored_as_planned(stored, grow)
    assert stored.version == ORDER_V3.version
    assert [(s.name, s.state, s.idempotency_key) for s in stored.steps] == [
        ("reserve", S.COMPLETED, idempotency_key("grow", "reserve")),
        ("charge", S.PENDING, idempotency_key("grow", "charge")),
        ("pack", S.PENDING, idempotency_key("grow", "pack")),
        ("post", S.PENDING, idempotency_key("grow", "post"))]
    shrink = await fresh(store, "shrink")
    shrink = await applies(store, shrink, Plan(ORDER_V2, COMPENSABLE).migrate(shrink, clock.now))
    stored = await fresh(store, "shrink")
    assert_stored_as_planned(stored, shrink)
    assert [s.name for s in stored.steps] == ["reserve", "charge"]
    assert await store.claim("s1", 10, PLANS) == []  # the old release no longer takes them
    [claimed] = await store.claim("s3", 10, {"order": Plan(ORDER_V3, COMPENSABLE)})
    assert (claimed.task_id, claimed.steps[1].state, claimed.steps[1].attempts) == (
        "grow", S.RUNNING, 2)  # charge had started once before its release
    assert claimed.steps[0].result == {"sku": 1}  # the completed step is not run again


async def test_an_incident_is_one_alert_until_resolved(store: Store, clock: Clock) -> None:
    """R4: the census counts unfinished tasks by workflow version and by the agent of
    their unit; an incident is one alert without a task, open until resolved, listed
    with the task alerts."""
    await submitted(store, "a", "b")
    await submitted(store, "c", workflow="slow")
    await store.claim("s1", 1, {"slow": PLANS["slow"]})
    census = await store.census()
    assert census.versions == {("order", ORDER.version): 2, ("slow", SLOW.version): 1}
    assert census.agents == {("order", ORDER.version, "inventory"): 2,
                             ("slow", SLOW.version, "inventory"): 1}
    key = f"workflow:order@{ORDER.version}"
    incident = Alert(id=0, task_id=None, at=0.0, message="2 tasks of order", agent=None,
                     incident=key, count=2)
    await store.report_incidents([incident], [])
    [open_one] = await store.incidents()
    assert (open_one.task_id, open_one.incident, open_one.count, open_one.at,
            open_one.resolved_at) == (None, incident.incident, 2, clock.now, None)
    clock.advance(1)
    again = Alert(id=0, task_id=None, at=0.0, message="4 tasks of order",
                  incident=incident.incident, count=4)
    await store.report_incidents([again], [])  # supersedes the first
    [current] = await store.incidents()
    assert (current.count, current.id > open_one.id) == (4, True)
    clock.advance(1)
    await store.report_incidents([], [key])
    assert await store.incidents() == []
    listed = await store.alerts()
    assert [(a.count, a.resolved_at) for a in listed] == [(2, clock.now - 1), (4, clock.now)]
async def test_dead_letters_are_kept_read_back_whole_and_purged(store: Store) -> None:
    """The in-process transport's dead letters (R3): kept with every field and the body
    byte for byte, oldest first, the same letter written twice kept once (a retried
    commit), an unknown id None, and all forgotten by a purge that counts them."""
    older = DeadLetter(id="01a", queue="sasflow.reply.w1", reason="MalformedMessage: not a reply",
                       deliveries=1, first_seen=1e9, at=1e9, body=b"\x00\xffnot json")
    newer = DeadLetter(id="01b", queue="sasflow.agent.pay", reason="RuntimeError: boom",
                       deliveries=5, first_seen=1e9 + 1, at=1e9 + 9, body=b"x" * 70_000)
    for letter in (newer, older, newer):
        await store.add_dead_letter(letter)
    assert await store.dead_letters() == [older, newer]
    assert await store.dead_letters(limit=1) == [older]
    assert await store.dead_letter("01b") == newer
    assert await store.dead_letter("01c") is None
    assert await store.purge_dead_letters() == 2
    assert await store.dead_letters() == []

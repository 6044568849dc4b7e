"""The planner (plan.py): every decision of the pattern, pure and with time passed in.

The tests follow one task through its decisions as a scheduler does: each decision's
Transition, then the task as that transition makes it (transition.applied), which
`make_plan`'s plans put in place of the snapshot they planned from.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from sasflow.errors import InvalidTransitionError
from sasflow.model import (
    Phase,
    StepRecord,
    StepState,
    Task,
    TaskState,
    can_move,
    idempotency_key,
)
from sasflow.plan import Plan
from sasflow.transition import Transition, UnitChange, applied
from sasflow.workflow import Step, Workflow

T, S = TaskState, StepState
NOW = 1_700_000_000.0

# reserve and ship can be undone; charge's agent declared no compensator.
STEPS = [Step("reserve", "inventory", 5.0), Step("charge", "payments", 10.0),
         Step("pack", "warehouse", 2.0), Step("ship", "shipping", 7.0)]
COMPENSABLE = frozenset({"inventory", "warehouse", "shipping"})


_DECISIONS = frozenset({"claim", "reply", "release", "expire", "orphan", "retry", "compensate",
                        "cancel", "migrate"})


class Applying:
    """A Plan whose decisions also move the snapshot they were made from to what their
    transition makes of it (transition.applied), as a scheduler holding the task does;
    and which checks that the planner itself left that snapshot as it was."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.workflow = plan.workflow

    def __getattr__(self, name: str) -> Any:
        decide = getattr(self.plan, name)
        if name not in _DECISIONS:
            return decide

        def deciding(task: Task, *args: Any, **kwargs: Any) -> Transition:
            before = copy.deepcopy(task)
            transition: Transition = decide(task, *args, **kwargs)
            assert task == before, "the planner changed the snapshot it was given"
            after = applied(task, transition)
            for field in Task.__struct_fields__:
                setattr(task, field, getattr(after, field))
            return transition

        return deciding


def make_plan(on_failure: str = "compensate", max_failures: int = 3,
              compensable: frozenset[str] = COMPENSABLE, steps: list[Step] = STEPS) -> Any:
    wf = Workflow.declare("process-order", steps, agents={s.agent for s in steps},
                          max_failures=max_failures, on_failure=on_failure,
                          retry_backoff=0.5, park_for=120.0)
    return Applying(Plan(wf, compensable))


def moves(t: Transition) -> list[UnitChange]:
    """The units a transition moves (those in the history), without the rows of steps
    that only show where their compensation stands."""
    return [u for u in t.units if u.in_history]


def new_task(plan: Plan, task_id: str = "order-42") -> Task:
    """A task as submitted (E2): pending, unlocked, no failures, every step pending."""
    return Task(task_id=task_id, workflow=plan.workflow.name, input={"order_id": 42},
                state=T.PENDING, reply_to="app-q",
                steps=[StepRecord(name=s.name, agent=s.agent, state=S.PENDING,
                                  idempotency_key=idempotency_key(task_id, s.name))
                       for s in plan.workflow.steps])


def run_until(plan: Plan, task: Task, cursor: int, owner: str = "s1") -> None:
    """Claim and complete steps until the step at `cursor` is running."""
    plan.claim(task, owner, NOW)
    while task.cursor < cursor:
        plan.reply(task, owner, True, {"done": task.steps[task.cursor].name}, None, NOW)


def undo_order(plan: Plan, task: Task, owner: str = "s1") -> list[str]:
    """Acknowledge each compensation as it is requested; the names in the order undone."""
    undone = []
    while task.state is T.COMPENSATING:
        if task.locked_by is None:
            plan.claim(task, owner, NOW)
            continue
        undone.append(task.steps[task.cursor].name)
        plan.reply(task, owner, True, None, None, NOW)
    return undone


# ---------------------------------------------------------------- scheduler: forward


def test_claim_starts_the_first_step_with_its_complete_by() -> None:
    """Claim (E3): processing, locked by the claimer, complete-by = now + step timeout."""
    plan = make_plan()
    task = new_task(plan)
    t = plan.claim(task, "s1", NOW)
    assert (t.from_state, t.state, t.locked_by, t.complete_by) == (
        T.PENDING, T.PROCESSING, "s1", NOW + 5.0)
    # the fence: unlocked at epoch 0, and a claim bumps the epoch
    assert (t.owner, t.epoch, t.claim, t.expired_before) == (None, 0, True, None)
    [unit] = moves(t)
    assert (unit.index, unit.phase, unit.state, unit.from_state) == (0, Phase.DO, S.RUNNING,
                                                                      S.PENDING)
    assert unit.attempts == 1 and unit.complete_by == NOW + 5.0
    assert unit.idempotency_key == idempotency_key("order-42", "reserve")
    assert (task.state, task.locked_by, task.epoch) == (T.PROCESSING, "s1", 1)
    assert (task.steps[0].state, task.steps[0].attempts) == (S.RUNNING, 1)


def test_each_claim_bumps_the_epoch_again() -> None:
    """A re-claim after a release fences out the previous owner with epoch + 1."""
    plan = make_plan()
    task = new_task(plan)
    plan.claim(task, "s1", NOW)
    plan.expire(task, "sup", NOW + 6)
    t = plan.claim(task, "s2", NOW + 10)
    assert (t.epoch, task.epoch, task.locked_by) == (1, 2, "s2")
    assert task.steps[0].attempts == 2


def test_ok_reply_completes_the_step_and_starts_the_next() -> None:
    """Reply ok (E6): the step completes with its result; the next runs with its own timeout."""
    plan = make_plan()
    task = new_task(plan)
    plan.claim(task, "s1", NOW)
    t = plan.reply(task, "s1", True, {"sku": 1}, None, NOW + 1)
    assert (t.from_state, t.state, t.owner, t.epoch, t.claim) == (
        T.PROCESSING, T.PROCESSING, "s1", 1, False)
    assert (t.cursor, t.locked_by, t.complete_by) == (1, "s1", NOW + 1 + 10.0)
    done, start = moves(t)
    assert (done.name, done.state, done.result) == ("reserve", S.COMPLETED, {"sku": 1})
    assert (start.name, start.state, start.attempts) == ("charge", S.RUNNING, 1)
    assert t.events == [("step_completed", "reserve")]
    assert task.steps[0].result == {"sku": 1}


def test_last_step_ok_makes_the_task_processed() -> None:
    """When every step is done the task is processed, unlocked, with no error (E6)."""
    plan = make_plan(steps=STEPS[:2])
    task = new_task(plan)
    run_until(plan, task, 1)
    t = plan.reply(task, "s1", True, {"charge_id": "c-1"}, None, NOW)
    assert (t.state, t.locked_by, t.complete_by, t.error) == (T.PROCESSED, None, None, None)
    assert t.events == [("step_completed", "charge"), ("processed", None)]
    assert [s.state for s in task.steps] == [S.COMPLETED, S.COMPLETED]
    assert task.terminal


def test_release_on_shutdown_hands_the_task_back_without_a_failure() -> None:
    """A scheduler stopping releases its task: pending, unlocked, claimable now, no failure."""
    plan = make_plan()
    task = new_task(plan)
    run_until(plan, task, 1)
    t = plan.release(task, "s1", NOW + 2)
    assert (t.owner, t.epoch, t.from_state) == ("s1", 1, T.PROCESSING)  # fenced on the holder
    assert (t.state, t.locked_by, t.complete_by, t.available_at) == (
        T.PENDING, None, None, NOW + 2)
    assert (t.failure_count, [(u.name, u.state, u.failure_count) for u in moves(t)]) == (
        0, [("charge", S.PENDING, 0)])
    t = plan.claim(task, "s2", NOW + 3)
    assert moves(t)[0].name == "charge"  # resumed at the step it stopped at (M4)
    assert task.steps[0].attempts == 1


def test_release_while_compensating_stays_compensating() -> None:
    """Released in the middle of an undo: still compensating, the undo pending again."""
    plan = make_plan()
    task = new_task(plan)
    run_until(plan, task, 1)
    plan.reply(task, "s1", False, None, "declined", NOW)
    t = plan.release(task, "s1", NOW)
    assert (t.state, t.locked_by) == (T.COMPENSATING, None)
    assert [(u.phase, u.state) for u in moves(t)] == [(Phase.UNDO, S.PENDING)]
    assert undo_order(plan, task, owner="s2") == ["reserve"]


# ---------------------------------------------------------------- nontransient errors (S6)


def test_permanent_error_compensates_completed_steps_in_reverse_skipping_no_undo() -> None:
    """compensate policy: the refused step is not undone; pack, then reserve; charge skipped."""
    plan = make_plan()
    task = new_task(plan)
    run_until(plan, task, 3)
    t = plan.reply(task, "s1", False, None, "address refused", NOW)
    assert (t.state, t.phase, t.locked_by) == (T.COMPENSATING, Phase.UNDO, "s1")
    failed, undo = moves(t)
    assert (failed.name, failed.phase, failed.state) == ("ship", Phase.DO, S.FAILED)
    assert not failed.in_doubt  # the remote refused: nothing of it to undo
    assert (undo.name, undo.phase, undo.state, undo.attempts) == (
        "pack", Phase.UNDO, S.RUNNING, 1)
    assert undo.idempotency_key == idempotency_key("order-42", "pack", Phase.UNDO)
    assert t.complete_by == NOW + 2.0  # the undo gets the step's window
    assert t.events == [("compensating", "ship")]
    assert task.error == "step ship failed: address refused"
    assert undo_order(plan, task) == ["pack", "reserve"]
    assert task.state is T.COMPENSATED
    assert [s.state for s in task.steps] == [S.COMPENSATED, S.COMPLETED, S.COMPENSATED,
                                             S.FAILED]


def test_compensation_reply_hands_over_the_next_undo_and_finishes_compensated() -> None:
    """Each compensation reply starts the next lower undo; the last makes it compensated."""
    plan = make_plan()
    task = new_task(plan)
    run_until(plan, task, 3)
    plan.reply(task, "s1", False, None, "refused", NOW)
    t = plan.reply(task, "s1", True, None, None, NOW)  # pack undone
    assert [(u.name, u.phase, u.state) for u in moves(t)] == [
        ("pack", Phase.UNDO, S.COMPENSATED), ("reserve", Phase.UNDO, S.RUNNING)]
    assert (t.state, t.cursor) == (T.COMPENSATING, 0)
    t = plan.reply(task, "s1", True, None, None, NOW)  # reserve undone
    assert (t.state, t.locked_by) == (T.COMPENSATED, None)
    assert t.events == [("compensated", None)]
    assert task.steps[0].compensation is not None
    assert task.steps[0].compensation.state is S.COMPENSATED


def test_permanent_error_on_the_first_step_compensates_nothing() -> None:
    """Nothing completed yet: the task ends compensated without any undo requested."""
    plan = make_plan()
    task = new_task(plan)
    plan.claim(task, "s1", NOW)
    t = plan.reply(task, "s1", False, None, "out of stock", NOW)
    assert [(u.phase, u.state) for u in moves(t)] == [(Phase.DO, S.FAILED)]
    assert ("compensating", "reserve") in t.events
    assert undo_order(plan, task) == []
    assert task.state is T.COMPENSATED


def test_permanent_error_with_error_policy_raises_an_alert() -> None:
    """error policy (E8): state error, unlocked, and an alert naming step and agent."""
    plan = make_plan(on_failure="error")
    task = new_task(plan)
    run_until(plan, task, 1)
    t = plan.reply(task, "s1", False, None, "card declined", NOW)
    assert (t.state, t.locked_by, t.complete_by) == (T.ERROR, None, None)
    assert t.error == "step charge failed: card declined"
    assert t.alert == "step charge failed: card declined"
    assert (t.alert_step, t.alert_agent) == ("charge", "payments")
    assert t.events == [("error", "charge")]
    assert [(u.name, u.state, u.error) for u in moves(t)] == [
        ("charge", S.FAILED, "card declined")]
    assert task.steps[0].state is S.COMPLETED  # nothing undone under this policy


def test_gave_up_reply_counts_as_a_failure_not_an_error() -> None:
    """A non-permanent error reply (retries ran out) releases like an expiry (S8)."""
    plan = make_plan(on_failure="error")
    task = new_task(plan)
    plan.claim(task, "s1", NOW)
    t = plan.reply(task, "s1", False, None, "ConnectError: refused", NOW, permanent=False)
    assert (t.state, t.locked_by, t.failure_count) == (T.PENDING, None, 1)
    assert t.available_at == NOW + 0.5
    assert t.alert is None
    assert "agent gave up" in t.why


# ---------------------------------------------------------------- supervisor (S8, E9)


def test_expiry_below_threshold_releases_with_backoff() -> None:
    """Expired, below max_failures: pending, unlocked, FailureCount + 1, backoff (E9)."""
    plan = make_plan(max_failures=3)
    task = new_task(plan)
    plan.claim(task, "s1", NOW)
    t = plan.expire(task, "sup-1", NOW + 6)
    # fenced on the expiry itself (M3): same owner, epoch, and complete_by < now
    assert (t.owner, t.epoch, t.from_state, t.expired_before) == ("s1", 1, T.PROCESSING,
                                                                    NOW + 6)
    assert (t.actor, t.state, t.locked_by, t.complete_by) == ("sup-1", T.PENDING, None, None)
    assert (t.failure_count, t.available_at) == (1, NOW + 6 + 0.5)
    [unit] = moves(t)
    assert (unit.state, unit.failure_count, unit.from_state) == (S.PENDING, 1, S.RUNNING)
    assert (task.steps[0].state, task.steps[0].failure_count) == (S.PENDING, 1)
    plan.claim(task, "s2", NOW + 7)
    t = plan.expire(task, "sup-1", NOW + 13)
    assert (t.failure_count, t.available_at) == (2, NOW + 13 + 1.0)  # doubled


def test_expiry_at_threshold_with_error_policy_alerts() -> None:
    """At max_failures with policy error: state error + an operator alert (E9)."""
    plan = make_plan(on_failure="error", max_failures=2)
    task = new_task(plan)
    run_until(plan, task, 1)
    plan.expire(task, "sup", NOW + 20)
    plan.claim(task, "s1", NOW + 21)
    t = plan.expire(task, "sup", NOW + 40)
    assert (t.state, t.locked_by, t.failure_count) == (T.ERROR, None, 2)
    assert t.alert is not None and "charge" in t.alert
    assert (t.alert_step, t.alert_agent) == ("charge", "payments")
    [unit] = moves(t)
    assert (unit.state, unit.in_doubt) == (S.FAILED, True)


def test_expiry_at_threshold_with_compensate_undoes_the_in_doubt_step_first() -> None:
    """Compensate at the threshold: the expired step may have applied, so it is undone too."""
    plan = make_plan(max_failures=1)
    task = new_task(plan)
    run_until(plan, task, 2)  # pack is running; its agent has a compensator
    t = plan.expire(task, "sup", NOW + 3)
    # the supervisor never runs anything: it leaves the undo for a scheduler to claim
    assert (t.state, t.locked_by, t.available_at, t.cursor) == (
        T.COMPENSATING, None, NOW + 3, 2)
    assert [(u.name, u.state, u.in_doubt) for u in moves(t)] == [("pack", S.FAILED, True)]
    assert t.events == [("compensating", "pack")]
    assert undo_order(plan, task) == ["pack", "reserve"]
    assert task.state is T.COMPENSATED


def test_expiry_at_threshold_skips_an_in_doubt_step_with_no_compensator() -> None:
    """An in-doubt step whose agent cannot undo is skipped; earlier steps are undone."""
    plan = make_plan(max_failures=1)
    task = new_task(plan)
    run_until(plan, task, 1)  # charge: payments has no compensator
    plan.expire(task, "sup", NOW + 11)
    assert task.cursor == 0
    assert undo_order(plan, task) == ["reserve"]


def test_expiry_at_threshold_with_park_policy_waits_long() -> None:
    """park: at the threshold the task waits park_for seconds, then is retried."""
    plan = make_plan(on_failure="park", max_failures=1)
    task = new_task(plan)
    plan.claim(task, "s1", NOW)
    t = plan.expire(task, "sup", NOW + 6)
    assert (t.state, t.locked_by, t.available_at, t.failure_count) == (
        T.PENDING, None, NOW + 6 + 120.0, 1)
    assert t.alert is None
    plan.claim(task, "s1", NOW + 130)
    t = plan.expire(task, "sup", NOW + 136)
    assert (t.state, t.available_at) == (T.PENDING, NOW + 136 + 120.0)


def test_compensation_expiry_is_recovered_like_a_step() -> None:
    """An undo that expires is released (still compensating); at the threshold, error."""
    plan = make_plan(max_failures=2)
    task = new_task(plan)
    run_until(plan, task, 1)
    plan.reply(task, "s1", False, None, "declined", NOW)  # -> undo reserve, running
    t = plan.expire(task, "sup", NOW + 6)
    assert (t.state, t.locked_by, t.failure_count) == (T.COMPENSATING, None, 1)
    assert [(u.phase, u.state, u.failure_count) for u in moves(t)] == [
        (Phase.UNDO, S.PENDING, 1)]
    t = plan.claim(task, "s2", NOW + 7)
    assert [(u.phase, u.state) for u in moves(t)] == [(Phase.UNDO, S.RUNNING)]
    assert task.steps[0].compensation is not None
    assert task.steps[0].compensation.attempts == 2
    t = plan.expire(task, "sup", NOW + 20)
    assert (t.state, t.failure_count) == (T.ERROR, 2)
    assert t.alert is not None and "compensation" in t.alert


def test_compensation_after_the_forward_budget_ran_out_has_a_budget_of_its_own() -> None:
    """S9: compensation is recovered like any step. A task whose forward steps used up
    `max_failures` turns to compensation with none of it spent, so its compensator gets
    `max_failures` attempts too, not a single one; the step's own count stays."""
    plan = make_plan(max_failures=2)
    task = new_task(plan)
    run_until(plan, task, 1)  # reserve completed, charge running
    plan.expire(task, "sup", NOW + 6)
    plan.claim(task, "s2", NOW + 7)
    t = plan.expire(task, "sup", NOW + 20)  # charge's second expiry: the budget is spent
    assert (t.state, t.failure_count) == (T.COMPENSATING, 0)
    assert task.steps[1].failure_count == 2 and task.error == "step charge: expired 2 times"
    t = plan.claim(task, "s3", NOW + 21)  # undo reserve, running
    t = plan.expire(task, "sup", NOW + 40)
    assert (t.state, t.failure_count, t.locked_by) == (T.COMPENSATING, 1, None)
    t = plan.claim(task, "s4", NOW + 41)
    assert task.steps[0].compensation is not None
    assert task.steps[0].compensation.attempts == 2
    t = plan.expire(task, "sup", NOW + 60)
    assert (t.state, t.failure_count) == (T.ERROR, 2)
    assert t.alert is not None and "compensation of reserve" in t.alert


def test_permanent_error_in_a_compensation_alerts() -> None:
    """A compensation that fails for good cannot be undone: error + alert."""
    plan = make_plan()
    task = new_task(plan)
    run_until(plan, task, 1)
    plan.reply(task, "s1", False, None, "declined", NOW)
    t = plan.reply(task, "s1", False, None, "already shipped", NOW)
    assert t.state is T.ERROR
    assert t.alert == "compensation of reserve failed: already shipped"
    assert [(u.phase, u.state) for u in moves(t)] == [(Phase.UNDO, S.FAILED)]


# ---------------------------------------------------------------- operator (E8)


def _errored(plan: Plan) -> Task:
    task = new_task(plan)
    run_until(plan, task, 1)
    plan.reply(task, "s1", False, None, "card declined", NOW)
    assert task.state is T.ERROR
    return task


def test_retry_resubmits_the_failed_step() -> None:
    """Operator retry (E8): pending, unlocked, claimable now, failures reset, step pending."""
    plan = make_plan(on_failure="error")
    task = _errored(plan)
    t = plan.retry(task, NOW + 100)
    assert (t.actor, t.from_state, t.state, t.locked_by) == (
        "operator", T.ERROR, T.PENDING, None)
    assert (t.failure_count, t.available_at, t.error) == (0, NOW + 100, None)
    [unit] = moves(t)
    assert (unit.name, unit.state, unit.failure_count) == ("charge", S.PENDING, 0)
    t = plan.claim(task, "s2", NOW + 101)
    assert moves(t)[0].name == "charge"  # resumes where it failed, reserve is not rerun


def test_retry_naming_another_step_is_refused() -> None:
    """Retry --step must name the failed step."""
    plan = make_plan(on_failure="error")
    task = _errored(plan)
    with pytest.raises(InvalidTransitionError, match="'reserve' is not the failed step"):
        plan.retry(task, NOW, step="reserve")
    assert plan.retry(task, NOW, step="charge").state is T.PENDING


def test_retry_of_a_failed_compensation_resumes_compensating() -> None:
    """A failed undo is retried as an undo."""
    plan = make_plan()
    task = new_task(plan)
    run_until(plan, task, 1)
    plan.reply(task, "s1", False, None, "declined", NOW)
    plan.reply(task, "s1", False, None, "refund refused", NOW)
    t = plan.retry(task, NOW)
    assert (t.state, t.locked_by) == (T.COMPENSATING, None)
    assert [(u.phase, u.state) for u in moves(t)] == [(Phase.UNDO, S.PENDING)]
    assert undo_order(plan, task) == ["reserve"]


@pytest.mark.parametrize("state", [T.PENDING, T.COMPENSATING, T.PROCESSED, T.COMPENSATED,
                                   T.CANCELLED])
def test_retry_is_refused_unless_in_error(state: TaskState) -> None:
    """Only a task in error can be retried; the message names the task and its state."""
    plan = make_plan()
    task = new_task(plan)
    task.state = state
    with pytest.raises(InvalidTransitionError) as caught:
        plan.retry(task, NOW)
    assert f"cannot retry task order-42: it is {state.value}" in str(caught.value)
    assert caught.value.task_id == "order-42"


def test_retry_of_a_running_task_is_refused() -> None:
    """A processing task has no failed step to resubmit: refused, nothing changes."""
    plan = make_plan()
    task = new_task(plan)
    run_until(plan, task, 1)
    with pytest.raises(InvalidTransitionError, match="order-42: it has no failed step"):
        plan.retry(task, NOW)
    assert (task.state, task.locked_by, task.steps[1].state) == (T.PROCESSING, "s1",
                                                                 S.RUNNING)


def test_compensate_a_running_task_undoes_the_interrupted_step_too() -> None:
    """Operator compensate while a step runs: that step is in doubt and undone first."""
    plan = make_plan(on_failure="error")
    task = new_task(plan)
    run_until(plan, task, 2)
    t = plan.compensate(task, NOW)
    assert (t.actor, t.owner, t.state, t.locked_by) == (
        "operator", "s1", T.COMPENSATING, None)
    assert [(u.name, u.state, u.in_doubt) for u in moves(t)] == [("pack", S.FAILED, True)]
    assert undo_order(plan, task, owner="s2") == ["pack", "reserve"]


def test_compensate_an_errored_task_does_not_undo_the_refused_step() -> None:
    """After a nontransient error, compensate undoes only what completed."""
    plan = make_plan(on_failure="error", steps=[STEPS[0], STEPS[3]])
    task = new_task(plan)
    run_until(plan, task, 1)
    plan.reply(task, "s1", False, None, "address refused", NOW)
    plan.compensate(task, NOW)
    assert undo_order(plan, task) == ["reserve"]
    assert task.steps[1].compensation is None


def test_compensate_a_pending_task_undoes_nothing_it_has_not_started() -> None:
    """A task never claimed has nothing to undo: it ends compensated, no undo requested."""
    plan = make_plan()
    task = new_task(plan)
    t = plan.compensate(task, NOW)
    assert moves(t) == []
    assert undo_order(plan, task) == []
    assert task.state is T.COMPENSATED


@pytest.mark.parametrize("state", [T.COMPENSATING, T.PROCESSED, T.COMPENSATED, T.CANCELLED])
def test_compensate_is_refused_when_compensating_or_finished(state: TaskState) -> None:
    """compensate is refused for a task already compensating or finished."""
    plan = make_plan()
    task = new_task(plan)
    task.state = state
    with pytest.raises(InvalidTransitionError, match="cannot compensate task order-42"):
        plan.compensate(task, NOW)


@pytest.mark.parametrize("state", [T.PENDING, T.PROCESSING, T.ERROR])
def test_cancel_stops_an_unfinished_task_undoing_nothing(state: TaskState) -> None:
    """cancel from pending, processing or error: cancelled, unlocked, fenced on the owner."""
    plan = make_plan()
    task = new_task(plan)
    if state is not T.PENDING:
        run_until(plan, task, 1)
    if state is T.ERROR:
        task.state, task.locked_by = T.ERROR, None
    owner = task.locked_by
    t = plan.cancel(task, NOW)
    assert (t.from_state, t.state, t.owner, t.locked_by) == (state, T.CANCELLED, owner, None)
    assert t.events == [("cancelled", None)]
    if state is T.PENDING:
        assert moves(t) == []
    else:  # the step that was running is left failed and in doubt, not "running" forever
        (unit,) = moves(t)
        assert (unit.name, unit.from_state, unit.state, unit.in_doubt) == (
            "charge", S.RUNNING, S.FAILED, True)


def test_cancel_of_a_step_released_after_a_dispatch_leaves_it_in_doubt() -> None:
    """Expired and released, the step is pending again, but its agent may have applied
    its effect: a cancel racing the supervisor's release records it failed and in
    doubt, as a cancel of the running step does, never as a step that never ran."""
    plan = make_plan(max_failures=3)
    task = new_task(plan)
    plan.claim(task, "s1", NOW)
    plan.expire(task, "sup-1", NOW + 6)
    assert (task.state, task.steps[0].state, task.steps[0].attempts) == (T.PENDING, S.PENDING, 1)
    t = plan.cancel(task, NOW + 6.1)
    (unit,) = moves(t)
    assert (unit.name, unit.from_state, unit.state, unit.in_doubt) == (
        "reserve", S.PENDING, S.FAILED, True)


@pytest.mark.parametrize("state", [T.COMPENSATING, T.PROCESSED, T.COMPENSATED, T.CANCELLED])
def test_cancel_is_refused_when_compensating_or_finished(state: TaskState) -> None:
    """A compensation in progress or a finished task cannot be cancelled."""
    plan = make_plan()
    task = new_task(plan)
    task.state = state
    with pytest.raises(InvalidTransitionError, match=f"it is {state.value}"):
        plan.cancel(task, NOW)


# ---------------------------------------------------------------- shape of every transition


def _every_transition() -> list[tuple[Task, Transition]]:
    """Each transition of a short saga, with the snapshot it was planned from."""
    plan = make_plan(max_failures=2)
    task = new_task(plan)
    decisions: list[Callable[[], Transition]] = [
        lambda: plan.claim(task, "s1", NOW),
        lambda: plan.reply(task, "s1", True, 1, None, NOW),
        lambda: plan.expire(task, "sup", NOW + 20),
        lambda: plan.claim(task, "s1", NOW + 21),
        lambda: plan.reply(task, "s1", True, 2, None, NOW),
        lambda: plan.reply(task, "s1", False, None, "no", NOW),
        lambda: plan.reply(task, "s1", True, None, None, NOW)]
    out = []
    for decide in decisions:
        before = copy.deepcopy(task)
        out.append((before, decide()))
    return out


def test_transitions_only_set_results_on_completion() -> None:
    """A unit's row carries a new result only when it completes (or its undo does);
    otherwise the result its step (or undo) had, kept."""
    seen = set()
    for before, transition in _every_transition():
        for unit in transition.units:
            step = before.steps[unit.index]
            if unit.phase is Phase.DO and unit.state is S.COMPLETED:
                assert unit.result is not None and step.result is None
                seen.add("completed")
            elif unit.phase is Phase.DO:
                assert unit.result == step.result, (transition.why, unit)
                seen.add("kept")
            elif unit.state is not S.COMPENSATED:
                kept = step.compensation.result if step.compensation else None
                assert unit.result == kept, (transition.why, unit)
    assert seen == {"completed", "kept"}


def test_an_undo_carries_the_row_of_its_step_showing_where_it_stands() -> None:
    """S9: with each change of a compensation comes its step's complete row, the same
    but for its state (compensating, then compensated), which is no move of its own."""
    plan = make_plan()
    task = new_task(plan)
    run_until(plan, task, 1)
    reserve = copy.deepcopy(task.steps[0])
    t = plan.reply(task, "s1", False, None, "declined", NOW)  # charge refused: undo reserve
    rows = [u for u in t.units if u.index == 0]
    assert [(u.phase, u.state, u.in_history) for u in rows] == [
        (Phase.UNDO, S.RUNNING, True), (Phase.DO, S.COMPENSATING, False)]
    shown = rows[1]
    assert (shown.attempts, shown.result, shown.complete_by, shown.from_state) == (
        reserve.attempts, reserve.result, reserve.complete_by, S.COMPLETED)
    t = plan.reply(task, "s1", True, {"refund": 1}, None, NOW)
    assert [(u.phase, u.state, u.in_history) for u in t.units if u.index == 0] == [
        (Phase.UNDO, S.COMPENSATED, True), (Phase.DO, S.COMPENSATED, False)]
    assert task.steps[0].compensation is not None
    assert task.steps[0].compensation.result == {"refund": 1}
    assert task.steps[0].result == reserve.result


def test_a_transition_applied_twice_changes_nothing_more() -> None:
    """Values, not deltas: the task once a transition applied is a fixed point of it."""
    for before, transition in _every_transition():
        once = applied(before, transition)
        assert applied(once, transition) == once, transition.why


# ---------------------------------------------------------------- nothing left to undo


def _first_step_refused(plan: Plan, task: Task) -> Transition:
    plan.claim(task, "s1", NOW)
    return plan.reply(task, "s1", False, None, "out of stock", NOW)


def _never_claimed_compensated(plan: Plan, task: Task) -> Transition:
    return plan.compensate(task, NOW)


def _errored_then_compensated(plan: Plan, task: Task) -> Transition:
    plan.claim(task, "s1", NOW)
    plan.reply(task, "s1", False, None, "out of stock", NOW)
    assert task.state is T.ERROR
    return plan.compensate(task, NOW)


def _expired_first_step_without_undo(plan: Plan, task: Task) -> Transition:
    plan.claim(task, "s1", NOW)
    return plan.expire(task, "sup", NOW + 6)


@pytest.mark.parametrize(("policy", "compensable", "happen"), [
    ("compensate", COMPENSABLE, _first_step_refused),
    ("compensate", COMPENSABLE, _never_claimed_compensated),
    ("error", COMPENSABLE, _errored_then_compensated),
    ("compensate", frozenset(), _expired_first_step_without_undo),
], ids=["refused-first-step", "operator-on-pending", "operator-on-error",
        "expired-no-compensator"])
def test_nothing_to_undo_is_a_move_the_lifecycle_allows(
        policy: str, compensable: frozenset[str],
        happen: Callable[[Plan, Task], Transition]) -> None:
    """With nothing to undo, the planner's move is still one model.can_move allows
    (stores refuse any other, which would leave the task stuck)."""
    plan = make_plan(on_failure=policy, max_failures=1, compensable=compensable)
    t = happen(plan, new_task(plan))
    assert t.from_state is t.state or can_move(t.from_state, t.state), (
        f"{t.from_state.value} -> {t.state.value}: {t.why}")


# ---------------------------------------------------------------- versions (R4, M4)


def test_a_step_list_shrunk_under_a_task_in_flight_is_refused_not_indexed() -> None:
    """The issue's case: a task whose first step completed meets a release whose list
    lost its later steps. Claim, reply, release, retry and compensate refuse with an
    error naming both versions: no IndexError, and the completed step is not run again."""
    old = make_plan()
    task = new_task(old)
    run_until(old, task, 1)
    old.release(task, "s1", NOW)
    shrunk = make_plan(steps=STEPS[:1])
    before = task.to_json()
    with pytest.raises(InvalidTransitionError) as caught:
        shrunk.claim(task, "s2", NOW)
    message = str(caught.value)
    assert old.workflow.version in message and shrunk.workflow.version in message
    assert "migrate" in message and caught.value.task_id == "order-42"
    running = new_task(old, "order-43")
    run_until(old, running, 1)
    actions: list[Callable[[Task], object]] = [
        lambda t: shrunk.reply(t, "s1", True, {}, None, NOW),
        lambda t: shrunk.release(t, "s1", NOW),
        lambda t: shrunk.compensate(t, NOW)]
    for action in actions:
        with pytest.raises(InvalidTransitionError, match=shrunk.workflow.version):
            action(running)
    assert task.to_json() == before  # nothing of the snapshot moved


def test_a_task_whose_version_column_disagrees_with_its_steps_is_refused() -> None:
    """The version a task row names is not taken on trust: a row that names this
    declaration's version over another step list (a claim selects by the column) is
    refused by its steps, and never run under a shape it was not planned for (R4)."""
    plan = make_plan()
    task = new_task(plan)
    task.version = plan.workflow.version  # as a claim read it: selected by this column
    task.steps = task.steps[:2]  # and its later steps gone
    with pytest.raises(InvalidTransitionError, match="migrate"):
        plan.claim(task, "s1", NOW)


def test_expiry_and_cancel_of_another_version_read_only_the_tasks_own_steps() -> None:
    """A supervisor of any release may count an expiry: it releases the task at its own
    step for schedulers of its own version; an operator may cancel it."""
    old = make_plan()
    task = new_task(old)
    run_until(old, task, 2)
    shrunk = make_plan(steps=STEPS[:1])
    released = shrunk.expire(task, "sup", NOW + 10)
    assert (released.state, released.cursor, moves(released)[0].name) == (T.PENDING, 2, "pack")
    assert shrunk.cancel(task, NOW + 11).state is T.CANCELLED


def test_migrate_keeps_the_steps_that_ran_and_takes_the_new_ones() -> None:
    """A pending task whose started steps are a prefix of the new declaration moves
    onto it: completed results kept, the steps after the prefix replaced."""
    old = make_plan()
    task = new_task(old)
    run_until(old, task, 1)
    old.release(task, "s1", NOW)
    steps = [*STEPS[:2], Step("label", "warehouse", 1.0)]
    new = make_plan(steps=steps)
    transition = new.migrate(task, NOW)
    assert (transition.version, transition.steps_from, transition.state) == (
        new.workflow.version, 3, T.PENDING)
    assert [(u.index, u.name) for u in transition.units] == [(2, "label")]
    assert [(s.name, s.state) for s in task.steps] == [
        ("reserve", S.COMPLETED), ("charge", S.PENDING), ("label", S.PENDING)]
    assert task.steps[0].result == {"done": "reserve"}
    claimed = new.claim(task, "s2", NOW)
    assert moves(claimed)[-1].name == "charge"


@pytest.mark.parametrize(("steps", "why"), [
    (STEPS[:1], "has run"),
    ([Step("reserve", "inventory"), Step("bill", "payments")], "has run"),
    ([Step("reserve", "stock"), *STEPS[1:]], "has run"),
])
def test_a_migration_that_cannot_be_proved_safe_is_refused(steps: list[Step],
                                                           why: str) -> None:
    """Refused with one clear line, the task untouched: a step that ran dropped, renamed
    or given to another agent."""
    old = make_plan()
    task = new_task(old)
    run_until(old, task, 1)  # charge started, then released: it ran
    old.release(task, "s1", NOW)
    before = task.to_json()
    with pytest.raises(InvalidTransitionError, match=why):
        make_plan(steps=steps).migrate(task, NOW)
    assert task.to_json() == before


def test_only_unlocked_forward_tasks_of_another_version_migrate() -> None:
    """A running, finished or same-version task is refused."""
    old = make_plan()
    task = new_task(old)
    new = make_plan(steps=[*STEPS, Step("thank", "shipping")])
    with pytest.raises(InvalidTransitionError, match="of that version already"):
        old.migrate(task, NOW)
    old.claim(task, "s1", NOW)
    with pytest.raises(InvalidTransitionError, match="processing"):
        new.migrate(task, NOW)

"""Property-based test of the pattern's state machine: plan.py driven at random.

Hypothesis builds a random workflow (2-4 steps, a random set of agents with a
compensator, a random failure policy and threshold), then runs random
sequences of what can happen to a task: schedulers claim it, agents reply (ok,
a permanent error, "gave up"), replies arrive late from an owner that lost the
task or land after the next unit's complete-by, supervisors expire it (two at once,
or from a read the task has moved on from), a scheduler hands it back on
shutdown, operators retry, compensate or cancel.

The task lives in an in-memory record built ONLY from the Transitions applied
to it (transition.applied, as the in-memory store applies them), with a store's
fencing rules, so what is checked is what a store would hold. Each scheduler
holds its own snapshot and moves it the same way. After every step the pattern's
invariants must hold, and the planner must have left the snapshot it planned from
as it was.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

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
from sasflow.workflow import OnFailure, Step, Workflow

T, S = TaskState, StepState
TASK_ID = "task-1"
FINISHED = frozenset({T.PROCESSED, T.COMPENSATED, T.CANCELLED})  # no way out, even for operators


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    size = draw(st.integers(2, 4))
    steps = [Step(f"step{i}", f"agent{i}", timeout=draw(st.sampled_from([1.0, 5.0, 30.0])))
             for i in range(size)]
    agents = [s.agent for s in steps]
    workflow = Workflow.declare(
        "wf", steps, agents=agents, max_failures=draw(st.integers(1, 3)),
        on_failure=draw(st.sampled_from(["error", "compensate", "park"])),
        retry_backoff=0.5, park_for=60.0)
    undoable = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    return Plan(workflow, frozenset(a for a, yes in zip(agents, undoable, strict=True) if yes))


@dataclass
class Driver:
    """A scheduler instance's own view of a task it claimed (the snapshot it plans on)."""

    owner: str
    view: Task


class Record:
    """The task as a store holds it: changed only by applying fenced Transitions."""

    def __init__(self, plan: Plan) -> None:
        self.task = Task(task_id=TASK_ID, workflow=plan.workflow.name, input={"n": 1},
                         state=T.PENDING,
                         steps=[StepRecord(name=s.name, agent=s.agent, state=S.PENDING,
                                           idempotency_key=idempotency_key(TASK_ID, s.name))
                                for s in plan.workflow.steps])
        self.applied: list[Transition] = []

    def snapshot(self) -> Task:
        return copy.deepcopy(self.task)

    def fence_holds(self, t: Transition) -> bool:
        task = self.task
        if (task.epoch, task.state, task.locked_by, task.phase, task.cursor, task.version) != (
                t.epoch, t.from_state, t.owner, t.from_phase, t.from_cursor, t.from_version):
            return False
        return t.expired_before is None or (
            task.complete_by is not None and task.complete_by < t.expired_before)

    def apply(self, t: Transition) -> bool:
        """All of the transition, or nothing if its fence no longer holds."""
        if not self.fence_holds(t):
            return False
        self.task = applied(self.task, t)
        self.applied.append(t)
        return True


def decided(view: Task, decide: Callable[[Task], Transition]) -> Transition:
    """`decide` on `view`, which the planner must leave exactly as it was."""
    before = copy.deepcopy(view)
    t = decide(view)
    assert view == before, f"the planner changed the snapshot it was given: {t.why}"
    return t


class TaskLifecycle(RuleBasedStateMachine):
    """Random histories of one task; the pattern's invariants checked after each event."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0
        self.drivers: list[Driver] = []
        self.completed: Counter[int] = Counter()  # step index -> times completed
        self.undo_started: list[int] = []  # step indexes, in order of their first undo
        self.undone: list[int] = []  # step indexes, in order of their compensation
        self.ever_done: set[int] = set()  # steps that completed, or were in doubt

    @initialize(plan=plans(), interruptions=st.integers(0, 2))
    def submit(self, plan: Plan, interruptions: int) -> None:
        self.plan = plan
        self.record = Record(plan)
        # how often an operator may step into a task that is not in error: rarely, or
        # few histories would get past their first steps
        self.interruptions = interruptions

    # ------------------------------------------------------------ applying, with checks
    def commit(self, t: Transition, view: Task | None = None) -> bool:
        """Apply `t` to the record, checking it against the pattern's rules first;
        `view` is the snapshot `t` was planned from."""
        before = self.record.snapshot()
        fresh = self.record.fence_holds(t)
        landed = self.record.apply(t)
        assert landed == fresh
        if not landed:
            assert self.record.task == before
            return False
        assert before.state not in FINISHED, f"{before.state} changed by {t.why}"
        if before.state is T.ERROR:
            assert t.actor == "operator", f"only an operator moves a task out of error: {t}"
        assert t.from_state is t.state or can_move(t.from_state, t.state), t.why
        keys = [(unit.phase, unit.index) for unit in t.units]
        assert len(keys) == len(set(keys)), f"a row written twice by {t.why}"
        for unit in t.units:
            self.check_unit(before, unit)
        if view is not None:
            # the planner's own idea of the task is exactly what the store now holds
            assert applied(view, t) == self.record.task, t.why
        # values, not deltas: the same write again changes nothing
        assert applied(self.record.task, t) == self.record.task, t.why
        return True

    def commit_held(self, driver: Driver, t: Transition) -> bool:
        """Commit `t`, planned by `driver` from its snapshot; if it applies, the driver
        holds the task as it now is, as a scheduler does."""
        if not self.commit(t, driver.view):
            return False
        driver.view = applied(driver.view, t)
        return True

    def check_unit(self, before: Task, unit: UnitChange) -> None:
        step = before.steps[unit.index]
        assert unit.idempotency_key == idempotency_key(TASK_ID, step.name, unit.phase)
        if unit.phase is Phase.DO:
            assert unit.from_state is step.state  # the history tells the truth
            # a new dispatch counts one attempt; failures count up one, or reset to 0
            assert unit.attempts - step.attempts in (0, 1), unit
            assert unit.attempts == step.attempts or unit.state is S.RUNNING, unit
            assert unit.failure_count in (0, step.failure_count, step.failure_count + 1)
            assert unit.in_doubt >= step.in_doubt, "in doubt once, in doubt for good"
            if unit.state is not S.COMPLETED:
                assert unit.result == step.result, "a result is kept unless it completes"
            if not unit.in_history:  # the step's row showing where its undo stands
                assert unit.state in (S.COMPENSATING, S.COMPENSATED), unit
                assert (unit.attempts, unit.failure_count, unit.error) == (
                    step.attempts, step.failure_count, step.error)
            if unit.state is S.COMPLETED:
                self.completed[unit.index] += 1
                assert self.completed[unit.index] == 1, f"{step.name} completed twice"
                self.ever_done.add(unit.index)
            if unit.in_doubt:
                self.ever_done.add(unit.index)
            return
        assert step.agent in self.plan.compensable, f"{step.name} cannot be undone"
        undo = step.compensation
        assert unit.from_state is (undo.state if undo else None)
        attempts = undo.attempts if undo else 0
        assert unit.attempts - attempts in (0, 1), unit
        started = unit.attempts > attempts  # a new dispatch of the undo
        assert not started or unit.state is S.RUNNING, unit
        if started and unit.index not in self.undo_started:
            assert unit.index in self.ever_done, f"undo of {step.name}, which never ran"
            assert all(unit.index < i for i in self.undo_started), "undo out of order"
            self.undo_started.append(unit.index)
        if unit.state is S.COMPENSATED:
            assert unit.index not in self.undone, f"{step.name} compensated twice"
            assert all(unit.index < i for i in self.undone), "compensations out of order"
            self.undone.append(unit.index)

    def plan_on_copy(self, decide: Callable[[Task], Transition]) -> tuple[Task, Transition]:
        view = self.record.snapshot()
        return view, decided(view, decide)

    def held(self) -> list[Driver]:
        """Drivers that believe they hold the task (they would still be waiting for a reply)."""
        return [d for d in self.drivers
                if d.view.locked_by == d.owner and d.view.state in (T.PROCESSING,
                                                                     T.COMPENSATING)]

    # ------------------------------------------------------------ schedulers
    @precondition(lambda self: self.record.task.locked_by is None
                  and self.record.task.state in (T.PENDING, T.COMPENSATING))
    @rule(owner=st.sampled_from(["s1", "s2"]), wait=st.integers(0, 5))
    def claim(self, owner: str, wait: int) -> None:
        # a store hands the task out only from its available-at time on
        self.now = max(self.now + wait, self.record.task.available_at)
        view, t = self.plan_on_copy(lambda v: self.plan.claim(v, owner, self.now))
        assert t.claim and t.owner is None
        assert self.commit(t, view)
        self.drivers = [*self.drivers[-3:], Driver(owner, applied(view, t))]

    def holder(self) -> Driver | None:
        """The driver whose view is the task as it is: the one instance that holds it."""
        return next((d for d in self.held() if d.view == self.record.task), None)

    @precondition(lambda self: self.holder() is not None)
    @rule(oks=st.integers(0, 4), then=st.sampled_from(["nothing", "permanent", "gave up"]),
          more=st.integers(0, 4), wait=st.integers(0, 3))
    def agents_reply(self, oks: int, then: str, more: int, wait: int) -> None:
        """The holder's agents answer ok unit after unit (E6), then maybe one fails for
        good (S6) or runs out of retries (S8), and `more` units after it answer ok (S9:
        the compensations a failure starts)."""
        driver = self.holder()
        assert driver is not None
        task = self.record.task
        if then != "nothing" and task.phase is Phase.DO:
            oks = min(oks, len(task.steps) - task.cursor - 1)  # fail before the last step ends
        outcomes = ["ok"] * oks + ([] if then == "nothing" else [then, *["ok"] * more])
        for outcome in outcomes:
            if driver not in self.held():
                return  # the task finished, or this driver no longer runs a unit of it
            self.now += wait
            ok, failures = outcome == "ok", self.record.task.failure_count
            state_before = self.record.task.state
            result = {"by": driver.owner, "at": self.now} if ok else None
            error = None if ok else f"{outcome} failure"
            permanent = outcome == "permanent"

            def reply(v: Task, ok: bool = ok, result: object = result,
                      error: str | None = error, permanent: bool = permanent) -> Transition:
                return self.plan.reply(v, driver.owner, ok, result, error, self.now,
                                       permanent=permanent)

            t = decided(driver.view, reply)
            assert self.commit_held(driver, t), "the holder's reply must land"
            if outcome == "gave up":
                self.assert_one_more_failure(failures, state_before)

    @precondition(lambda self: self.holder() is not None
                  and self.record.task.state is T.PROCESSING
                  and self.record.task.cursor + 1 < len(self.record.task.steps))
    @rule()
    def reply_held_up(self) -> None:
        """A timely ok reply whose write is held up (the database restarting) lands after
        the next unit's complete-by, in the same epoch, state and owner; the expiry a
        supervisor planned meanwhile from the unit before must not land on the next one
        and roll the completed step back to be run again."""
        driver = self.holder()
        assert driver is not None
        t = decided(driver.view, lambda v: self.plan.reply(v, driver.owner, True,
                                                            {"by": driver.owner}, None,
                                                            self.now))
        assert t.complete_by is not None
        self.now = t.complete_by + 0.5  # the write is still on its way
        _, expiry = self.plan_on_copy(lambda v: self.plan.expire(v, "sup-1", self.now))
        assert self.commit_held(driver, t)
        assert not self.commit(expiry)

    def stale(self) -> list[Driver]:
        return [d for d in self.held() if d.view != self.record.task]

    @precondition(lambda self: bool(self.stale()))
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "permanent", "gave up"]))
    def late_reply(self, data: st.DataObject, outcome: str) -> None:
        """A reply reaches a driver the task was taken from: it must change nothing (M1)."""
        driver = data.draw(st.sampled_from(self.stale()))
        ok = outcome == "ok"
        t = decided(driver.view, lambda v: self.plan.reply(
            v, driver.owner, ok, {"late": True} if ok else None,
            None if ok else f"{outcome} failure", self.now, permanent=outcome == "permanent"))
        assert not self.commit_held(driver, t)
        self.drivers.remove(driver)  # taken away: the driver lets go

    @precondition(lambda self: bool(self.held()))
    @rule(data=st.data())
    def shut_down(self, data: st.DataObject) -> None:
        """A scheduler stopping hands its task back without counting a failure."""
        driver = data.draw(st.sampled_from(self.held()))
        current = driver.view == self.record.task
        failures = self.record.task.failure_count
        t = decided(driver.view, lambda v: self.plan.release(v, driver.owner, self.now))
        assert self.commit_held(driver, t) == current
        if current:
            assert self.record.task.failure_count == failures
            assert self.record.task.locked_by is None
        self.drivers.remove(driver)

    # ------------------------------------------------------------ supervisors
    @precondition(lambda self: self.record.task.locked_by is not None)
    @rule()
    def expire(self) -> None:
        """Supervisors find the task past its complete-by: an expiry decided too early is
        never applied, and of two at once only one counts (M3)."""
        complete_by = self.record.task.complete_by
        assert complete_by is not None
        _, early = self.plan_on_copy(lambda v: self.plan.expire(v, "sup-1", complete_by))
        assert not self.commit(early)
        self.now = max(self.now, complete_by + 0.5)
        failures, state_before = self.record.task.failure_count, self.record.task.state
        first, t1 = self.plan_on_copy(lambda v: self.plan.expire(v, "sup-1", self.now))
        _, t2 = self.plan_on_copy(lambda v: self.plan.expire(v, "sup-2", self.now))
        assert self.commit(t1, first)
        assert not self.commit(t2)
        self.assert_one_more_failure(failures, state_before)

    def assert_one_more_failure(self, failures: int, state_before: TaskState) -> None:
        """A failed attempt counts once (S8); the one that turns the task to compensation
        leaves the undo a budget of its own (S9), starting from none spent."""
        task = self.record.task
        if state_before is not T.COMPENSATING and task.phase is Phase.UNDO:
            assert task.failure_count == 0
        else:
            assert task.failure_count == failures + 1

    # ------------------------------------------------------------ operators (E8)
    # Operators mostly act on tasks in error; now and then on any task, which the
    # planner must either allow or refuse cleanly (finished tasks: always refused).
    ACTIONS = st.sampled_from(["retry", "retry the step", "compensate", "cancel"])

    @precondition(lambda self: self.record.task.state is T.ERROR or self.interruptions > 0
                  or self.record.task.state in FINISHED)
    @rule(action=ACTIONS)
    def operator_acts(self, action: str) -> None:
        if self.record.task.state not in FINISHED and self.record.task.state is not T.ERROR:
            self.interruptions -= 1
        self.operator(action)

    def operator(self, action: str) -> None:
        task = self.record.task
        state = task.state
        step = task.steps[task.cursor].name
        # each action, and whether the lifecycle allows it from this state; a task in
        # error always has a failed unit, so retry is allowed exactly there
        decide, allowed = {
            "retry": (lambda v: self.plan.retry(v, self.now), state is T.ERROR),
            "retry the step": (lambda v: self.plan.retry(v, self.now, step),
                               state is T.ERROR),
            "compensate": (lambda v: self.plan.compensate(v, self.now),
                           state is not T.COMPENSATING and can_move(state, T.COMPENSATING)),
            "cancel": (lambda v: self.plan.cancel(v, self.now), can_move(state, T.CANCELLED)),
        }[action]
        try:
            view, t = self.plan_on_copy(decide)
        except InvalidTransitionError as refused:
            assert not allowed, f"{action} refused for a {state.value} task: {refused}"
            assert refused.task_id == TASK_ID
            return
        assert allowed, f"{action} allowed for a {state.value} task"
        assert t.actor == "operator"
        assert self.commit(t, view)
        if action.startswith("retry"):
            assert self.record.task.failure_count == 0
        if action == "cancel":
            assert self.record.task.state is T.CANCELLED

    def teardown(self) -> None:
        # steer generation towards long sagas: the histories where undo order matters
        if hasattr(self, "record"):
            target(len(self.undone) + len(self.undo_started) + len(self.ever_done) / 2,
                   label="compensations")

    # ------------------------------------------------------------ invariants
    @invariant()
    def failures_stay_within_the_budget(self) -> None:
        """No task counts more failures than its workflow allows, forward or undoing (S8),
        unless the policy parks it at the threshold and retries on (S8: "wait an extended
        period before the next retry")."""
        if hasattr(self, "record") and self.plan.workflow.on_failure is not OnFailure.PARK:
            assert self.record.task.failure_count <= self.plan.workflow.max_failures

    @invariant()
    def locked_exactly_while_a_unit_runs(self) -> None:
        """LockedBy (and CompleteBy) set iff processing, or compensating with an undo running."""
        if not hasattr(self, "record"):
            return
        task = self.record.task
        undo = task.steps[task.cursor].compensation
        running = task.state is T.PROCESSING or (
            task.state is T.COMPENSATING and undo is not None and undo.state is S.RUNNING)
        assert (task.locked_by is not None) == running, task
        assert (task.complete_by is not None) == running, task
        if task.state is T.PROCESSING:
            assert task.steps[task.cursor].state is S.RUNNING

    @invariant()
    def ended_tasks_hold_no_running_units(self) -> None:
        """processed: every step completed; processed, compensated, error: nothing running."""
        if not hasattr(self, "record"):
            return
        task = self.record.task
        if task.state is T.PROCESSED:
            assert all(s.state is S.COMPLETED for s in task.steps)
            assert self.undo_started == []
        if task.state in (T.PROCESSED, T.COMPENSATED, T.ERROR):
            units = [s.state for s in task.steps] + [
                s.compensation.state for s in task.steps if s.compensation]
            assert S.RUNNING not in units

    @invariant()
    def compensated_means_everything_done_was_undone(self) -> None:
        """compensated: each step that completed (or was in doubt) and can be undone, was."""
        if not hasattr(self, "record") or self.record.task.state is not T.COMPENSATED:
            return
        steps = self.record.task.steps
        owed = {i for i in self.ever_done if steps[i].agent in self.plan.compensable}
        assert owed == set(self.undone)


TestTaskLifecycle = TaskLifecycle.TestCase
# derandomize: the same 200 histories on every run, so CI results never depend on luck
TestTaskLifecycle.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])

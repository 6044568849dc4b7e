"""The planner's forward run: steps started, replied to, released, recovered.

Forward (phase do) the cursor is the step being run. A scheduler claims a task
and starts its step, applies the agent's reply and moves to the next step, or
hands the task back on shutdown; a supervisor counts an expiry or a lost holder
as a failed attempt (S8), and past the workflow's threshold applies its failure
policy (error, park, or compensate: compensation.py); an operator retries a
failed step or cancels a task (E8). The replies of a compensation come here too,
to the same `reply` as the steps' own.
"""

from __future__ import annotations

from typing import Any

from sasflow.errors import InvalidTransitionError
from sasflow.model import Phase, StepState, Task, TaskState
from sasflow.plan.compensation import Compensation
from sasflow.plan.draft import Event, Fence, draft, may_have_run
from sasflow.transition import Transition, UnitChange
from sasflow.workflow import OnFailure

__all__ = ["Forward"]


class Forward(Compensation):
    """A Plan's decisions for the scheduler, the supervisor and the operator's
    retry and cancel."""

    __slots__ = ()

    # ------------------------------------------------------------ scheduler
    def claim(self, task: Task, owner: str, now: float) -> Transition:
        """A scheduler takes an unlocked pending or compensating task (E3)."""
        self._same_shape(task, "claim")
        task = draft(task)
        fence = Fence(task, owner=None, claim=True)
        if task.state is TaskState.PENDING:
            return self._run_step(task, fence, owner, now, why="claimed")
        return self._undo_from(task, task.cursor, fence, owner, now, why="claimed")

    def reply(self, task: Task, owner: str, ok: bool, result: Any, error: str | None,
              now: float, *, permanent: bool = True) -> Transition:
        """Apply an agent's reply for the unit at the cursor (E6, S6).

        A failure that is not permanent means the agent ran out of attempts: it
        counts like an expiry, only sooner.
        """
        self._same_shape(task, "apply a reply to")
        task = draft(task)
        fence = Fence(task, owner=owner)
        name = task.steps[task.cursor].name
        if not ok and not permanent:
            return self._failed_attempt(task, fence, owner, now, f"agent gave up: {error}")
        if task.state is TaskState.COMPENSATING:
            if not ok:
                return self._error(task, fence, owner, now,
                                   self._undo_unit(task, StepState.FAILED, error=error),
                                   f"compensation of {name} failed: {error}")
            undone = self._undo_unit(task, StepState.COMPENSATED, result=result)
            return self._undo_from(task, task.cursor - 1, fence, owner, now, units=undone,
                                   why=f"{name} compensated")
        if not ok:
            failed = self._unit(task, StepState.FAILED, error=error)
            message = f"step {name} failed: {error}"
            if self.workflow.on_failure is OnFailure.COMPENSATE:
                # a nontransient error means the remote refused: nothing of this step to undo
                task.error = message
                return self._undo_from(task, task.cursor - 1, fence, owner, now,
                                       units=[failed], why=message,
                                       events=[("compensating", name)])
            return self._error(task, fence, owner, now, [failed], message)
        done = self._unit(task, StepState.COMPLETED, result=result)
        if task.cursor + 1 < len(task.steps):
            task.cursor += 1
            return self._run_step(task, fence, owner, now, units=[done], why=f"{name} completed",
                                  events=[("step_completed", name)])
        return self._move(task, fence, TaskState.PROCESSED, owner, now, units=[done],
                          why=f"{name} completed, all steps done",
                          events=[("step_completed", name), ("processed", None)])

    def release(self, task: Task, owner: str, now: float) -> Transition:
        """A scheduler shutting down hands its task back, counting no failure."""
        self._same_shape(task, "release")
        task = draft(task)
        fence = Fence(task, owner=owner)
        undoing = task.state is TaskState.COMPENSATING
        name = task.steps[task.cursor].name
        if undoing:
            units = self._undo_unit(task, StepState.PENDING)
        else:
            units = [self._unit(task, StepState.PENDING)]
        return self._move(task, fence, task.state if undoing else TaskState.PENDING, owner, now,
                          units=units, locked_by=None, available_at=now,
                          why=f"{name}: released by {owner} on shutdown")

    # ------------------------------------------------------------ supervisor
    def expire(self, task: Task, supervisor: str, now: float) -> Transition:
        """The unit at the cursor ran past its complete-by (E9, S8, M3).

        Fenced on the expiry itself, so two supervisors never count it twice, and
        (as every transition) on the unit it was read at: an owner whose write was
        held up (a database restart) can record the unit's reply and start the next
        unit with a complete-by that has passed already, and an expiry decided on
        the old unit must not then rewind the task to it.
        """
        task = draft(task)
        fence = Fence(task, owner=task.locked_by, expired_before=now)
        return self._failed_attempt(task, fence, supervisor, now, "expired")

    def orphan(self, task: Task, supervisor: str, now: float) -> Transition:
        """The unit at the cursor is held by an instance that is gone (its heartbeat
        lease lapsed, R2): recover it now rather than at its complete-by.

        Fenced on the owner, epoch, state and unit as read: if the owner was only
        paused and went on to a later unit meanwhile, nothing is written. Counted as
        a failed attempt, like an expiry (S8, E7): to the task a dead holder and a
        step that ran out of time are the same thing, and a step that kills every
        worker that runs it must reach the workflow's threshold rather than be
        retried for ever.
        """
        task = draft(task)
        fence = Fence(task, owner=task.locked_by)
        return self._failed_attempt(task, fence, supervisor, now,
                                    f"holder {task.locked_by} lost its heartbeat lease")

    def _failed_attempt(self, task: Task, fence: Fence, actor: str, now: float,
                        how: str) -> Transition:
        """FailureCount + 1; release below the threshold, else the policy (S8)."""
        name = task.steps[task.cursor].name
        task.failure_count += 1
        failures = task.failure_count
        undoing = task.state is TaskState.COMPENSATING
        why = f"{'compensation of ' if undoing else ''}{name}: {how} ({failures}x)"
        if failures < self.workflow.max_failures:
            if undoing:
                units = self._undo_unit(task, StepState.PENDING, failed=True)
            else:
                units = [self._unit(task, StepState.PENDING, failed=True)]
            return self._move(task, fence, task.state if undoing else TaskState.PENDING,
                              actor, now, units=units, locked_by=None,
                              available_at=now + self.workflow.release_delay(failures),
                              why=f"{why}: released")
        if undoing:
            units = self._undo_unit(task, StepState.FAILED, failed=True, error=how)
            return self._error(task, fence, actor, now, units,
                               f"{why}: compensation exhausted its retries")
        policy = self.workflow.on_failure
        if policy is OnFailure.PARK:
            unit = self._unit(task, StepState.PENDING, failed=True)
            return self._move(task, fence, TaskState.PENDING, actor, now, units=[unit],
                              locked_by=None, available_at=now + self.workflow.park_for,
                              why=f"{why}: parked for {self.workflow.park_for:g}s")
        # its effect may have happened (a reply lost after the effect): in doubt
        unit = self._unit(task, StepState.FAILED, failed=True, in_doubt=True,
                          error=f"{how} {failures} times")
        if policy is OnFailure.COMPENSATE:
            task.error = f"step {name}: {how} {failures} times"
            return self._undo_from(task, task.cursor, fence, None, now, units=[unit],
                                   why=f"{why}: compensating", actor=actor,
                                   events=[("compensating", name)])
        return self._error(task, fence, actor, now, [unit], f"{why}: retries exhausted")

    # ------------------------------------------------------------ operator (E8)
    def retry(self, task: Task, now: float, step: str | None = None) -> Transition:
        """Resubmit the failed step (or failed compensation) of a task in error."""
        self._allow(task, TaskState.PENDING, "retry")
        self._same_shape(task, "retry")
        task = draft(task)
        fence = Fence(task, owner=task.locked_by)
        record = task.steps[task.cursor]
        undoing = task.phase is Phase.UNDO
        failed = (record.compensation.state if undoing and record.compensation
                  else record.state) is StepState.FAILED
        if not failed:
            raise InvalidTransitionError(
                f"cannot retry task {task.task_id}: it has no failed step", task_id=task.task_id)
        if step is not None and step != record.name:
            raise InvalidTransitionError(
                f"cannot retry task {task.task_id}: step {step!r} is not the failed step"
                f" {record.name!r}", task_id=task.task_id, step=step)
        task.failure_count, task.error = 0, None
        if undoing:
            units = self._undo_unit(task, StepState.PENDING, reset=True)
        else:
            units = [self._unit(task, StepState.PENDING, reset=True)]
        return self._move(task, fence, TaskState.COMPENSATING if undoing else TaskState.PENDING,
                          "operator", now, units=units, locked_by=None, available_at=now,
                          why=f"operator retry of {record.name}")

    def cancel(self, task: Task, now: float) -> Transition:
        """Stop the task where it is, undoing nothing."""
        self._allow(task, TaskState.CANCELLED, "cancel")
        task = draft(task)
        fence = Fence(task, owner=task.locked_by)
        units: list[UnitChange] = []
        record = task.steps[task.cursor]
        why = "cancelled by the operator after it started"
        if task.phase is Phase.UNDO:
            if record.compensation is not None and (
                    record.compensation.state is StepState.RUNNING):
                units.extend(self._undo_unit(task, StepState.FAILED, error=why))
        elif may_have_run(record):  # running, or released after a dispatch: in doubt
            units.append(self._unit(task, StepState.FAILED, in_doubt=True, error=why))
        return self._move(task, fence, TaskState.CANCELLED, "operator", now, units=units,
                          locked_by=None, why="operator cancelled",
                          events=[("cancelled", None)])

    def _run_step(self, task: Task, fence: Fence, owner: str, now: float, *, why: str,
                  units: list[UnitChange] | None = None,
                  events: list[Event] | None = None) -> Transition:
        record = task.steps[task.cursor]
        deadline = now + self.workflow.steps[task.cursor].timeout
        task.phase = Phase.DO
        start = self._unit(task, StepState.RUNNING, started=True, complete_by=deadline)
        return self._move(task, fence, TaskState.PROCESSING, owner, now, locked_by=owner,
                          units=[*(units or []), start], complete_by=deadline,
                          why=f"{why}; {record.name} started", events=events)

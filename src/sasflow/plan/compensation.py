"""The planner's compensation: completed steps undone, last to first (S9).

Backward (phase undo) the cursor is the highest step that may still need
undoing; the planner walks it down over the steps that completed, or whose
outcome is in doubt, and have a compensator. A compensation is a durable unit
of its own, with its own attempts, failures and idempotency key, and the step's
own row shows where its undo stands. Entered from a failure of the forward run
(forward.py) or on an operator's request (`compensate`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from sasflow.errors import InvalidTransitionError
from sasflow.model import Phase, StepState, Task, TaskState, idempotency_key
from sasflow.plan.draft import Drafting, Event, Fence, draft, may_have_run
from sasflow.transition import Transition, UnitChange, put_unit, unit_of

__all__ = ["Compensation"]


class Compensation(Drafting):
    """A Plan's decisions that undo what a task did."""

    __slots__ = ()

    def compensate(self, task: Task, now: float) -> Transition:
        """Undo whatever the task did so far, on an operator's request (S9)."""
        if task.state is TaskState.COMPENSATING:
            raise InvalidTransitionError(
                f"cannot compensate task {task.task_id}: it is already compensating",
                task_id=task.task_id)
        self._allow(task, TaskState.COMPENSATING, "compensate")
        self._same_shape(task, "compensate")
        task = draft(task)
        fence = Fence(task, owner=task.locked_by)
        record = task.steps[task.cursor]
        units = []
        start = task.cursor
        if task.phase is Phase.DO:
            if may_have_run(record):  # it may have applied its effect: undo it too
                units.append(self._unit(task, StepState.FAILED, in_doubt=True,
                                        error="interrupted: operator requested compensation"))
            elif not record.in_doubt:
                start = task.cursor - 1
        return self._undo_from(task, start, fence, None, now, units=units, actor="operator",
                               why="operator requested compensation",
                               events=[("compensating", None)])

    def _undo_from(self, task: Task, highest: int, fence: Fence, owner: str | None,
                   now: float, *, why: str, units: list[UnitChange] | None = None,
                   events: list[Event] | None = None, actor: str | None = None) -> Transition:
        """Start the next compensation at or below `highest`, or finish as compensated.

        With no `owner` (supervisor, operator) the task is left unlocked for any
        scheduler to claim. Compensation starts with a failure budget of its own
        (S9: recoverable like any step): the forward steps' failures stay on their
        units and in the task's error, and do not leave the undo a single attempt.
        """
        if task.state is not TaskState.COMPENSATING:
            task.failure_count = 0
        task.phase = Phase.UNDO
        units, events = list(units or []), list(events or [])
        who = actor or owner or "scheduler"
        index = next((i for i in range(min(highest, len(task.steps) - 1), -1, -1)
                      if self._needs_undo(task, i)), None)
        if index is None:
            task.cursor = max(highest, 0)
            return self._move(task, fence, TaskState.COMPENSATED, who, now, units=units,
                              locked_by=None, why=f"{why}; nothing left to undo",
                              events=[*events, ("compensated", None)])
        task.cursor = index
        if owner is None:
            return self._move(task, fence, TaskState.COMPENSATING, who, now, units=units,
                              locked_by=None, available_at=now, why=why, events=events)
        deadline = now + self.workflow.steps[index].timeout
        units.extend(self._undo_unit(task, StepState.RUNNING, started=True,
                                     complete_by=deadline))
        return self._move(task, fence, TaskState.COMPENSATING, owner, now, units=units,
                          locked_by=owner, complete_by=deadline, events=events,
                          why=f"{why}; compensating {task.steps[index].name}")

    def _needs_undo(self, task: Task, index: int) -> bool:
        record = task.steps[index]
        if record.agent not in self.compensable:
            return False
        if record.compensation is not None:
            return record.compensation.state is not StepState.COMPENSATED
        return record.state is StepState.COMPLETED or (
            record.state is StepState.FAILED and record.in_doubt)

    def _undo_unit(self, task: Task, state: StepState, *, started: bool = False,
                   failed: bool = False, reset: bool = False, complete_by: float | None = None,
                   result: Any = None, error: str | None = None) -> list[UnitChange]:
        """The new row of the compensation of the step at the cursor (its own unit, S9),
        and the step's own row, which shows where its undo stands; put into the draft."""
        record = task.steps[task.cursor]
        undo = record.compensation
        index, name, agent = task.cursor, record.name, record.agent
        before = unit_of(undo, index=index, phase=Phase.UNDO, name=name, agent=agent) if (
            undo is not None) else UnitChange(
            index=index, phase=Phase.UNDO, name=name, agent=agent, state=state,
            idempotency_key=idempotency_key(task.task_id, name, Phase.UNDO))
        change = msgspec.structs.replace(
            before, state=state, attempts=before.attempts + started,
            failure_count=0 if reset else before.failure_count + failed,
            complete_by=complete_by if complete_by is not None else before.complete_by,
            result=result if state is StepState.COMPENSATED else before.result,
            error=error, from_state=undo.state if undo is not None else None)
        shown = StepState.COMPENSATED if state is StepState.COMPENSATED else (
            StepState.COMPENSATING)
        step = msgspec.structs.replace(
            unit_of(record, index=index, phase=Phase.DO, name=name, agent=agent),
            state=shown, in_history=False)
        put_unit(task.steps, change)
        put_unit(task.steps, step)
        return [change, step]

"""How the planner builds every decision: the draft, the fence, the new rows.

Each decision works on a private draft of the task's snapshot, fences the
Transition on how the task was read, and computes each touched unit's complete
new row once (attempts, failures, result, in doubt). The shape checks live here
too: every decision that runs a unit, or leads to running one, first checks that
the declaration's step list is the task's (R4). These blocks are shared by the
forward, compensation and migration decisions (forward.py, compensation.py,
migration.py), so what a row or a fence is has one definition.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sasflow.errors import InvalidTransitionError
from sasflow.model import Phase, StepRecord, StepState, Task, TaskState, can_move
from sasflow.transition import Transition, UnitChange, put_unit, unit_of
from sasflow.workflow import Workflow, workflow_version

__all__ = ["Drafting", "Event", "Fence", "draft", "may_have_run", "names", "task_version"]

Event = tuple[str, str | None]


def task_version(task: Task) -> str:
    """The version a task was planned for: as stored, else from its own steps."""
    return task.version or workflow_version(task.workflow,
                                            [(s.name, s.agent) for s in task.steps])


class Drafting:
    """The building blocks of a Plan's decisions (Plan holds the fields)."""

    __slots__ = ()

    workflow: Workflow
    compensable: frozenset[str]  # agents that declared a compensator

    def _shape(self) -> list[tuple[str, str]]:
        return [(s.name, s.agent) for s in self.workflow.steps]

    @staticmethod
    def _shape_of(task: Task) -> list[tuple[str, str]]:
        return [(s.name, s.agent) for s in task.steps]

    def _same_shape(self, task: Task, action: str) -> None:
        """Refuse to plan a task under a declaration whose step list is not the task's."""
        steps = self.workflow.steps
        if task.workflow == self.workflow.name and len(task.steps) == len(steps):
            # on every claim and reply: a plain loop, half the time of all() over a
            # generator, and no lists built
            for record, step in zip(task.steps, steps, strict=True):
                if record.name != step.name or record.agent != step.agent:
                    break
            else:
                return
        declared, current = self.workflow.version, task_version(task)
        raise InvalidTransitionError(
            f"cannot {action} task {task.task_id}: it was planned for version {current} of"
            f" workflow {task.workflow!r} (steps: {names(self._shape_of(task))}) and this"
            f" application declares version {declared} (steps: {names(self._shape())});"
            f" run it on a worker of version {current}, or migrate it"
            " (sasflow tasks migrate)", task_id=task.task_id)

    def _allow(self, task: Task, target: TaskState, action: str) -> None:
        if not can_move(task.state, target):
            raise InvalidTransitionError(
                f"cannot {action} task {task.task_id}: it is {task.state.value}",
                task_id=task.task_id)

    def _move(self, task: Task, fence: Fence, state: TaskState, actor: str, now: float, *,
              why: str, units: list[UnitChange] | None = None, locked_by: str | None = None,
              events: list[Event] | None = None, complete_by: float | None = None,
              available_at: float | None = None) -> Transition:
        """The Transition that moves `task` to `state`, fenced on how it was read."""
        return Transition(
            task_id=task.task_id, workflow=task.workflow, actor=actor, why=why,
            epoch=fence.epoch, from_state=fence.state, owner=fence.owner, from_phase=fence.phase,
            from_cursor=fence.cursor, from_version=fence.version,
            expired_before=fence.expired_before,
            state=state, phase=task.phase, cursor=task.cursor, locked_by=locked_by,
            complete_by=complete_by,
            available_at=task.available_at if available_at is None else available_at,
            failure_count=task.failure_count,
            error=None if state is TaskState.PROCESSED else task.error,
            new_epoch=fence.epoch + fence.claim, version=task.version,
            units=units or [], events=events or [], reply_to=task.reply_to, at=now)

    def _error(self, task: Task, fence: Fence, actor: str, now: float,
               units: list[UnitChange], message: str) -> Transition:
        record = task.steps[task.cursor]
        task.error = message
        transition = self._move(task, fence, TaskState.ERROR, actor, now, units=units,
                                locked_by=None, why=message, events=[("error", record.name)])
        transition.alert = message
        transition.alert_step, transition.alert_agent = record.name, record.agent
        return transition

    def _unit(self, task: Task, state: StepState, *, started: bool = False,
              failed: bool = False, reset: bool = False, complete_by: float | None = None,
              result: Any = None, error: str | None = None,
              in_doubt: bool = False) -> UnitChange:
        """The new row of the step at the cursor, put into the draft: a new dispatch
        counts an attempt, a failed one a failure; the result is the step's own."""
        record = task.steps[task.cursor]
        change = msgspec.structs.replace(
            unit_of(record, index=task.cursor, phase=Phase.DO, name=record.name,
                    agent=record.agent),
            state=state, attempts=record.attempts + started,
            failure_count=0 if reset else record.failure_count + failed,
            complete_by=record.complete_by if complete_by is None else complete_by,
            result=result if state is StepState.COMPLETED else record.result, error=error,
            in_doubt=record.in_doubt or in_doubt)
        put_unit(task.steps, change)
        return change


def draft(task: Task) -> Task:
    """A copy of `task` for a decision to work on. Its step list is its own; the
    records in it are replaced (transition.put_unit), never changed, so they are
    shared with `task` until then."""
    return msgspec.structs.replace(task, steps=list(task.steps))


def names(shape: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name}/{agent}" for name, agent in shape) or "none"


def may_have_run(record: StepRecord) -> bool:
    """Whether the step may have applied its effect without its completion recorded:
    it runs now, or it was dispatched before and released (an expiry, a lost reply)."""
    return record.state is StepState.RUNNING or (
        record.state is StepState.PENDING and record.attempts > 0)


class Fence:
    """How the task was read: the transition applies only if it is still so."""

    __slots__ = ("claim", "cursor", "epoch", "expired_before", "owner", "phase", "state",
                 "version")

    def __init__(self, task: Task, *, owner: str | None, claim: bool = False,
                 expired_before: float | None = None) -> None:
        self.epoch, self.state, self.owner = task.epoch, task.state, owner
        self.phase, self.cursor = task.phase, task.cursor  # the unit it was read at
        self.version = task.version  # and the shape it was planned for
        self.claim, self.expired_before = claim, expired_before

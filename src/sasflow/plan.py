"""The planner: pure functions that decide each task's next Transition.

Given a workflow, a snapshot of a task and what just happened (a claim, an
agent's reply, an expiry, an operator's request), the planner returns the one
Transition to apply: the task's new values and each touched unit's complete new
row, computed from the snapshot, which it leaves as it was
(`transition.applied(task, t)` is the task once it applies). No I/O and no clock
of its own: `now` is passed in. The scheduler, the
supervisor and the operator commands all decide here, so the rules of the
pattern (S2, S6, S8, S9, E8, E9) live in one place.

Forward (phase do) the cursor is the step being run. Backward (phase undo) it
is the highest step that may still need undoing; the planner walks it down over
the steps that completed, or whose outcome is in doubt, and have a compensator.

Versions (R4, M4). A task is planned for one shape of its workflow: the steps
(names and agents, in order) it was submitted with, which its version names.
Whatever runs a unit, or leads to running one (claim, reply, release, retry,
compensate), needs the declaration's step list to be the task's, and refuses
with InvalidTransitionError naming both versions otherwise: never an IndexError
or a step run again because the list moved under it. Expiry and cancel read
only the task's own steps, so the supervisor of any release can count an
expiry (the release leaves the task to schedulers of its own version). `migrate`
re-plans a task onto this declaration when that is provably safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

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
from sasflow.transition import Transition, UnitChange, put_unit
from sasflow.workflow import OnFailure, Workflow, workflow_version

__all__ = ["Plan", "task_version"]

Event = tuple[str, str | None]


def task_version(task: Task) -> str:
    """The version a task was planned for: as stored, else from its own steps."""
    return task.version or workflow_version(task.workflow,
                                            [(s.name, s.agent) for s in task.steps])


@dataclass(frozen=True, slots=True)
class Plan:
    """A workflow plus which of its agents can undo their work: decides each of its
    tasks' Transitions, never changing the snapshot it is given.

    (Each decision works on a private draft of the snapshot: `_draft`.)
    """

    workflow: Workflow
    compensable: frozenset[str]  # agents that declared a compensator

    @property
    def version(self) -> str:
        """The workflow version it decides for: the only one its claims take (R4)."""
        return self.workflow.version

    # ------------------------------------------------------------ scheduler
    def claim(self, task: Task, owner: str, now: float) -> Transition:
        """A scheduler takes an unlocked pending or compensating task (E3)."""
        self._same_shape(task, "claim")
        task = _draft(task)
        fence = _Fence(task, owner=None, claim=True)
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
        task = _draft(task)
        fence = _Fence(task, owner=owner)
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
        task = _draft(task)
        fence = _Fence(task, owner=owner)
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
        task = _draft(task)
        fence = _Fence(task, owner=task.locked_by, expired_before=now)
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
        task = _draft(task)
        fence = _Fence(task, owner=task.locked_by)
        return self._failed_attempt(task, fence, supervisor, now,
                                    f"holder {task.locked_by} lost its heartbeat lease")

    def _failed_attempt(self, task: Task, fence: _Fence, actor: str, now: float,
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
        task = _draft(task)
        fence = _Fence(task, owner=task.locked_by)
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

    def compensate(self, task: Task, now: float) -> Transition:
        """Undo whatever the task did so far, on an operator's request (S9)."""
        if task.state is TaskState.COMPENSATING:
            raise InvalidTransitionError(
                f"cannot compensate task {task.task_id}: it is already compensating",
                task_id=task.task_id)
        self._allow(task, TaskState.COMPENSATING, "compensate")
        self._same_shape(task, "compensate")
        task = _draft(task)
        fence = _Fence(task, owner=task.locked_by)
        record = task.steps[task.cursor]
        units = []
        start = task.cursor
        if task.phase is Phase.DO:
            if _may_have_run(record):  # it may have applied its effect: undo it too
                units.append(self._unit(task, StepState.FAILED, in_doubt=True,
                                        error="interrupted: operator requested compensation"))
            elif not record.in_doubt:
                start = task.cursor - 1
        return self._undo_from(task, start, fence, None, now, units=units, actor="operator",
                               why="operator requested compensation",
                               events=[("compensating", None)])

    def cancel(self, task: Task, now: float) -> Transition:
        """Stop the task where it is, undoing nothing."""
        self._allow(task, TaskState.CANCELLED, "cancel")
        task = _draft(task)
        fence = _Fence(task, owner=task.locked_by)
        units: list[UnitChange] = []
        record = task.steps[task.cursor]
        why = "cancelled by the operator after it started"
        if task.phase is Phase.UNDO:
            if record.compensation is not None and (
                    record.compensation.state is StepState.RUNNING):
                units.extend(self._undo_unit(task, StepState.FAILED, error=why))
        elif _may_have_run(record):  # running, or released after a dispatch: in doubt
            units.append(self._unit(task, StepState.FAILED, in_doubt=True, error=why))
        return self._move(task, fence, TaskState.CANCELLED, "operator", now, units=units,
                          locked_by=None, why="operator cancelled",
                          events=[("cancelled", None)])

    def migrate(self, task: Task, now: float) -> Transition:
        """Re-plan a task of another version of this workflow onto this declaration.

        Only when it is provably safe: the task is unlocked and moving forward
        (pending, or error at a failed step); every step it has started keeps its
        place, name and agent in this declaration (a prefix of both lists); and
        this declaration has a step at the task's cursor to resume from. The steps
        after that prefix, none of which ever ran, become this declaration's.
        Anything else is refused with InvalidTransitionError saying why.
        """
        target, current = self.workflow.version, task_version(task)
        what = (f"cannot migrate task {task.task_id} from version {current} to {target}"
                f" of workflow {self.workflow.name!r}")
        if task.workflow != self.workflow.name:
            raise InvalidTransitionError(f"{what}: it is a task of workflow {task.workflow!r}",
                                         task_id=task.task_id)
        if current == target and self._shape_of(task) == self._shape():
            raise InvalidTransitionError(f"{what}: it is of that version already",
                                         task_id=task.task_id)
        if task.locked_by is not None or task.phase is not Phase.DO or task.state not in (
                TaskState.PENDING, TaskState.ERROR):
            where = " while compensating" if task.phase is Phase.UNDO else ""
            raise InvalidTransitionError(
                f"{what}: it is {task.state.value}{where}; only unlocked pending or error"
                " tasks moving forward can be migrated", task_id=task.task_id)
        declared, held = self._shape(), self._shape_of(task)
        kept = next((i for i, (a, b) in enumerate(zip(held, declared, strict=False)) if a != b),
                    min(len(held), len(declared)))
        for index in range(kept, len(task.steps)):
            record = task.steps[index]
            if record.state is not StepState.PENDING or record.attempts or record.in_doubt or (
                    record.compensation is not None):
                raise InvalidTransitionError(
                    f"{what}: step {record.name!r} (agent {record.agent!r}, position"
                    f" {index + 1}) has run and version {target} has no such step there",
                    task_id=task.task_id, step=record.name)
        if task.cursor >= len(declared):
            raise InvalidTransitionError(
                f"{what}: version {target} has no step left to run after"
                f" {', '.join(n for n, _ in declared)}; finish it on a worker of version"
                f" {current}, or cancel it", task_id=task.task_id)
        task = _draft(task)
        fence = _Fence(task, owner=None)
        units = [UnitChange(index=i, phase=Phase.DO, name=step.name, agent=step.agent,
                            idempotency_key=idempotency_key(task.task_id, step.name),
                            state=StepState.PENDING)
                 for i, step in enumerate(self.workflow.steps) if i >= kept]
        del task.steps[len(declared):]
        for unit in units:
            put_unit(task.steps, unit)
        task.version = target
        transition = self._move(task, fence, task.state, "operator", now, units=units,
                                why=f"operator migrated it from version {current} to {target}")
        if len(held) > len(declared):
            transition.steps_from = len(declared)
        return transition

    # ------------------------------------------------------------ building blocks
    def _shape(self) -> list[tuple[str, str]]:
        return [(s.name, s.agent) for s in self.workflow.steps]

    @staticmethod
    def _shape_of(task: Task) -> list[tuple[str, str]]:
        return [(s.name, s.agent) for s in task.steps]

    def _same_shape(self, task: Task, action: str) -> None:
        """Refuse to plan a task under a declaration whose step list is not the task's."""
        steps = self.workflow.steps
        if task.workflow == self.workflow.name and len(task.steps) == len(steps) and all(
                r.name == s.name and r.agent == s.agent
                for r, s in zip(task.steps, steps, strict=True)):
            return  # (on every claim and reply: no lists built)
        declared, current = self.workflow.version, task_version(task)
        raise InvalidTransitionError(
            f"cannot {action} task {task.task_id}: it was planned for version {current} of"
            f" workflow {task.workflow!r} (steps: {_names(self._shape_of(task))}) and this"
            f" application declares version {declared} (steps: {_names(self._shape())});"
            f" run it on a worker of version {current}, or migrate it"
            " (sasflow tasks migrate)", task_id=task.task_id)

    def _run_step(self, task: Task, fence: _Fence, owner: str, now: float, *, why: str,
                  units: list[UnitChange] | None = None,
                  events: list[Event] | None = None) -> Transition:
        record = task.steps[task.cursor]
        deadline = now + self.workflow.steps[task.cursor].timeout
        task.phase = Phase.DO
        start = self._unit(task, StepState.RUNNING, started=True, complete_by=deadline)
        return self._move(task, fence, TaskState.PROCESSING, owner, now, locked_by=owner,
                          units=[*(units or []), start], complete_by=deadline,
                          why=f"{why}; {record.name} started", events=events)

    def _undo_from(self, task: Task, highest: int, fence: _Fence, owner: str | None,
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

    def _error(self, task: Task, fence: _Fence, actor: str, now: float,
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
        change = UnitChange(
            index=task.cursor, phase=Phase.DO, name=record.name, agent=record.agent,
            idempotency_key=record.idempotency_key, state=state,
            attempts=record.attempts + started,
            failure_count=0 if reset else record.failure_count + failed,
            complete_by=record.complete_by if complete_by is None else complete_by,
            result=result if state is StepState.COMPLETED else record.result, error=error,
            in_doubt=record.in_doubt or in_doubt, from_state=record.state)
        put_unit(task.steps, change)
        return change

    def _undo_unit(self, task: Task, state: StepState, *, started: bool = False,
                   failed: bool = False, reset: bool = False, complete_by: float | None = None,
                   result: Any = None, error: str | None = None) -> list[UnitChange]:
        """The new row of the compensation of the step at the cursor (its own unit, S9),
        and the step's own row, which shows where its undo stands; put into the draft."""
        record = task.steps[task.cursor]
        undo = record.compensation
        change = UnitChange(
            index=task.cursor, phase=Phase.UNDO, name=record.name, agent=record.agent,
            idempotency_key=undo.idempotency_key if undo is not None else idempotency_key(
                task.task_id, record.name, Phase.UNDO),
            state=state, attempts=(undo.attempts if undo else 0) + started,
            failure_count=0 if reset else (undo.failure_count if undo else 0) + failed,
            complete_by=complete_by if complete_by is not None else (
                undo.complete_by if undo else None),
            result=result if state is StepState.COMPENSATED else (
                undo.result if undo else None),
            error=error, from_state=undo.state if undo is not None else None)
        shown = StepState.COMPENSATED if state is StepState.COMPENSATED else (
            StepState.COMPENSATING)
        step = UnitChange(
            index=task.cursor, phase=Phase.DO, name=record.name, agent=record.agent,
            idempotency_key=record.idempotency_key, state=shown, attempts=record.attempts,
            failure_count=record.failure_count, complete_by=record.complete_by,
            result=record.result, error=record.error, in_doubt=record.in_doubt,
            from_state=record.state, in_history=False)
        put_unit(task.steps, change)
        put_unit(task.steps, step)
        return [change, step]

    def _allow(self, task: Task, target: TaskState, action: str) -> None:
        if not can_move(task.state, target):
            raise InvalidTransitionError(
                f"cannot {action} task {task.task_id}: it is {task.state.value}",
                task_id=task.task_id)

    def _move(self, task: Task, fence: _Fence, state: TaskState, actor: str, now: float, *,
              why: str, units: list[UnitChange] | None = None, locked_by: str | None = None,
              events: list[Event] | None = None, complete_by: float | None = None,
              available_at: float | None = None) -> Transition:
        """The Transition that moves `task` to `state`, fenced on how it was read."""
        return Transition(
            task_id=task.task_id, actor=actor, why=why, epoch=fence.epoch,
            from_state=fence.state, owner=fence.owner, from_phase=fence.phase,
            from_cursor=fence.cursor, from_version=fence.version,
            expired_before=fence.expired_before,
            state=state, phase=task.phase, cursor=task.cursor, locked_by=locked_by,
            complete_by=complete_by,
            available_at=task.available_at if available_at is None else available_at,
            failure_count=task.failure_count,
            error=None if state is TaskState.PROCESSED else task.error,
            new_epoch=fence.epoch + fence.claim, version=task.version,
            units=units or [], events=events or [], reply_to=task.reply_to)


def _draft(task: Task) -> Task:
    """A copy of `task` for a decision to work on. Its step list is its own; the
    records in it are replaced (transition.put_unit), never changed, so they are
    shared with `task` until then."""
    return msgspec.structs.replace(task, steps=list(task.steps))


def _names(shape: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name}/{agent}" for name, agent in shape) or "none"


def _may_have_run(record: StepRecord) -> bool:
    """Whether the step may have applied its effect without its completion recorded:
    it runs now, or it was dispatched before and released (an expiry, a lost reply)."""
    return record.state is StepState.RUNNING or (
        record.state is StepState.PENDING and record.attempts > 0)


class _Fence:
    """How the task was read: the transition applies only if it is still so."""

    __slots__ = ("claim", "cursor", "epoch", "expired_before", "owner", "phase", "state",
                 "version")

    def __init__(self, task: Task, *, owner: str | None, claim: bool = False,
                 expired_before: float | None = None) -> None:
        self.epoch, self.state, self.owner = task.epoch, task.state, owner
        self.phase, self.cursor = task.phase, task.cursor  # the unit it was read at
        self.version = task.version  # and the shape it was planned for
        self.claim, self.expired_before = claim, expired_before

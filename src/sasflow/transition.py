"""The one shape of every state change: a fenced, all-or-nothing Transition.

Schedulers, supervisors and operators compute Transitions with the pure planner
(sasflow.plan); stores apply them as a single conditional write. A Transition applies
only if the task still has the epoch, state, owner and position (phase and
cursor) it was computed from (the fence, DESIGN invariants 2 and 4); otherwise
nothing at all is written.

The version is part of the fence because a transition writes the version it
read (it carries values, see below), and a migration changes the version and the
steps and nothing else of the fence.

The position is part of the fence because a scheduler holding a task moves it
from unit to unit within one epoch, state and owner: a write planned from a read
of the unit before (a supervisor's expiry, an operator's action) must not land on
the unit after, rolling a committed step back to be run again.

A Transition carries results, not deltas: the task's new values and each touched
unit's complete new row, computed once by the planner from the snapshot it read.
A store writes them as they are, under the fence, so writing the same Transition
again changes nothing; `applied` says what they make of a snapshot, and is the
one definition of that (the planner, the in-memory store and the model test use
it; the SQL stores write the same values column for column).
"""

from __future__ import annotations

from typing import Any

import msgspec

from sasflow.fields import copier
from sasflow.model import CompensationRecord, Phase, StepRecord, StepState, Task, TaskState

__all__ = ["LeaseFence", "Transition", "UnitChange", "applied", "put_unit", "unit_of",
           "written_at"]


# out of the garbage collector, as model.py's records (see there)
class UnitChange(msgspec.Struct, kw_only=True, gc=False):
    """The complete new row of one unit of work: a step (phase do) or its
    compensation (undo)."""

    index: int
    phase: Phase
    name: str
    agent: str
    idempotency_key: str
    state: StepState
    attempts: int = 0
    failure_count: int = 0
    complete_by: float | None = None
    result: Any = None
    error: str | None = None
    in_doubt: bool = False  # (a step's: its effect may have happened)
    # for the history: the state the unit moved from, and whether this is a move of
    # its own (False: a step's row showing where its compensation stands, S9)
    from_state: StepState | None = None
    in_history: bool = True


class LeaseFence(msgspec.Struct, frozen=True):
    """A lease the writer must still hold, with this fencing epoch, for the write to apply."""

    name: str
    holder: str
    epoch: int


class Transition(msgspec.Struct, kw_only=True, gc=False):
    """A fenced change to one task: its new values, its units' new rows, and the
    history, status and alert that go with it."""

    task_id: str
    # the task's workflow: written nowhere (the task row has it), it names what a
    # change is about to those who hear of it (metrics.py counts by workflow)
    workflow: str = ""
    actor: str  # who: a scheduler/supervisor instance id, or "operator"
    why: str
    # the fence: the task must still be exactly as it was read
    epoch: int
    from_state: TaskState
    owner: str | None  # locked_by must equal this (None: must be unlocked)
    from_phase: Phase  # and the unit at the cursor the same one: phase...
    from_cursor: int  # ... and cursor as read
    from_version: str | None  # and the version (a migration changes it, nothing else)
    expired_before: float | None = None  # and complete_by < this (supervisor)
    lease: LeaseFence | None = None  # and the supervisors' lease still held (M3)
    # the task's new values
    state: TaskState
    phase: Phase
    cursor: int
    locked_by: str | None
    complete_by: float | None = None
    available_at: float  # claimable from then on (if claimable at all)
    failure_count: int
    error: str | None = None
    new_epoch: int  # the epoch, one more on a claim (the fencing token)
    version: str | None  # of its workflow (plan.Plan.migrate changes it)
    units: list[UnitChange] = msgspec.field(default_factory=list)
    # a migration to a shape with fewer steps: step rows (phase do) from this index on
    # are dropped (disjoint from the units, which end before it)
    steps_from: int | None = None
    events: list[tuple[str, str | None]] = msgspec.field(default_factory=list)  # (event, step)
    reply_to: str | None = None  # where status events go (E11)
    alert: str | None = None
    alert_step: str | None = None
    alert_agent: str | None = None
    # when it was decided (the planner's now, on the store's clock): the task's
    # updated_at and the time of its history once written, so the snapshot `applied`
    # makes is the row the store holds; None: the time the store writes it
    at: float | None = None

    @property
    def claim(self) -> bool:
        """Whether this is a claim: it starts a new epoch."""
        return self.new_epoch != self.epoch


def applied(task: Task, t: Transition) -> Task:
    """The task once `t` applied to it: a new snapshot, `task` left as it was.

    The fence is not checked here: the caller knows that it holds (the planner,
    which computed `t` from `task`) or checks it (the in-memory store). Step
    records are replaced, never changed, so the two snapshots may share the rest.
    """
    steps = list(task.steps)
    if t.steps_from is not None:
        del steps[t.steps_from:]
    for unit in t.units:
        put_unit(steps, unit)
    return msgspec.structs.replace(
        task, state=t.state, phase=t.phase, cursor=t.cursor, locked_by=t.locked_by,
        complete_by=t.complete_by, available_at=t.available_at,
        failure_count=t.failure_count, error=t.error, epoch=t.new_epoch, version=t.version,
        updated_at=task.updated_at if t.at is None else t.at, steps=steps)


def written_at(t: Transition, now: float) -> float:
    """The time the store writes for `t`, applied at `now`."""
    return now if t.at is None else t.at


def unit_of(record: StepRecord | CompensationRecord, *, index: int, phase: Phase,
            name: str, agent: str) -> UnitChange:
    """The row `record` stands for, every value as it is (to change with
    msgspec.structs.replace): a field added to the records is carried along by
    every transition without being named here."""
    unit: UnitChange = _UNIT_OF[type(record)](record, index, phase, name, agent, record.state)
    return unit


def put_unit(steps: list[StepRecord], unit: UnitChange) -> None:
    """Put `unit`'s row into `steps` (a task's step list), replacing the record."""
    if unit.phase is Phase.DO:
        record: StepRecord = _AS_STEP(unit)
        if unit.index < len(steps):
            record.compensation = steps[unit.index].compensation
            steps[unit.index] = record
        else:  # a step a migration adds at the end
            steps.append(record)
        return
    steps[unit.index] = msgspec.structs.replace(steps[unit.index],
                                                compensation=_AS_UNDO(unit))


# The fields a unit row and each record share, by name: what put_unit and unit_of copy
# (compiled once: fields.py)
_STEP_FIELDS = [f for f in StepRecord.__struct_fields__ if f in UnitChange.__struct_fields__]
_UNDO_FIELDS = [f for f in CompensationRecord.__struct_fields__
                if f in UnitChange.__struct_fields__]
_AS_STEP = copier(UnitChange, StepRecord, _STEP_FIELDS)
_AS_UNDO = copier(UnitChange, CompensationRecord, _UNDO_FIELDS)
_GIVEN = ("index", "phase", "name", "agent", "from_state")
_UNIT_OF = {record: copier(record, UnitChange, [*fields, *_GIVEN], *_GIVEN)
            for record, fields in ((StepRecord, _STEP_FIELDS),
                                   (CompensationRecord, _UNDO_FIELDS))}

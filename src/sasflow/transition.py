"""The one shape of every state change: a fenced, all-or-nothing Transition.

Schedulers, supervisors and operators compute Transitions with the pure planner
(plan.py); stores apply them as a single conditional write. A Transition applies
only if the task still has the epoch, state, owner and position (phase and
cursor) it was computed from (the fence, DESIGN invariants 2 and 4); otherwise
nothing at all is written.

The position is part of the fence because a scheduler holding a task moves it
from unit to unit within one epoch, state and owner: a write planned from a read
of the unit before (a supervisor's expiry, an operator's action) must not land on
the unit after, rolling a committed step back to be run again.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sasflow.model import Phase, StepState, TaskState

__all__ = ["UNSET", "LeaseFence", "Transition", "UnitChange"]

UNSET: Any = msgspec.UNSET


class UnitChange(msgspec.Struct, kw_only=True):
    """A change to one unit of work: a step (phase do) or its compensation (undo)."""

    index: int
    phase: Phase
    name: str
    agent: str
    idempotency_key: str
    state: StepState
    from_state: StepState | None = None  # for the history
    started: bool = False  # a new dispatch: attempts + 1
    failed: bool = False  # one more failure: failure_count + 1
    reset_failures: bool = False  # operator retry: failure_count = 0
    complete_by: float | None = None
    result: Any = UNSET  # kept unless given
    error: str | None = None
    in_doubt: bool = False


class LeaseFence(msgspec.Struct, frozen=True):
    """A lease the writer must still hold, with this fencing epoch, for the write to apply."""

    name: str
    holder: str
    epoch: int


class Transition(msgspec.Struct, kw_only=True):
    """A fenced change to one task, with its units, history, status and alert."""

    task_id: str
    actor: str  # who: a scheduler/supervisor instance id, or "operator"
    why: str
    # the fence: the task must still be exactly as it was read
    epoch: int
    from_state: TaskState
    owner: str | None  # locked_by must equal this (None: must be unlocked)
    from_phase: Phase  # and the unit at the cursor the same one: phase...
    from_cursor: int  # ... and cursor as read
    expired_before: float | None = None  # and complete_by < this (supervisor)
    lease: LeaseFence | None = None  # and the supervisors' lease still held (M3)
    # the task's new values
    state: TaskState
    phase: Phase
    cursor: int
    locked_by: str | None
    complete_by: float | None = None
    available_at: float | None = None  # claimable from then on; None keeps it
    failure_count: int
    error: str | None = None
    claim: bool = False  # a claim: epoch + 1
    units: list[UnitChange] = msgspec.field(default_factory=list)
    events: list[tuple[str, str | None]] = msgspec.field(default_factory=list)  # (event, step)
    reply_to: str | None = None  # where status events go (E11)
    alert: str | None = None
    alert_step: str | None = None
    alert_agent: str | None = None
    # a migration (plan.Plan.migrate) re-plans the task onto another version: its new
    # version, and where its step rows end now if the new shape has fewer steps
    version: str | None = None  # None keeps the task's
    steps_from: int | None = None  # step rows (phase do) from this index on are dropped

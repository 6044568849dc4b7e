"""Task and step records, their states, and the transitions allowed between them.

Pure: no I/O. Every store asks this module whether a transition is allowed, so
the rules live in one place (SPEC S2, E2, S9)::

    task:  pending ──claim──▶ processing ──all steps done──▶ processed
              ▲                  │  │ └─nontransient / exhausted──▶ error ◀──┐
              └──release─────────┘  └──undo──▶ compensating ──▶ compensated│
                                         (nothing to undo: straight to compensated)
                                               └──compensation exhausted───┘
           pending | processing | error ──cancel──▶ cancelled

    step:  pending ──▶ running ──▶ completed ──▶ compensating ──▶ compensated
                        │  ▲ release
                        └──┴──▶ failed ──operator retry──▶ pending

A compensation is a unit of its own (own attempts, deadline and idempotency key,
DESIGN invariant 8): the step it undoes moves completed -> compensating ->
compensated alongside it.
"""

from __future__ import annotations

import enum
import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec

__all__ = [
    "CLAIMABLE_TASK_STATES",
    "FINAL_TASK_STATES",
    "TERMINAL_TASK_STATES",
    "UNFINISHED_TASK_STATES",
    "CompensationRecord",
    "Phase",
    "StepRecord",
    "StepState",
    "Task",
    "TaskState",
    "can_move",
    "claimable",
    "final",
    "idempotency_key",
    "isoformat",
    "terminal",
]


class TaskState(enum.StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    PROCESSED = "processed"
    ERROR = "error"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    CANCELLED = "cancelled"


class StepState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"


class Phase(enum.StrEnum):
    """Which way a task is moving: forward through its steps, or back undoing them."""

    DO = "do"
    UNDO = "undo"


# The two predicates every layer asks, defined here once. The stores' SQL spells them
# from these constants (store/queries.py CLAIMABLE_SQL; the partial index tasks_claimable
# in the migrations is checked against it by tests/unit/test_model.py).

# A task no scheduler holds is taken up (claimed) in these states: pending runs its
# next step, compensating its next undo (E3, S9). In this order in SQL text: SQLite
# uses a partial index only for a query whose WHERE repeats the index's own terms.
CLAIMABLE_TASK_STATES: tuple[TaskState, ...] = (TaskState.PENDING, TaskState.COMPENSATING)

TERMINAL_TASK_STATES = frozenset(
    {TaskState.PROCESSED, TaskState.ERROR, TaskState.COMPENSATED, TaskState.CANCELLED}
)

# Work still to be done by some worker (the census of incidents, R4).
UNFINISHED_TASK_STATES: tuple[TaskState, ...] = (
    TaskState.PENDING, TaskState.PROCESSING, TaskState.COMPENSATING)


def claimable(state: TaskState, locked_by: str | None) -> bool:
    """Whether a scheduler may claim a task in `state` held by `locked_by` (once its
    available-at time has come): nobody holds it and it has a unit to run."""
    return locked_by is None and state in CLAIMABLE_TASK_STATES


def terminal(state: TaskState) -> bool:
    """Whether a task in `state` is done with: nothing runs it any more, and waiters
    return (only an operator moves a task out of error, E8)."""
    return state in TERMINAL_TASK_STATES


_T = TaskState
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    # -> compensated directly: an undo was asked for and there was nothing to undo
    _T.PENDING: frozenset(
        {_T.PROCESSING, _T.COMPENSATING, _T.COMPENSATED, _T.ERROR, _T.CANCELLED}
    ),
    # processing -> pending is the supervisor's release; -> compensating is a saga
    _T.PROCESSING: frozenset(
        {_T.PENDING, _T.PROCESSED, _T.ERROR, _T.COMPENSATING, _T.COMPENSATED, _T.CANCELLED}
    ),
    _T.COMPENSATING: frozenset({_T.COMPENSATING, _T.COMPENSATED, _T.ERROR}),
    # error is terminal until an operator acts on it (E8)
    _T.ERROR: frozenset({_T.PENDING, _T.COMPENSATING, _T.COMPENSATED, _T.CANCELLED}),
    _T.PROCESSED: frozenset(),
    _T.COMPENSATED: frozenset(),
    _T.CANCELLED: frozenset(),
}

# The terminal states with no way out: no rule and no operator moves a task out of
# one, and nothing deletes it, so a task in one reads the same forever (ended_here.py)
FINAL_TASK_STATES = frozenset(state for state, out in TASK_TRANSITIONS.items() if not out)


def final(state: TaskState) -> bool:
    """Whether a task in `state` can never change again (processed, compensated,
    cancelled; not error, which an operator may retry or compensate, E8)."""
    return state in FINAL_TASK_STATES

_S = StepState
# Both kinds of unit use these states: a step (pending -> running -> completed |
# failed) and its compensation (pending -> running -> compensated | failed); the
# step itself shows completed -> compensating -> compensated meanwhile.
STEP_TRANSITIONS: dict[StepState, frozenset[StepState]] = {
    # pending -> failed: an operator undoes a task whose released step had run (in doubt)
    _S.PENDING: frozenset({_S.RUNNING, _S.FAILED}),
    _S.RUNNING: frozenset({_S.RUNNING, _S.PENDING, _S.COMPLETED, _S.FAILED, _S.COMPENSATED}),
    # failed -> compensating: a step whose outcome is in doubt (it expired too often)
    # is undone too, since its effect may have been applied; failed -> running: a
    # failed compensation tried again
    _S.FAILED: frozenset({_S.PENDING, _S.RUNNING, _S.COMPENSATING}),
    _S.COMPLETED: frozenset({_S.COMPENSATING}),
    _S.COMPENSATING: frozenset({_S.COMPENSATING, _S.COMPENSATED}),
    _S.COMPENSATED: frozenset(),
}


def can_move(current: TaskState | StepState, target: TaskState | StepState) -> bool:
    """Whether `current -> target` is an allowed transition (task or step states)."""
    if isinstance(current, TaskState) and isinstance(target, TaskState):
        return target in TASK_TRANSITIONS[current]
    if isinstance(current, StepState) and isinstance(target, StepState):
        return target in STEP_TRANSITIONS[current]
    raise TypeError("cannot mix task and step states")


_KEY_NAMESPACE = uuid.UUID("6f1c1c0e-5a5f-4d0e-9a57-5a5f10e5a5f1")
_KEY_NAMESPACE_BYTES = _KEY_NAMESPACE.bytes


def idempotency_key(task_id: str, step: str, phase: Phase = Phase.DO) -> str:
    """The key an agent passes to its remote service (S3, DESIGN invariant 5).

    Derived only from what never changes for a unit of work, so it is identical on
    every attempt, every epoch and every instance; a compensation gets its own.
    """
    # uuid.uuid5 spelled out (RFC 4122 name-based, SHA-1): the same string, without
    # building a UUID object, three times per submission
    digest = bytearray(hashlib.sha1(_KEY_NAMESPACE_BYTES + (
        f"{phase.value}\x00{task_id}\x00{step}").encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def isoformat(ts: float | None) -> str | None:
    """A store timestamp (seconds since the epoch) as ISO-8601 with a UTC offset."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat()


# The records a step makes and drops by the thousand (these, transition.py's, the
# messages', store/records.py's) are kept out of the garbage collector (msgspec's
# `gc=False`): tracked, they were counted toward each young collection and swept
# by every full one while their tasks were in flight, and collecting took about a
# sixth of the in-process roles' time (docs/benchmarks.md). They can be: their
# fields hold scalars, these records, and values decoded from JSON or msgpack
# (inputs, results), which never refer back to a record, so no reference cycle
# runs through them. (A caller that made one, by putting a record inside a task's
# input or result, would keep that record alive until the process ends.)
class CompensationRecord(msgspec.Struct, kw_only=True, gc=False):
    """The undo of one completed step: a durable unit of its own (S9)."""

    state: StepState
    attempts: int = 0
    failure_count: int = 0
    complete_by: float | None = None
    idempotency_key: str = ""
    result: Any = None  # what the compensator returned (stored; not shown)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "attempts": self.attempts,
            "failure_count": self.failure_count,
            "complete_by": isoformat(self.complete_by),
            "idempotency_key": self.idempotency_key,
            "error": self.error,
        }


class StepRecord(msgspec.Struct, kw_only=True, gc=False):
    """One step of a task as the store holds it (SPEC S2)."""

    name: str
    agent: str
    state: StepState
    attempts: int = 0
    failure_count: int = 0
    complete_by: float | None = None
    idempotency_key: str = ""
    result: Any = None
    error: str | None = None
    in_doubt: bool = False  # failed by expiring too often: its effect may have happened
    compensation: CompensationRecord | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "agent": self.agent,
            "state": self.state.value,
            "attempts": self.attempts,
            "failure_count": self.failure_count,
            "complete_by": isoformat(self.complete_by),
            "idempotency_key": self.idempotency_key,
            "result": self.result,
            "error": self.error,
        }
        if self.compensation is not None:
            out["compensation"] = self.compensation.to_json()
        return out


class Task(msgspec.Struct, kw_only=True, gc=False):
    """A task's state record (SPEC E2) and, when loaded with them, its steps."""

    task_id: str
    workflow: str
    input: Any
    state: TaskState
    phase: Phase = Phase.DO  # do: forward through the steps; undo: compensating
    cursor: int = 0  # the step being run, or undone
    locked_by: str | None = None
    complete_by: float | None = None
    available_at: float = 0.0  # a scheduler may claim it from then on (backoff, park)
    failure_count: int = 0
    epoch: int = 0
    reply_to: str | None = None
    error: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    # the version of its workflow it was planned for (workflow.py: Workflow.version);
    # only workers that declare this version run it (R4, M4)
    version: str | None = None
    steps: list[StepRecord] = msgspec.field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return terminal(self.state)

    def step(self, name: str) -> StepRecord:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_json(self, *, steps: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "task_id": self.task_id,
            "workflow": self.workflow,
            "version": self.version,
            "state": self.state.value,
            "locked_by": self.locked_by,
            "complete_by": isoformat(self.complete_by),
            "failure_count": self.failure_count,
            "epoch": self.epoch,
            "reply_to": self.reply_to,
            "created_at": isoformat(self.created_at),
            "updated_at": isoformat(self.updated_at),
            "error": self.error,
        }
        if steps:
            out["steps"] = [s.to_json() for s in self.steps]
        return out

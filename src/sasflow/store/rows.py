"""Rows <-> records, by column name, for every SQL store whatever its dialect.

A row read is a mapping of column name to value (sqlite3.Row, psycopg's
dict_row); a row written is a dict of named parameters. Unit rows are made and
read field by field from columns.STEP, so a new unit field needs no change here
(unless it holds JSON, as `result` does).

A Transition becomes the named parameters of the fenced task update
(`task_values`) and the rows it implies (`implied_rows`), each tagged with its
table; a submission becomes its task row and the rows it implies
(`submission_rows`). The values are the Transition's own: a store writes them
as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import msgspec

from sasflow.errors import InvalidTransitionError, StoreError
from sasflow.fields import as_row, from_row
from sasflow.messages import Status, StatusEvent, encode
from sasflow.model import (
    CompensationRecord,
    Phase,
    StepRecord,
    StepState,
    Task,
    TaskState,
    can_move,
    terminal,
)
from sasflow.store import columns
from sasflow.store.records import Alert, HistoryEntry, Instance, NewTask, submitted
from sasflow.transition import Transition, UnitChange, applied, written_at
from sasflow.transport.dead_letter import DeadLetter
from sasflow.workflow import workflow_version

__all__ = ["Row", "Table", "alert_from_row", "attach_steps", "check_legal",
           "claim_transition", "claimed_at_submission", "history_entries", "implied_rows",
           "incident_params",
           "instance_from_row", "instance_params", "letter_from_row", "letter_params",
           "reports_status", "status_row",
           "submission_rows", "task_from_row", "task_values", "unit_row", "versions_of"]

# The table an implied row goes to ("drop": the step rows past a shorter shape's end)
Table = Literal["steps", "history", "outbox", "alerts", "drop"]
Row = dict[str, Any]

_decode = msgspec.json.decode
log = logging.getLogger("sasflow.store")


class _Rule(Protocol):
    def claim(self, task: Task, owner: str, now: float) -> Transition: ...


# ---------------------------------------------------------------- reading
def task_from_row(row: Mapping[str, Any]) -> Task:
    return Task(task_id=row["task_id"], workflow=row["workflow"], input=_decode(row["input"]),
                state=TaskState(row["state"]), phase=Phase(row["phase"]),
                cursor=row["cursor"], locked_by=row["locked_by"],
                complete_by=row["complete_by"], available_at=row["available_at"],
                failure_count=row["failure_count"], epoch=row["epoch"],
                reply_to=row["reply_to"], error=row["error"], created_at=row["created_at"],
                updated_at=row["updated_at"], version=row["version"])


# a unit's record from its row, and its row from a transition's unit (fields.py). A
# unit row is read at its columns' places in columns.STEP, compiled from their names:
# a claim reads back every step of the tasks it takes, and a dict a row cost three
# times the reading (docs/benchmarks.md)
_STEP_OF = from_row(StepRecord, columns.STEP, by_position=True)
_UNDO_OF = from_row(CompensationRecord, columns.STEP, by_position=True)
_TASK_ID, _PHASE, _IDX = (list(columns.STEP).index(name) for name in ("task_id", "phase", "idx"))
_UNIT_ROW = as_row(UnitChange, columns.STEP, task_id="task_id", idx="index",
                   updated_at="now")


def attach_steps(tasks: dict[str, Task], step_rows: Iterable[Sequence[Any]]) -> None:
    """Fill in each task's steps, and their compensations, from its unit rows, each
    with the values of columns.STEP in that order (a tuple, an sqlite3.Row)."""
    undo: list[Sequence[Any]] = []
    for row in step_rows:
        if row[_PHASE] == Phase.UNDO.value:  # after every step of its task is in place
            undo.append(row)
            continue
        tasks[row[_TASK_ID]].steps.append(_STEP_OF(row))
    for row in undo:
        tasks[row[_TASK_ID]].steps[row[_IDX]].compensation = _UNDO_OF(row)


def alert_from_row(row: Mapping[str, Any]) -> Alert:
    return Alert(id=row["id"], task_id=row["task_id"], step=row["step"], agent=row["agent"],
                 at=row["at"], message=row["message"], incident=row["incident"],
                 count=row["count"], resolved_at=row["resolved_at"],
                 acknowledged_at=row["acknowledged_at"], acknowledged_by=row["acknowledged_by"],
                 acknowledged_why=row["acknowledged_why"])


def instance_from_row(row: Mapping[str, Any]) -> Instance:
    """A row of select_instances (JSON columns as text) as an Instance."""
    return Instance(instance_id=row["instance_id"], host=row["host"], pid=row["pid"],
                    roles=_decode(row["roles"]), agents=_decode(row["agents"]),
                    workflows=_decode(row["workflows"]), lease=row["lease"],
                    started_at=row["started_at"], beat_at=row["beat_at"],
                    stopped_at=row["stopped_at"])


def letter_from_row(row: Mapping[str, Any]) -> DeadLetter:
    return DeadLetter(id=row["id"], queue=row["queue"], reason=row["reason"],
                      deliveries=row["deliveries"], first_seen=row["first_seen"],
                      at=row["at"], body=bytes(row["body"]))


def versions_of(rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    """The set_version parameters of tasks written before versions existed, from rows
    of select_unversioned (task_id, workflow, step name, agent; in step order)."""
    shapes: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for row in rows:
        shapes.setdefault(row["task_id"], (row["workflow"], []))[1].append(
            (row["name"], row["agent"]))
    return [{"version": workflow_version(workflow, steps), "task_id": task_id}
            for task_id, (workflow, steps) in shapes.items()]


# ---------------------------------------------------------------- parameters
def instance_params(instance: Instance, now: float, first: bool) -> Row:
    """The parameters of `beat`: lists and maps as JSON text."""
    return {"instance_id": instance.instance_id, "host": instance.host, "pid": instance.pid,
            "roles": encode(instance.roles).decode(), "agents": encode(instance.agents).decode(),
            "workflows": encode(instance.workflows).decode(), "lease": instance.lease,
            "now": now, "first": first}


def incident_params(alert: Alert, now: float) -> Row:
    return {"agent": alert.agent, "now": now, "message": alert.message,
            "incident": alert.incident, "count": alert.count}


def letter_params(letter: DeadLetter) -> Row:
    return {"id": letter.id, "queue": letter.queue, "reason": letter.reason,
            "deliveries": letter.deliveries, "first_seen": letter.first_seen,
            "at": letter.at, "body": letter.body}


def status_row(queue: str, task_id: str, event: str, state: TaskState, step: str | None,
               now: float, error: str | None = None) -> Row:
    """An outbox row: the status message, written with the change it reports (E11)."""
    body = encode(Status(task_id=task_id, event=StatusEvent(event), state=state.value, at=now,
                         step=step, error=error if event in ("error", "compensating") else None))
    return {"task_id": task_id, "queue": queue, "body": body, "created_at": now}


def unit_row(task_id: str, unit: UnitChange, now: float) -> Row:
    """A unit's complete row (columns.STEP), from the values the transition carries."""
    row: Row = _UNIT_ROW(unit, task_id, now)
    return row


# ---------------------------------------------------------------- transitions
def claim_transition(rule: _Rule, task: Task, owner: str, now: float
                     ) -> tuple[Transition, Task] | None:
    """The rule's claim of a task and the task once claimed, or None (the task is left
    alone) if its stored steps are not of the rule's version. Claims select by version,
    so this means a task row whose version column disagrees with its own steps: it is
    skipped, never run under a shape it was not planned for (R4)."""
    try:
        transition = rule.claim(task, owner, now)
    except InvalidTransitionError as error:
        log.warning("not claiming task %s: %s", task.task_id, error)
        return None
    return transition, applied(task, transition)


def claimed_at_submission(rule: _Rule, task: NewTask, owner: str, now: float
                          ) -> tuple[Transition, Task]:
    """The rule's claim of `task` as its submission at `now` stores it, and the task once
    claimed; StoreError if the rule refuses it (one of another version than the task's)."""
    planned = claim_transition(rule, submitted(task, now), owner, now)
    if planned is None:
        raise StoreError(f"task {task.task_id} cannot be claimed as it is submitted",
                         task_id=task.task_id)
    return planned


def check_legal(t: Transition) -> None:
    """Refuse a transition the state machine does not allow, before anything is written."""
    if not can_move(t.from_state, t.state) and t.from_state is not t.state:
        raise StoreError(f"refusing {t.from_state} -> {t.state} for task {t.task_id}",
                         task_id=t.task_id)


def task_values(t: Transition, now: float) -> Row:
    """The parameters of the fenced task update: the new values (with when the task
    ended, if it does: tasks_ended), then the fence (task id, epoch, state, owner,
    unit, version, expired-before, and the lease's name, holder and epoch, None when
    the writer holds no lease)."""
    lease = t.lease
    now = written_at(t, now)
    # (the states and phases are str enums: each is its value already)
    return {"state": t.state, "phase": t.phase, "cursor": t.cursor,
            "locked_by": t.locked_by, "complete_by": t.complete_by,
            "available_at": t.available_at, "failure_count": t.failure_count,
            "error": t.error, "new_epoch": t.new_epoch, "updated_at": now,
            "version": t.version, "ended_at": now if terminal(t.state) else None,
            "task_id": t.task_id, "epoch": t.epoch, "from_state": t.from_state,
            "owner": t.owner, "from_phase": t.from_phase, "from_cursor": t.from_cursor,
            "from_version": t.from_version, "expired_before": t.expired_before,
            "lease": lease and lease.name, "lease_holder": lease and lease.holder,
            "lease_epoch": lease and lease.epoch}


def _history(task_id: str, now: float, actor: str, epoch: int, from_state: str | None,
             to_state: str, why: str | None, units: str | None = None) -> Row:
    return {"task_id": task_id, "step": None, "phase": None, "at": now, "actor": actor,
            "epoch": epoch, "from_state": from_state, "to_state": to_state, "why": why,
            "units": units}


def history_entries(row: Mapping[str, Any]) -> Iterator[HistoryEntry]:
    """The entries one history row records: its task's move, then its units' (the
    memory store's reading of what the view history_entries reads in SQL)."""
    entry = HistoryEntry(**{name: row[name] for name in _ENTRY_FIELDS})
    yield entry
    for step, phase, from_state, to_state in msgspec.json.decode(row["units"] or "[]"):
        yield msgspec.structs.replace(entry, step=step, phase=phase, from_state=from_state,
                                      to_state=to_state, why=None)


_ENTRY_FIELDS = ("task_id", "step", "phase", "at", "actor", "epoch", "from_state",
                 "to_state", "why")


def reports_status(write: Transition | NewTask) -> bool:
    """Whether writing it writes status messages (outbox rows: E11), so that the
    outbox's readers are to be told (RelayStore.watch_outbox)."""
    if isinstance(write, NewTask):
        return bool(write.reply_to)  # "received"
    return bool(write.reply_to and write.events)


def implied_rows(t: Transition, now: float) -> Iterator[tuple[Table, Row]]:
    """The unit, history, outbox and alert rows an applied transition writes."""
    now = written_at(t, now)
    epoch = t.new_epoch
    if t.steps_from is not None:  # a migration to a shorter shape (disjoint from its units)
        yield "drop", {"task_id": t.task_id, "idx": t.steps_from}
    moves = []  # the units' moves, in the task's history row
    for unit in t.units:
        yield "steps", unit_row(t.task_id, unit, now)
        if unit.in_history:  # (not: a step's row showing where its compensation stands)
            moves.append((unit.name, unit.phase, unit.from_state, unit.state))
    yield "history", _history(t.task_id, now, t.actor, epoch, t.from_state, t.state, t.why,
                              encode(moves).decode() if moves else None)
    if t.reply_to:
        for event, step in t.events:
            yield "outbox", status_row(t.reply_to, t.task_id, event, t.state, step, now,
                                       t.error)
    if t.alert:
        yield "alerts", {"task_id": t.task_id, "step": t.alert_step, "agent": t.alert_agent,
                         "at": now, "message": t.alert}


# a new step's row: every column as a new unit has it, but its identity
_NEW_UNIT = unit_row("", UnitChange(index=0, phase=Phase.DO, name="", agent="",
                                    idempotency_key="", state=StepState.PENDING), 0.0)


def submission_rows(task: NewTask, now: float, claim: Transition | None = None
                    ) -> tuple[Row, list[tuple[Table, Row]]]:
    """A new task's row (pending, unlocked, 0 failures; E2) and the rows it implies; with
    `claim` (planned from the task as submitted), the rows of the task once claimed too:
    what a submission then that claim would leave, history included."""
    row = {"task_id": task.task_id, "workflow": task.workflow,
           "input": task.input_json.decode(), "state": TaskState.PENDING.value,
           "phase": Phase.DO.value, "cursor": 0, "locked_by": None, "complete_by": None,
           "available_at": now, "failure_count": 0, "epoch": 0, "reply_to": task.reply_to,
           "created_at": now, "updated_at": now, "version": task.version}
    steps = {(Phase.DO.value, i): {**_NEW_UNIT, "task_id": task.task_id, "idx": i,
                                   "name": name, "agent": agent, "idempotency_key": key,
                                   "updated_at": now}
             for i, (name, agent, key) in enumerate(task.steps)}
    implied: list[tuple[Table, Row]] = [
        ("history", _history(task.task_id, now, "submit", 0, None,
                             TaskState.PENDING.value, "submitted"))]
    if task.reply_to:
        implied.append(("outbox", status_row(task.reply_to, task.task_id, "received",
                                              TaskState.PENDING, None, now)))
    if claim is not None:
        values = task_values(claim, now)
        row.update({name: values[name] for name in (
            "state", "phase", "cursor", "locked_by", "complete_by", "available_at",
            "failure_count")}, epoch=claim.new_epoch)
        for table, claimed in implied_rows(claim, now):
            if table == "steps":  # the unit the claim starts, as it leaves it
                steps[(claimed["phase"], claimed["idx"])] = claimed
            else:
                implied.append((table, claimed))
    return row, [*(("steps", unit) for unit in steps.values()), *implied]

"""Rows <-> records, shared by every SQL store: one mapping, whatever the dialect.

A task row's columns are sql.TASK_COLUMNS in order; a step row's are those of
sql.select_steps / pg_sql.SELECT_STEPS (task_id, phase, idx, name, agent, state,
attempts, failure_count, complete_by, idempotency_key, result, error, in_doubt).

The other way, a Transition becomes the parameters of the fenced task UPDATE
(`set_values`, `fence_values`) and the rows it implies (`implied_rows`), each
tagged with what it is; every store maps a tag to its own dialect's statement.
The values are the Transition's own: a store writes them as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import msgspec

from sasflow.errors import InvalidTransitionError, StoreError
from sasflow.messages import Status, StatusEvent, encode
from sasflow.model import (
    CompensationRecord,
    Phase,
    StepRecord,
    StepState,
    Task,
    TaskState,
    can_move,
)
from sasflow.plan import Plan
from sasflow.store.base import Alert, Instance
from sasflow.transition import Transition, applied
from sasflow.workflow import workflow_version

__all__ = ["Row", "RowKind", "alert_from_row", "attach_steps", "check_legal",
           "claim_transition", "fence_values", "implied_rows", "incident_params",
           "instance_from_row", "instance_params", "set_values", "status_row",
           "task_from_row", "versions_of"]

# What an implied row is; stores map each to their UPSERT_STEP, INSERT_HISTORY,
# INSERT_OUTBOX, INSERT_ALERT and DROP_STEPS statements.
RowKind = Literal["step", "history", "outbox", "alert", "drop"]
Row = tuple[RowKind, tuple[Any, ...]]

_decode = msgspec.json.decode
log = logging.getLogger("sasflow.store")


def instance_params(instance: Instance, now: float, first: bool) -> dict[str, Any]:
    """The named parameters of BEAT: lists and maps as JSON text."""
    return {"instance_id": instance.instance_id, "host": instance.host, "pid": instance.pid,
            "roles": encode(instance.roles).decode(), "agents": encode(instance.agents).decode(),
            "workflows": encode(instance.workflows).decode(), "lease": instance.lease,
            "now": now, "first": first}


def instance_from_row(row: tuple[Any, ...]) -> Instance:
    """A row of SELECT_INSTANCES (JSON columns as text) as an Instance."""
    (instance_id, host, pid, roles, agents, workflows, started_at, beat_at,
     stopped_at, lease) = row
    return Instance(instance_id=instance_id, host=host, pid=pid, roles=_decode(roles),
                    agents=_decode(agents), workflows=_decode(workflows), lease=lease,
                    started_at=started_at, beat_at=beat_at, stopped_at=stopped_at)


def task_from_row(row: tuple[Any, ...]) -> Task:
    return Task(task_id=row[0], workflow=row[1], input=_decode(row[2]),
                state=TaskState(row[3]), phase=Phase(row[4]), cursor=row[5], locked_by=row[6],
                complete_by=row[7], available_at=row[8], failure_count=row[9], epoch=row[10],
                reply_to=row[11],
                error=row[12], created_at=row[13], updated_at=row[14], version=row[15])


def alert_from_row(row: tuple[Any, ...]) -> Alert:
    """A row of sql.ALERT_COLUMNS as an Alert."""
    (id_, task_id, step, agent, at, message, incident, count, resolved_at) = row
    return Alert(id=id_, task_id=task_id, step=step, agent=agent, at=at, message=message,
                 incident=incident, count=count, resolved_at=resolved_at)


def incident_params(alert: Alert, now: float) -> dict[str, Any]:
    """The named parameters of INSERT_INCIDENT."""
    return {"agent": alert.agent, "now": now, "message": alert.message,
            "incident": alert.incident, "count": alert.count}


def versions_of(rows: Iterable[tuple[Any, ...]]) -> list[tuple[str, str]]:
    """(version, task_id) of tasks written before versions existed, from rows of
    SELECT_UNVERSIONED (task_id, workflow, step name, agent; in step order)."""
    shapes: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for task_id, workflow, name, agent in rows:
        shapes.setdefault(task_id, (workflow, []))[1].append((name, agent))
    return [(workflow_version(workflow, steps), task_id)
            for task_id, (workflow, steps) in shapes.items()]


def attach_steps(tasks: dict[str, Task], step_rows: Iterable[tuple[Any, ...]]) -> None:
    """Fill in each task's steps, and their compensations, from its step rows."""
    undo: list[tuple[Any, ...]] = []
    for r in step_rows:
        if r[1] == Phase.UNDO.value:  # after every step of its task is in place
            undo.append(r)
            continue
        tasks[r[0]].steps.append(StepRecord(
            name=r[3], agent=r[4], state=StepState(r[5]), attempts=r[6], failure_count=r[7],
            complete_by=r[8], idempotency_key=r[9],
            result=None if r[10] is None else _decode(r[10]), error=r[11],
            in_doubt=bool(r[12])))
    for r in undo:
        tasks[r[0]].steps[r[2]].compensation = CompensationRecord(
            state=StepState(r[5]), attempts=r[6], failure_count=r[7], complete_by=r[8],
            idempotency_key=r[9], result=None if r[10] is None else _decode(r[10]),
            error=r[11])


def status_row(queue: str, task_id: str, event: str, state: TaskState, step: str | None,
               now: float, error: str | None = None) -> tuple[str, bytes, float]:
    """An outbox row: the status message, written with the change it reports (E11)."""
    body = encode(Status(task_id=task_id, event=StatusEvent(event), state=state.value, at=now,
                         step=step, error=error if event in ("error", "compensating") else None))
    return (queue, body, now)


# ---------------------------------------------------------------- transitions
def claim_transition(plan: Plan, task: Task, owner: str, now: float
                     ) -> tuple[Transition, Task] | None:
    """The plan's claim of a task and the task once claimed, or None (the task is left
    alone) if its stored steps are not of the plan's version. Claims select by version,
    so this means a task row whose version column disagrees with its own steps: it is
    skipped, never run under a shape it was not planned for (R4)."""
    try:
        transition = plan.claim(task, owner, now)
    except InvalidTransitionError as error:
        log.warning("not claiming task %s: %s", task.task_id, error)
        return None
    return transition, applied(task, transition)


def check_legal(t: Transition) -> None:
    """Refuse a transition the state machine does not allow, before anything is written."""
    if not can_move(t.from_state, t.state) and t.from_state is not t.state:
        raise StoreError(f"refusing {t.from_state} -> {t.state} for task {t.task_id}",
                         task_id=t.task_id)


def set_values(t: Transition, now: float) -> tuple[Any, ...]:
    """The new values of the fenced UPDATE: state, phase, cursor, locked_by, complete_by,
    available_at, failure_count, error, epoch, updated_at, version."""
    return (t.state.value, t.phase.value, t.cursor, t.locked_by, t.complete_by,
            t.available_at, t.failure_count, t.error, t.new_epoch, now, t.version)


def fence_values(t: Transition) -> tuple[Any, ...]:
    """The fence of the UPDATE: task id, epoch, state, owner, phase, cursor, version,
    expired-before, and the lease's name, holder and epoch (None when the writer holds
    no lease)."""
    lease = t.lease
    return (t.task_id, t.epoch, t.from_state.value, t.owner, t.from_phase.value,
            t.from_cursor, t.from_version, t.expired_before,
            lease and lease.name, lease and lease.holder, lease and lease.epoch)


def implied_rows(t: Transition, now: float) -> Iterator[Row]:
    """The unit, history, outbox and alert rows an applied transition writes."""
    epoch = t.new_epoch
    if t.steps_from is not None:  # a migration to a shorter shape (disjoint from its units)
        yield "drop", (t.task_id, t.steps_from)
    yield "history", (t.task_id, None, None, now, t.actor, epoch, t.from_state.value,
                      t.state.value, t.why)
    for unit in t.units:
        result = None if unit.result is None else encode(unit.result).decode()
        yield "step", (t.task_id, unit.phase.value, unit.index, unit.name, unit.agent,
                       unit.state.value, unit.attempts, unit.failure_count, unit.complete_by,
                       unit.idempotency_key, result, unit.error, int(unit.in_doubt), now)
        if not unit.in_history:  # a step's row showing where its compensation stands
            continue
        yield "history", (t.task_id, unit.name, unit.phase.value, now, t.actor, epoch,
                          unit.from_state.value if unit.from_state else None,
                          unit.state.value, None)
    if t.reply_to:
        for event, step in t.events:
            yield "outbox", status_row(t.reply_to, t.task_id, event, t.state, step, now,
                                       t.error)
    if t.alert:
        yield "alert", (t.task_id, t.alert_step, t.alert_agent, now, t.alert)

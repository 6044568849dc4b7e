"""Rows <-> records, shared by every SQL store: one mapping, whatever the dialect.

A task row's columns are sql.TASK_COLUMNS in order; a step row's are those of
sql.select_steps / pg_sql.SELECT_STEPS (task_id, phase, idx, name, agent, state,
attempts, failure_count, complete_by, idempotency_key, result, error, in_doubt).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from sasflow.messages import Status, encode
from sasflow.model import CompensationRecord, Phase, StepRecord, StepState, Task, TaskState

__all__ = ["attach_steps", "status_row", "task_from_row"]

_decode = msgspec.json.decode


def task_from_row(row: tuple[Any, ...]) -> Task:
    return Task(task_id=row[0], workflow=row[1], input=_decode(row[2]),
                state=TaskState(row[3]), phase=Phase(row[4]), cursor=row[5], locked_by=row[6],
                complete_by=row[7], failure_count=row[9], epoch=row[10], reply_to=row[11],
                error=row[12], created_at=row[13], updated_at=row[14])


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
            idempotency_key=r[9], error=r[11])


def status_row(queue: str, task_id: str, event: str, state: TaskState, step: str | None,
               now: float, error: str | None = None) -> tuple[str, bytes, float]:
    """An outbox row: the status message, written with the change it reports (E11)."""
    body = encode(Status(task_id=task_id, event=event, state=state.value, at=now, step=step,
                         error=error if event in ("error", "compensating") else None))
    return (queue, body, now)

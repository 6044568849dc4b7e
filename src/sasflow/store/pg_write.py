"""Writing to PostgreSQL: many submissions and transitions in one transaction.

`write_batch` applies a batch that the group commit (pg_commit.py) gathered: the
fenced task UPDATEs and the task INSERTs go first, in one pipelined round trip,
since their answers say what applied; the rows that follow from what applied
(units, history, outbox, alerts) go after them in one `executemany` per
statement; one NOTIFY tells idle schedulers anywhere that work appeared.

Each batch first asks for its transaction id (`Attempt.xid`). If the connection
dies before COMMIT's answer arrives, the writer asks the database, once it is
back, whether that transaction committed (`txid_status`): committed, the
outcomes it had read are the answer; aborted, nothing of it was written and the
batch can be written again (its fences are checked again then). So a write is
neither lost nor applied twice when the database restarts under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import psycopg

from sasflow.errors import TaskConflictError
from sasflow.model import Phase, StepState, TaskState
from sasflow.store import pg_sql as q
from sasflow.store.base import NewTask
from sasflow.store.rows import RowKind, fence_values, implied_rows, set_values, status_row
from sasflow.transition import Transition

__all__ = ["Attempt", "Outcome", "Write", "insert_sync", "transaction_status", "write_batch"]

Write = Transition | NewTask
Outcome = bool | Exception  # applied / created, or why a submission was refused

_decode = msgspec.json.decode
_encode = msgspec.json.encode
# each kind of row, as one statement taking a batch's rows as arrays
_BULK: dict[RowKind, str] = {
    "step": q.UPSERT_STEPS, "mirror": q.MIRROR_UNDOS, "history": q.INSERT_HISTORIES,
    "outbox": q.INSERT_OUTBOXES, "alert": q.INSERT_ALERTS}
_NEW_STEP = "new-step"  # a submitted task's steps: plain INSERTs
_CLAIMABLE = (TaskState.PENDING, TaskState.COMPENSATING)


class _Rows:
    """The rows of a batch that only need writing, by kind, sent as arrays."""

    def __init__(self) -> None:
        self.by_kind: dict[str, list[tuple[Any, ...]]] = {}
        self.resets: list[tuple[str, str, int]] = []  # operator retry: failure count = 0
        self.wake_at: float | None = None  # the earliest claimable time of new work

    def add(self, kind: str, row: tuple[Any, ...]) -> None:
        self.by_kind.setdefault(kind, []).append(row)

    def work_at(self, at: float) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)

    def add_transition(self, t: Transition, now: float) -> None:
        for kind, row in implied_rows(t, now):
            if kind == "step":
                *values, failures = row  # the last value says "reset" when < 0
                if failures < 0:
                    values[7] = 0
                    self.resets.append((row[0], row[1], row[2]))
                row = tuple(values)
            self.add(kind, row)
        if t.locked_by is None and t.state in _CLAIMABLE:  # released: claimable again
            self.work_at(t.available_at if t.available_at is not None else now)

    def add_submission(self, task: NewTask, now: float) -> None:
        for i, (name, agent, key) in enumerate(task.steps):
            self.add(_NEW_STEP, (task.task_id, Phase.DO.value, i, name, agent,
                                 StepState.PENDING.value, key, now))
        self.add("history", (task.task_id, None, None, now, "submit", 0, None,
                             TaskState.PENDING.value, "submitted"))
        if task.reply_to:
            self.add("outbox", status_row(task.reply_to, task.task_id, "received",
                                          TaskState.PENDING, None, now))
        self.work_at(now)

    def statements(self) -> list[tuple[str, tuple[str]]]:
        """Each kind's statement with its rows as column arrays, in a safe order:
        new steps before the updates of steps, resets after them."""
        out: list[tuple[str, tuple[str]]] = []
        for kind, statement in ((_NEW_STEP, q.INSERT_STEPS), *_BULK.items()):
            rows = self.by_kind.get(kind)
            if rows:
                out.append((statement, _json(rows)))
        if self.resets:
            out.append((q.RESET_FAILURES, _json(self.resets)))
        return out


def _json(rows: Sequence[tuple[Any, ...]]) -> tuple[str]:
    """The parameter of a bulk statement (pg_sql.rows_of): the rows as one JSON array."""
    return (_encode(rows).decode(),)


class Attempt:
    """One try at writing a batch: its transaction id and outcomes, once known."""

    def __init__(self) -> None:
        self.xid: int | None = None
        self.outcomes: list[Outcome] | None = None  # set before COMMIT is sent


def _task_row(task: NewTask, now: float) -> tuple[Any, ...]:
    return (task.task_id, task.workflow, task.input_json.decode(), TaskState.PENDING.value,
            now, task.reply_to, now, now)


def _identity_outcome(task: NewTask, workflow: str, input_json: str) -> Outcome:
    """A task id reused for other work is refused (the original stays as it was)."""
    if workflow != task.workflow or _decode(input_json) != _decode(task.input_json):
        return TaskConflictError(f"task {task.task_id} exists with another workflow or input",
                                 task_id=task.task_id)
    return False


async def write_batch(conn: psycopg.AsyncConnection[Any], batch: Sequence[Write],
                      attempt: Attempt, now: float) -> list[Outcome]:
    """Write `batch` in the caller's transaction; what became of each write, in order.

    The caller keeps one write per task in a batch, in task-id order: every batch
    then locks task rows in the same order, so two batches never deadlock.
    """
    outcomes: list[Outcome] = [False] * len(batch)
    xid = await conn.execute(q.TRANSACTION_ID)  # read with the first answers below
    index = {write.task_id: i for i, write in enumerate(batch)}
    transitions = [t for t in batch if isinstance(t, Transition)]
    submissions = [t for t in batch if isinstance(t, NewTask)]
    rows = _Rows()
    async with conn.cursor() as cur:
        if transitions:
            await cur.execute(q.LOCK_TASKS, ([t.task_id for t in transitions],))
            await cur.execute(q.APPLY_TRANSITIONS, _json(
                [set_values(t, now) + fence_values(t)[:5] for t in transitions]))
            applied = {row[0] for row in await cur.fetchall()}
            for t in transitions:
                if t.task_id in applied:
                    outcomes[index[t.task_id]] = True
                    rows.add_transition(t, now)
        if submissions:
            await cur.execute(q.INSERT_TASKS, _json([_task_row(task, now)
                                                        for task in submissions]))
            created = {row[0] for row in await cur.fetchall()}
            existing = [task for task in submissions if task.task_id not in created]
            for task in submissions:
                if task.task_id in created:
                    outcomes[index[task.task_id]] = True
                    rows.add_submission(task, now)
            if existing:
                await cur.execute(q.SELECT_TASK_IDENTITIES, ([t.task_id for t in existing],))
                found = {r[0]: (r[1], r[2]) for r in await cur.fetchall()}
                for task in existing:
                    outcomes[index[task.task_id]] = _identity_outcome(task,
                                                                      *found[task.task_id])
        for statement, columns in rows.statements():
            await cur.execute(statement, columns)
        if rows.wake_at is not None:
            await cur.execute(q.NOTIFY_WORK, (repr(rows.wake_at),))
    row = await xid.fetchone()
    assert row is not None
    attempt.xid = int(row[0])
    attempt.outcomes = outcomes
    return outcomes


async def transaction_status(conn: psycopg.AsyncConnection[Any], xid: int) -> str | None:
    """'committed', 'aborted' or 'in progress' (None: too old to know, never here)."""
    row = await (await conn.execute(q.TRANSACTION_STATUS, (xid,))).fetchone()
    return None if row is None else row[0]


def insert_sync(conn: psycopg.Connection[Any], task: NewTask, now: float) -> bool:
    """One submission in the caller's (blocking) transaction; False if it existed."""
    with conn.cursor() as cur:
        if cur.execute(q.INSERT_TASK, _task_row(task, now)).fetchone() is None:
            row = cur.execute(q.SELECT_TASK_IDENTITY, (task.task_id,)).fetchone()
            assert row is not None  # ON CONFLICT: it is there
            outcome = _identity_outcome(task, row[0], row[1])
            if isinstance(outcome, TaskConflictError):
                raise outcome
            return False
        rows = _Rows()
        rows.add_submission(task, now)
        for statement, columns in rows.statements():
            cur.execute(statement, columns)
        cur.execute(q.NOTIFY_WORK, (repr(now),))
    return True

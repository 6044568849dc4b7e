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
from sasflow.store.rows import fence_values, implied_rows, set_values, status_row
from sasflow.transition import Transition

__all__ = ["Attempt", "Outcome", "Write", "insert_sync", "transaction_status", "write_batch"]

Write = Transition | NewTask
Outcome = bool | Exception  # applied / created, or why a submission was refused

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_CLAIMABLE = (TaskState.PENDING, TaskState.COMPENSATING)


class _Implied:
    """The rows a batch's writes imply, tagged with their task: the statement
    writes those of the writes that applied (pg_sql.APPLY_TRANSITIONS)."""

    def __init__(self) -> None:
        self.steps: list[tuple[Any, ...]] = []
        self.history: list[tuple[Any, ...]] = []
        self.outbox: list[tuple[Any, ...]] = []  # (task_id, queue, body, created_at)
        self.alerts: list[tuple[Any, ...]] = []
        # the rare rows, written after the statement for the tasks it applied
        self.resets: dict[str, list[tuple[str, str, int]]] = {}
        self.mirrors: dict[str, list[tuple[Any, ...]]] = {}

    def add_transition(self, t: Transition, now: float) -> None:
        for kind, row in implied_rows(t, now):
            if kind == "step":
                *values, failures = row  # the last value asks for a reset when < 0
                if failures < 0:
                    values[7] = 0
                    self.resets.setdefault(t.task_id, []).append((row[0], row[1], row[2]))
                self.steps.append(tuple(values))
            elif kind == "mirror":
                self.mirrors.setdefault(t.task_id, []).append(row)
            elif kind == "history":
                self.history.append(row)
            elif kind == "outbox":
                self.outbox.append((t.task_id, *row))
            elif kind == "alert":
                self.alerts.append(row)

    def add_submission(self, task: NewTask, now: float) -> None:
        self.steps.extend((task.task_id, Phase.DO.value, i, name, agent,
                           StepState.PENDING.value, key, now)
                          for i, (name, agent, key) in enumerate(task.steps))
        self.history.append((task.task_id, None, None, now, "submit", 0, None,
                             TaskState.PENDING.value, "submitted"))
        if task.reply_to:
            self.outbox.append((task.task_id, *status_row(
                task.reply_to, task.task_id, "received", TaskState.PENDING, None, now)))


class _After:
    """What follows from the writes that applied: the rare rows (resets, undo
    mirrors) and the wake-up of idle schedulers."""

    def __init__(self) -> None:
        self.resets: list[tuple[str, str, int]] = []
        self.mirrors: list[tuple[Any, ...]] = []
        self.wake_at: float | None = None  # the earliest claimable time of new work

    def work_at(self, at: float) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)

    def applied(self, t: Transition, implied: _Implied, now: float) -> None:
        self.resets.extend(implied.resets.get(t.task_id, ()))
        self.mirrors.extend(implied.mirrors.get(t.task_id, ()))
        if t.locked_by is None and t.state in _CLAIMABLE:  # released: claimable again
            self.work_at(t.available_at if t.available_at is not None else now)

    def statements(self) -> list[tuple[str, tuple[str, ...]]]:
        out: list[tuple[str, tuple[str, ...]]] = []
        if self.resets:
            out.append((q.RESET_FAILURES, _json(self.resets)))
        if self.mirrors:
            out.append((q.MIRROR_UNDOS, _json(self.mirrors)))
        if self.wake_at is not None:
            out.append((q.NOTIFY_WORK, (repr(self.wake_at),)))
        return out


def _json(*rows: Sequence[tuple[Any, ...]]) -> tuple[str, ...]:
    """Parameters of a bulk statement (pg_sql.rows_of): each set of rows as one JSON array."""
    return tuple(_encode(r).decode() for r in rows)


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

    The caller keeps one write per task in a batch; the statement locks the
    batch's task rows in task-id order, so two batches never deadlock.
    """
    outcomes: list[Outcome] = [False] * len(batch)
    index = {write.task_id: i for i, write in enumerate(batch)}
    transitions = [t for t in batch if isinstance(t, Transition)]
    submissions = [t for t in batch if isinstance(t, NewTask)]
    after = _After()
    async with conn.cursor() as cur:
        if transitions:
            implied = _Implied()
            for t in transitions:
                implied.add_transition(t, now)
            await cur.execute(q.APPLY_TRANSITIONS, _json(
                [set_values(t, now) + fence_values(t) for t in transitions],
                implied.steps, implied.history, implied.outbox, implied.alerts))
            applied = await _answer(cur, attempt)
            for t in transitions:
                if t.task_id in applied:
                    outcomes[index[t.task_id]] = True
                    after.applied(t, implied, now)
        if submissions:
            implied = _Implied()
            for task in submissions:
                implied.add_submission(task, now)
            await cur.execute(q.INSERT_TASKS, _json(
                [_task_row(task, now) for task in submissions], implied.steps,
                implied.history, implied.outbox))
            created = await _answer(cur, attempt)
            existing = [task for task in submissions if task.task_id not in created]
            for task in submissions:
                if task.task_id in created:
                    outcomes[index[task.task_id]] = True
                    after.work_at(now)
            if existing:
                await cur.execute(q.SELECT_TASK_IDENTITIES, ([t.task_id for t in existing],))
                found = {r[0]: (r[1], r[2]) for r in await cur.fetchall()}
                for task in existing:
                    outcomes[index[task.task_id]] = _identity_outcome(task,
                                                                      *found[task.task_id])
        for statement, params in after.statements():
            await cur.execute(statement, params)
    attempt.outcomes = outcomes
    return outcomes


async def _answer(cur: psycopg.AsyncCursor[Any], attempt: Attempt) -> set[str]:
    """The (transaction id, ids written) a bulk statement answers; notes the id."""
    row = await cur.fetchone()
    assert row is not None
    attempt.xid = int(row[0])
    return set(row[1] or ())


async def transaction_status(conn: psycopg.AsyncConnection[Any], xid: int) -> str | None:
    """'committed', 'aborted' or 'in progress' (None: too old to know, never here)."""
    row = await (await conn.execute(q.TRANSACTION_STATUS, (xid,))).fetchone()
    return None if row is None else row[0]


def insert_sync(conn: psycopg.Connection[Any], task: NewTask, now: float) -> bool:
    """One submission in the caller's (blocking) transaction; False if it existed."""
    implied = _Implied()
    implied.add_submission(task, now)
    with conn.cursor() as cur:
        cur.execute(q.INSERT_TASKS, _json([_task_row(task, now)], implied.steps,
                                          implied.history, implied.outbox))
        row = cur.fetchone()
        assert row is not None
        if not row[1]:
            found = cur.execute(q.SELECT_TASK_IDENTITY, (task.task_id,)).fetchone()
            assert found is not None  # ON CONFLICT: it is there
            outcome = _identity_outcome(task, found[0], found[1])
            if isinstance(outcome, TaskConflictError):
                raise outcome
            return False
        cur.execute(q.NOTIFY_WORK, (repr(now),))
    return True

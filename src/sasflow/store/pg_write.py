"""Writing to PostgreSQL: many submissions and transitions in one transaction.

`write_batch` applies a batch that the group commit (pg_commit.py) gathered, as
one statement (pg_sql.APPLY_TRANSITIONS or INSERT_TASKS) that applies the fences,
writes the rows implied by what applied and NOTIFYs idle schedulers of work
released or submitted. One statement is a transaction by itself, so most
batches cost one round trip; a batch that mixes submissions and transitions, or
holds a migration that drops step rows after (`needs_transaction`), runs in a
transaction.

Every task row a write touches gets the write's random token (`last_write`). A
statement's answer and its commit come back together, so if the connection dies
first the writer cannot tell whether it committed; once the database is back it
looks for its token (`written`): found, the write committed and only its answer
was lost; not found, nothing of it was written and it can be written again (its
fences are checked again then). So a write is neither lost nor applied twice
when the database restarts under it. (Asking `txid_status()` about the write's
transaction id is not enough: after a crash PostgreSQL may hand out again the id
of a transaction that never committed, and then says "committed" of it; the
scenario tests caught that.)
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import msgspec
import psycopg

from sasflow.errors import TaskConflictError
from sasflow.model import Phase, StepState, TaskState, claimable
from sasflow.store import pg_sql as q
from sasflow.store.base import NewTask
from sasflow.store.rows import fence_values, implied_rows, set_values, status_row
from sasflow.transition import Transition

__all__ = ["Outcome", "Write", "insert_sync", "needs_transaction", "new_token", "write_batch",
           "written"]

Write = Transition | NewTask
Outcome = bool | Exception  # applied / created, or why a submission was refused

_decode = msgspec.json.decode
_encode = msgspec.json.encode


class _Implied:
    """The rows a batch's writes imply, tagged with their task: the statement
    writes those of the writes that applied (pg_sql.APPLY_TRANSITIONS)."""

    def __init__(self) -> None:
        self.steps: list[tuple[Any, ...]] = []
        self.history: list[tuple[Any, ...]] = []
        self.outbox: list[tuple[Any, ...]] = []  # (task_id, queue, body, created_at)
        self.alerts: list[tuple[Any, ...]] = []
        # the rare rows, removed after the statement for the tasks it applied
        self.drops: dict[str, list[tuple[Any, ...]]] = {}

    def add_transition(self, t: Transition, now: float) -> None:
        for kind, row in implied_rows(t, now):
            if kind == "step":
                self.steps.append(row)
            elif kind == "drop":
                self.drops.setdefault(t.task_id, []).append(row)
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
    """The rare rows that follow from the transitions that applied: the step rows a
    migration to a shorter shape drops."""

    def __init__(self) -> None:
        self.drops: list[tuple[Any, ...]] = []

    def applied(self, t: Transition, implied: _Implied) -> None:
        self.drops.extend(implied.drops.get(t.task_id, ()))

    def statements(self) -> list[tuple[str, tuple[str, ...]]]:
        if self.drops:  # rows past the new shape's end: disjoint from those just written
            return [(q.DROP_STEPS, _json(self.drops))]
        return []


def needs_transaction(batch: Sequence[Write]) -> bool:
    """Whether `batch` takes more than its one statement (which is a transaction by
    itself): when it mixes submissions and transitions, or drops step rows after."""
    kinds = {type(write) for write in batch}
    return len(kinds) > 1 or any(
        write.steps_from is not None for write in batch if isinstance(write, Transition))


def _wake(t: Transition) -> float | None:
    """When the task becomes claimable, if the transition releases it."""
    return t.available_at if claimable(t.state, t.locked_by) else None


def _json(*rows: Sequence[tuple[Any, ...]]) -> tuple[str, ...]:
    """Parameters of a bulk statement (pg_sql.rows_of): each set of rows as one JSON array."""
    return tuple(_encode(r).decode() for r in rows)


def new_token() -> int:
    """A write's name in the rows it writes (tasks.last_write)."""
    return secrets.randbits(63)


def _task_row(task: NewTask, now: float, token: int) -> tuple[Any, ...]:
    return (task.task_id, task.workflow, task.input_json.decode(), TaskState.PENDING.value,
            now, task.reply_to, now, now, token, task.version)


def _identity_outcome(task: NewTask, workflow: str, input_json: str) -> Outcome:
    """A task id reused for other work is refused (the original stays as it was)."""
    if workflow != task.workflow or _decode(input_json) != _decode(task.input_json):
        return TaskConflictError(f"task {task.task_id} exists with another workflow or input",
                                 task_id=task.task_id)
    return False


async def write_batch(conn: psycopg.AsyncConnection[Any], batch: Sequence[Write],
                      token: int, now: float) -> list[Outcome]:
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
                [set_values(t, now) + fence_values(t) + (_wake(t), token)
                 for t in transitions],
                implied.steps, implied.history, implied.outbox, implied.alerts))
            applied = await _answer(cur)
            for t in transitions:
                if t.task_id in applied:
                    outcomes[index[t.task_id]] = True
                    after.applied(t, implied)
        if submissions:
            implied = _Implied()
            for task in submissions:
                implied.add_submission(task, now)
            await cur.execute(q.INSERT_TASKS, _json(
                [_task_row(task, now, token) for task in submissions], implied.steps,
                implied.history, implied.outbox))
            created = await _answer(cur)
            existing = [task for task in submissions if task.task_id not in created]
            for task in submissions:
                if task.task_id in created:
                    outcomes[index[task.task_id]] = True
            if existing:
                await cur.execute(q.SELECT_TASK_IDENTITIES, ([t.task_id for t in existing],))
                found = {r[0]: (r[1], r[2]) for r in await cur.fetchall()}
                for task in existing:
                    outcomes[index[task.task_id]] = _identity_outcome(task,
                                                                      *found[task.task_id])
        for statement, params in after.statements():
            await cur.execute(statement, params)
    return outcomes


async def _answer(cur: psycopg.AsyncCursor[Any]) -> set[str]:
    """The ids of the tasks a bulk statement wrote (its first column's array)."""
    row = await cur.fetchone()
    assert row is not None
    return set(row[0] or ())


async def written(conn: psycopg.AsyncConnection[Any], task_ids: Sequence[str],
                  token: int) -> set[str]:
    """Of these tasks, those whose last write was the one with `token`."""
    cur = await conn.execute(q.SELECT_WRITTEN, (list(task_ids), token))
    return {row[0] for row in await cur.fetchall()}


def insert_sync(conn: psycopg.Connection[Any], task: NewTask, now: float) -> bool:
    """One submission, one statement: in the caller's transaction, or (autocommit)
    a transaction by itself. False if the task existed."""
    implied = _Implied()
    implied.add_submission(task, now)
    with conn.cursor() as cur:
        cur.execute(q.INSERT_TASKS, _json([_task_row(task, now, new_token())], implied.steps,
                                          implied.history, implied.outbox))
        row = cur.fetchone()
        assert row is not None
        if not row[0]:
            found = cur.execute(q.SELECT_TASK_IDENTITY, (task.task_id,)).fetchone()
            assert found is not None  # ON CONFLICT: it is there
            outcome = _identity_outcome(task, found[0], found[1])
            if isinstance(outcome, TaskConflictError):
                raise outcome
            return False
    return True

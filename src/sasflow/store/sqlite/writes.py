"""SQLite's writes, inside the writer's transaction (writer.py): a submission, and
a fenced transition with the rows it implies.

Only the fenced task update must run at once (its row count says whether the
transition applies); the rows that follow from it are deferred to the end of the
group commit and written in bulk, one `executemany` per table.
"""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple

import msgspec

from sasflow.errors import TaskConflictError
from sasflow.store import queries
from sasflow.store.records import NewTask
from sasflow.store.rows import Row, Table, check_legal, implied_rows, submission_rows, task_values
from sasflow.transition import Transition

__all__ = ["Deferred", "Submission", "apply", "insert", "statements", "submission"]

_Q = queries.load("sqlite", "named")
_decode = msgspec.json.decode
# the statements of every transition and submission, bound by position (queries.py)
_BY_POSITION = {name: queries.positional(_Q[name]) for name in (
    "apply_transition", "insert_task", "insert_claimed_task", "insert_step", "upsert_step",
    "insert_history", "insert_outbox", "insert_alert", "drop_steps")}
# the statement that writes each table's implied rows
_WRITES: dict[Table, queries.Positional] = {
    "steps": _BY_POSITION["upsert_step"], "history": _BY_POSITION["insert_history"],
    "outbox": _BY_POSITION["insert_outbox"], "alerts": _BY_POSITION["insert_alert"],
    "drop": _BY_POSITION["drop_steps"]}


def statements() -> dict[str, str]:
    """SQLite's statements by name."""
    return _Q


class Deferred:
    """Implied rows of the current group commit, written in bulk before it commits,
    or before the next job that reads steps (a claim), which flushes first."""

    def __init__(self) -> None:
        self.rows: dict[queries.Positional, list[Row]] = {}

    def add(self, table: Table, row: Row) -> None:
        self.rows.setdefault(_WRITES[table], []).append(row)

    def flush(self, conn: sqlite3.Connection) -> None:
        # dicts keep insertion order: statements run in the order first used
        rows, self.rows = self.rows, {}
        for statement, values in rows.items():
            conn.executemany(statement.text, map(statement.values, values))

    def clear(self) -> None:
        self.rows = {}


def apply(conn: sqlite3.Connection, t: Transition, now: float, deferred: Deferred) -> bool:
    """Apply one fenced transition inside the writer's transaction."""
    check_legal(t)
    fenced = _BY_POSITION["apply_transition"]
    if not conn.execute(fenced.text, fenced.values(task_values(t, now))).rowcount:
        return False
    for table, row in implied_rows(t, now):
        deferred.add(table, row)
    return True


class Submission(NamedTuple):
    """A new task's statements and their values, made before its transaction (they
    read nothing stored): a job then only runs them."""

    task: NewTask
    insert_task: queries.Positional
    task_row: tuple[Any, ...]
    new_steps: list[tuple[Any, ...]]  # pending steps, the columns a new step sets
    rows: list[tuple[queries.Positional, tuple[Any, ...]]]  # the rest, in order


def submission(task: NewTask, now: float, claim: Transition | None = None) -> Submission:
    """`task` as submitted at `now`; with `claim` (planned from the task as submitted),
    as that claim leaves it: what a submission then the claim's fenced update would
    write, in one insert a row."""
    if claim is not None:
        check_legal(claim)
    row, implied = submission_rows(task, now, claim)
    insert_task = _BY_POSITION["insert_task" if claim is None else "insert_claimed_task"]
    insert_step = _BY_POSITION["insert_step"]
    # a unit the claim started has columns past a new step's: its whole row is written
    started = set() if claim is None else {(unit.phase, unit.index) for unit in claim.units}
    new_steps, rows = [], []
    for table, values in implied:
        if table == "steps" and (values["phase"], values["idx"]) not in started:
            new_steps.append(insert_step.values(values))
        else:  # its history rows, its first status message if any, its started units
            rows.append((_WRITES[table], _WRITES[table].values(values)))
    return Submission(task, insert_task, insert_task.values(row), new_steps, rows)


def insert(conn: sqlite3.Connection, new: Submission) -> bool:
    """Write a new task and its rows; False if it exists (TaskConflictError if it exists
    with another workflow or input: the original stays as it was)."""
    task = new.task
    if not conn.execute(new.insert_task.text, new.task_row).rowcount:
        found: Any = conn.execute(_Q["select_task_identity"], {"task_id": task.task_id}
                                  ).fetchone()
        if found is not None and (found["workflow"] != task.workflow
                                  or _decode(found["input"]) != _decode(task.input_json)):
            raise TaskConflictError(f"task {task.task_id} exists with another workflow or input",
                                    task_id=task.task_id)
        return False
    conn.executemany(_BY_POSITION["insert_step"].text, new.new_steps)
    for statement, values in new.rows:
        conn.execute(statement.text, values)
    return True

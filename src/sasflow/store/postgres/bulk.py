"""Writing to PostgreSQL: many submissions and transitions in one statement.

`write_batch` applies a batch that the group commit (commit.py) gathered, as one
statement (write_batch, postgres/queries.sql) that applies the transitions'
fences, creates the submitted tasks, writes the rows implied by what applied and
NOTIFYs idle schedulers of work released or submitted; it answers the tasks it
ended, which a statement of its own tells waiting clients once that one committed
(`tell_finished`, notify_finished; the store sends it beside its writers,
wake.CommitNotices), and whether it wrote status messages, told the outbox's
readers the same way (`tell_statuses`, notify_outbox).
Each kind of row travels as ONE parameter, a JSON array of row arrays in the
column order of columns.py (msgspec encodes it in C, where psycopg would adapt
arrays value by value in Python). One statement is a
transaction by itself, so a batch costs one round trip and one commit, whatever it
mixes; only a batch holding a migration that drops step rows after
(`needs_transaction`) runs in a transaction.

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

import operator
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg
from psycopg.rows import dict_row

from sasflow.errors import TaskConflictError
from sasflow.model import claimable, terminal
from sasflow.store import columns, queries
from sasflow.store.records import NewTask
from sasflow.store.rows import (
    Row,
    Table,
    implied_rows,
    reports_status,
    submission_rows,
    task_values,
)
from sasflow.transition import Transition, written_at

__all__ = ["Claimed", "Notices", "Outcome", "Write", "insert_sync", "needs_transaction",
           "new_token", "notice_parts", "tell_finished", "tell_statuses", "write_batch",
           "written"]


class Claimed(msgspec.Struct, frozen=True):
    """A submission written as already claimed (Store.submit_claimed): its rows are
    those of the task once `claim` applied (rows.submission_rows), in one statement."""

    task: NewTask
    claim: Transition

    @property
    def task_id(self) -> str:
        return self.task.task_id


Write = Transition | NewTask | Claimed


@dataclass
class Notices:
    """What a batch has to tell other processes once it committed (wake.CommitNotices)."""

    ended: list[str] = field(default_factory=list)  # the tasks it ended
    statuses: bool = False  # whether it wrote status messages (outbox rows)

    def __bool__(self) -> bool:
        return bool(self.ended) or self.statuses


def _new(write: NewTask | Claimed) -> NewTask:
    """The task a submission writes, claimed or not."""
    return write.task if isinstance(write, Claimed) else write
Outcome = bool | Exception  # applied / created, or why a submission was refused

_Q = queries.load("postgres", "pyformat")
# the statements run with the raw cursor (queries.numbered): too long for psycopg to
# keep how it parsed them
RAW = frozenset({"write_batch", "apply_transitions"})
_NUMBERED = {name: queries.numbered(queries.load("postgres", "named")[name]) for name in RAW}
_APPLY = ("transitions", "steps", "history", "outbox", "alerts")
_INSERT = ("tasks", "steps", "history", "outbox")
_BOTH = ("transitions", "tasks", "steps", "history", "outbox", "alerts")
_decode = msgspec.json.decode
_NOTICE_BYTES = 7_900  # a NOTIFY payload must be shorter than 8,000 bytes
_encode = msgspec.json.encode
# the parameter of a bulk statement that carries each table's implied rows
_PARAMETER: dict[Table, str] = {"steps": "steps", "history": "history", "outbox": "outbox",
                                "alerts": "alerts", "drop": "drops"}


# each bulk parameter's row as a tuple in its column order, taken from a row by name
# (in C: a comprehension over the names cost a batch's rows a third of their making)
_IN_ORDER = {parameter: operator.itemgetter(*names) for parameter, names in columns.BULK.items()}


class _Rows:
    """The rows of a batch, by bulk parameter (columns.BULK), in column order, each
    encoded as it is added.

    A batch makes thousands of rows. Kept as tuples until the batch was encoded,
    they outlived several of the garbage collector's young collections, each of
    which walked them and handed them on to the older generations, where they
    brought on full collections; a row's bytes are nothing it walks
    (docs/benchmarks.md, rows encoded as they are made).
    """

    def __init__(self) -> None:
        self.rows: dict[str, list[bytes]] = {name: [] for name in columns.BULK}

    def add(self, parameter: str, row: Mapping[str, Any]) -> None:
        self.rows[parameter].append(_encode(_IN_ORDER[parameter](row)))

    def add_implied(self, implied: Sequence[tuple[Table, Row]]) -> None:
        for table, row in implied:
            self.add(_PARAMETER[table], row)

    def params(self, *names: str) -> dict[str, str]:
        return {name: (b"[%b]" % b",".join(self.rows[name])).decode() for name in names}


def needs_transaction(batch: Sequence[Write]) -> bool:
    """Whether `batch` takes more than its one statement (which is a transaction by
    itself): when a migration in it drops step rows after."""
    return any(write.steps_from is not None for write in batch if isinstance(write, Transition))


def new_token() -> int:
    """A write's name in the rows it writes (tasks.last_write). It tells a task's
    writes apart, and is no secret: the process's own generator (seeded anew in a
    forked child) makes it without the system call `secrets` makes for each."""
    return random.getrandbits(63)


def _transition_row(t: Transition, now: float, token: int) -> Row:
    # wake: when the task becomes claimable, if the transition releases it; finished:
    # whether it ends the task
    row = task_values(t, now)
    row["wake"] = t.available_at if claimable(t.state, t.locked_by) else None
    row["finished"] = terminal(t.state)
    row["token"] = token
    return row


def _identity_outcome(task: NewTask, found: Mapping[str, Any]) -> Outcome:
    """A task id reused for other work is refused (the original stays as it was)."""
    if found["workflow"] != task.workflow or (
            _decode(found["input"]) != _decode(task.input_json)):
        return TaskConflictError(f"task {task.task_id} exists with another workflow or input",
                                 task_id=task.task_id)
    return False


def _add_submissions(rows: _Rows, tasks: Sequence[NewTask | Claimed], now: float,
                     token: int) -> None:
    for write in tasks:
        if isinstance(write, Claimed):  # written as of its claim, so the snapshot its
            # scheduler holds is the row (transition.applied)
            row, implied = submission_rows(write.task, written_at(write.claim, now),
                                           write.claim)
        else:
            row, implied = submission_rows(write, now)
        rows.add("tasks", {**row, "last_write": token})
        rows.add_implied(implied)


def _add_transitions(rows: _Rows, transitions: Sequence[Transition], now: float, token: int
                     ) -> dict[str, list[Row]]:
    """Add `transitions` and the rows they imply; the step rows each would drop,
    written after, if its transition applied."""
    dropped: dict[str, list[Row]] = {}
    for t in transitions:
        rows.add("transitions", _transition_row(t, now, token))
        for table, row in implied_rows(t, now):
            if table == "drop":
                dropped.setdefault(t.task_id, []).append(row)
            else:
                rows.add(_PARAMETER[table], row)
    return dropped


async def write_batch(conn: psycopg.AsyncConnection[Any], batch: Sequence[Write],
                      token: int, now: float, *, notices: Notices | None = None
                      ) -> list[Outcome]:
    """Write `batch` in the caller's transaction; what became of each write, in order.

    The caller keeps one write per task in a batch; the statement locks the
    batch's task rows in task-id order, so two batches never deadlock.

    The ids of the tasks it ended, and whether it wrote status messages, go to
    `notices`, for the caller to tell once the write committed; without `notices`
    they are told here, in the caller's transaction, so with its commit or not at
    all.
    """
    outcomes: list[Outcome] = [False] * len(batch)
    index = {write.task_id: i for i, write in enumerate(batch)}
    transitions = [t for t in batch if isinstance(t, Transition)]
    submissions = [w for w in batch if isinstance(w, NewTask | Claimed)]
    rows = _Rows()
    dropped = _add_transitions(rows, transitions, now, token)
    _add_submissions(rows, submissions, now, token)
    answer = await _write(conn, rows, transitions, submissions)
    applied, created = answer.get("applied") or (), set(answer.get("created") or ())
    for task_id in (*applied, *created):
        outcomes[index[task_id]] = True
    existing = [_new(w) for w in submissions if w.task_id not in created]
    drops = _Rows()  # rows past the new shape's end: disjoint from those written
    for task_id in applied:
        for row in dropped.get(task_id, ()):
            drops.add("drops", row)
    if existing or drops.rows["drops"]:  # (rare: a cursor only then)
        async with conn.cursor(row_factory=dict_row) as cur:
            if existing:
                await cur.execute(_Q["select_task_identities"],
                                  {"task_ids": [t.task_id for t in existing]})
                found = {row["task_id"]: row for row in await cur.fetchall()}
                for task in existing:
                    outcomes[index[task.task_id]] = _identity_outcome(task,
                                                                      found[task.task_id])
            if drops.rows["drops"]:
                await cur.execute(_Q["drop_steps"], drops.params("drops"))
    # (a claimed submission reports "received" as any with a reply_to)
    told = Notices(ended=answer.get("finished") or [], statuses=any(
        outcome is True and reports_status(_new(write) if isinstance(write, Claimed) else write)
        for write, outcome in zip(batch, outcomes, strict=True)))
    if notices is None:
        await tell(conn, told)
    else:
        notices.ended.extend(told.ended)
        notices.statuses |= told.statuses
    return outcomes


async def _write(conn: psycopg.AsyncConnection[Any], rows: _Rows,
                 transitions: Sequence[Transition], submissions: Sequence[NewTask | Claimed]
                 ) -> Mapping[str, Any]:
    """The batch's rows in its one statement: the transitions' (apply_transitions),
    the submissions' (insert_tasks), or both (write_batch); its answer."""
    name, parameters = (("write_batch", _BOTH) if transitions and submissions
                        else ("apply_transitions", _APPLY) if transitions
                        else ("insert_tasks", _INSERT))
    if name in RAW:
        statement = _NUMBERED[name]
        async with psycopg.AsyncRawCursor(conn, row_factory=dict_row) as raw:
            await raw.execute(statement.text, statement.values(rows.params(*parameters)))
            answer = await raw.fetchone()
    else:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(_Q[name], rows.params(*parameters))
            answer = await cur.fetchone()
    assert answer is not None
    return answer


async def tell(conn: psycopg.AsyncConnection[Any], notices: Notices) -> None:
    """Send `notices` on `conn`."""
    await tell_finished(conn, notices.ended)
    if notices.statuses:
        await tell_statuses(conn)


async def tell_statuses(conn: psycopg.AsyncConnection[Any]) -> None:
    """Tell the outbox's readers, in every process, that status messages were written."""
    await conn.execute(_Q["notify_outbox"])


async def tell_finished(conn: psycopg.AsyncConnection[Any], task_ids: Sequence[str]) -> None:
    """Tell the listening clients of other processes that these tasks ended."""
    for part in notice_parts(task_ids):
        await conn.execute(_Q["notify_finished"], {"ids": part})


def notice_parts(task_ids: Sequence[str]) -> list[str]:
    """The ids, one per line, in payloads under NOTIFY's limit of 8,000 bytes."""
    parts: list[str] = []
    part: list[str] = []
    size = 0
    for task_id in task_ids:
        length = len(task_id.encode()) + 1
        if part and size + length > _NOTICE_BYTES:
            parts.append("\n".join(part))
            part, size = [], 0
        part.append(task_id)
        size += length
    if part:
        parts.append("\n".join(part))
    return parts


async def written(conn: psycopg.AsyncConnection[Any], task_ids: Sequence[str],
                  token: int) -> set[str]:
    """Of these tasks, those whose last write was the one with `token`."""
    cur = await conn.execute(_Q["select_written"], {"task_ids": list(task_ids),
                                                    "token": token})
    return {row["task_id"] for row in await cur.fetchall()}


def insert_sync(conn: psycopg.Connection[Any], write: NewTask | Claimed, now: float) -> bool:
    """One submission, one statement: in the caller's transaction, or (autocommit)
    a transaction by itself. False if the task existed."""
    task = _new(write)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = _Rows()
        _add_submissions(rows, [write], now, new_token())
        cur.execute(_Q["insert_tasks"], rows.params(*_INSERT))
        row = cur.fetchone()
        assert row is not None
        if not row["created"]:
            found = cur.execute(_Q["select_task_identities"],
                                {"task_ids": [task.task_id]}).fetchone()
            assert found is not None  # ON CONFLICT: it is there
            outcome = _identity_outcome(task, found)
            if isinstance(outcome, TaskConflictError):
                raise outcome
            return False
        if reports_status(task):  # heard at the caller's commit, or never
            cur.execute(_Q["notify_outbox"])
    return True


"""A page of the task list (SPEC U4): its filters and its cursor, written once.

An operator pages through the tasks oldest or newest first, filtered by any of
state, workflow and creation time. A page goes on from a cursor, the
(created_at, task_id) of the last task shown, instead of an OFFSET: each page is
one ordered range scan of an index (tasks_created; with a state, tasks_state on
PostgreSQL, tasks_listed on SQLite), so it costs the same on the thousandth page
as on the first however many tasks the store holds, and tasks submitted meanwhile
neither shift a page nor show twice.

Each combination of filters is a statement of its own, made here once for every
store (queries.py adds them to each dialect's): one statement with
``(:state IS NULL OR state = :state)`` for every filter would keep SQLite from
using any index, and PostgreSQL's generic plan from using the right one.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import math
from typing import Any

import msgspec

from sasflow.errors import PayloadError
from sasflow.model import Task, TaskState

__all__ = ["MAX_PAGE", "TaskQuery", "decode_cursor", "encode_cursor", "statements"]

MAX_PAGE = 1000  # tasks in one page at most

# each filter's condition, in the order the statement names list them
_CONDITIONS = {
    "state": "state = :state",
    "workflow": "workflow = :workflow",
    "created_from": "created_at >= :created_from",
    "created_to": "created_at < :created_to",
}
# past the cursor, in the page's order (row values: one range of the index)
_PAST = {False: "(created_at, task_id) > (:after_at, :after_id)",
         True: "(created_at, task_id) < (:after_at, :after_id)"}
_ORDER = {False: "created_at, task_id", True: "created_at DESC, task_id DESC"}


class TaskQuery(msgspec.Struct, frozen=True, kw_only=True):
    """What a page of the task list shows: its filters, its cursor and its size."""

    state: TaskState | None = None
    workflow: str | None = None
    created_from: float | None = None  # created at or after (store time, seconds)
    created_to: float | None = None  # created before
    after: tuple[float, str] | None = None  # (created_at, task_id) of the page before's last
    newest_first: bool = False
    limit: int = 100

    def statement(self) -> str:
        """The name of the statement that reads this page."""
        used = [name for name in _CONDITIONS if getattr(self, name) is not None]
        return _name(used, self.after is not None, self.newest_first)

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {name: getattr(self, name) for name in _CONDITIONS
                                  if getattr(self, name) is not None}
        if "state" in params:
            params["state"] = params["state"].value
        if self.after is not None:
            params["after_at"], params["after_id"] = self.after
        params["limit"] = self.limit
        return params

    def matches(self, task: Task) -> bool:
        """Whether `task` is on this list, in or after its cursor (the in-memory store's
        reading of the same statement)."""
        if self.after is not None:
            key, cursor = (task.created_at, task.task_id), self.after
            if not (key < cursor if self.newest_first else key > cursor):
                return False
        return ((self.state is None or task.state is self.state)
                and (self.workflow is None or task.workflow == self.workflow)
                and (self.created_from is None or task.created_at >= self.created_from)
                and (self.created_to is None or task.created_at < self.created_to))


def _name(used: list[str], after: bool, newest_first: bool) -> str:
    return "list_tasks:" + "+".join([*used, *(["after"] if after else [])]) + (
        ":newest" if newest_first else ":oldest")


def statements() -> dict[str, str]:
    """Every page statement, by name (their column list still to be expanded)."""
    made: dict[str, str] = {}
    for count in range(len(_CONDITIONS) + 1):
        for used in itertools.combinations(_CONDITIONS, count):
            for after, newest in itertools.product((False, True), repeat=2):
                where = [_CONDITIONS[name] for name in used] + ([_PAST[newest]] if after else [])
                made[_name(list(used), after, newest)] = (
                    "SELECT {task_columns} FROM tasks"
                    + (" WHERE " + " AND ".join(where) if where else "")
                    + f" ORDER BY {_ORDER[newest]} LIMIT :limit")
    return made


def encode_cursor(task: Task) -> str:
    """The cursor of the page that follows `task` (opaque to the caller)."""
    raw = msgspec.json.encode([task.created_at, task.task_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The (created_at, task_id) a cursor names; PayloadError if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, task_id = msgspec.json.decode(raw, type=tuple[float, str])
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise PayloadError(f"bad cursor {cursor[:40]!r}: pass back the one a page gave"
                           ) from None
    if not math.isfinite(at):
        raise PayloadError(f"bad cursor {cursor[:40]!r}: pass back the one a page gave")
    return at, task_id

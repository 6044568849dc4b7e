"""The columns of a task row and of a unit (step or compensation) row, once.

Every statement that reads or writes whole rows gets its column list from here
(queries.py expands ``{task_columns}``, ``{step_columns}`` and the like), and rows
are read and written by name (rows.py). So a new field of a task or of a unit is
a line here, its migrations and the planner rule that sets it: no statement
changes. The types are PostgreSQL's, for the bulk statements that carry rows as
JSON and must say what each value is (postgres/queries.sql).
"""

from __future__ import annotations

__all__ = ["ALERT", "HISTORY", "NEW_STEP", "NEW_TASK", "OUTBOX", "STEP", "TASK", "TRANSITION",
           "expansions"]

TASK = {
    "task_id": "text", "workflow": "text", "input": "text", "state": "text",
    "phase": "text", "cursor": "int", "locked_by": "text", "complete_by": "float8",
    "available_at": "float8", "failure_count": "int", "epoch": "bigint",
    "reply_to": "text", "error": "text", "created_at": "float8", "updated_at": "float8",
    "version": "text",
}

# a unit: a step (phase "do") or its compensation (phase "undo"), keyed by
# (task_id, phase, idx)
STEP = {
    "task_id": "text", "phase": "text", "idx": "int", "name": "text", "agent": "text",
    "state": "text", "attempts": "int", "failure_count": "int", "complete_by": "float8",
    "idempotency_key": "text", "result": "text", "error": "text", "in_doubt": "int",
    "updated_at": "float8",
}
_STEP_KEY = ("task_id", "phase", "idx")
# what a new task's step sets; the rest start as their columns' defaults (writing
# them explicitly doubled the cost of SQLite's insert)
NEW_STEP = ("task_id", "phase", "idx", "name", "agent", "state", "idempotency_key",
            "updated_at")

# units: the moves of the units that changed with it, as one JSON array of
# [step, phase, from_state, to_state] (rows.implied_rows; the view history_entries
# reads them as entries of their own)
HISTORY = {
    "task_id": "text", "step": "text", "phase": "text", "at": "float8", "actor": "text",
    "epoch": "bigint", "from_state": "text", "to_state": "text", "why": "text",
    "units": "text",
}

# task_id: whose change wrote it (a bulk write keeps only the rows of what applied)
OUTBOX = {"task_id": "text", "queue": "text", "body": "bytea", "created_at": "float8"}

ALERT = {"task_id": "text", "step": "text", "agent": "text", "at": "float8",
         "message": "text"}


# A new task's row as a submission writes it (its error takes the default): pending,
# or already claimed (Store.submit_claimed); last_write: the write's token
# (postgres/bulk.py)
NEW_TASK = {name: kind for name, kind in TASK.items() if name != "error"} | {
    "last_write": "bigint"}

# A transition as the fenced update of a task takes it (rows.task_values): the new
# values, then the fence; wake, finished and token are PostgreSQL's (postgres/bulk.py)
TRANSITION = {
    "state": "text", "phase": "text", "cursor": "int", "locked_by": "text",
    "complete_by": "float8", "available_at": "float8", "failure_count": "int",
    "error": "text", "new_epoch": "bigint", "updated_at": "float8", "version": "text",
    "ended_at": "float8",
    "task_id": "text", "epoch": "bigint", "from_state": "text", "owner": "text",
    "from_phase": "text", "from_cursor": "int", "from_version": "text",
    "expired_before": "float8", "lease": "text", "lease_holder": "text",
    "lease_epoch": "bigint",
    "wake": "float8",  # when the task is claimable again, if this releases it
    "finished": "bool",  # whether this ends the task (waiting clients are told)
    "token": "bigint",  # the write's, into last_write
}

# the step rows past a shorter shape's end: (task_id, first index dropped)
DROP = {"task_id": "text", "idx": "int"}

# Bulk statements take each kind of row as ONE parameter named here, a JSON array of
# row arrays in column order (postgres/bulk.py)
BULK = {"transitions": TRANSITION, "tasks": NEW_TASK, "steps": STEP, "history": HISTORY,
        "outbox": OUTBOX, "alerts": ALERT, "drops": DROP}


def _json_rows(parameter: str, columns: dict[str, str]) -> str:
    """SELECT the typed columns of the rows in a JSON parameter. It is read as jsonb,
    parsed once: as json, each `->>` would parse its row's text again."""
    picked = []
    for n, (name, kind) in enumerate(columns.items()):
        value = f"r.v->>{n}"  # (text already: no cast)
        picked.append(f"decode({value}, 'base64') AS {name}" if kind == "bytea"  # msgspec's
                      else f"{value} AS {name}" if kind == "text"                # bytes
                      else f"({value})::{kind} AS {name}")
    return (f"SELECT {', '.join(picked)} FROM jsonb_array_elements(:{parameter}::jsonb)"
            " AS r(v)")


def _names(columns: dict[str, str], prefix: str = "") -> str:
    return ", ".join(f"{prefix}{name}" for name in columns)


def expansions() -> dict[str, str]:
    """What each ``{name}`` in a statement stands for."""
    updated = [name for name in STEP if name not in _STEP_KEY]
    return {
        "task_columns": _names(TASK),
        "step_columns": _names(STEP),
        "step_values": _names(STEP, ":"),
        "new_step_columns": ", ".join(NEW_STEP),
        "new_step_values": ", ".join(f":{name}" for name in NEW_STEP),
        "step_updates": ", ".join(f"{name} = excluded.{name}" for name in updated),
        "step_json": _names({k: v for k, v in STEP.items() if k != "task_id"}, "s."),
        "new_task_columns": _names(NEW_TASK),
        "history_columns": _names(HISTORY),
        "history_values": _names(HISTORY, ":"),
        "alert_columns": _names(ALERT),
        "alert_values": _names(ALERT, ":"),
        **{f"{parameter}_rows": _json_rows(parameter, columns)
           for parameter, columns in BULK.items()},
    }

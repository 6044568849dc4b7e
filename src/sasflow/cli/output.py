"""What the operator commands print: JSON per CONTRACT, or compact aligned tables."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from sasflow.model import Task, isoformat
from sasflow.store.records import Alert, HistoryEntry

__all__ = [
    "alert_json",
    "alerts_table",
    "dumps",
    "history_json",
    "history_table",
    "table",
    "task_detail",
    "tasks_table",
]

_CELL_MAX = 60  # longer results and errors are cut in tables; --json has them whole


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def alert_json(alert: Alert) -> dict[str, Any]:
    out = {"id": alert.id, "task_id": alert.task_id, "step": alert.step,
           "agent": alert.agent, "at": isoformat(alert.at), "message": alert.message}
    if alert.incident is not None:  # an incident's alert (R4): what, how many, resolved
        out.update(incident=alert.incident, count=alert.count,
                   resolved_at=isoformat(alert.resolved_at))
    return out


def history_json(entry: HistoryEntry) -> dict[str, Any]:
    return {"at": isoformat(entry.at), "actor": entry.actor, "epoch": entry.epoch,
            "step": entry.step, "phase": entry.phase, "from_state": entry.from_state,
            "to_state": entry.to_state, "why": entry.why}


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A header line, then the rows, in columns aligned two spaces apart."""
    return _aligned([headers, *rows])


def _aligned(lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
                     .rstrip() for line in lines)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _text(value: Any, limit: int | None = _CELL_MAX) -> str:
    """One line for a cell: '-' for nothing, JSON for data, cut if over `limit`."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def tasks_table(tasks: Sequence[Task]) -> str:
    if not tasks:
        return "no tasks"
    return table(["TASK ID", "WORKFLOW", "STATE", "FAILURES", "LOCKED BY", "UPDATED"], [
        [t.task_id, t.workflow, t.state.value, str(t.failure_count), _text(t.locked_by),
         _when(t.updated_at)] for t in tasks])


def task_detail(task: Task) -> str:
    """The task's record, then one row per step with its compensation's state."""
    fields = [("task", task.task_id), ("workflow", task.workflow),
              ("version", _text(task.version)), ("state", task.state.value),
              ("error", _text(task.error, None)), ("failures", str(task.failure_count)),
              ("locked by", _text(task.locked_by)), ("complete by", _when(task.complete_by)),
              ("epoch", str(task.epoch)), ("reply to", _text(task.reply_to)),
              ("created", _when(task.created_at)), ("updated", _when(task.updated_at)),
              ("input", _text(task.input, None))]
    head = _aligned(fields)
    rows = []
    for step in task.steps:
        undo = step.compensation
        detail = f"error: {_text(step.error)}" if step.error else (
            f"result: {_text(step.result)}" if step.result is not None else "")
        if undo is not None and undo.error:
            detail = f"compensation error: {_text(undo.error)}"
        rows.append([step.name, step.agent, step.state.value, str(step.attempts),
                     str(step.failure_count), _when(step.complete_by),
                     undo.state.value if undo is not None else "-", detail])
    steps = table(["STEP", "AGENT", "STATE", "ATTEMPTS", "FAILURES", "COMPLETE BY",
                   "COMPENSATION", "DETAIL"], rows)
    return f"{head}\n\n{steps}"


def history_table(entries: Sequence[HistoryEntry]) -> str:
    rows = []
    for e in entries:
        unit = "task" if e.step is None else (
            f"{e.step} (undo)" if e.phase == "undo" else e.step)
        rows.append([_when(e.at), e.actor, str(e.epoch), unit,
                     f"{e.from_state or '-'} -> {e.to_state}", _text(e.why)])
    return table(["AT", "ACTOR", "EPOCH", "UNIT", "CHANGE", "WHY"], rows)


def alerts_table(alerts: Sequence[Alert]) -> str:
    if not alerts:
        return "no alerts"
    return table(["ID", "AT", "TASK ID", "STEP", "AGENT", "MESSAGE"], [
        [str(a.id), _when(a.at), _text(a.task_id), _text(a.step), _text(a.agent),
         _text(a.message) + (" (resolved)" if a.resolved_at is not None else "")]
        for a in alerts])

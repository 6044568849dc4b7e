"""The HTTP API's bodies, for validation and for the OpenAPI document (SPEC U4).

A task, step, history entry and alert read as `sasflow tasks show --json` and
`sasflow alerts list --json` print them (CONTRACT): the same shapes, made by the
same functions (model.py's `to_json`, cli/output.py), plus what a page needs.
Times are ISO-8601 with a UTC offset.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AlertOut",
    "AlertsOut",
    "CountsOut",
    "DeadLetterOut",
    "DeadLettersOut",
    "HealthOut",
    "InstanceOut",
    "InstancesOut",
    "PurgedOut",
    "Reason",
    "RetryIn",
    "StepOut",
    "SubmitIn",
    "SubmittedOut",
    "TaskDetailOut",
    "TaskOut",
    "TaskPageOut",
]

# an operator's reason, kept in the task's history: required, one line's worth
REASON = Field(min_length=1, max_length=500, description="Why: kept in the task's history.")


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Reason(_Closed):
    reason: str = REASON


class RetryIn(Reason):
    step: str | None = Field(default=None, max_length=200,
                             description="The failed step (default: the one that failed).")


class SubmitIn(_Closed):
    workflow: str = Field(min_length=1, max_length=200)
    input: Any = None
    task_id: str | None = Field(default=None, min_length=1, max_length=200)
    reply_to: str | None = Field(default=None, min_length=1, max_length=200)


class SubmittedOut(BaseModel):
    task_id: str


class StepOut(BaseModel):
    name: str
    agent: str
    state: str
    attempts: int
    failure_count: int
    complete_by: str | None
    idempotency_key: str
    result: Any = None
    error: str | None
    compensation: dict[str, Any] | None = None


class TaskOut(BaseModel):
    task_id: str
    workflow: str
    version: str | None
    state: str
    locked_by: str | None
    complete_by: str | None
    failure_count: int
    epoch: int
    reply_to: str | None
    created_at: str | None
    updated_at: str | None
    error: str | None


class HistoryOut(BaseModel):
    at: str | None
    actor: str
    epoch: int
    step: str | None
    phase: str | None
    from_state: str | None
    to_state: str
    why: str | None


class TaskDetailOut(TaskOut):
    input: Any = None
    steps: list[StepOut]
    history: list[HistoryOut]


class TaskPageOut(BaseModel):
    tasks: list[TaskOut]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page.")


class CountsOut(BaseModel):
    counts: dict[str, int] = Field(description="Tasks in each state, every state named.")
    total: int


class AlertOut(BaseModel):
    id: int
    task_id: str | None
    step: str | None
    agent: str | None
    at: str | None
    message: str
    incident: str | None = None
    count: int | None = None
    resolved_at: str | None = None
    acknowledged_at: str | None = None
    acknowledged_by: str | None = None
    acknowledged_why: str | None = None


class AlertsOut(BaseModel):
    alerts: list[AlertOut]


class InstanceOut(BaseModel):
    instance_id: str
    host: str
    pid: int
    roles: list[str]
    agents: list[str]
    workflows: dict[str, str]
    started_at: str | None
    beat_at: str | None
    heartbeat_age_s: float = Field(description="Seconds since its last heartbeat.")
    live: bool = Field(description="It has beaten within its lease and not stopped.")
    stopped_at: str | None


class InstancesOut(BaseModel):
    instances: list[InstanceOut]


class DeadLetterOut(BaseModel):
    id: str
    queue: str
    reason: str
    deliveries: int
    first_seen: str | None
    at: str | None
    body: str = Field(description="The message as it was, UTF-8 (invalid bytes replaced).")


class DeadLettersOut(BaseModel):
    dead_letters: list[DeadLetterOut]


class PurgedOut(BaseModel):
    purged: int


class HealthOut(BaseModel):
    status: str
    store: str

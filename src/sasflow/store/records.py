"""The records a state store takes and gives, beside the model's Task (SPEC S10)."""

from __future__ import annotations

import msgspec

from sasflow.model import StepRecord, StepState, Task, TaskState
from sasflow.workflow import workflow_version

__all__ = ["Alert", "AlertDelivery", "Census", "DeliveryRecord", "HistoryEntry", "Instance",
           "NewTask", "OutboxMessage", "submitted"]


# out of the garbage collector, as model.py's records (see there)
class NewTask(msgspec.Struct, kw_only=True, gc=False):
    """A task as submitted: validated, its input already encoded as JSON."""

    task_id: str
    workflow: str
    input_json: bytes
    steps: list[tuple[str, str, str]]  # (name, agent, idempotency key), in order
    reply_to: str | None = None
    version: str = ""  # the workflow's version; derived from `steps` when not given

    def __post_init__(self) -> None:
        if not self.version:
            self.version = workflow_version(self.workflow, [(n, a) for n, a, _ in self.steps])


def submitted(task: NewTask, now: float) -> Task:
    """The task as its submission at `now` stores it: pending, unlocked, epoch 0 (E2)."""
    return Task(task_id=task.task_id, workflow=task.workflow,
                input=msgspec.json.decode(task.input_json), state=TaskState.PENDING,
                available_at=now, reply_to=task.reply_to, created_at=now, updated_at=now,
                version=task.version,
                steps=[StepRecord(name=name, agent=agent, state=StepState.PENDING,
                                  idempotency_key=key) for name, agent, key in task.steps])


class HistoryEntry(msgspec.Struct, kw_only=True, gc=False):
    """One transition of a task or of one of its units: who, when, from, to, why."""

    task_id: str
    at: float
    actor: str
    epoch: int
    from_state: str | None
    to_state: str
    why: str | None
    step: str | None = None
    phase: str | None = None


class Alert(msgspec.Struct, kw_only=True):
    """An operator alert: raised with a task's move to error (E8), or for an incident.

    An incident is a condition of the deployment rather than of one task (R4): tasks
    of a workflow version, or units of an agent, that no live process declares. It
    has no task id; `incident` names what it is about (``workflow:NAME@VERSION``,
    ``agent:NAME``), `count` how many tasks it held when raised, and `resolved_at`
    when it was gone. One alert per incident, not one per task. An operator may
    acknowledge it (`acknowledged_at`, `_by`, `_why`); it is then not delivered again.
    """

    id: int
    task_id: str | None
    at: float
    message: str
    step: str | None = None
    agent: str | None = None
    incident: str | None = None
    count: int | None = None
    resolved_at: float | None = None
    acknowledged_at: float | None = None
    acknowledged_by: str | None = None
    acknowledged_why: str | None = None


class AlertDelivery(msgspec.Struct, kw_only=True):
    """One POST of an alert to one webhook, taken to be sent (alert_delivery.py).

    `url` is the webhook's label (its URL as `redact` shows it); `attempt` counts
    the POSTs taken so far, this one included, and fences what it records.
    """

    alert: Alert
    url: str
    attempt: int


class DeliveryRecord(msgspec.Struct, kw_only=True):
    """What came of an alert's delivery to one webhook so far: the POSTs taken, when
    the next may be (`due_at`: the lease of one in flight, or the backoff after a
    failure), when it was delivered or given up on, and the last failure's error."""

    alert_id: int
    url: str
    tries: int  # POSTs taken, the one in flight included
    due_at: float
    delivered_at: float | None = None
    gave_up_at: float | None = None
    last_error: str | None = None


class Census(msgspec.Struct, kw_only=True):
    """What unfinished tasks need: how many of each (workflow, version), and of those
    how many are at a unit of each agent ((workflow, version, agent) -> count)."""

    versions: dict[tuple[str, str | None], int]
    agents: dict[tuple[str, str | None, str], int]


class Instance(msgspec.Struct, kw_only=True):
    """A worker instance as it declares itself, with its last heartbeat (store clock)."""

    instance_id: str
    host: str
    pid: int
    roles: list[str]
    agents: list[str]  # the agents it serves
    workflows: dict[str, str]  # workflow name -> version, those it can run
    lease: float = 10.0  # seconds: with no beat since beat_at + lease, it counts as gone
    started_at: float = 0.0
    beat_at: float = 0.0
    stopped_at: float | None = None  # a clean shutdown; None while it runs


class OutboxMessage(msgspec.Struct, kw_only=True):
    id: int
    queue: str
    body: bytes

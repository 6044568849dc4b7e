"""The state store seam (SPEC S10): where tasks, steps, history and leases live.

A store speaks domain verbs and applies Transitions atomically; it holds no
business rules (those are in plan.py). Every implementation passes the same
contract suite in tests/contract/.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import msgspec

from sasflow.model import Task, TaskState
from sasflow.plan import Plan
from sasflow.transition import Transition
from sasflow.transport.dead_letter import DeadLetter
from sasflow.workflow import workflow_version

__all__ = ["Alert", "Census", "HistoryEntry", "Instance", "NewTask", "OutboxMessage", "Store"]


class NewTask(msgspec.Struct, kw_only=True):
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


class HistoryEntry(msgspec.Struct, kw_only=True):
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
    when it was gone. One alert per incident, not one per task.
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


class Store(Protocol):
    """What the actors need from a state store, in their own words."""

    def now(self) -> float:
        """The store's clock (seconds since the epoch): deadlines are compared with it."""
        ...

    async def submit(self, task: NewTask, *, connection: Any = None) -> bool:
        """Create the task (pending, unlocked, 0 failures; E2); False if it existed already.

        With `connection`, the writes join the caller's open transaction and are
        committed, or rolled back, with it (E1).
        """
        ...

    def submit_blocking(self, task: NewTask) -> bool:
        """`submit` for a caller outside any event loop (the sync facade): one thread
        hop fewer than going through an event loop."""
        ...

    def submit_in(self, connection: Any, task: NewTask) -> bool:
        """`submit` inside the caller's open transaction, in the caller's thread (E1)."""
        ...

    async def claim(self, owner: str, limit: int, plans: Mapping[str, Plan]) -> list[Task]:
        """Atomically take up to `limit` claimable tasks (model.claimable, once their
        available-at has come) and start their next unit (E3); the tasks as claimed."""
        ...

    async def apply(self, transition: Transition) -> bool:
        """Apply a fenced transition: all of it, or nothing if the fence no longer holds.

        The values it carries are written as they are (transition.applied says what
        they make of the task), so writing it again changes nothing more."""
        ...

    async def expired(self, limit: int, workflows: Collection[str] | None = None
                      ) -> list[Task]:
        """Locked tasks whose complete-by has passed, with their steps (S7); only those
        of `workflows` when given (R4: a supervisor looks only at what it knows, and
        the others cost it nothing)."""
        ...

    async def get(self, task_id: str) -> Task | None: ...

    async def list_tasks(self, *, state: TaskState | None = None, workflow: str | None = None,
                   limit: int = 100) -> list[Task]: ...

    async def history(self, task_id: str) -> list[HistoryEntry]: ...

    async def alerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]: ...

    async def next_expiry(self, workflows: Collection[str] | None = None) -> float | None:
        """The earliest complete-by among locked tasks (of `workflows` when given): the
        supervisor's alarm clock."""
        ...

    async def census(self) -> Census:
        """What the unfinished tasks need (workflow versions, agents): the supervisor
        compares it with what live instances declare (R4)."""
        ...

    async def incidents(self) -> list[Alert]:
        """The incident alerts not yet resolved, oldest first."""
        ...

    async def report_incidents(self, raised: Collection[Alert], resolved: Collection[str]
                               ) -> None:
        """Record new incident alerts (each resolves an open one of the same incident,
        which it supersedes) and resolve the open alerts of `resolved` incidents."""
        ...

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        """Take or renew a named lease; its fencing epoch if held, else None (M3)."""
        ...

    async def watch(self, wake: Callable[[float], None]) -> None:
        """Call `wake(at)` when work becomes claimable at `at` anywhere, until cancelled.

        A store with no way to hear of other processes' work returns at once;
        schedulers then find it by polling.
        """
        ...

    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Call `finished(task_id)`, from any thread, when another process ends a task
        of this store; returns the unsubscribe.

        A client waiting for a task then wakes at once instead of polling. A store
        with no way to hear of other processes never calls it (in-process endings
        reach the App directly).
        """
        ...

    async def beat(self, instance: Instance, *, first: bool = False) -> None:
        """Record that `instance` is alive now: its row, written or renewed, with
        `beat_at` (and, on its first beat, `started_at`) on the store's clock.

        `first`: the first beat of a process. An instance id may be used again by a
        new process (a restarted container keeps its name): the tasks an earlier
        process left locked under that id are then orphaned (see `orphaned`).
        """
        ...

    async def stopped(self, instance_id: str) -> None:
        """Record a clean shutdown of the instance (its heartbeat stops on purpose)."""
        ...

    async def instances(self, *, instance_id: str | None = None) -> list[Instance]:
        """The instances that have beaten (or only the one named), oldest first."""
        ...

    async def orphaned(self, limit: int, workflows: Collection[str] | None = None
                       ) -> list[Task]:
        """Locked tasks, with their steps, whose owner is an instance that is gone at
        the store's now: stopped, or silent past its lease (`beat_at + lease < now`); or
        that an earlier process with the same instance id locked (last written
        before the current process's first beat). Only those of `workflows` when
        given (R4, as `expired`)."""
        ...

    # The in-process transport's dead letters (R3): its queues die with the
    # process, so they are kept in the store (transport/dead_letter.py).
    async def add_dead_letter(self, letter: DeadLetter) -> None: ...

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        """The oldest `limit` dead letters, oldest first."""
        ...

    async def dead_letter(self, letter_id: str) -> DeadLetter | None: ...

    async def purge_dead_letters(self) -> int:
        """Forget every dead letter; how many there were."""
        ...

    async def take_outbox(self, queues: Collection[str] | None, limit: int
                          ) -> list[OutboxMessage]:
        """Lease pending status messages (of all queues, or only these) for relaying."""
        ...

    async def ack_outbox(self, ids: Collection[int]) -> None:
        """Forget status messages once they are published."""
        ...

    async def close(self) -> None: ...

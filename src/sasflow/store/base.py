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

__all__ = ["Alert", "HistoryEntry", "Instance", "NewTask", "OutboxMessage", "Store"]


class NewTask(msgspec.Struct, kw_only=True):
    """A task as submitted: validated, its input already encoded as JSON."""

    task_id: str
    workflow: str
    input_json: bytes
    steps: list[tuple[str, str, str]]  # (name, agent, idempotency key), in order
    reply_to: str | None = None


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
    """An operator alert raised with a task's move to error (E8)."""

    id: int
    task_id: str
    at: float
    message: str
    step: str | None = None
    agent: str | None = None


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
        """Atomically take up to `limit` claimable tasks and start their next unit (E3)."""
        ...

    async def apply(self, transition: Transition) -> bool:
        """Apply a fenced transition: all of it, or nothing if the fence no longer holds."""
        ...

    async def expired(self, limit: int) -> list[Task]:
        """Locked tasks whose complete-by has passed, with their steps (S7)."""
        ...

    async def get(self, task_id: str) -> Task | None: ...

    async def list_tasks(self, *, state: TaskState | None = None, workflow: str | None = None,
                   limit: int = 100) -> list[Task]: ...

    async def history(self, task_id: str) -> list[HistoryEntry]: ...

    async def alerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]: ...

    async def next_expiry(self) -> float | None:
        """The earliest complete-by among locked tasks (the supervisor's alarm clock)."""
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

    async def orphaned(self, limit: int) -> list[Task]:
        """Locked tasks, with their steps, whose owner is an instance that is gone at
        the store's now: stopped, or silent past its lease (`beat_at + lease < now`); or
        that an earlier process with the same instance id locked (last written
        before the current process's first beat)."""
        ...

    async def take_outbox(self, queues: Collection[str] | None, limit: int
                          ) -> list[OutboxMessage]:
        """Lease pending status messages (of all queues, or only these) for relaying."""
        ...

    async def ack_outbox(self, ids: Collection[int]) -> None:
        """Forget status messages once they are published."""
        ...

    async def close(self) -> None: ...

"""What each actor needs from a state store, in its own words (SPEC S10).

A client submits, reads and acts as an operator; a scheduler claims, applies and
is woken; a supervisor finds expired and orphaned work under a lease; the relay
empties the outbox; the alert deliverer posts alerts to webhooks; every
worker instance beats. Each actor is typed with its
own interface, so a change to what one actor needs shows whom it touches.
`Store` is all of them: what the SQLite, PostgreSQL and memory stores implement
and the contract suite in tests/contract/ checks.

A store speaks domain verbs and applies Transitions atomically; it holds no
business rules. Even a claim is decided outside it: the scheduler hands it one
`ClaimRule` per workflow (the planner's Plan is one), so the store never imports
the planner.

Every verb is a coroutine but one: `submit_in`, which joins the caller's own
open transaction in the caller's thread (E1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from sasflow.model import Task, TaskState
from sasflow.store.listing import TaskQuery
from sasflow.store.records import (
    Alert,
    AlertDelivery,
    Census,
    DeliveryRecord,
    HistoryEntry,
    Instance,
    NewTask,
    OutboxMessage,
)
from sasflow.transition import Transition
from sasflow.transport.dead_letter import DeadLetter

__all__ = ["OUTBOX_LEASE_S", "AlertDeliveryStore", "ClaimRule", "ClientStore", "DeadLetterStore",
           "InstanceStore", "RelayStore", "SchedulerStore", "Store", "SupervisorStore"]


class ClaimRule(Protocol):
    """How the tasks of one workflow are claimed: the decision a claim applies."""

    @property
    def version(self) -> str:
        """The workflow version claimed: tasks of any other shape are left alone (R4)."""
        ...

    def claim(self, task: Task, owner: str, now: float) -> Transition:
        """The transition that claims `task` for `owner` at `now`; InvalidTransitionError
        if the task cannot be claimed under this rule (it is then skipped)."""
        ...


class _Clock(Protocol):
    def now(self) -> float:
        """The store's clock (seconds since the epoch): deadlines are compared with it."""
        ...


class _Applies(Protocol):
    async def apply(self, transition: Transition) -> bool:
        """Apply a fenced transition: all of it, or nothing if the fence no longer holds.

        The values it carries are written as they are (transition.applied says what
        they make of the task), so writing it again changes nothing more."""
        ...


class ClientStore(_Clock, _Applies, Protocol):
    """An application's: submit, read, wait, and act as an operator (apply)."""

    async def submit(self, task: NewTask, *, connection: Any = None) -> bool:
        """Create the task (pending, unlocked, 0 failures; E2); False if it existed already.

        With `connection`, the writes join the caller's open transaction and are
        committed, or rolled back, with it (E1).
        """
        ...

    def submit_in(self, connection: Any, task: NewTask) -> bool:
        """`submit` inside the caller's open transaction, in the caller's thread (E1):
        the one blocking verb."""
        ...

    async def submit_claimed(self, task: NewTask, owner: str, rule: ClaimRule) -> Task | None:
        """Create the task and, in the same transaction, claim it for `owner` by `rule`:
        the task as claimed, or None if it existed already (nothing is written then,
        no claim either; one that differs raises TaskConflictError, as `submit` does).

        What a submitting process whose own scheduler has a free slot uses: one commit
        where a submission and a claim take two, and no scheduler looks for the task."""
        ...

    async def get(self, task_id: str) -> Task | None: ...

    async def list_tasks(self, query: TaskQuery) -> list[Task]:
        """A page of the task list, without steps (listing.py)."""
        ...

    async def task_counts(self) -> dict[TaskState, int]:
        """How many tasks are in each state (states with none left out)."""
        ...

    async def ended_per_minute(self, since: float) -> dict[int, dict[TaskState, int]]:
        """How many tasks ended (reached an end state) in each minute since `since`
        (minute 0 starts then), by state; minutes with none left out."""
        ...

    async def history(self, task_id: str) -> list[HistoryEntry]: ...

    async def alerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]: ...

    async def alert(self, alert_id: int) -> Alert | None: ...

    async def acknowledge_alert(self, alert_id: int, *, by: str, why: str) -> Alert | None:
        """Record that `by` saw the alert, and why it needs nothing more; the first
        acknowledgement stands. None if there is no such alert."""
        ...

    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Call `finished(task_id)`, from any thread, when another process ends a task
        of this store; returns the unsubscribe.

        A client waiting for a task then wakes at once instead of polling. A store
        with no way to hear of other processes never calls it (in-process endings
        reach the App directly).
        """
        ...


class SchedulerStore(_Clock, _Applies, Protocol):
    """A scheduler's: claim the next units, record their outcomes, hear of new work."""

    async def claim(self, owner: str, limit: int, rules: Mapping[str, ClaimRule]
                    ) -> list[Task]:
        """Atomically take up to `limit` claimable tasks (model.claimable, once their
        available-at has come) of the workflows `rules` names, at the version each
        rule claims, and apply each rule's claim (E3); the tasks as claimed."""
        ...

    async def watch(self, wake: Callable[[float], None]) -> None:
        """Call `wake(at)` when work becomes claimable at `at` anywhere, until cancelled.

        A store with no way to hear of other processes' work returns at once;
        schedulers then find it by polling.
        """
        ...


class SupervisorStore(_Clock, _Applies, Protocol):
    """A supervisor's: expired and orphaned work, the lease it sweeps under, incidents."""

    async def expired(self, limit: int, workflows: Collection[str] | None = None
                      ) -> list[Task]:
        """Locked tasks whose complete-by has passed, with their steps (S7); only those
        of `workflows` when given (R4: a supervisor looks only at what it knows, and
        the others cost it nothing)."""
        ...

    async def next_expiry(self, workflows: Collection[str] | None = None) -> float | None:
        """The earliest complete-by among locked tasks (of `workflows` when given): the
        supervisor's alarm clock."""
        ...

    async def orphaned(self, limit: int, workflows: Collection[str] | None = None
                       ) -> list[Task]:
        """Locked tasks, with their steps, whose owner is an instance that is gone at
        the store's now: stopped, or silent past its lease (`beat_at + lease < now`); or
        that an earlier process with the same instance id locked (last written
        before the current process's first beat). Only those of `workflows` when
        given (R4, as `expired`)."""
        ...

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        """Take or renew a named lease; its fencing epoch if held, else None (M3)."""
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

    async def instances(self, *, instance_id: str | None = None) -> list[Instance]:
        """The instances that have beaten (or only the one named), oldest first."""
        ...

    async def forget_instances(self, before: float) -> int:
        """Delete the rows of instances whose last beat is older than `before` and that
        hold no task; how many went. Keeps the table to the instances of recent days
        however often pods are replaced."""
        ...


class InstanceStore(_Clock, Protocol):
    """A worker instance's: its heartbeat (R2)."""

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


# A relay that dies gives back the status messages it took after this long
OUTBOX_LEASE_S = 30.0


class RelayStore(Protocol):
    """The outbox relay's: status messages written with the changes they report (E11)."""

    async def take_outbox(self, queues: Collection[str] | None, limit: int
                          ) -> list[OutboxMessage]:
        """Lease pending status messages (of all queues, or only these) for relaying."""
        ...

    async def ack_outbox(self, ids: Collection[int]) -> None:
        """Forget status messages once they are published."""
        ...

    async def watch_outbox(self, written: Callable[[], None]) -> None:
        """Call `written()` (on this loop) whenever a commit, by any process, may have
        written status messages, until cancelled; and once as it starts listening
        (again), for what came meanwhile. A hint, never the truth: a reader takes the
        outbox when told, and still now and then (outbox.py)."""
        ...


class DeadLetterStore(Protocol):
    """The in-process transport's dead letters (R3): its queues die with the process,
    so they are kept in the store (transport/dead_letter.py)."""

    async def add_dead_letter(self, letter: DeadLetter) -> None: ...

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        """The oldest `limit` dead letters, oldest first."""
        ...

    async def dead_letter(self, letter_id: str) -> DeadLetter | None: ...

    async def purge_dead_letters(self) -> int:
        """Forget every dead letter; how many there were."""
        ...


class AlertDeliveryStore(_Clock, Protocol):
    """The alert deliverer's (alert_delivery.py): which alerts each webhook still needs,
    and what came of each POST. A webhook is named by its label, its URL as `redact`
    shows it: no credential reaches the store."""

    async def take_alert_deliveries(self, webhooks: Collection[str], limit: int, *,
                                    lease: float, attempts: int, max_age: float
                                    ) -> list[AlertDelivery]:
        """Take the POSTs due now: per webhook, up to `limit` alerts, oldest first, that
        are not acknowledged, were raised at most `max_age` seconds ago, and that it
        was neither sent nor refused, with fewer than `attempts` attempts taken and the
        last one's lease or backoff passed. Each attempt is counted and leased for
        `lease` seconds, so no other deliverer takes it meanwhile.

        First, the alerts needing nothing more are done with, for good: those
        acknowledged, older than `max_age`, or delivered or given up for every one of
        `webhooks` (a webhook added later is sent the alerts raised from then on,
        and those still pending for the others)."""
        ...

    async def record_alert_delivery(self, delivery: AlertDelivery, *,
                                    error: str | None = None,
                                    retry_at: float | None = None) -> bool:
        """Record what came of a taken POST: delivered (no `error`); failed, due again at
        `retry_at`; or failed for good (an `error` and no `retry_at`). Fenced by the
        attempt: False, and nothing written, if a later attempt was taken since or
        the delivery was settled."""
        ...

    async def alert_deliveries(self, alert_id: int) -> list[DeliveryRecord]:
        """What came of an alert's deliveries so far: one record per webhook it was
        taken for, by label."""
        ...


class Store(ClientStore, SchedulerStore, SupervisorStore, InstanceStore, RelayStore,
            DeadLetterStore, AlertDeliveryStore, Protocol):
    """Every verb: what a store implements."""

    async def close(self) -> None: ...

    def closes_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether closing the store needs `loop` to run (its connections live there)."""
        ...

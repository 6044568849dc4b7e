"""The client side of an application: submit tasks, read them, wait for them,
follow their status messages, and act on them as an operator (E8).

One naming rule for every operation: `x()` blocks (it runs on a private event
loop in a background thread, background_loop.py) and `ax()` is its coroutine
for use inside an event loop — `submit`/`asubmit`, `get`/`aget`, `list`/`alist`,
`history`/`ahistory`, `alerts`/`aalerts`, `listen`/`alisten`, `retry`/`aretry`,
`compensate`/`acompensate`, `cancel`/`acancel`, `migrate`/`amigrate`,
`dead_letters`/`adead_letters`, `dead_letter`/`adead_letter`,
`purge_dead_letters`/`apurge_dead_letters`. Where
`ax` would be a Python keyword it takes a trailing underscore (PEP 8):
`wait`/`await_`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal, ParamSpec, TypeVar

from sasflow import loop_calls
from sasflow.backends import Backends, running_loop
from sasflow.background_loop import BackgroundLoop, answer_early
from sasflow.declarations import Declarations
from sasflow.errors import (
    PayloadError,
    UnknownTaskError,
    WaitTimeout,
)
from sasflow.messages import Status, encode_json_value
from sasflow.model import Task, TaskState, idempotency_key
from sasflow.operations import Migration, Operations
from sasflow.own_connection import OwnConnection
from sasflow.plan import Plan
from sasflow.scheduler import Scheduler
from sasflow.signals import InProcessSignals
from sasflow.status_stream import Listening, statuses
from sasflow.store.interfaces import ClaimRule, Store
from sasflow.store.listing import TaskQuery, decode_cursor
from sasflow.store.records import Alert, HistoryEntry, Instance, NewTask
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES, Transport, check_reply_to
from sasflow.twins import blocking as _blocking

__all__ = ["Client", "Migration", "new_task_id"]

P = ParamSpec("P")
T = TypeVar("T")

_MAX_TASK_ID = 200


# how long a waiter first trusts the store's and this process's notices alone
_FIRST_LOOK_S = 0.05


def new_task_id() -> str:
    """A unique id that sorts by creation time (the layout of a UUIDv7, in hex).

    Time-ordered ids keep the store's B-trees appending at their right edge instead
    of touching a random page per insert, so each commit writes fewer pages.
    """
    millis = time.time_ns() // 1_000_000
    return f"{millis:012x}{secrets.token_hex(10)}"


class Client(Operations):
    """Submits, reads and acts on the tasks in an application's store."""

    def __init__(self, store: str | None = None, transport: str | None = None, *,
                 max_payload_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 clock: Callable[[], float] | None = None) -> None:
        self._backends = Backends(store, transport, max_payload_bytes=max_payload_bytes,
                                  clock=clock)
        self._declared = Declarations()
        self._signals = InProcessSignals(now=lambda: self._store.now())
        self._loop = BackgroundLoop()
        # the blocking submit's own connection (PostgreSQL); False: not looked at yet
        self._own: OwnConnection | Literal[False] | None = False

    # ------------------------------------------------------------ where it points
    @property
    def store_url(self) -> str | None:
        return self._backends.store_url

    @property
    def transport_url(self) -> str | None:
        return self._backends.transport_url

    @property
    def max_payload_bytes(self) -> int:
        return self._backends.max_payload_bytes

    def configure(self, *, store: str | None = None, transport: str | None = None,
                  connect_within: float | None = None, create: bool | None = None) -> None:
        """Point the app elsewhere before it first touches its store (the CLI's options).
        `connect_within` bounds the wait for a server store; `create=False` refuses a
        store that does not exist yet instead of creating it (operator commands)."""
        self._backends.configure(store=store, transport=transport,
                                 connect_within=connect_within, create=create)

    @property
    def _store(self) -> Store:
        return self._backends.store

    @property
    def _transport(self) -> Transport:
        return self._backends.transport

    def _plans(self) -> dict[str, Plan]:
        return self._declared.plans()

    # ------------------------------------------------------------ submission
    def _new_task(self, workflow: str, input: Any = None, *, task_id: str | None = None,
                  reply_to: str | None = None) -> NewTask:
        """Validate a submission and build its record; raises before anything is written."""
        declared = self._declared.known(workflow)
        if task_id is None:
            task_id = new_task_id()
        if not isinstance(task_id, str) or not task_id or len(task_id) > _MAX_TASK_ID or (
                not task_id.isprintable()):
            raise PayloadError(f"task id must be 1-{_MAX_TASK_ID} printable characters,"
                               f" got {task_id!r}")
        if reply_to is not None:
            check_reply_to(self._transport, reply_to, task_id)
        try:
            body = encode_json_value(input)
        except TypeError as error:
            raise PayloadError(f"input is not JSON-serialisable: {error}",
                               task_id=task_id) from None
        if len(body) > self.max_payload_bytes:
            raise PayloadError(f"input of {len(body)} bytes is over the limit of"
                               f" {self.max_payload_bytes} bytes", task_id=task_id)
        return NewTask(task_id=task_id, workflow=workflow, input_json=body, reply_to=reply_to,
                       steps=[(s.name, s.agent, idempotency_key(task_id, s.name))
                              for s in declared.steps],
                       version=declared.version)  # only workers of this version run it

    async def asubmit(self, workflow: str, input: Any = None, *, task_id: str | None = None,
                      reply_to: str | None = None, connection: Any = None) -> str:
        """Submit a task; idempotent on task_id. With `connection` (a DB-API connection to
        the store's database) it joins the caller's transaction (E1)."""
        new = self._new_task(workflow, input, task_id=task_id, reply_to=reply_to)
        if connection is not None:
            await self._store.submit(new, connection=connection)
            return new.task_id
        # a blocking caller (`submit`) may have the id as soon as the task is stored:
        # the store's writer gives it, the schedulers are told after
        answer_early(new.task_id)
        claimer = self._signals.claimer(new.workflow, new.version)
        if claimer is None:
            await self._store.submit(new)
            self._signals.wake_schedulers()
            return new.task_id
        # a scheduler of this process has a slot: the task is claimed for it in the
        # submission's own transaction and driven at once (no claim, no wake-up)
        loop, scheduler, rule = claimer
        writing = functools.partial(self._begin_claimed, new, scheduler, rule)
        if loop is asyncio.get_running_loop():
            await asyncio.shield(writing())
        else:  # on the scheduler's loop, where the write and the hand-over (or the slot
            # given back) outlive this caller and its loop
            await loop_calls.into(loop)(writing, outlive_caller=True)
        return new.task_id

    def _begin_claimed(self, new: NewTask, scheduler: Scheduler, rule: ClaimRule
                       ) -> asyncio.Future[Task | None]:
        """On `scheduler`'s loop: the write of `new` claimed for it, begun (one task, from
        any loop); the task is handed over once written, even if the caller is gone."""
        writing = asyncio.ensure_future(
            self._store.submit_claimed(new, scheduler.instance_id, rule))
        writing.add_done_callback(functools.partial(self._hand_over, scheduler=scheduler))
        return writing

    def _submit_on(self, own: OwnConnection, new: NewTask) -> bool:
        """Write `new` on the blocking submit's own connection, claimed for a scheduler of
        this process with a slot free if there is one (handed to it on its loop); False
        if the connection failed (nothing written)."""
        claimer = self._signals.claimer(new.workflow, new.version)
        if claimer is None:
            if own.submit(new) is None:
                return False
            self._signals.wake_schedulers()
            return True
        loop, scheduler, rule = claimer
        try:
            claimed = own.submit_claimed(new, scheduler.instance_id, rule)
        except BaseException:
            scheduler.unpromise()
            raise
        if not claimed:  # existed (nothing written), or the connection failed
            # (a commit whose answer the failure lost leaves the task claimed and not
            # driven: its complete-by passes and a supervisor releases it, as after a
            # crash; the submission through the loop then finds it exists)
            scheduler.unpromise()
            self._signals.wake_schedulers()
            return claimed is False
        # (its loop closed meanwhile: the task, locked to a stopped scheduler, is
        # released by a supervisor at its complete-by, as after a crash)
        loop_calls.tell(loop, scheduler.adopt, claimed)
        return True

    def _hand_over(self, written: asyncio.Future[Task | None], scheduler: Scheduler) -> None:
        """Give the task claimed with its submission to the scheduler it was claimed for
        (on this loop, its own); or give the slot back if nothing was claimed."""
        claimed = None if written.cancelled() or written.exception() else written.result()
        if claimed is None:  # it existed (nothing was written), or the write failed
            scheduler.unpromise()
            self._signals.wake_schedulers()
        else:
            scheduler.adopt(claimed)

    def submit(self, workflow: str, input: Any = None, *, task_id: str | None = None,
               reply_to: str | None = None, connection: Any = None) -> str:
        """Blocking twin of `asubmit`."""
        if connection is None:
            own = self._own_connection()
            if own is not None:  # PostgreSQL: in this thread, not behind the roles' loop
                new = self._new_task(workflow, input, task_id=task_id, reply_to=reply_to)
                if self._submit_on(own, new):
                    return new.task_id
                task_id = new.task_id  # (not written: the same task, through the loop)
            return self._loop.call(self.asubmit(workflow, input, task_id=task_id,
                                                reply_to=reply_to), early=True)
        # the caller's transaction lives in the caller's thread
        new = self._new_task(workflow, input, task_id=task_id, reply_to=reply_to)
        self._store.submit_in(connection, new)
        return new.task_id

    # ------------------------------------------------------------ reading
    async def aget(self, task_id: str) -> Task:
        """The task and its steps; UnknownTaskError if there is none by that id."""
        task = await self._store.get(task_id)
        if task is None:
            raise UnknownTaskError(f"unknown task {task_id!r}", task_id=task_id)
        return task

    async def await_(self, task_id: str, timeout: float | None = 60.0) -> Task:
        """Wait until the task reaches a terminal state; WaitTimeout if it does not."""
        ended = self._signals.ended.get(task_id)
        if ended is not None:  # ended here in a final state: what the store holds for good
            return ended
        try:
            self._signals.hear(self._store)
            async with self._signals.waiting(task_id) as waiter, asyncio.timeout(timeout):
                # Every store tells of the tasks any process ends (`hear` above), so
                # reading again is only the net for a lost notice (a datagram dropped,
                # a listener reconnecting). At 5 ms, it read every task of more than
                # 5 ms once more, in the middle of its steps: 0.7-1.5 ms of a task's
                # p50 over a broker (docs/benchmarks.md)
                poll = _FIRST_LOOK_S
                # driven by a scheduler of this process, whose end is not yet begun:
                # it will hand the end over, or say it let go, so the first read
                # (a round trip, on the loop the scheduler needs) can wait till then
                read = not waiter.driven_here
                while True:
                    if read:
                        task = await self.aget(task_id)
                        if task.terminal:  # (a final end kept: the next waiter need not read)
                            self._signals.ended.keep_read(task)
                            return task
                    read = True
                    while True:
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(poll):
                                await waiter.event.wait()
                        if waiter.task is not None:  # ended by a scheduler of this
                            return waiter.task  # process as written, while this waited
                        waiter.event.clear()
                        if not waiter.promised:  # (else its scheduler is writing the end)
                            break
                    poll = min(poll * 2, 0.25)
        except TimeoutError:
            raise WaitTimeout(f"task {task_id} did not finish within {timeout}s",
                              task_id=task_id) from None

    async def alist(self, *, state: str | None = None, workflow: str | None = None,
                    limit: int = 100, created_from: float | None = None,
                    created_to: float | None = None, cursor: str | None = None,
                    newest_first: bool = False) -> builtins.list[Task]:
        """A page of tasks, oldest first (or `newest_first`), optionally only those in
        `state`, of `workflow`, or created in [`created_from`, `created_to`) (seconds
        since the epoch). `cursor` goes on after a page: `store.listing.encode_cursor`
        of its last task."""
        try:
            wanted = TaskState(state) if state is not None else None
        except ValueError:
            choices = ", ".join(s.value for s in TaskState)
            raise PayloadError(f"unknown state {state!r} (choose {choices})") from None
        if limit < 1:
            raise PayloadError(f"limit must be at least 1, not {limit}")
        return await self._store.list_tasks(TaskQuery(
            state=wanted, workflow=workflow, limit=limit, created_from=created_from,
            created_to=created_to, after=decode_cursor(cursor) if cursor else None,
            newest_first=newest_first))

    async def acount(self) -> dict[TaskState, int]:
        """How many tasks are in each state, every state named."""
        counts = await self._store.task_counts()
        return {state: counts.get(state, 0) for state in TaskState}

    async def athroughput(self, *, minutes: int = 60) -> builtins.list[dict[TaskState, int]]:
        """How many tasks ended in each of the last `minutes` minutes, by end state,
        oldest minute first (the dashboard's throughput)."""
        since = self._store.now() - 60 * minutes
        ended = await self._store.ended_per_minute(since)
        return [ended.get(minute, {}) for minute in range(minutes)]

    async def ainstances(self) -> builtins.list[Instance]:
        """The worker instances that have beaten, oldest first, with their roles and
        last heartbeat (compare `beat_at + lease` with `now()`)."""
        return await self._store.instances()

    def now(self) -> float:
        """The store's clock (seconds since the epoch), by which deadlines and
        heartbeats are judged (R1)."""
        return self._store.now()

    async def ahistory(self, task_id: str) -> builtins.list[HistoryEntry]:
        """Every recorded state change of the task, oldest first."""
        await self.aget(task_id)
        return await self._store.history(task_id)

    async def aalerts(self, *, limit: int = 100, after: int = 0) -> builtins.list[Alert]:
        """Operator alerts, oldest first; `after` an id, to page or to follow new ones."""
        return await self._store.alerts(limit=limit, after=after)

    def alisten(self, queue: str) -> AsyncGenerator[Status, None]:
        """Status messages of the tasks submitted with ``reply_to=queue`` (E11), as an
        async iterator; close it (``contextlib.aclosing``) to stop listening."""
        return statuses(self._store, self._transport, queue)

    def listen(self, queue: str) -> Listening:
        """Blocking twin of `alisten`: ``with app.listen(q) as s: for status in s: ...``."""
        return Listening(self.alisten(queue), self._loop)

    get = _blocking(aget)
    _wait = _blocking(await_)

    def wait(self, task_id: str, timeout: float | None = 60.0) -> Task:
        """Blocking twin of `await_`: Wait until the task reaches a terminal state;
        WaitTimeout if it does not."""
        # a task ended here in a final state is answered in the caller's thread, with
        # no trip through the client's loop (which the schedulers may be keeping busy)
        ended = self._signals.ended.get(task_id)
        return ended if ended is not None else self._wait(task_id, timeout)
    history = _blocking(ahistory)
    alerts = _blocking(aalerts)
    count = _blocking(acount)
    instances = _blocking(ainstances)
    throughput = _blocking(athroughput)

    def _own_connection(self) -> OwnConnection | None:
        if self._own is False:
            self._own = OwnConnection.of(self._store)
        return self._own

    def close(self) -> None:
        """Close the store, the transport the blocking methods opened, and the
        background loop (a closed client opens them again if used). Inside an event
        loop the client was used from, `await aclose()`: the store's connections may
        live on that loop, and closing them from here would wait on it for good."""
        store = self._backends.opened_store
        running = running_loop()
        if store is not None and running is not None and store.closes_on(running):
            raise RuntimeError("close() inside the event loop the store's connections live"
                               " on would wait on itself: use `await app.aclose()`")
        if self._own:
            self._own.close()
        self._own = False
        transport = self._backends.detach_transport_of(self._loop.started)
        if transport is not None:  # closed on its own loop: a broker's client is bound to it
            self._loop.run(transport.close())
        store = self._backends.detach_store()
        if store is not None:
            self._loop.run(store.close())
        self._loop.close()

    async def aclose(self) -> None:
        """Coroutine twin of `close`: closes what the client opened, the store on this
        loop if its connections live here, without blocking the loop."""
        if self._own:
            await asyncio.to_thread(self._own.close)
        self._own = False
        transport = self._backends.detach_transport_of(self._loop.started)
        if transport is not None:  # closed on its own loop: a broker's client is bound to it
            await asyncio.to_thread(self._loop.run, transport.close())
        store = self._backends.detach_store()
        if store is not None:  # (a pool living on another loop is closed there)
            await store.close()
        await asyncio.to_thread(self._loop.close)

    # last: inside this class body, `list` means the method from here on
    list = _blocking(alist)

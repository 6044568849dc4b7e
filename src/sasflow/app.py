"""App: declares agents and workflows, submits tasks, and runs the actors.

The public face of sasflow (CONTRACT "Python API"). Every operation is async at
heart (`asubmit`, `aget`, `await_`...); the sync methods call them through a
private event loop (background_loop.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sasflow.agent import AgentFunction, AgentRequest
from sasflow.background_loop import BackgroundLoop, refuse_inside_a_loop
from sasflow.errors import (
    ConfigurationError,
    InvalidTransitionError,
    PayloadError,
    UnknownTaskError,
    UnknownWorkflowError,
    WaitTimeout,
)
from sasflow.isolation import Isolation
from sasflow.messages import Status, decode_status, encode_json_value
from sasflow.model import Task, TaskState, idempotency_key
from sasflow.plan import Plan, task_version
from sasflow.resilience import RetryPolicy
from sasflow.store import Store, open_store
from sasflow.store.base import Alert, HistoryEntry, NewTask
from sasflow.transition import Transition
from sasflow.transport import Transport, open_transport
from sasflow.transport.base import DEFAULT_MAX_MESSAGE_BYTES
from sasflow.transport.dead_letter import (
    MalformedMessage,
    decoded,
    letter_for,
    log_dead_letter,
)
from sasflow.worker import DEFAULT_HEARTBEAT, ROLES, Worker
from sasflow.workflow import Step, Workflow

__all__ = ["App", "Migration"]

log = logging.getLogger("sasflow.app")

DEFAULT_STORE = "sqlite:///sasflow.db"
_DEFAULT_CONCURRENCY = 256  # an agent's calls at once, on the loop or in threads
_DEFAULT_PROCESSES = 8  # ... in worker processes, each one a Python process
_MAX_TASK_ID = 200
_ALL = 2**31 - 1  # every task of a listing


@dataclass(frozen=True, slots=True)
class Migration:
    """What `App.migrate` did, or (dry run) would do, with one task."""

    task_id: str
    from_version: str
    to_version: str
    migrated: bool  # done (or possible, in a dry run)
    refused: str | None  # why not, in one line


def new_task_id() -> str:
    """A unique id that sorts by creation time (the layout of a UUIDv7, in hex).

    Time-ordered ids keep the store's B-trees appending at their right edge instead
    of touching a random page per insert, so each commit writes fewer pages.
    """
    millis = time.time_ns() // 1_000_000
    return f"{millis:012x}{secrets.token_hex(10)}"


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class App:
    """One application: its agents, its workflows, and where its state lives."""

    def __init__(self, store: str | None = None, transport: str | None = None, *,
                 max_payload_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 clock: Callable[[], float] | None = None) -> None:
        self.store_url = store
        self.transport_url = transport
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self.agents: dict[str, AgentFunction] = {}
        self.workflows: dict[str, Workflow] = {}
        self._store: Store | None = None
        self._connect_within: float | None = None
        self._transport: Transport | None = None
        self._loop = BackgroundLoop()
        self._workers: list[tuple[asyncio.AbstractEventLoop, Worker]] = []
        self._alert_callbacks: list[Callable[[Alert], None]] = []
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._lock = threading.Lock()
        self._background: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ declarations
    def agent(self, name: str, *, attempts: int = 10, initial_wait: float = 0.05,
              max_wait: float = 2.0, failure_threshold: int = 5, reset_timeout: float = 5.0,
              concurrency: int | None = None, isolation: Isolation = "thread"
              ) -> Callable[[Callable[[AgentRequest], Any]], AgentFunction]:
        """Declare an agent: the function that calls one remote service (S3).

        `isolation` says where a sync function runs: "thread" (the default; at the
        complete-by its result is dropped, but the call cannot be stopped) or
        "process" (each call in a worker process, killed at the complete-by; the
        function must be defined at the top level of a module). `concurrency`
        bounds the calls at once: 256 in threads, 8 worker processes by default.
        """
        if not name or not isinstance(name, str):
            raise ConfigurationError(f"agent name must be a non-empty string, got {name!r}")
        if name in self.agents:
            raise ConfigurationError(f"agent {name!r} is declared twice", agent=name)
        try:
            policy = RetryPolicy(attempts=attempts, initial_wait=initial_wait, max_wait=max_wait)
        except ValueError as error:
            raise ConfigurationError(f"agent {name!r}: {error}", agent=name) from None

        def declare(fn: Callable[[AgentRequest], Any]) -> AgentFunction:
            declared = AgentFunction(
                name=name, handler=fn, retry=policy, failure_threshold=failure_threshold,
                reset_timeout=reset_timeout, isolation=isolation,
                concurrency=concurrency if concurrency is not None else (
                    _DEFAULT_PROCESSES if isolation == "process" else _DEFAULT_CONCURRENCY))
            self.agents[name] = declared
            return declared

        return declare

    def workflow(self, name: str, steps: Sequence[Step], *, max_failures: int = 3,
                 on_failure: str = "compensate", retry_backoff: float = 0.2,
                 park_for: float = 300.0) -> Workflow:
        """Declare a workflow: an ordered pipeline of steps and its failure policy (S1)."""
        if name in self.workflows:
            raise ConfigurationError(f"workflow {name!r} is declared twice")
        declared = Workflow.declare(name, steps, agents=self.agents, max_failures=max_failures,
                                    on_failure=on_failure, retry_backoff=retry_backoff,
                                    park_for=park_for)
        self.workflows[name] = declared
        return declared

    def plans(self) -> dict[str, Plan]:
        compensable = frozenset(n for n, a in self.agents.items() if a.undo is not None)
        return {name: Plan(wf, compensable) for name, wf in self.workflows.items()}

    def on_alert(self, callback: Callable[[Alert], None]) -> Callable[[Alert], None]:
        """Call `callback` with each operator alert raised in this process: a task's move
        to error (E8), or an incident its supervisor raised (R4; no task id)."""
        self._alert_callbacks.append(callback)
        return callback

    def configure(self, *, store: str | None = None, transport: str | None = None,
                  connect_within: float | None = None) -> None:
        """Point the app elsewhere before it first touches its store (the CLI's options);
        `connect_within` bounds the wait for a server store (operator commands)."""
        if self._store is not None or self._transport is not None:
            raise ConfigurationError("configure() must come before the store is opened")
        if connect_within is not None:
            self._connect_within = connect_within
        if store is not None:
            self.store_url = store
        if transport is not None:
            self.transport_url = transport

    # ------------------------------------------------------------ backends
    @property
    def store(self) -> Store:
        if self._store is None:
            url = self.store_url or os.environ.get("SASFLOW_STORE") or DEFAULT_STORE
            self._store = open_store(url, clock=self.clock, connect_within=self._connect_within)
        return self._store

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            url = self.transport_url or os.environ.get("SASFLOW_TRANSPORT")
            # in-process queues die with the process: their dead letters go to the store
            self._transport = open_transport(url, max_message_bytes=self.max_payload_bytes,
                                             dead_letter_box=lambda: self.store)
        return self._transport

    # ------------------------------------------------------------ submission
    def new_task(self, workflow: str, input: Any = None, *, task_id: str | None = None,
                 reply_to: str | None = None) -> NewTask:
        """Validate a submission and build its record; raises before anything is written."""
        declared = self.workflows.get(workflow)
        if declared is None:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise UnknownWorkflowError(f"unknown workflow {workflow!r} (declared: {known})")
        if task_id is None:
            task_id = new_task_id()
        if not isinstance(task_id, str) or not task_id or len(task_id) > _MAX_TASK_ID or (
                not task_id.isprintable()):
            raise PayloadError(f"task id must be 1-{_MAX_TASK_ID} printable characters,"
                               f" got {task_id!r}")
        if reply_to is not None and (not isinstance(reply_to, str) or not reply_to
                                     or not reply_to.isprintable()):
            raise PayloadError(f"reply_to must be a queue name, got {reply_to!r}")
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
        new = self.new_task(workflow, input, task_id=task_id, reply_to=reply_to)
        await self.store.submit(new, connection=connection)
        if connection is None:
            self._wake_schedulers()
        return new.task_id

    def submit(self, workflow: str, input: Any = None, *, task_id: str | None = None,
               reply_to: str | None = None, connection: Any = None) -> str:
        new = self.new_task(workflow, input, task_id=task_id, reply_to=reply_to)
        if connection is not None:  # the caller's transaction lives in the caller's thread
            self.store.submit_in(connection, new)
        else:
            refuse_inside_a_loop()
            self.store.submit_blocking(new)
            self._wake_schedulers()
        return new.task_id

    # ------------------------------------------------------------ reading
    async def aget(self, task_id: str) -> Task:
        task = await self.store.get(task_id)
        if task is None:
            raise UnknownTaskError(f"unknown task {task_id!r}", task_id=task_id)
        return task

    def get(self, task_id: str) -> Task:
        return self._loop.call(self.aget(task_id))

    async def await_(self, task_id: str, timeout: float | None = 60.0) -> Task:
        """Wait until the task reaches a terminal state; WaitTimeout if it does not."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        with self._lock:
            self._waiters.setdefault(task_id, []).append((loop, event))
        try:
            async with asyncio.timeout(timeout):
                poll = 0.005
                while True:
                    task = await self.aget(task_id)
                    if task.terminal:
                        return task
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(poll):
                            await event.wait()
                    event.clear()
                    poll = min(poll * 2, 0.25)
        except TimeoutError:
            raise WaitTimeout(f"task {task_id} did not finish within {timeout}s",
                              task_id=task_id) from None
        finally:
            with self._lock:
                waiters = self._waiters.get(task_id, [])
                with contextlib.suppress(ValueError):
                    waiters.remove((loop, event))
                if not waiters:
                    self._waiters.pop(task_id, None)

    def wait(self, task_id: str, timeout: float | None = 60.0) -> Task:
        return self._loop.call(self.await_(task_id, timeout))

    async def alist(self, *, state: str | None = None, workflow: str | None = None,
                    limit: int = 100) -> list[Task]:
        try:
            wanted = TaskState(state) if state is not None else None
        except ValueError:
            choices = ", ".join(s.value for s in TaskState)
            raise PayloadError(f"unknown state {state!r} (choose {choices})") from None
        return await self.store.list_tasks(state=wanted, workflow=workflow, limit=limit)

    async def ahistory(self, task_id: str) -> list[HistoryEntry]:
        await self.aget(task_id)
        return await self.store.history(task_id)

    async def aalerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]:
        return await self.store.alerts(limit=limit, after=after)

    def alerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]:
        return self._loop.call(self.aalerts(limit=limit, after=after))

    async def listen(self, queue: str) -> AsyncIterator[Status]:
        """Status messages of the tasks submitted with ``reply_to=queue`` (E11)."""
        if self.transport.shared:
            inbox: asyncio.Queue[Status] = asyncio.Queue()

            async def put(body: bytes) -> None:
                # decoded here: a body that is no status is the transport's dead letter (R3)
                await inbox.put(decoded(decode_status, body, "status message"))

            consumer = asyncio.create_task(self.transport.consume(queue, put, prefetch=256))
            try:
                while True:
                    yield await inbox.get()
            finally:
                consumer.cancel()
                # its connection is closed by the time the listener goes on
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await consumer
        # in-process queues cannot cross processes: read this queue's outbox directly
        while True:
            messages = await self.store.take_outbox([queue], 256)
            for message in messages:
                try:
                    status = decoded(decode_status, message.body, "status message")
                except MalformedMessage as error:  # kept aside once, as a transport would
                    letter = letter_for(queue, message.body, error)
                    await self.store.add_dead_letter(letter)
                    log_dead_letter(log, letter)
                    continue
                yield status
            await self.store.ack_outbox([m.id for m in messages])
            if not messages:
                await asyncio.sleep(0.02)

    # ------------------------------------------------------------ operator actions (E8)
    async def _operate(self, task_id: str,
                       decide: Callable[[Plan, Task, float], Transition]) -> Task:
        plans = self.plans()
        for _ in range(10):  # the task may move under us: read again and retry
            task = await self.aget(task_id)
            plan = plans.get(task.workflow)
            if plan is None:
                raise UnknownWorkflowError(
                    f"task {task_id} belongs to workflow {task.workflow!r}, unknown to this app",
                    task_id=task_id)
            transition = decide(plan, task, self.store.now())
            if await self.store.apply(transition):
                self._wake_schedulers()
                return await self.aget(task_id)
        raise InvalidTransitionError(f"task {task_id} keeps changing; try again",
                                     task_id=task_id)

    async def aretry(self, task_id: str, step: str | None = None) -> Task:
        return await self._operate(task_id, lambda p, t, now: p.retry(t, now, step))

    async def acompensate(self, task_id: str) -> Task:
        return await self._operate(task_id, lambda p, t, now: p.compensate(t, now))

    async def acancel(self, task_id: str) -> Task:
        return await self._operate(task_id, lambda p, t, now: p.cancel(t, now))

    async def amigrate(self, workflow: str, *, from_version: str | None = None,
                       dry_run: bool = False) -> list[Migration]:
        """Move the pending and error tasks of other versions of `workflow` (or of
        `from_version` only) onto the version declared here, each where it is
        provably safe (plan.Plan.migrate), fenced like every operator action.

        Returns what became of each task, oldest first; with `dry_run` nothing is
        written and each says what would be done. Tasks being run are left to the
        workers of their own version.
        """
        plan = self.plans().get(workflow)
        if plan is None:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise UnknownWorkflowError(f"unknown workflow {workflow!r} (declared: {known})")
        target = plan.workflow.version
        if from_version == target:
            raise InvalidTransitionError(f"version {target} is the one this application"
                                         f" declares for {workflow!r}: nothing to migrate")
        done = []
        for state in (TaskState.PENDING, TaskState.ERROR):
            for found in await self.store.list_tasks(state=state, workflow=workflow,
                                                     limit=_ALL):
                if found.version == target or from_version not in (None, found.version):
                    continue
                done.append(await self._migrate_one(plan, found.task_id, dry_run))
        return done

    async def _migrate_one(self, plan: Plan, task_id: str, dry_run: bool) -> Migration:
        task = await self.aget(task_id)
        old = task_version(task)
        try:
            if dry_run:
                plan.migrate(task, self.store.now())
            else:
                await self._operate(task_id, lambda p, t, now: plan.migrate(t, now))
        except InvalidTransitionError as refused:
            return Migration(task_id, old, plan.workflow.version, False, str(refused))
        return Migration(task_id, old, plan.workflow.version, True, None)

    def migrate(self, workflow: str, *, from_version: str | None = None,
                dry_run: bool = False) -> list[Migration]:
        return self._loop.call(self.amigrate(workflow, from_version=from_version,
                                               dry_run=dry_run))

    def retry(self, task_id: str, step: str | None = None) -> Task:
        return self._loop.call(self.aretry(task_id, step))

    def compensate(self, task_id: str) -> Task:
        return self._loop.call(self.acompensate(task_id))

    def cancel(self, task_id: str) -> Task:
        return self._loop.call(self.acancel(task_id))

    # ------------------------------------------------------------ running
    def worker(self, *, roles: Sequence[str] = ROLES, agents: Sequence[str] | None = None,
               concurrency: int = 64, supervisor_interval: float = 1.0,
               instance_id: str | None = None, heartbeat: float = DEFAULT_HEARTBEAT,
               heartbeat_lease: float | None = None) -> Worker:
        return Worker(self, roles=roles, agents=agents, concurrency=concurrency,
                      supervisor_interval=supervisor_interval,
                      instance_id=instance_id or default_instance_id(),
                      heartbeat=heartbeat, heartbeat_lease=heartbeat_lease,
                      on_applied=self._applied, on_alert=self._alerted)

    async def arun(self, **options: Any) -> None:
        """Run scheduler, agents and supervisor in this event loop until cancelled."""
        await self._serve(self.worker(**options))

    async def _serve(self, worker: Worker) -> None:
        entry = (asyncio.get_running_loop(), worker)
        with self._lock:
            self._workers.append(entry)
        try:
            await worker.run()
        finally:
            with self._lock:
                self._workers.remove(entry)

    def run(self, **options: Any) -> None:
        """Run all roles in this process until SIGINT or SIGTERM."""

        async def main() -> None:
            task = asyncio.current_task()
            assert task is not None
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, task.cancel)
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await self.arun(**options)
            finally:
                # closed in the loop it served: a broker client left open keeps
                # reconnecting, and swallows the cancellation that ends the loop (R2)
                transport, self._transport = self._transport, None
                if transport is not None:
                    await transport.close()

        asyncio.run(main())

    def start(self, **options: Any) -> App:
        """Run all roles in a background thread of this process (tests, notebooks)."""
        if self._background is not None:
            raise ConfigurationError("this app is already running in the background")
        worker = self.worker(**options)

        async def launch() -> asyncio.Task[None]:
            return asyncio.create_task(self._serve(worker))

        self._background = self._loop.run(launch())
        return self

    def stop(self) -> None:
        """Stop the background roles (they hand back the tasks they hold) and close,
        the transport too: a broker's connections are not left open behind."""
        background, self._background = self._background, None
        if background is not None:

            async def halt() -> None:
                background.cancel()
                await asyncio.gather(background, return_exceptions=True)
                # on the loop the roles used: a broker client is bound to its loop
                transport, self._transport = self._transport, None
                if transport is not None:
                    await transport.close()

            self._loop.run(halt())
        self.close()

    def close(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            self._loop.run(store.close())
        self._loop.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ in-process signals
    def _alerted(self, alert: Alert) -> None:
        """An alert raised in this process: a task's (E8) or an incident's (R4)."""
        for callback in self._alert_callbacks:
            callback(alert)

    def _applied(self, transition: Transition) -> None:
        if transition.alert:
            self._alerted(Alert(id=0, task_id=transition.task_id, at=self.store.now(),
                                message=transition.alert, step=transition.alert_step,
                                agent=transition.alert_agent))
        if transition.state in (TaskState.PENDING, TaskState.COMPENSATING) and (
                transition.locked_by is None):
            self._wake_schedulers()
        if transition.state in (TaskState.PROCESSED, TaskState.ERROR, TaskState.COMPENSATED,
                                TaskState.CANCELLED):
            with self._lock:
                waiters = list(self._waiters.get(transition.task_id, ()))
            for loop, event in waiters:
                loop.call_soon_threadsafe(event.set)

    def _wake_schedulers(self) -> None:
        with self._lock:
            workers = list(self._workers)
        for loop, worker in workers:
            if worker.scheduler is not None:
                loop.call_soon_threadsafe(worker.scheduler.wake)

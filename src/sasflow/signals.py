"""Signals between an application's client and the workers running in its own
process: a submission is claimed with its write by a scheduler on the same loop
that has a slot free, or else wakes the schedulers; a terminal state wakes the waiters,
an alert reaches the `on_alert` callbacks. Across processes the store carries
what it can (`Store.watch` for schedulers, `Store.on_finished` for waiters: the
SQLite store's wake channel); polling the store is the safety net."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from sasflow.model import claimable, terminal
from sasflow.scheduler import Scheduler
from sasflow.store.interfaces import ClaimRule, Store
from sasflow.store.records import Alert
from sasflow.transition import Transition

__all__ = ["InProcessSignals"]

class InProcessSignals:
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now  # the store's clock, for alerts' times
        self._lock = threading.Lock()
        self._schedulers: list[tuple[asyncio.AbstractEventLoop, Scheduler]] = []
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self.alert_callbacks: list[Callable[[Alert], None]] = []
        self._hearing: Store | None = None  # the store that tells of tasks ended elsewhere

    @contextlib.contextmanager
    def scheduler(self, scheduler: Scheduler | None) -> Iterator[None]:
        """While inside, `wake_schedulers` reaches `scheduler` on the running loop."""
        if scheduler is None:
            yield
            return
        entry = (asyncio.get_running_loop(), scheduler)
        with self._lock:
            self._schedulers.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self._schedulers.remove(entry)

    def claimer(self, workflow: str, version: str
                ) -> tuple[asyncio.AbstractEventLoop, Scheduler, ClaimRule] | None:
        """A scheduler of this process that promises a slot to a task of `workflow` at
        `version`, claimed with its submission: its loop, itself and its rule; None if
        none has a slot. From any loop or thread: the submitter writes the task and
        hands it over on the scheduler's loop (loop_calls.py).

        A web app's loop beside roles in a background thread may have many
        submissions in flight: they reach the scheduler's loop together, are written
        together, and their tasks are handed over as each write commits, spared the
        claim that would otherwise take each (docs/benchmarks.md).
        """
        with self._lock:
            schedulers = list(self._schedulers)
        for loop, scheduler in schedulers:
            rule = scheduler.promise(workflow, version)
            if rule is not None:
                return loop, scheduler, rule
        return None

    def wake_schedulers(self) -> None:
        with self._lock:
            schedulers = list(self._schedulers)
        for loop, scheduler in schedulers:
            _soon(loop, scheduler.wake)

    @contextlib.asynccontextmanager
    async def waiting(self, task_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set when a worker of this process ends `task_id`."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.setdefault(task_id, []).append(entry)
        try:
            yield entry[1]
        finally:
            with self._lock:
                waiters = self._waiters.get(task_id, [])
                with contextlib.suppress(ValueError):
                    waiters.remove(entry)
                if not waiters:
                    self._waiters.pop(task_id, None)

    def hear(self, store: Store) -> None:
        """Have `store` tell the waiters of tasks that other processes end (once per
        store: the client may reopen it)."""
        with self._lock:
            if self._hearing is store:
                return
            self._hearing = store
        store.on_finished(self.finished)

    def finished(self, task_id: str) -> None:
        """`task_id` ended, in this process or (told by the store) in another."""
        with self._lock:
            waiters = list(self._waiters.get(task_id, ()))
        for loop, event in waiters:
            _soon(loop, event.set)

    def alerted(self, alert: Alert) -> None:
        """An alert raised in this process: a task's (E8) or an incident's (R4)."""
        for callback in self.alert_callbacks:
            callback(alert)

    def applied(self, transition: Transition) -> None:
        """A worker of this process applied `transition`: tell whom it concerns."""
        if transition.alert:
            self.alerted(Alert(id=0, task_id=transition.task_id, at=self._now(),
                               message=transition.alert, step=transition.alert_step,
                               agent=transition.alert_agent))
        if claimable(transition.state, transition.locked_by):
            self.wake_schedulers()
        if terminal(transition.state):
            self.finished(transition.task_id)


def _soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """`callback` on `loop`; from the loop's own thread without waking it through its
    self-pipe (a write, an extra turn and a read, twice per task)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.call_soon(callback)
    else:
        loop.call_soon_threadsafe(callback)

"""Signals between an application's client and the workers running in its own
process: a submission is claimed with its write by a scheduler on the same loop
that has a slot free, or else wakes the schedulers; a terminal state wakes the waiters,
and the scheduler that wrote it hands them the ended task (handover.py: a client
that comes to wait while a scheduler here drives the task need not read it); an alert
reaches the `on_alert` callbacks; a task ended here in a final state is kept
(ended_here.py), so a client that comes to wait for it later need not read it.
Across processes the store carries what it can (`Store.watch` for schedulers,
`Store.on_finished` for waiters: the SQLite store's wake channel); polling the
store is the safety net."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from sasflow.ended_here import EndedHere, decode_task, encode_task
from sasflow.handover import Handover
from sasflow.loop_calls import tell
from sasflow.model import Task, claimable, final, terminal
from sasflow.scheduler import Scheduler
from sasflow.store.interfaces import ClaimRule, Store
from sasflow.store.records import Alert
from sasflow.transition import Transition

__all__ = ["InProcessSignals", "Waiter"]

class InProcessSignals:
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now  # the store's clock, for alerts' times
        self._lock = threading.Lock()
        self._schedulers: list[tuple[asyncio.AbstractEventLoop, Scheduler]] = []
        self._waiters: dict[str, list[Waiter]] = {}
        # the tasks schedulers of this process drive and have not yet begun to end
        self._driven: set[str] = set()
        self.alert_callbacks: list[Callable[[Alert], None]] = []
        self._hearing: Store | None = None  # the store that tells of tasks ended elsewhere
        self.ended = EndedHere()  # the final ends this process's schedulers wrote

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
            tell(loop, scheduler.wake)

    @contextlib.asynccontextmanager
    async def waiting(self, task_id: str) -> AsyncIterator[Waiter]:
        """A waiter told when `task_id` ends (`Waiter`)."""
        waiter = Waiter(asyncio.get_running_loop(), self._lock)
        with self._lock:
            self._waiters.setdefault(task_id, []).append(waiter)
            waiter.driven_here = task_id in self._driven
        try:
            yield waiter
        finally:
            with self._lock:
                waiters = self._waiters.get(task_id, [])
                with contextlib.suppress(ValueError):
                    waiters.remove(waiter)
                if not waiters:
                    self._waiters.pop(task_id, None)

    def driving(self, task_id: str) -> None:
        """A scheduler of this process drives `task_id` from now on: a waiter that comes
        now is told of its end by it (`ending`), or that it let go (`let_go`)."""
        # Without the lock (once a task, on the hot path): a waiter registering just
        # before the mark only reads first, as it would have without it
        self._driven.add(task_id)

    def let_go(self, task_id: str) -> None:
        """The scheduler driving `task_id` let go of it. If it did so without beginning
        to write an end (its reply did not come, its task was taken away, it
        stopped), the waiters that counted on it read the store now."""
        if task_id not in self._driven:
            return  # (its end was written, or not: `ending` told the waiters)
        with self._lock:
            if task_id not in self._driven:
                return
            self._driven.discard(task_id)
            waiters = list(self._waiters.get(task_id, ()))
        for waiter in waiters:
            tell(waiter.loop, waiter.event.set)

    def ending(self, task_id: str) -> Handover:
        """Called by a scheduler of this process before it writes the transition that
        ends `task_id`: the waiters there are now, to be handed the task once the
        write applied. The ended task is then the row the store holds
        (transition.applied), and these waiters waited from before it was written, so
        it is a state of the task while they waited: a read would tell them no more.
        Until the scheduler says, a waiter woken by the store's notice of the end
        waits for the task rather than reading it; waiters that come later read,
        unless the end is final: it is then kept (`ended`), and is what any read of
        the task would return from then on."""
        with self._lock:
            self._driven.discard(task_id)  # waiters from now on read
            waiters = list(self._waiters.get(task_id, ()))
            for waiter in waiters:
                waiter.promised += 1
        return _Handover(self.ended, waiters)

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
        for waiter in waiters:
            tell(waiter.loop, waiter.event.set)

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


class Waiter:
    """A client waiting for a task to end, on its own loop: `event` is set when a
    worker of this process ends it (or the store tells of another's); `task` holds
    the ended task once its scheduler handed it over, and `promised` counts the
    handovers on their way (signals.ending). `driven_here`: a scheduler of this
    process drove the task as the waiter came, its end not yet begun, so it hands
    the end over or says it let go: the waiter need not read the task first."""

    __slots__ = ("_lock", "driven_here", "event", "loop", "promised", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, lock: threading.Lock) -> None:
        self.loop = loop
        self._lock = lock  # the signals' own: `ending` counts a promise under it
        self.event = asyncio.Event()
        self.task: Task | None = None
        self.promised = 0
        self.driven_here = False

    def _handed(self, task: Task | None) -> None:
        """(On its loop.) The end written (`task`), or not (None)."""
        with self._lock:
            self.promised -= 1
        if task is not None:
            self.task = task
        self.event.set()


class _Handover:
    __slots__ = ("_ended", "_waiters")

    def __init__(self, ended: EndedHere, waiters: list[Waiter]) -> None:
        self._ended = ended
        self._waiters = waiters

    def written(self, task: Task) -> None:
        if not self._waiters and not final(task.state):
            return  # nobody to tell, nothing to keep
        encoded = encode_task(task)
        self._ended.keep(task, encoded)
        for waiter in self._waiters:  # each its own copy: callers may change theirs
            tell(waiter.loop, waiter._handed, decode_task(encoded))

    def dropped(self) -> None:
        for waiter in self._waiters:
            tell(waiter.loop, waiter._handed, None)

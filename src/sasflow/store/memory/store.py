"""An in-memory state store: every verb of the Store protocol, in plain dicts.

For tests and the deterministic simulation (`sasflow.testing`, SPEC R6): no
file, no thread, no I/O, so a run on a virtual clock is the same run every
time. It passes the same contract suite as SQLite and PostgreSQL.

``memory://NAME`` opens a store on the data named NAME in this process: two
stores opened with one name share their tasks, as two hosts share a database
(the data lives while a store refers to it). ``memory://`` alone is private.

Every verb runs without awaiting anything in between, so each is atomic on its
event loop; a lock makes it so across threads too (the App's sync facade
submits from the caller's thread). A task is held as a snapshot (model.Task),
changed only by `transition.applied` under the fence: what the SQL stores write
column for column. Snapshots are copied in and out: a caller never holds a
reference into the store.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from sasflow.errors import ConfigurationError, StoreError, TaskConflictError
from sasflow.loop_calls import tell
from sasflow.messages import encode
from sasflow.model import (
    Task,
    TaskState,
    claimable,
    terminal,
)
from sasflow.store.interfaces import ClaimRule
from sasflow.store.listing import TaskQuery
from sasflow.store.memory.data import Stored, named
from sasflow.store.memory.deliveries import Deliveries
from sasflow.store.memory.tables import Tables
from sasflow.store.records import Alert, HistoryEntry, NewTask, submitted
from sasflow.store.rows import (
    check_legal,
    claim_transition,
    claimed_at_submission,
    history_entries,
    implied_rows,
    status_row,
)
from sasflow.transition import Transition, applied, written_at

__all__ = ["MemoryStore"]

_decode = msgspec.json.decode


class MemoryStore(Tables, Deliveries):
    """Tasks, steps, history, alerts, outbox, leases, instances and alert deliveries in
    this process."""

    def __init__(self, name: str = "", *, clock: Callable[[], float] | None = None) -> None:
        self.name = name
        self.now: Callable[[], float] = clock or time.time
        data = named(name)
        assert data is not None
        self._data = data

    @classmethod
    def from_url(cls, url: str, *, clock: Callable[[], float] | None = None,
                 create: bool = True) -> MemoryStore:
        parts = urlsplit(url)
        if parts.scheme != "memory" or parts.path not in ("", "/") or parts.query:
            raise ConfigurationError(f"bad memory store URL {url!r}: expected memory://NAME")
        if not create and (not parts.netloc or named(parts.netloc, create=False) is None):
            raise StoreError(f"no memory store named {parts.netloc!r} in this process")
        return cls(parts.netloc, clock=clock)

    # ------------------------------------------------------------ submission
    async def submit(self, task: NewTask, *, connection: Any = None) -> bool:
        if connection is not None:
            return self.submit_in(connection, task)
        return self.submit_now(task)

    def submit_now(self, task: NewTask) -> bool:
        """`submit` from outside a coroutine (the simulation's clients): this store does
        no I/O, so it needs no event loop."""
        with self._data.lock:
            created = self._insert(task, self.now())
        if created:
            self._tell_watchers(self.now())
        return created

    async def submit_claimed(self, task: NewTask, owner: str, rule: ClaimRule
                             ) -> Task | None:
        with self._data.lock:
            now = self.now()  # one moment, as one transaction has
            if not self._insert(task, now):
                return None
            claim, _ = claimed_at_submission(rule, task, owner, now)
            if not self._apply(claim, now):
                raise StoreError(f"task {task.task_id}: its claim did not apply to it as"
                                 " submitted", task_id=task.task_id)
            return self._copy(task.task_id)

    def submit_in(self, connection: Any, task: NewTask) -> bool:
        raise ConfigurationError("the memory store has no transaction to join: "
                                 "submit without a connection")

    def _insert(self, task: NewTask, now: float) -> bool:
        data = self._data
        existing = data.tasks.get(task.task_id)
        if existing is not None:
            if existing.task.workflow != task.workflow or (
                    _decode(existing.input_json) != _decode(task.input_json)):
                raise TaskConflictError(
                    f"task {task.task_id} exists with another workflow or input",
                    task_id=task.task_id)
            return False
        data.tasks[task.task_id] = Stored(bytes(task.input_json), submitted(task, now))
        data.history.append(HistoryEntry(task_id=task.task_id, at=now, actor="submit", epoch=0,
                                         from_state=None, to_state=TaskState.PENDING.value,
                                         why="submitted"))
        if task.reply_to:
            row = status_row(task.reply_to, task.task_id, "received", TaskState.PENDING,
                             None, now)
            self._add_outbox(row["queue"], row["body"])
        return True

    # ------------------------------------------------------------ scheduler
    async def claim(self, owner: str, limit: int, rules: Mapping[str, ClaimRule]
                    ) -> list[Task]:
        if not rules or limit <= 0:
            return []
        # only the versions declared here (R4)
        versions = {name: rule.version for name, rule in rules.items()}
        claimed: list[Task] = []
        with self._data.lock:
            now = self.now()
            runnable = sorted(
                (task for task in self._tasks()
                 if claimable(task.state, task.locked_by)
                 and task.available_at <= now and versions.get(task.workflow) == task.version),
                key=lambda task: task.available_at)[:limit]
            for task in runnable:  # (the planner changes no snapshot: no copy needed)
                planned = claim_transition(rules[task.workflow], task, owner, now)
                if planned is not None and self._apply(planned[0], now):
                    claimed.append(self._copy(task.task_id))
        return claimed

    async def apply(self, transition: Transition) -> bool:
        with self._data.lock:
            now = self.now()
            applied = self._apply(transition, now)
        if applied and claimable(transition.state, transition.locked_by):
            self._tell_watchers(transition.available_at)
        if applied and terminal(transition.state):
            with self._data.lock:
                listeners = list(self._data.finished)
            for finished in listeners:
                finished(transition.task_id)
        return applied

    def _apply(self, t: Transition, now: float) -> bool:
        """The fenced write of one transition (as the SQL stores' apply_transition) and
        its rows: only if the task still has the epoch, state, owner and step it was
        planned from."""
        check_legal(t)
        data = self._data
        stored = data.tasks.get(t.task_id)
        if stored is None:
            return False
        task = stored.task
        if (task.epoch, task.state, task.locked_by) != (t.epoch, t.from_state, t.owner):
            return False
        if (task.phase, task.cursor, task.version) != (t.from_phase, t.from_cursor,
                                                       t.from_version):
            return False  # planned at another unit, or for another shape
        if t.expired_before is not None and not (
                task.complete_by is not None and task.complete_by < t.expired_before):
            return False
        if t.lease is not None:
            lease = data.leases.get(t.lease.name)
            if lease is None or (lease.holder, lease.epoch) != (t.lease.holder, t.lease.epoch):
                return False
        # copied in, as a SQL store encodes the results it writes
        t = _decode(encode(t), type=Transition)
        stored.task = msgspec.structs.replace(applied(task, t), updated_at=written_at(t, now))
        for table, row in implied_rows(t, now):
            if table == "history":
                data.history.extend(history_entries(row))
            elif table == "outbox":
                self._add_outbox(row["queue"], row["body"])
            elif table == "alerts":
                data.alerts.append(Alert(id=next(data.ids), **row))
            # (unit rows and dropped ones: in the snapshot already)
        return True

    def _copy(self, task_id: str, *, steps: bool = True) -> Task:
        """A fresh copy of a held task: the caller may change it freely."""
        task = self._data.tasks[task_id].task
        if not steps:
            task = msgspec.structs.replace(task, steps=[])
        return _decode(encode(task), type=Task)

    # ------------------------------------------------------------ supervisor
    async def expired(self, limit: int, workflows: Collection[str] | None = None
                      ) -> list[Task]:
        names = None if workflows is None else set(workflows)
        with self._data.lock:
            now = self.now()
            found = sorted((task for task in self._tasks()
                            if task.locked_by is not None and task.complete_by is not None
                            and task.complete_by < now
                            and (names is None or task.workflow in names)),
                           key=lambda task: (task.complete_by, task.task_id))
            return [self._copy(task.task_id) for task in found[:limit]]

    async def orphaned(self, limit: int, workflows: Collection[str] | None = None
                       ) -> list[Task]:
        """As sql.SELECT_ORPHANED: locked tasks of instances stopped, silent past their
        lease, or restarted under the same id since the task was last written."""
        names = None if workflows is None else set(workflows)
        with self._data.lock:
            now = self.now()
            instances = self._data.instances

            def gone(task: Task) -> bool:
                holder = instances.get(task.locked_by or "")
                return holder is not None and (
                    holder.stopped_at is not None or holder.beat_at + holder.lease < now
                    or task.updated_at < holder.started_at - 1.0)

            found = sorted((task for task in self._tasks()
                            if task.locked_by is not None and task.complete_by is not None
                            and (names is None or task.workflow in names) and gone(task)),
                           key=lambda task: (task.complete_by or 0.0, task.task_id))
            return [self._copy(task.task_id) for task in found[:limit]]

    async def next_expiry(self, workflows: Collection[str] | None = None) -> float | None:
        names = None if workflows is None else set(workflows)
        with self._data.lock:
            return min((task.complete_by for task in self._tasks()
                        if task.locked_by is not None and task.complete_by is not None
                        and (names is None or task.workflow in names)),
                       default=None)

    # ------------------------------------------------------------ reading
    async def watch(self, wake: Callable[[float], None]) -> None:
        """Call `wake(at)` when a task is submitted or handed back, until cancelled."""
        entry = (wake, asyncio.get_running_loop())
        with self._data.lock:
            self._data.watchers.append(entry)
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            with self._data.lock:
                self._data.watchers.remove(entry)

    def on_finished(self, finished: Callable[[str], None]) -> Callable[[], None]:
        """Call `finished(task_id)` when any user of this store's data ends a task."""
        with self._data.lock:
            self._data.finished.append(finished)

        def unsubscribe() -> None:
            with self._data.lock, contextlib.suppress(ValueError):
                self._data.finished.remove(finished)

        return unsubscribe

    def _tell_watchers(self, at: float) -> None:
        with self._data.lock:
            watchers = list(self._data.watchers)
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # a submission from the caller's thread (the sync facade)
            here = None
        for wake, loop in watchers:
            if loop is here:
                wake(at)
            else:  # (a thread may run several loops in turn: the same thread is not
                # the same loop, and a watcher's loop may have closed)
                tell(loop, wake, at)

    async def get(self, task_id: str) -> Task | None:
        with self._data.lock:
            return self._copy(task_id) if task_id in self._data.tasks else None

    async def list_tasks(self, query: TaskQuery) -> list[Task]:
        with self._data.lock:
            found = sorted((task for task in self._tasks() if query.matches(task)),
                           key=lambda task: (task.created_at, task.task_id),
                           reverse=query.newest_first)
            return [self._copy(task.task_id, steps=False) for task in found[:query.limit]]

    async def task_counts(self) -> dict[TaskState, int]:
        with self._data.lock:
            return dict(collections.Counter(task.state for task in self._tasks()))

    async def ended_per_minute(self, since: float) -> dict[int, dict[TaskState, int]]:
        found: dict[int, dict[TaskState, int]] = {}
        with self._data.lock:
            for task in self._tasks():
                if terminal(task.state) and task.updated_at >= since:
                    minute = found.setdefault(int((task.updated_at - since) // 60), {})
                    minute[task.state] = minute.get(task.state, 0) + 1
        return found

    async def history(self, task_id: str) -> list[HistoryEntry]:
        with self._data.lock:
            return [msgspec.structs.replace(entry) for entry in self._data.history
                    if entry.task_id == task_id]

    async def alerts(self, *, limit: int = 100, after: int = 0) -> list[Alert]:
        with self._data.lock:
            return [msgspec.structs.replace(alert) for alert in self._data.alerts
                    if alert.id > after][:limit]

    async def alert(self, alert_id: int) -> Alert | None:
        with self._data.lock:
            found = [alert for alert in self._data.alerts if alert.id == alert_id]
            return msgspec.structs.replace(found[0]) if found else None

    async def acknowledge_alert(self, alert_id: int, *, by: str, why: str) -> Alert | None:
        with self._data.lock:
            for i, alert in enumerate(self._data.alerts):
                if alert.id == alert_id and alert.acknowledged_at is None:
                    self._data.alerts[i] = msgspec.structs.replace(
                        alert, acknowledged_at=self.now(), acknowledged_by=by,
                        acknowledged_why=why)
        return await self.alert(alert_id)

    def closes_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        return False

    async def close(self) -> None:
        """Nothing to release: the data lives while a store refers to it."""

"""The in-memory store's tables beside the tasks: leases, incidents, instances, dead
letters and the outbox, each verb under the data's lock as the SQL stores' are in
one transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

import msgspec

from sasflow.loop_calls import tell
from sasflow.model import UNFINISHED_TASK_STATES, Task
from sasflow.store.interfaces import OUTBOX_LEASE_S
from sasflow.store.memory.data import Data, Lease, Outbox
from sasflow.store.records import Alert, Census, Instance, OutboxMessage
from sasflow.transport.dead_letter import DeadLetter

__all__ = ["Tables"]


class Tables:
    """Leases, incidents, instances, dead letters and the outbox of one Data."""

    _data: Data
    now: Callable[[], float]

    def _tasks(self) -> list[Task]:
        """The snapshots held (not copies: only to read, under the lock)."""
        return [stored.task for stored in self._data.tasks.values()]

    # ------------------------------------------------------------ incidents (R4)
    async def census(self) -> Census:
        versions: dict[tuple[str, str | None], int] = {}
        agents: dict[tuple[str, str | None, str], int] = {}
        with self._data.lock:
            for task in self._tasks():
                if task.state not in UNFINISHED_TASK_STATES:
                    continue
                shape = (task.workflow, task.version)
                versions[shape] = versions.get(shape, 0) + 1
                if task.cursor < len(task.steps):
                    key = (task.workflow, task.version, task.steps[task.cursor].agent)
                    agents[key] = agents.get(key, 0) + 1
        return Census(versions=versions, agents=agents)

    async def incidents(self) -> list[Alert]:
        with self._data.lock:
            return [msgspec.structs.replace(a) for a in self._data.alerts
                    if a.incident is not None and a.resolved_at is None]

    async def report_incidents(self, raised: Collection[Alert], resolved: Collection[str]
                               ) -> None:
        with self._data.lock:
            now = self.now()
            ending = {*resolved, *(a.incident for a in raised)}
            for alert in self._data.alerts:
                if alert.incident in ending and alert.resolved_at is None:
                    alert.resolved_at = now
            for alert in raised:
                self._data.alerts.append(Alert(
                    id=next(self._data.ids), task_id=None, at=now, message=alert.message,
                    agent=alert.agent, incident=alert.incident, count=alert.count))

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        with self._data.lock:
            now = self.now()
            lease = self._data.leases.get(name)
            if lease is None:
                self._data.leases[name] = Lease(holder, 1, now + ttl)
                return 1
            if lease.holder == holder:
                lease.expires_at = now + ttl
                return lease.epoch
            if lease.expires_at < now:  # taken over: a new fencing epoch (M3)
                lease.holder, lease.epoch, lease.expires_at = holder, lease.epoch + 1, now + ttl
                return lease.epoch
            return None


    # ------------------------------------------------------------ instances (R2)
    async def beat(self, instance: Instance, *, first: bool = False) -> None:
        with self._data.lock:
            now = self.now()
            known = self._data.instances.get(instance.instance_id)
            started = now if known is None or first else known.started_at
            self._data.instances[instance.instance_id] = msgspec.structs.replace(
                instance, roles=list(instance.roles), agents=list(instance.agents),
                workflows=dict(instance.workflows), started_at=started, beat_at=now,
                stopped_at=None)

    async def stopped(self, instance_id: str) -> None:
        with self._data.lock:
            known = self._data.instances.get(instance_id)
            if known is not None:
                known.stopped_at = self.now()

    async def forget_instances(self, before: float) -> int:
        with self._data.lock:
            holding = {s.task.locked_by for s in self._data.tasks.values() if s.task.locked_by}
            gone = [i for i, row in self._data.instances.items()
                    if row.beat_at < before and i not in holding]
            for instance_id in gone:
                del self._data.instances[instance_id]
        return len(gone)

    async def instances(self, *, instance_id: str | None = None) -> list[Instance]:
        with self._data.lock:
            found = [msgspec.structs.replace(i) for i in self._data.instances.values()
                     if instance_id is None or i.instance_id == instance_id]
        return sorted(found, key=lambda i: (i.started_at, i.instance_id))

    # ------------------------------------------------------------ dead letters (R3)
    async def add_dead_letter(self, letter: DeadLetter) -> None:
        with self._data.lock:
            self._data.dead_letters.setdefault(letter.id, letter)

    async def dead_letters(self, *, limit: int = 100) -> list[DeadLetter]:
        with self._data.lock:  # oldest first, as the SQL stores order them
            return sorted(self._data.dead_letters.values(), key=lambda d: (d.at, d.id))[:limit]

    async def dead_letter(self, letter_id: str) -> DeadLetter | None:
        with self._data.lock:
            return self._data.dead_letters.get(letter_id)

    async def purge_dead_letters(self) -> int:
        with self._data.lock:
            count = len(self._data.dead_letters)
            self._data.dead_letters.clear()
            return count

    # ------------------------------------------------------------ outbox (E11)
    def _add_outbox(self, queue: str, body: bytes) -> None:
        """(Under the data's lock.) Its watchers are told soon, never in the middle of
        the write: `tell` only queues the call on their loop."""
        message_id = next(self._data.ids)
        self._data.outbox[message_id] = Outbox(message_id, queue, body)
        for written, loop in self._data.outbox_watchers:
            tell(loop, written)

    async def watch_outbox(self, written: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        entry = (written, loop)
        with self._data.lock:
            self._data.outbox_watchers.append(entry)
        written()  # for what came before it listened
        try:
            await loop.create_future()  # until cancelled
        finally:
            with self._data.lock:
                self._data.outbox_watchers.remove(entry)

    async def take_outbox(self, queues: Collection[str] | None, limit: int
                          ) -> list[OutboxMessage]:
        wanted = None if queues is None else set(queues)
        with self._data.lock:
            now = self.now()
            taken: list[OutboxMessage] = []
            for message in self._data.outbox.values():
                if len(taken) >= limit:
                    break
                if message.leased_until < now and (wanted is None or message.queue in wanted):
                    message.leased_until = now + OUTBOX_LEASE_S
                    taken.append(OutboxMessage(id=message.id, queue=message.queue,
                                               body=message.body))
            return taken

    async def ack_outbox(self, ids: Collection[int]) -> None:
        with self._data.lock:
            for message_id in ids:
                self._data.outbox.pop(message_id, None)


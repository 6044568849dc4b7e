"""What one in-memory database holds, and the databases named in this process.

Two stores opened with one name share their data, as two hosts share a database;
the data lives while a store refers to it (a weak registry)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from sasflow.model import Task
from sasflow.store.records import Alert, DeliveryRecord, HistoryEntry, Instance
from sasflow.transport.dead_letter import DeadLetter

__all__ = ["Data", "Lease", "Outbox", "Stored", "named"]


@dataclass(slots=True)
class Stored:
    """A task as this store holds it: its input as submitted (to compare with a
    submission reusing its id), and its snapshot."""

    input_json: bytes
    task: Task


@dataclass(slots=True)
class Lease:
    holder: str
    epoch: int
    expires_at: float


@dataclass(slots=True)
class Outbox:
    id: int
    queue: str
    body: bytes
    leased_until: float = 0.0


class Data:
    """What one named in-memory database holds (a plain class: weakly referenceable)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tasks: dict[str, Stored] = {}
        self.history: list[HistoryEntry] = []
        self.alerts: list[Alert] = []
        self.outbox: dict[int, Outbox] = {}
        self.leases: dict[str, Lease] = {}
        self.instances: dict[str, Instance] = {}
        self.dead_letters: dict[str, DeadLetter] = {}  # by id: one written twice is kept once
        # alert deliveries by (alert id, webhook), and when each alert was done with
        self.deliveries: dict[tuple[int, str], DeliveryRecord] = {}
        self.delivery_done: dict[int, float] = {}
        self.ids = itertools.count(1)
        # watchers: (callback, its loop), told when work becomes claimable
        self.watchers: list[tuple[Callable[[float], None], asyncio.AbstractEventLoop]] = []
        self.finished: list[Callable[[str], None]] = []  # told when a task ends
        # told when a status message is written: (callback, its loop)
        self.outbox_watchers: list[tuple[Callable[[], None], asyncio.AbstractEventLoop]] = []



_named: weakref.WeakValueDictionary[str, Data] = weakref.WeakValueDictionary()
_named_lock = threading.Lock()


def named(name: str, *, create: bool = True) -> Data | None:
    """The data named `name` in this process (made if `create`), or a private one for
    the empty name."""
    if not name:
        return Data()
    with _named_lock:
        data = _named.get(name)
        if data is None and create:
            data = _named[name] = Data()
        return data

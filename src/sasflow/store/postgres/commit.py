"""Group commit for PostgreSQL: the writes waiting when a transaction starts share it.

Each scheduler driver applies one transition per step, and each would pay a
transaction of its own (round trips, a WAL flush, the driver's Python work
per statement). Instead, writes queue here; a flusher takes everything waiting
(up to `max_batch`) into one transaction, and while it is in flight the next
writes gather for the next one. At most `in_flight` transactions run at once, so
under load batches grow instead of connections; a lone write still goes at once.

A batch holds one write per task, sorted by task id: the order rows are locked
in is then the same for every batch of every process (no deadlocks), and a write
whose commit was lost can be told apart by its task alone (bulk.py). A
second write for a task already in the batch waits for the next one.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

from sasflow.store.postgres.flushers import Flushers

__all__ = ["GroupCommit"]


class _Keyed(Protocol):
    @property
    def task_id(self) -> str: ...


# Two batches hold a default scheduler's 1,024 tasks in flight: one is written while the
# next gathers. Caps of 128 and 256 made four to eight statements of the same writes,
# which cost the server more (CPU a step +12%, steps/s -15%); one batch of 1,024 left
# nothing to overlap (steps/s -25%) (docs/benchmarks.md, the group commit's batch).
MAX_BATCH = 512

W = TypeVar("W", bound=_Keyed)
R = TypeVar("R")


class GroupCommit(Generic[W, R]):
    """Batches writes for one event loop; `write` applies a batch in one transaction.

    `write` returns one result per write, in order; a result that is an
    exception is raised to that write's caller alone. If `write` itself raises,
    every caller of the batch gets the error.
    """

    def __init__(self, write: Callable[[Sequence[W]], Awaitable[list[R | Exception]]], *,
                 in_flight: int = 8, max_batch: int = MAX_BATCH) -> None:
        self._write = write
        self._max_batch = max_batch
        self._waiting: collections.deque[tuple[W, asyncio.Future[R]]] = collections.deque()
        self._flushers = Flushers(self._write_all, in_flight)

    async def __call__(self, write: W) -> R:
        return await self.enqueue(write)

    def enqueue(self, write: W) -> asyncio.Future[R]:
        """Queue `write` (from this loop); its result comes in the future. Cancelled
        before its batch is taken, it is never written."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((write, future))
        self._flushers.queued()
        return future

    async def _write_all(self) -> None:
        while self._waiting:
            batch = self._take()
            if not batch:
                continue
            try:
                results = await self._write([write for write, _ in batch])
            except Exception as error:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _take(self) -> list[tuple[W, asyncio.Future[R]]]:
        """Up to max_batch waiting writes, one per task, in task-id order."""
        batch: dict[str, tuple[W, asyncio.Future[R]]] = {}
        later: list[tuple[W, asyncio.Future[R]]] = []
        while self._waiting and len(batch) < self._max_batch:
            write, future = self._waiting.popleft()
            if future.done():  # its caller was cancelled: it never learns, so never write
                continue
            if write.task_id in batch:
                later.append((write, future))
            else:
                batch[write.task_id] = (write, future)
        self._waiting.extendleft(reversed(later))
        return [batch[key] for key in sorted(batch)]

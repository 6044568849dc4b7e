"""At most so many tasks of one event loop emptying a queue: how the group commit
(commit.py) and the read batches (reads.py) gather what waits together."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["Flushers"]


class Flushers:
    """Starts a task running `flush` when work is queued and fewer than `in_flight`
    run; each empties the queue, so while some are in flight the next work gathers."""

    def __init__(self, flush: Callable[[], Awaitable[None]], in_flight: int) -> None:
        self._flush = flush
        self._in_flight = in_flight
        self._tasks: set[asyncio.Task[None]] = set()  # (held: a task is weakly held)
        self._running = 0  # flushers that have not yet left their loop

    def queued(self) -> None:
        """Work was queued: see that a flusher is coming."""
        if self._running < self._in_flight:
            self._running += 1
            # started as a task, it runs after the callbacks already due in this loop
            # iteration: the work that arrived together goes together
            task = asyncio.create_task(self._run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        try:
            await self._flush()
        finally:
            # counted down as it leaves, not when its done-callback runs later: work
            # queued in between would otherwise find no flusher coming
            self._running -= 1

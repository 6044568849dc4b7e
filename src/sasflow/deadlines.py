"""A scheduler's waits for replies, given up at their complete-by by one timer for all.

A scheduler waits for each step's reply until the step's complete-by, then lets
the unit be (E7). One loop timer per step cost more than the wait's own work: on
uvloop a timer is three objects for the garbage collector (the handle, its libuv
timer and a copy of the context) and a libuv timer started and stopped, ~3 µs a
step on the benchmark machine, for a timer that almost never fires. Here a wait
is put in the bucket of its deadline, rounded up to `RESOLUTION`: a set add
and, once the reply came, a set discard. One timer, for the earliest bucket,
ends the waits still in it with None.

A wait therefore ends up to `RESOLUTION` after its complete-by, never before
it: the agent has fallen silent by then (S5), and the supervisor decides what
becomes of the unit on the store's clock, not on this one.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from typing import Any

__all__ = ["RESOLUTION", "Deadlines"]

# A bucket's width, in seconds of the loop's clock.
RESOLUTION = 0.01


class Deadlines:
    """Futures of one event loop, each ended with None once its delay has passed
    (unless it is done or discarded first)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buckets: dict[int, set[asyncio.Future[Any]]] = {}
        self._keys: list[int] = []  # of the buckets, a heap; keys of buckets gone stay
        self._timer: asyncio.TimerHandle | None = None
        self._timer_key: int | None = None

    def add(self, delay: float, future: asyncio.Future[Any]) -> int:
        """End `future` with None `delay` seconds from now; the key to discard it with."""
        key = math.ceil((self._loop.time() + max(0.0, delay)) / RESOLUTION)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = set()
            heapq.heappush(self._keys, key)
            if self._timer_key is None or key < self._timer_key:
                self._set_timer(key)
        bucket.add(future)
        return key

    def discard(self, key: int, future: asyncio.Future[Any]) -> None:
        """`future` no longer waits for its deadline (its reply came, or its driver stops)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return
        bucket.discard(future)
        if not bucket:
            del self._buckets[key]
            if not self._buckets and self._timer is not None:  # nothing left to end
                self._timer.cancel()
                self._timer = self._timer_key = None
                self._keys.clear()

    def _set_timer(self, key: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_key = key
        self._timer = self._loop.call_at(key * RESOLUTION, self._due)

    def _due(self) -> None:
        self._timer = self._timer_key = None
        now = self._loop.time()
        while self._keys and self._keys[0] * RESOLUTION <= now:
            for future in self._buckets.pop(heapq.heappop(self._keys), ()):
                if not future.done():
                    future.set_result(None)
        while self._keys and self._keys[0] not in self._buckets:  # emptied before their time
            heapq.heappop(self._keys)
        if self._keys:
            self._set_timer(self._keys[0])

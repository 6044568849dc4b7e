"""An asyncio event loop on a virtual clock: waiting costs no time at all.

`loop.time()` is virtual. When every task waits for a timer, the loop moves its
clock straight to the earliest one instead of sleeping, so a step's 300 s
timeout, a supervisor's interval or a retry's backoff pass in microseconds, and
the order of events depends only on the program, never on the machine's load.

Real work handed to threads (`run_in_executor`, `asyncio.to_thread`: a sync
agent, say) is waited for in real time, and virtual time stands still
meanwhile: a thread's result can never arrive "late" because the clock raced
ahead while it ran.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["VirtualClock", "VirtualClockLoop"]

T = TypeVar("T")


class _VirtualSelector(selectors.DefaultSelector):
    """Polls the loop's real file descriptors without waiting, then moves the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        loop = self.loop
        assert loop is not None
        loop.count_step()
        if loop.threads_busy:  # real work under way: wait for it in real time
            events: list[tuple[Any, int]] = super().select(timeout)
            return events
        events = super().select(0)
        if events or not timeout:
            return events
        if timeout is None:  # nothing scheduled: only another thread can wake us
            events = super().select(None)
            return events
        loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is virtual, starting at `start`."""

    def __init__(self, start: float = 0.0, *, step_limit: int | None = None) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = start
        self.threads_busy = 0  # calls running in executors
        # a guard against hot loops: so many rounds without time moving is an error
        self.step_limit = step_limit
        self._steps_still = 0

    def count_step(self) -> None:
        self._steps_still += 1
        if self.step_limit is not None and self._steps_still > self.step_limit:
            self._steps_still = 0
            raise RuntimeError(f"{self.step_limit} rounds of the event loop without time"
                               f" moving at virtual time {self._virtual_now:.3f}")

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock on (the loop does this itself when all tasks wait)."""
        if seconds > 0:
            self._virtual_now += seconds
            self._steps_still = 0

    def run_in_executor(self, executor: Any, func: Callable[..., T],  # type: ignore[override]
                        *args: Any) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_busy += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, future: asyncio.Future[Any]) -> None:
        self.threads_busy -= 1


class VirtualClock:
    """A wall clock for stores on a virtual loop: `start` plus the loop's time, plus jumps.

    A jump moves this clock (a host's NTP step, say) without touching the loop's
    timers: what was due in 5 s is still due in 5 s of loop time.
    """

    def __init__(self, loop: VirtualClockLoop, start: float) -> None:
        self.loop = loop
        self.start = start
        self.offset = 0.0

    def __call__(self) -> float:
        return self.start + self.loop.time() + self.offset

    def jump(self, seconds: float) -> None:
        self.offset += seconds

"""Worker instances on a virtual clock: every clock a worker reads is the store's.

A Worker built by `App.worker` reads two clocks besides the store's: its agent
runtime judges complete-by times on `clock` (the host's, by default) and each
circuit breaker times its reset on the host's monotonic clock. On a virtual
loop both would read real time while the store's runs virtually, so a run would
depend on how fast the machine is. Here both are pointed at virtual time.
"""

from __future__ import annotations

from collections.abc import Callable

from sasflow.testing.clock import VirtualClock
from sasflow.worker import Worker

__all__ = ["on_virtual_time"]


def on_virtual_time(worker: Worker, clock: VirtualClock | Callable[[], float]) -> Worker:
    """Point the worker's agent deadlines at `clock` (R1) and its breakers at the loop."""
    runtime = worker.agents
    if runtime is not None:
        runtime.clock = clock
        monotonic = clock.loop.time if isinstance(clock, VirtualClock) else clock
        for breaker in runtime.breakers.values():
            breaker._clock = monotonic
    return worker

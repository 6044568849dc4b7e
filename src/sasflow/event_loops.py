"""The event loop sasflow's own loops run on: uvloop's where it is installed (the
default on Linux and macOS), else the standard library's.

sasflow makes two kinds of loop of its own: the background loop an application's
blocking methods and `app.start()` roles run on (background_loop.py), and the
loop of `app.run()`, which `sasflow worker` runs. Their work is many small
callbacks: a step crosses the loop several times (its request, its reply, its
commit's answer, the wake-ups between threads). uvloop (libuv, written in Cython)
runs those hops with less interpreter work than asyncio's pure-Python loop. On
SQLite, one blocking submission after another went from 3,818 to 4,724 steps/s
(medians) and 271 to 221 µs of CPU a step (docs/benchmarks.md, "sasflow's loops
on uvloop").

Loops an application makes itself (`asyncio.run`, a web framework's) are its
own choice: sasflow's async API runs on either.

``SASFLOW_EVENT_LOOP`` chooses: ``auto`` (the default: uvloop if importable),
``uvloop`` (refuse to start without it), or ``asyncio`` (the standard library's,
for its debug mode, or to rule the loop out when chasing a problem).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sasflow.errors import ConfigurationError

__all__ = ["VARIABLE", "loop_factory", "new_event_loop", "run"]

T = TypeVar("T")

VARIABLE = "SASFLOW_EVENT_LOOP"
_CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes sasflow's loops, as ``SASFLOW_EVENT_LOOP`` chooses (read at each
    call); ConfigurationError for a choice it does not know, or uvloop asked for and
    not installed."""
    choice = os.environ.get(VARIABLE, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ConfigurationError(
            f"{VARIABLE}={choice!r}: expected one of {', '.join(_CHOICES)}")
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigurationError(
                f"{VARIABLE}=uvloop, but uvloop is not installed (pip install uvloop)"
            ) from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the chosen kind (not set as the thread's current loop)."""
    return loop_factory()()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a loop of the chosen kind."""
    try:
        factory = loop_factory()
    except ConfigurationError:
        main.close()  # never started: no "never awaited" warning on top of the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)

"""The clients waiting for a task as a scheduler of their process writes its end.

The scheduler asks who waits (`Scheduler.ending`, signals.py answers) before it
writes the transition that ends a task, and hands them the task once the write
applied: the task as the store now holds it (`transition.applied`), so a waiter
need not read it back. If the write does not apply, or fails, it says so, and
the waiters read the store.
"""

from __future__ import annotations

from typing import Protocol

from sasflow.model import Task

__all__ = ["NO_HANDOVER", "Handover", "no_waiters"]


class Handover(Protocol):
    """The clients waiting for a task as its ending transition is written: handed
    the task once it is (`written`), or told that it is not (`dropped`)."""

    def written(self, task: Task) -> None: ...

    def dropped(self) -> None: ...


class _NoHandover:
    """Nobody to hand the task to."""

    def written(self, task: Task) -> None:
        pass

    def dropped(self) -> None:
        pass


NO_HANDOVER: Handover = _NoHandover()  # no client of the process waits for the task


def no_waiters(task_id: str) -> Handover:
    """`Scheduler.ending` where no client of the process waits."""
    return NO_HANDOVER

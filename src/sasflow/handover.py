"""The clients waiting for a task that a scheduler of their process drives.

A scheduler says when it starts driving a task (`Waiters.driving`) and when it
lets go of it (`Waiters.let_go`). Before it writes the transition that ends the
task, it asks who waits (`Waiters.ending`; signals.py answers), and hands them the
task once the write applied: the task as the store now holds it
(`transition.applied`), so a waiter need not read it back. If the write does not
apply, or fails, it says so, and the waiters read the store.

So a client that comes to wait while a scheduler of its process drives the task,
and before its end is written, is sure to hear of the end from that scheduler, or
that it let go: it need not read the task first.
"""

from __future__ import annotations

from typing import Protocol

from sasflow.model import Task

__all__ = ["NO_HANDOVER", "NO_WAITERS", "Handover", "Waiters"]


class Handover(Protocol):
    """The clients waiting for a task as its ending transition is written: handed
    the task once it is (`written`), or told that it is not (`dropped`)."""

    def written(self, task: Task) -> None: ...

    def dropped(self) -> None: ...


class Waiters(Protocol):
    """The clients of the scheduler's process that wait for the tasks it drives."""

    def driving(self, task_id: str) -> None:
        """The scheduler drives `task_id` from now on."""

    def ending(self, task_id: str) -> Handover:
        """The scheduler is about to write the end of `task_id`: who to hand it to."""

    def let_go(self, task_id: str) -> None:
        """The scheduler no longer drives `task_id` (its end written, or not)."""


class _NoHandover:
    """Nobody to hand the task to."""

    def written(self, task: Task) -> None:
        pass

    def dropped(self) -> None:
        pass


NO_HANDOVER: Handover = _NoHandover()  # no client of the process waits for the task


class _NoWaiters:
    """No client in the scheduler's process."""

    def driving(self, task_id: str) -> None:
        pass

    def ending(self, task_id: str) -> Handover:
        return NO_HANDOVER

    def let_go(self, task_id: str) -> None:
        pass


NO_WAITERS: Waiters = _NoWaiters()

"""Named failpoints in the actors: where a test can crash, pause or break a worker.

The scheduler, agent and supervisor each mark the points where a fault matters
with one line::

    if failpoints.ARMED: await failpoints.hit("scheduler.before_publish")

Unarmed (in production) that is one global read and a false test: tens of
nanoseconds, against hundreds of microseconds of work per step (measured in
docs/reliability.md). A test arms a point with what should happen there::

    with failpoints.armed("agent.after_call", failpoints.Crash()):
        ...

- `Raise(error)`: the actor gets the exception, as if the call there failed.
- `Crash()`: the instance stops dead at that point, as a SIGKILL would stop it:
  no `finally` runs, nothing is handed back, its calls never return.
- `Pause(seconds)`: the instance stands still for that long, then goes on with
  whatever it held (a SIGSTOP, then SIGCONT).

Which instance is hit is the one whose task reaches the point: an action may
name instances (`only=`), and fire a number of times (`times=`). Crash and
Pause act through the instance's I/O gate (sasflow.testing.world) when it runs
under one; outside a gate, Crash waits forever and Pause sleeps.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Collection, Iterator

from sasflow.testing.gate import Gate, current_gate

__all__ = ["ARMED", "POINTS", "Action", "Crash", "Pause", "Raise", "arm", "armed",
           "current_gate", "disarm", "hit", "reset"]

# The points the actors mark, by the role that reaches them.
POINTS = (
    "scheduler.after_claim",        # a task claimed, its driver not started yet
    "scheduler.before_publish",     # a request built, not yet sent to the agent
    "scheduler.before_apply_reply",  # a reply received, its transition not yet written
    "agent.before_call",            # a request taken, the remote service not called yet
    "agent.after_call",             # the remote call returned, no reply sent yet
    "agent.before_reply",           # the reply encoded, not yet published
    "supervisor.before_recover",    # expired tasks found, their recovery not yet written
)

ARMED = False  # read by the actors on every pass: True only while some point is armed


class Action(abc.ABC):
    """What happens at an armed point (subclasses below)."""

    def __init__(self, *, times: int | None = 1, only: Collection[str] | None = None) -> None:
        self.times = times  # None: every time
        self.only = None if only is None else tuple(only)
        self.fired = 0

    def wants(self, instance_id: str | None) -> bool:
        if self.times is not None and self.fired >= self.times:
            return False
        return self.only is None or instance_id in self.only

    @abc.abstractmethod
    async def fire(self, point: str, gate: Gate | None) -> None:
        """Do what this action does at `point`, for the instance behind `gate`."""


class Raise(Action):
    """Raise `error` (an exception instance or class) at the point."""

    def __init__(self, error: BaseException | type[BaseException], *, times: int | None = 1,
                 only: Collection[str] | None = None) -> None:
        super().__init__(times=times, only=only)
        self.error = error

    async def fire(self, point: str, gate: Gate | None) -> None:
        raise self.error


class Crash(Action):
    """Stop the instance dead at the point, as SIGKILL would."""

    async def fire(self, point: str, gate: Gate | None) -> None:
        if gate is not None:
            gate.crash()
            await gate.check()  # never returns
        await asyncio.get_running_loop().create_future()


class Pause(Action):
    """Freeze the instance for `seconds`, then let it go on with what it held."""

    def __init__(self, seconds: float, *, times: int | None = 1,
                 only: Collection[str] | None = None) -> None:
        super().__init__(times=times, only=only)
        self.seconds = seconds

    async def fire(self, point: str, gate: Gate | None) -> None:
        if gate is not None:
            await gate.pause_for(self.seconds)
        else:
            await asyncio.sleep(self.seconds)


_armed: dict[str, list[Action]] = {}
hits: dict[str, int] = {}  # how often each armed point was reached (for tests' assertions)


def arm(point: str, action: Action) -> Action:
    """Arm `point` with `action` (several actions on one point fire in order)."""
    global ARMED
    if point not in POINTS:
        raise ValueError(f"unknown failpoint {point!r}; known: {', '.join(POINTS)}")
    _armed.setdefault(point, []).append(action)
    ARMED = True
    return action


def disarm(point: str, action: Action | None = None) -> None:
    """Disarm one action of `point`, or all of them."""
    global ARMED
    actions = _armed.get(point, [])
    if action is None:
        actions.clear()
    else:
        with contextlib.suppress(ValueError):
            actions.remove(action)
    if not actions:
        _armed.pop(point, None)
    ARMED = bool(_armed)


def reset() -> None:
    """Disarm every point and forget the counts."""
    global ARMED
    _armed.clear()
    hits.clear()
    ARMED = False


@contextlib.contextmanager
def armed(point: str, action: Action) -> Iterator[Action]:
    """Arm `point` for the duration of a `with` block."""
    arm(point, action)
    try:
        yield action
    finally:
        disarm(point, action)


async def hit(point: str) -> None:
    """Reached by an actor at `point` while something is armed: fire what applies."""
    hits[point] = hits.get(point, 0) + 1
    gate = current_gate.get()
    instance_id = None if gate is None else gate.instance_id
    for action in _armed.get(point, ()):
        if action.wants(instance_id):
            action.fired += 1
            await action.fire(point, gate)
            return

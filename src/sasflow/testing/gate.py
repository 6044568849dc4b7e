"""An instance's I/O gate: how a simulated process is crashed or paused at any await.

Each simulated worker instance runs its tasks in a context that names its Gate
(failpoints.current_gate). Every call it makes to the outside world (the store,
the transport, the remote service) passes the gate on the way out and on the
way back. That is where it stops:

- crashed: every call hangs for good, in flight or new, and the instance's
  tasks are simply abandoned: no `finally` runs and nothing is handed back, as
  with SIGKILL (cancelling them would run cleanup a killed process never runs);
- paused: calls wait until it resumes, then go on with whatever stale state the
  instance held (a SIGSTOP past a deadline or a lease, then SIGCONT).

A hook sees every passage (its count) and decides there whether to crash or
pause: that is how a seeded schedule reaches any await point that touches the
world.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sasflow.errors import StoreError

__all__ = ["Gate", "GatedStore", "Halted", "current_gate", "run_in_instance"]

T = TypeVar("T")


class Halted(BaseException):
    """Raised into an abandoned instance's calls when the whole simulation ends.

    A BaseException, so no actor's `except Exception` catches it and goes on.
    """


class Gate:
    """The door between one instance and the world."""

    def __init__(self, instance_id: str, *,
                 hook: Callable[[Gate, str], None] | None = None) -> None:
        self.instance_id = instance_id
        self.hook = hook
        self.passages = 0
        self.crashed = False
        self.paused = False
        self.ended = False  # the simulation is over: raise Halted instead of waiting
        self._resumed: asyncio.Event | None = None
        self._forever: asyncio.Future[None] | None = None
        self.on_crash: list[Callable[[], None]] = []
        self.on_pause: list[Callable[[], None]] = []

    async def passage(self, what: str) -> None:
        """One crossing of the gate: counted, offered to the hook, then held if stopped."""
        self.passages += 1
        if self.hook is not None:
            self.hook(self, what)
        if self.crashed or self.paused:
            await self.check()

    async def check(self) -> None:
        """Return only while the instance runs: hang if crashed, wait if paused."""
        while True:
            if self.ended:
                raise Halted(self.instance_id)
            if self.crashed:
                if self._forever is None:
                    self._forever = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._forever)
            elif self.paused:
                assert self._resumed is not None
                await self._resumed.wait()
            else:
                return

    def crash(self) -> None:
        if self.crashed:
            return
        self.crashed = True
        for callback in self.on_crash:
            callback()

    def pause(self) -> None:
        if self.paused or self.crashed:
            return
        self.paused = True
        self._resumed = asyncio.Event()
        for callback in self.on_pause:
            callback()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            assert self._resumed is not None
            self._resumed.set()

    async def pause_for(self, seconds: float) -> None:
        self.pause()
        asyncio.get_running_loop().call_later(seconds, self.resume)
        await self.check()

    def end(self) -> None:
        """The simulation is over: wake every waiter with Halted so its task can finish."""
        self.ended = True
        if self._forever is not None and not self._forever.done():
            self._forever.set_exception(Halted(self.instance_id))
            self._forever.exception()  # retrieved: no "never retrieved" warning
        if self._resumed is not None:
            self._resumed.set()


# The gate of the instance whose task is running: set when an instance starts,
# inherited by every task it creates (failpoints and the simulated world read it).
current_gate: contextvars.ContextVar[Gate | None] = contextvars.ContextVar(
    "sasflow_current_gate", default=None)


def run_in_instance(gate: Gate, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Start `coro` as a task of the instance behind `gate` (it and its children)."""
    context = contextvars.copy_context()
    context.run(current_gate.set, gate)
    return asyncio.get_running_loop().create_task(coro, context=context)


# Store verbs that are no call to the store's server: never gated.
_LOCAL = frozenset({"now", "submit_now", "submit_in", "close", "name", "from_url"})


class GatedStore:
    """A store whose every async verb passes the calling instance's gate, both ways.

    Shared by all instances of a simulation: the gate is the caller's, found in
    its context. A `fault(verb)` hook may fail a call before it is applied
    ("before") or after (the answer is lost: "after"), as a dropped connection
    does. Verbs added to the Store protocol later are gated without a change
    here.
    """

    def __init__(self, store: Any, *,
                 fault: Callable[[str], str | None] | None = None) -> None:
        self._store = store
        self._fault = fault
        self.now: Callable[[], float] = store.now

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if name in _LOCAL or not asyncio.iscoroutinefunction(target):
            return target

        async def gated(*args: Any, **kwargs: Any) -> Any:
            gate = current_gate.get()
            if gate is None:
                return await target(*args, **kwargs)
            await gate.passage(f"store.{name}")
            fault = self._fault(name) if self._fault is not None else None
            if fault == "before":
                raise StoreError(f"simulated: {name} failed before it was applied")
            result = await target(*args, **kwargs)
            await gate.passage(f"store.{name}.answer")
            if fault == "after":
                raise StoreError(f"simulated: the answer to {name} was lost")
            return result

        gated.__name__ = name
        setattr(self, name, gated)  # built once per verb
        return gated

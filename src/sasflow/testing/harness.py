"""SimulatedApp: crash-test your own workflows on a virtual clock (SPEC R6).

Wraps an App declared as in production: its workers run in this process on an
event loop whose clock is virtual (a 300 s step timeout passes in an instant),
over an in-memory store and an in-memory broker. Each worker instance runs
behind its own gate, so a test can kill one as SIGKILL would (`crash`), freeze
it past its deadlines and let it go on (`pause` / `resume`), or stop it cleanly;
failpoints (sasflow.testing.failpoints) pick the exact point::

    from sasflow.testing import SimulatedApp, failpoints

    def test_a_crash_after_charging_charges_once(app):
        with SimulatedApp(app) as sim:
            sim.start_worker("w1")
            failpoints.arm("agent.after_call", failpoints.Crash(only=["w1"]))
            task_id = sim.submit("process-order", {"order_id": 42})
            sim.run_for(1)
            sim.start_worker("w2")                   # the replacement
            assert sim.wait(task_id).state == "processed"

The pytest fixture `sasflow_sim` (registered by installing sasflow) builds one
and closes it after the test. Agents should be async functions: a sync agent
runs in a thread in real time, and virtual time stands still meanwhile.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sasflow.app import App
from sasflow.errors import ConfigurationError, UnknownTaskError, WaitTimeout
from sasflow.model import Task
from sasflow.store.memory import MemoryStore
from sasflow.store.records import Alert, HistoryEntry
from sasflow.testing import failpoints
from sasflow.testing.clock import VirtualClock, VirtualClockLoop
from sasflow.testing.gate import Gate, GatedStore, run_in_instance
from sasflow.testing.transport import SimTransport
from sasflow.testing.workers import on_virtual_time
from sasflow.worker import ROLES, Worker

__all__ = ["SimulatedApp"]

T = TypeVar("T")

START = 1_700_000_000.0  # the store's clock at virtual time 0 (2023-11-14T22:13:20Z)
_STEPS_WITHOUT_TIME = 1_000_000  # so many loop rounds with the clock standing still: a hot loop


@dataclass
class _Instance:
    gate: Gate
    worker: Worker
    task: asyncio.Task[None]


class SimulatedApp:
    """An App's workers, store and broker in this process, on a virtual clock."""

    def __init__(self, app: App, *, seed: int | None = 0, start: float = START) -> None:
        if app._backends.opened:
            raise ConfigurationError("SimulatedApp needs an app whose store and transport"
                                     " are not opened yet")
        self.app = app
        self.loop = VirtualClockLoop(step_limit=_STEPS_WITHOUT_TIME)
        self.clock = VirtualClock(self.loop, start)
        self.store = MemoryStore(clock=self.clock)
        self.transport = SimTransport(max_message_bytes=app.max_payload_bytes)
        # the app's own store and transport become the simulated ones (reads and
        # submissions from the test go straight to them; workers pass their gates)
        self._store_faults: list[tuple[str, str]] = []  # (verb, "before" | "after"), in order
        app._backends.use(store=GatedStore(self.store, fault=self._store_fault),
                          transport=self.transport)
        if seed is not None:
            random.seed(seed)  # the agents' retry jitter: the same run every time
        self.instances: dict[str, _Instance] = {}
        self._closed = False

    # ------------------------------------------------------------ time
    @property
    def elapsed(self) -> float:
        """Virtual seconds since the start."""
        return self.loop.time()

    def now(self) -> float:
        """The store's clock (seconds since the epoch)."""
        return self.clock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the simulation's loop (the workers run meanwhile)."""
        return self.loop.run_until_complete(coro)

    def run_for(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass, the workers running."""
        self.run(asyncio.sleep(seconds))

    def jump_clock(self, seconds: float) -> None:
        """Move the store's clock by `seconds` (forward or back), timers unmoved."""
        self.clock.jump(seconds)

    # ------------------------------------------------------------ workers
    def start_worker(self, instance_id: str = "w1", *, roles: Sequence[str] = ROLES,
                     agents: Sequence[str] | None = None, concurrency: int = 64,
                     supervisor_interval: float = 1.0) -> str:
        """Start a worker instance (all roles by default); it runs while the loop runs."""
        if instance_id in self.instances and not self.instances[instance_id].task.done():
            raise ConfigurationError(f"instance {instance_id!r} is running already")
        worker = self.app._worker(roles=roles, agents=agents, concurrency=concurrency,
                                 supervisor_interval=supervisor_interval,
                                 instance_id=instance_id)
        on_virtual_time(worker, self.clock)
        gate = Gate(instance_id)

        async def launch() -> asyncio.Task[None]:
            return run_in_instance(gate, worker.run())

        self.instances[instance_id] = _Instance(gate, worker, self.run(launch()))
        return instance_id

    def _instance(self, instance_id: str) -> _Instance:
        found = self.instances.get(instance_id)
        if found is None:
            raise ConfigurationError(f"no instance {instance_id!r}"
                                     f" (started: {', '.join(self.instances) or 'none'})")
        return found

    def crash(self, instance_id: str) -> None:
        """Kill the instance as SIGKILL would: nothing handed back, its calls never return."""
        self._instance(instance_id).gate.crash()

    def pause(self, instance_id: str) -> None:
        """Freeze the instance (SIGSTOP): its calls wait until `resume`."""
        self._instance(instance_id).gate.pause()

    def resume(self, instance_id: str) -> None:
        """Let a paused instance go on, with whatever it held (SIGCONT)."""
        self._instance(instance_id).gate.resume()

    def stop_worker(self, instance_id: str) -> None:
        """Stop the instance cleanly, as SIGTERM does: it hands back what it holds."""
        instance = self._instance(instance_id)
        instance.task.cancel()

        async def stopped() -> None:
            await asyncio.gather(instance.task, return_exceptions=True)

        self.run(stopped())

    def fail_store_calls(self, verb: str, *, times: int = 1, lost_answer: bool = False) -> None:
        """Make the next `times` calls of the store verb `verb` by a worker raise StoreError:
        before the call is applied, or (`lost_answer`) after it is applied."""
        self._store_faults += [(verb, "after" if lost_answer else "before")] * times

    def _store_fault(self, verb: str) -> str | None:
        for i, (failing, when) in enumerate(self._store_faults):
            if failing == verb:
                del self._store_faults[i]
                return when
        return None

    # ------------------------------------------------------------ tasks
    def submit(self, workflow: str, input: Any = None, *, task_id: str | None = None) -> str:
        """Submit a task (validated as App.submit validates it); its id."""
        return self.run(self.app.asubmit(workflow, input, task_id=task_id))

    def get(self, task_id: str) -> Task:
        task = self.run(self.store.get(task_id))
        if task is None:
            raise UnknownTaskError(f"unknown task {task_id!r}", task_id=task_id)
        return task

    def wait(self, task_id: str, timeout: float = 3600.0) -> Task:
        """Run until the task is terminal; WaitTimeout after `timeout` virtual seconds."""

        async def until_terminal() -> Task:
            deadline = self.loop.time() + timeout
            while True:
                task = await self.store.get(task_id)
                if task is None:
                    raise UnknownTaskError(f"unknown task {task_id!r}", task_id=task_id)
                if task.terminal:
                    return task
                if self.loop.time() >= deadline:
                    raise WaitTimeout(f"task {task_id} did not finish within {timeout:g}"
                                      f" virtual seconds ({task.state.value})", task_id=task_id)
                await asyncio.sleep(0.05)

        return self.run(until_terminal())

    def history(self, task_id: str) -> list[HistoryEntry]:
        return self.run(self.store.history(task_id))

    def alerts(self) -> list[Alert]:
        return self.run(self.store.alerts(limit=10_000))

    # ------------------------------------------------------------ the end
    def close(self) -> None:
        """End every instance, disarm every failpoint and close the loop."""
        if self._closed:
            return
        self._closed = True
        failpoints.reset()

        async def end() -> None:
            for instance in self.instances.values():
                instance.gate.end()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(end())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def __enter__(self) -> SimulatedApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""One run of the deterministic simulation: its world and what happens in it.

The world of a seed's run (sim.py): the real Scheduler, AgentRuntime and
Supervisor of a few worker instances, on a virtual clock (clock.py), over an
in-memory store behind per-instance gates (gate.py), a simulated broker
(transport.py) and a simulated remote service (remote.py). `World` starts the
instances, submits the tasks, and applies the faults the schedule draws
(faults.py) as they come due: instances crashed, paused, stopped and replaced,
failpoints armed, clock jumps, operators' commands. Once the faults stop and
every task is terminal it gives its verdict, the invariants checked against the
store's history and the remote's ledger (invariants.py), and a digest of all it
did, to compare two runs of one seed.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sasflow.agent import AgentRequest
from sasflow.app import App
from sasflow.errors import InvalidTransitionError
from sasflow.model import Task
from sasflow.store.memory import MemoryStore
from sasflow.testing import failpoints
from sasflow.testing.clock import VirtualClock, VirtualClockLoop
from sasflow.testing.faults import CrashPoint, Decisions, Schedule
from sasflow.testing.gate import Gate, GatedStore, run_in_instance
from sasflow.testing.invariants import Policy, check
from sasflow.testing.remote import SimRemote
from sasflow.testing.transport import SimTransport
from sasflow.testing.workers import on_virtual_time
from sasflow.workflow import Step

__all__ = ["HORIZON", "START", "SUPERVISOR_INTERVAL", "World"]

START = 1_700_000_000.0  # the store clock's reading at virtual time 0
HORIZON = 900.0  # virtual seconds after the fault window for every task to end
SUPERVISOR_INTERVAL = 0.5


class _Noted(failpoints.Action):
    """A failpoint action of the schedule: noted when it fires, inert after the window."""

    def __init__(self, action: failpoints.Action, decisions: Decisions, what: str, *,
                 times: int, only: list[str]) -> None:
        super().__init__(times=times, only=only)
        self.action, self.decisions, self.what = action, decisions, what

    async def fire(self, point: str, gate: Gate | None) -> None:
        if not self.decisions.active:
            return
        who = gate.instance_id if gate is not None else "?"
        self.decisions.note("failpoint", f"failpoint: {self.what} in {who}")
        await self.action.fire(point, gate)


class _Counting(logging.Handler):
    """Counts sasflow's log records (a bounded log is part of 'no hot loop')."""

    def __init__(self, clock: VirtualClock, keep: bool) -> None:
        super().__init__(logging.INFO)
        self.clock, self.keep = clock, keep
        self.count = 0
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if self.keep:
            self.lines.append(f"{self.clock() - START:10.3f} {record.name}"
                              f" {record.levelname.lower()}: {record.getMessage()}")


def _build_app(schedule: Schedule, remote: SimRemote) -> App:
    app = App(store="memory://")

    for name, compensable in schedule.agents.items():
        def declare(agent: str, undo: bool) -> None:
            async def work(req: AgentRequest) -> Any:
                return await remote.call(agent, req)

            declared = app.agent(agent, attempts=schedule.retry_attempts, initial_wait=0.05,
                                 max_wait=0.5)(work)
            if undo:
                declared.compensator(work)

        declare(name, compensable)
    for w in schedule.workflows:
        app.workflow(w.name, [Step(s.name, agent=s.agent, timeout=s.timeout) for s in w.steps],
                     max_failures=w.max_failures, on_failure=w.on_failure, retry_backoff=0.2)
    return app




class World:
    """One simulated run: its world, its instances, its bookkeeping."""

    def __init__(self, schedule: Schedule, loop: VirtualClockLoop, *, trace: bool) -> None:
        self.schedule = schedule
        self.loop = loop
        self.decisions = Decisions(schedule)
        self.clock = VirtualClock(loop, START)
        self.store = MemoryStore(clock=self.clock)
        self.remote = SimRemote(clock=self.clock, fault=self.decisions.remote_call,
                                hang_for=self.decisions.hang_for)
        self.transport = SimTransport(fault=self.decisions.message, unacked_timeout=10.0)
        self.app = _build_app(schedule, self.remote)
        # the app's store and transport are the simulation's: one in-memory world
        self.app._backends.use(store=GatedStore(self.store, fault=self.decisions.store_call),
                               transport=self.transport)
        self.gates: list[Gate] = []
        self.passages_of: collections.defaultdict[Gate, collections.Counter[str]] = (
            collections.defaultdict(collections.Counter))
        self.workers: list[asyncio.Task[None]] = []
        self.submitted: list[str] = []
        self.operators: list[asyncio.Task[None]] = []
        self.per_second: collections.Counter[int] = collections.Counter()
        self.generation = 0
        self.logs = _Counting(self.clock, trace)

    def start_instance(self, instance_id: str, roles: Sequence[str]) -> None:
        point = self.decisions.crash_point()
        gate = Gate(instance_id, hook=lambda g, what: self._passage(g, what, point, roles))
        gate.on_crash.append(lambda: self._replace(gate, roles))
        worker = self.app._worker(roles=roles, instance_id=instance_id,
                                 supervisor_interval=SUPERVISOR_INTERVAL)
        on_virtual_time(worker, self.clock)
        self.gates.append(gate)
        self.workers.append(run_in_instance(gate, worker.run()))

    def _replace(self, gate: Gate, roles: Sequence[str]) -> None:
        """What systemd's Restart=always does: a new instance, a little later."""
        self.generation += 1
        replacement = f"{gate.instance_id.split('.')[0]}.{self.generation}"
        self.loop.call_later(self.decisions.restart_delay(), self.start_instance, replacement,
                             roles)

    def _passage(self, gate: Gate, what: str, point: CrashPoint | None,
                 roles: Sequence[str]) -> None:
        self.per_second[int(self.loop.time())] += 1
        if point is None or not self.decisions.active or (
                point.passage and what != point.passage):
            return
        counts = self.passages_of[gate]
        counts[point.passage] += 1
        if counts[point.passage] != point.n:
            return
        kind, pause = point.kind, point.pause
        self.decisions.note(kind, f"{kind} {gate.instance_id} at its {point.n}th"
                                  f" {point.passage or 'passage'} ({what})"
                                  f"{f' for {pause:g}s' if kind == 'pause' else ''}")
        if kind == "pause":
            gate.pause()
            self.loop.call_later(pause, gate.resume)
        elif kind == "stop":  # SIGTERM: it hands back what it holds as it stops
            self.workers[self.gates.index(gate)].cancel()
            self._replace(gate, roles)
        else:
            gate.crash()  # its replacement follows (on_crash)

    def arm_failpoints(self) -> None:
        actions: dict[str, Callable[[float], failpoints.Action]] = {
            "crash": lambda seconds: failpoints.Crash(),
            "pause": lambda seconds: failpoints.Pause(seconds),
            "raise": lambda seconds: failpoints.Raise(RuntimeError("failpoint")),
        }
        for point, kind, instance_id, times, seconds in self.decisions.failpoint_plan():
            failpoints.arm(point, _Noted(actions[kind](seconds), self.decisions,
                                         f"{kind} at {point}", times=times, only=[instance_id]))

    def submit(self, task_id: str, workflow: str) -> None:
        new = self.app._new_task(workflow, {"n": len(self.submitted)}, task_id=task_id)
        self.store.submit_now(new)  # acknowledged: from here on it must end
        self.submitted.append(task_id)
        action = self.decisions.operator_action()
        if action is not None:
            what, later = action
            self.loop.call_later(later, self._operate, what, task_id)

    def _operate(self, what: str, task_id: str) -> None:
        """An operator's command, made whatever the task is doing (it may be refused)."""
        if not self.decisions.active:
            return
        act = {"retry": self.app.aretry, "compensate": self.app.acompensate,
               "cancel": self.app.acancel}[what]

        async def command() -> None:
            try:
                await act(task_id)
            except InvalidTransitionError:
                self.decisions.note("operator", f"operator {what} {task_id}: refused")
            else:
                self.decisions.note("operator", f"operator {what} {task_id}")

        self.operators.append(self.loop.create_task(command()))

    def end_faults(self) -> None:
        self.decisions.active = False
        failpoints.reset()
        for gate in self.gates:
            gate.resume()

    async def simulate(self) -> list[str]:
        s = self.schedule
        for task in s.tasks:
            self.loop.call_later(task.submit_at, self.submit, task.task_id, task.workflow)
        for at, seconds in s.clock_jumps:
            self.loop.call_later(at, self._jump, seconds)
        self.loop.call_later(s.window, self.end_faults)
        self.arm_failpoints()
        for instance_id, roles in s.instances:
            self.start_instance(instance_id, roles)
        while True:
            await asyncio.sleep(1.0)
            now = self.loop.time()
            if now < s.window or len(self.submitted) < len(s.tasks):
                continue
            if all(t is not None and t.terminal for t in await self.tasks()) or (
                    now > s.window + HORIZON):
                break
        return await self._verdict()

    def _jump(self, seconds: float) -> None:
        self.decisions.note("clock-jump", f"clock jump {seconds:+g}s")
        self.clock.jump(seconds)

    async def tasks(self) -> list[Task | None]:
        return [await self.store.get(task_id) for task_id in self.submitted]

    async def _verdict(self) -> list[str]:
        tasks = {t.task_id: t for t in await self.tasks() if t is not None}
        history = {task_id: await self.store.history(task_id) for task_id in self.submitted}
        compensable = frozenset(a for a, undo in self.schedule.agents.items() if undo)
        attempts = dict.fromkeys(self.schedule.agents, self.schedule.retry_attempts)
        policies = {w.name: Policy(w.max_failures, attempts, compensable)
                    for w in self.schedule.workflows}
        busiest = max(self.per_second.values(), default=0)
        return check(submitted=self.submitted, tasks=tasks, history=history,
                     alerts=await self.store.alerts(limit=10_000), remote=self.remote,
                     policies=policies, busiest_second=busiest)

    async def stop(self) -> None:
        """End every instance: their blocked calls raise Halted, their tasks finish."""
        for gate in self.gates:
            gate.end()
        for worker in self.workers:
            worker.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        # and what they left behind (handlers of abandoned deliveries, say)
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    async def digest(self) -> str:
        """A fingerprint of everything the run did, to compare two runs of one seed."""
        h = hashlib.sha256()
        for task_id in self.submitted:
            for entry in await self.store.history(task_id):
                h.update(repr((entry.task_id, entry.step, entry.phase, entry.at, entry.actor,
                               entry.epoch, entry.from_state, entry.to_state,
                               entry.why)).encode())
        for attempt in self.remote.attempts:
            h.update(repr(attempt).encode())
        for effect in self.remote.effects:
            h.update(repr(effect).encode())
        return h.hexdigest()[:16]


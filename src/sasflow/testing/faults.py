"""A seeded fault schedule: everything a simulated run will meet, drawn from one seed.

The seed draws the shape of the run (instances and their roles, workflows,
tasks and when they are submitted) and which kinds of fault it meets, with
their rates. During the run, each decision (crash this instance at its 37th
passage through its gate? drop this message? fail this store call?) is drawn
from its own stream of the same seed, so a run is the same however often it is
replayed, and one kind of decision does not shift another's.

Faults happen only within the fault window; after it, crashed instances stay
down (their replacements run), paused ones resume, and time runs on until
every submitted task is terminal (SPEC R6).
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field

from sasflow.testing.failpoints import POINTS
from sasflow.testing.remote import HANG, HANG_THEN_APPLY, LOST_REPLY, OK, PERMANENT, TRANSIENT
from sasflow.testing.transport import Delivery

__all__ = ["FAULT_KINDS", "PASSAGES", "CrashPoint", "Decisions", "Schedule", "StepPlan",
           "TaskPlan", "WorkflowPlan"]

# Every kind of fault a schedule can draw (docs/reliability.md lists them).
FAULT_KINDS = (
    "crash",            # an instance dies at a gate passage (any await that touches the world)
    "pause",            # an instance freezes, past deadlines and leases, then goes on
    "stop",             # an instance is stopped cleanly (SIGTERM) mid-work and replaced
    "drop",             # a message is lost
    "duplicate",        # a message arrives twice
    "delay",            # a message arrives late
    "reorder",          # a message overtakes those queued before it
    "clock-jump",       # the store's clock jumps, forward or back
    "store-fail",       # a store call fails before it is applied
    "store-lost-answer",  # a store call is applied and its answer lost
    "remote-transient",  # the remote service fails an attempt
    "remote-permanent",  # the remote service refuses for good
    "remote-lost-reply",  # the remote applies the effect and the reply is lost
    "remote-hang",      # the remote answers past the deadline (sometimes applying late)
    "operator",         # an operator retries, compensates or cancels a task, racing the actors
    "failpoint",        # a named failpoint in an actor crashes, pauses or fails an instance
)

ROLE_SETS = (("scheduler", "agent", "supervisor"), ("scheduler", "agent", "supervisor"),
             ("scheduler",), ("agent",), ("supervisor",), ("scheduler", "supervisor"))


@dataclass(frozen=True, slots=True)
class StepPlan:
    name: str
    agent: str
    timeout: float


@dataclass(frozen=True, slots=True)
class WorkflowPlan:
    name: str
    steps: tuple[StepPlan, ...]
    max_failures: int
    on_failure: str


@dataclass(frozen=True, slots=True)
class TaskPlan:
    task_id: str
    workflow: str
    submit_at: float


@dataclass
class Schedule:
    """The run a seed describes; `describe()` prints it for a replay."""

    seed: int
    window: float = 0.0
    instances: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    agents: dict[str, bool] = field(default_factory=dict)  # name -> has a compensator
    retry_attempts: int = 3
    workflows: list[WorkflowPlan] = field(default_factory=list)
    tasks: list[TaskPlan] = field(default_factory=list)
    kinds: dict[str, float] = field(default_factory=dict)  # fault kind -> its rate
    clock_jumps: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds)
    max_crashes: int = 0

    @classmethod
    def draw(cls, seed: int) -> Schedule:
        rng = random.Random(f"schedule:{seed}")
        s = cls(seed=seed, window=rng.uniform(5.0, 40.0))
        s.agents = {name: rng.random() < 0.8 for name in ("inventory", "payments", "shipping")}
        s.retry_attempts = rng.randint(1, 4)
        names = list(s.agents)
        for w in range(rng.randint(1, 2)):
            steps = tuple(StepPlan(f"s{i}", rng.choice(names), rng.choice((0.5, 1.0, 2.0, 5.0)))
                          for i in range(rng.randint(1, 3)))
            s.workflows.append(WorkflowPlan(f"wf{w}", steps, rng.randint(1, 4),
                                            rng.choice(("compensate", "compensate", "error"))))
        s.tasks = [TaskPlan(f"t{i}", rng.choice(s.workflows).name,
                            round(rng.uniform(0.0, s.window * 0.7), 3))
                   for i in range(rng.randint(2, 8))]
        for i in range(rng.randint(1, 3)):
            roles = ROLE_SETS[0] if i == 0 else rng.choice(ROLE_SETS)
            s.instances.append((f"w{i}", roles))
        for kind in FAULT_KINDS:
            if rng.random() < 0.45:
                s.kinds[kind] = round(rng.uniform(0.02, 0.3), 3)
        if {"crash", "pause", "stop"} & s.kinds.keys():
            s.max_crashes = rng.randint(1, 4)
        if "clock-jump" in s.kinds:
            s.clock_jumps = [(round(rng.uniform(0, s.window), 3),
                              round(rng.choice((-1, 1)) * rng.uniform(0.1, 10.0), 3))
                             for _ in range(rng.randint(1, 3))]
        return s

    def describe(self) -> str:
        lines = [f"seed {self.seed}: fault window {self.window:.3f}s"]
        lines.append("instances: " + ", ".join(f"{i}({'+'.join(r)})" for i, r in self.instances))
        lines.append("agents: " + ", ".join(
            f"{a}{' (undo)' if undo else ''}" for a, undo in self.agents.items())
            + f"; {self.retry_attempts} attempt(s) per dispatch")
        for w in self.workflows:
            steps = " -> ".join(f"{s.name}:{s.agent}/{s.timeout:g}s" for s in w.steps)
            lines.append(f"workflow {w.name}: {steps}; max_failures={w.max_failures},"
                         f" on_failure={w.on_failure}")
        lines.append("tasks: " + ", ".join(f"{t.task_id}:{t.workflow}@{t.submit_at:g}"
                                           for t in self.tasks))
        lines.append("faults: " + (", ".join(f"{k}={v:g}" for k, v in self.kinds.items())
                                   or "none"))
        if self.clock_jumps:
            lines.append("clock jumps: " + ", ".join(f"{d:+g}s@{at:g}"
                                                     for at, d in self.clock_jumps))
        return "\n".join(lines)


# Where a crash point may fall: the n-th passage of one kind through the gate (on
# the way to the world, or with its answer), or "" for the n-th passage of any kind.
# Counting one kind reaches the writes that matter as often as the idle polls.
PASSAGES = ("", "", "store.claim", "store.claim.answer", "store.apply", "store.apply.answer",
            "store.expired", "store.acquire_lease", "transport.publish",
            "transport.publish.answer", "remote.call", "remote.call.answer")


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Crash, pause or stop an instance at its n-th passage of `passage` ("" any)."""

    kind: str
    passage: str
    n: int
    pause: float


class Decisions:
    """The run-time draws of a schedule, each kind from its own seeded stream."""

    def __init__(self, schedule: Schedule) -> None:
        self.s = schedule
        self.active = True  # False once the fault window is over
        seed = schedule.seed
        self._messages = random.Random(f"messages:{seed}")
        self._store = random.Random(f"store:{seed}")
        self._remote = random.Random(f"remote:{seed}")
        self._processes = random.Random(f"processes:{seed}")
        self._operator = random.Random(f"operator:{seed}")
        self._failpoints = random.Random(f"failpoints:{seed}")
        self.crashes = 0
        self.log: list[str] = []  # what was injected, in order (printed on a replay)
        self.injected: collections.Counter[str] = collections.Counter()  # by fault kind

    def note(self, kind: str, what: str) -> None:
        self.injected[kind] += 1
        self.log.append(what)

    def rate(self, kind: str) -> float:
        return self.s.kinds.get(kind, 0.0) if self.active else 0.0

    def message(self, queue: str) -> Delivery:
        rng = self._messages
        if not self.active:
            return Delivery()
        if rng.random() < self.rate("drop"):
            self.note("drop", f"drop a message to {queue}")
            return Delivery(delays=())
        if rng.random() < self.rate("duplicate"):
            self.note("duplicate", f"duplicate a message to {queue}")
            return Delivery(delays=(0.0, round(rng.uniform(0.0, 2.0), 3)))
        if rng.random() < self.rate("delay"):
            self.note("delay", f"delay a message to {queue}")
            return Delivery(delays=(round(rng.uniform(0.01, 5.0), 3),))
        if rng.random() < self.rate("reorder"):
            self.note("reorder", f"reorder a message to {queue}")
            return Delivery(to_front=True)
        return Delivery()

    def store_call(self, verb: str) -> str | None:
        rng = self._store
        if not self.active:
            return None
        if rng.random() < self.rate("store-fail"):
            self.note("store-fail", f"fail store.{verb}")
            return "before"
        if rng.random() < self.rate("store-lost-answer"):
            self.note("store-lost-answer", f"lose the answer of store.{verb}")
            return "after"
        return None

    def remote_call(self, agent: str, phase: str) -> str:
        rng = self._remote
        if not self.active:
            return OK
        for kind, outcome in (("remote-transient", TRANSIENT), ("remote-lost-reply", LOST_REPLY),
                              ("remote-hang", HANG), ("remote-permanent", PERMANENT)):
            if rng.random() < self.rate(kind):
                if outcome == HANG and rng.random() < 0.5:
                    outcome = HANG_THEN_APPLY
                self.note(kind, f"remote {agent}/{phase}: {outcome}")
                return outcome
        return OK

    def hang_for(self) -> float:
        return round(self._remote.uniform(0.5, 15.0), 3)

    def crash_point(self) -> CrashPoint | None:
        """For a new instance: where to crash, pause or stop it (and a pause's length)."""
        rng = self._processes
        kinds = [k for k in ("crash", "pause", "stop") if k in self.s.kinds]
        if not kinds or self.crashes >= self.s.max_crashes:
            return None
        self.crashes += 1
        kind = rng.choice(kinds)
        pause = round(rng.uniform(0.1, 20.0), 3)
        passage = rng.choice(PASSAGES)
        if passage == "":  # any passage: most of them are idle polls
            return CrashPoint(kind, "", rng.randint(1, 250), pause)
        return CrashPoint(kind, passage, rng.randint(1, 12), pause)

    def restart_delay(self) -> float:
        return round(self._processes.uniform(0.05, 5.0), 3)

    def failpoint_plan(self) -> list[tuple[str, str, str, int, float]]:
        """The failpoints armed for the run: (point, crash | pause | raise, instance,
        times, a pause's length)."""
        rng = self._failpoints
        if "failpoint" not in self.s.kinds:
            return []
        return [(rng.choice(POINTS), rng.choice(("crash", "pause", "raise")),
                 rng.choice(self.s.instances)[0], rng.randint(1, 3),
                 round(rng.uniform(0.1, 20.0), 3))
                for _ in range(rng.randint(1, 2))]

    def operator_action(self) -> tuple[str, float] | None:
        """For a task just submitted: an operator action on it, and how much later."""
        rng = self._operator
        if rng.random() >= self.rate("operator"):
            return None
        return (rng.choice(("retry", "compensate", "cancel")),
                round(rng.uniform(0.0, self.s.window), 3))
